"""The two verbs of every policy: ``choose`` and ``update``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from policies.authors import index_of
from policies.config import PolicyConfig
from policies.indices import Prepared
from policies.ridge import Array, uniform_integers
from policies.state import State, apply_observations, discounted


@dataclass(frozen=True)
class Choice:
    """Decisions for a batch of experiments.

    Attributes
    ----------
    arms : ndarray of int, shape (B,)
    scores : ndarray, shape (B, K)
        The policy's index per arm; ``+inf`` marks an eligible arm never pulled
        (explored before it competes), ``-inf`` an ineligible one.
    """

    arms: NDArray[np.int64]
    scores: Array


@dataclass(frozen=True)
class Ready:
    """Everything about a decision but its random draw (see :func:`prepare`)."""

    config: PolicyConfig
    prepared: Prepared
    eligible: NDArray[np.bool_]  # (B, K)
    unexplored: NDArray[np.bool_]  # (B, K): eligible and never pulled
    exploring_rows: NDArray[np.int64]  # experiments with an unexplored arm (distinct, ascending)
    masked: bool  # some arm is ineligible or unexplored: scores need masking
    # True only when every entry of ``eligible`` is (prepare knows it): no eligibility
    # mask then. False is always safe: the mask is applied.
    every_arm_eligible: bool = False


def choose(
    config: PolicyConfig,
    state: State,
    contexts: Array,
    rngs: Sequence[np.random.Generator],
    eligible: NDArray[np.bool_] | None = None,
) -> Choice:
    """Pick one arm per experiment: :func:`draw` of :func:`prepare`.

    Parameters
    ----------
    state : dict of ndarray
        Statistics from :func:`policies.state.init_state`, batch size B, K arms.
    contexts : ndarray, shape (B, K, d)
        This round's context of every arm (in the covariates setting the one
        context repeated for every arm).
    rngs : sequence of B generators, one per experiment.
    eligible : ndarray of bool, shape (B, K), optional
        Arms that may be chosen; default all.

    Notes
    -----
    With ``config.first_pass`` an eligible arm that was never pulled is chosen
    first (uniformly among such arms), as the paper's first K rounds pull every
    arm once (its bootstrap variance ``RSS_k / s_k^2`` is undefined at
    ``s_k = 0``); otherwise it competes with its prior score.
    """
    return draw(prepare(config, state, contexts, eligible), rngs)


def prepare(
    config: PolicyConfig,
    state: State,
    contexts: Array,
    eligible: NDArray[np.bool_] | None = None,
) -> Ready:
    """The deterministic part of :func:`choose`: check the inputs, solve, factorise.

    One :class:`Ready` serves any number of draws while the state and contexts
    stay the same (the service reuses it until a reward arrives). With
    forgetting the policy sees the statistics at their clock
    (:func:`policies.state.discounted`).
    """
    batch, n_arms = state["pulls"].shape
    if contexts.shape != (batch, n_arms, config.dim):
        expected = (batch, n_arms, config.dim)
        raise ValueError(f"contexts must have shape {expected}, got {contexts.shape}")
    state = discounted(config, state)
    # Only the paper's first pass forces a never-pulled arm; without it the arm
    # competes with its prior score like any other.
    unexplored = state["pulls"] == 0 if config.forces_pass else np.zeros((batch, n_arms), bool)
    if eligible is None:  # the common case, in few array operations: every arm eligible
        eligible = _all_eligible(batch, n_arms)
        restricted = False
    else:
        eligible = np.asarray(eligible)
        if eligible.dtype != np.bool_ or eligible.shape != (batch, n_arms):
            raise ValueError(f"eligible must be a boolean array of shape {(batch, n_arms)}")
        if not eligible.any(axis=1).all():
            raise ValueError("every experiment needs at least one eligible arm")
        unexplored &= eligible
        restricted = not eligible.all()
    if config.first_pass_in_order:
        unexplored = _lowest(unexplored)
    # count_nonzero: one call, cheaper than any() on a single experiment's arms
    exploring_rows = (np.flatnonzero(unexplored.any(axis=1)) if np.count_nonzero(unexplored)
                      else _NO_ROWS)
    return Ready(
        config=config,
        prepared=index_of(config).prepare(config, state, contexts),
        eligible=eligible,
        unexplored=unexplored,
        exploring_rows=exploring_rows,
        masked=bool(exploring_rows.size) or restricted,
        every_arm_eligible=not restricted,
    )


def _lowest(unexplored: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Only the lowest-numbered unexplored arm of each experiment."""
    lowest = np.zeros_like(unexplored)
    rows = np.flatnonzero(unexplored.any(axis=1))
    lowest[rows, unexplored[rows].argmax(axis=1)] = True
    return lowest


_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


@functools.lru_cache(maxsize=64)
def _all_eligible(batch: int, n_arms: int) -> NDArray[np.bool_]:
    """All arms eligible (read-only: shared by every decision of that shape)."""
    eligible = np.ones((batch, n_arms), dtype=bool)
    eligible.flags.writeable = False
    return eligible


def draw(ready: Ready, rngs: Sequence[np.random.Generator]) -> Choice:
    """The random part of :func:`choose`: one draw per experiment from its generator.

    The arm with the highest score; equal highest scores (a deterministic
    policy, or point masses) are split evenly, so that the propensity of
    each is known (:mod:`policies.propensity`). With ``config.epsilon > 0``,
    each experiment then draws a uniform number from its generator and with
    probability epsilon takes a uniformly random eligible arm instead.
    Generators are used in that order (scores, tie, unexplored arm, epsilon),
    and only when needed, so seeded runs stay reproducible.
    """
    return chosen(ready, scores_of(ready, rngs), rngs)


def scores_of(ready: Ready, rngs: Sequence[np.random.Generator]) -> Array:
    """The first part of :func:`draw`: each arm's randomised (or optimistic) index, shape
    (B, K), an ineligible arm's -inf and an unexplored one's +inf."""
    batch = ready.eligible.shape[0]
    if len(rngs) != batch:
        raise ValueError(
            f"need one generator per experiment: {batch} experiments, {len(rngs)} generators"
        )
    config = ready.config
    scores = index_of(config).draw(config, ready.prepared, rngs)
    if ready.masked:
        if not ready.every_arm_eligible:
            scores = np.where(ready.eligible, scores, -np.inf)
        scores = np.where(ready.unexplored, np.inf, scores)
    return scores


def chosen(ready: Ready, scores: Array, rngs: Sequence[np.random.Generator]) -> Choice:
    """The rest of :func:`draw`: the arm each experiment takes from its ``scores``."""
    batch = scores.shape[0]
    config = ready.config
    exploring = ready.exploring_rows
    if exploring.size < batch:
        arms = _highest(scores, exploring, rngs)
    else:  # every experiment explores (a first pass): no score decides, nor a tie
        arms = np.empty(batch, dtype=np.int64)
    if exploring.size:
        arms[exploring] = _uniform(rngs, exploring, ready.unexplored[exploring])
    if config.epsilon > 0.0:
        for row in range(batch):
            if rngs[row].random() < config.epsilon:
                arms[row] = _uniform(rngs, np.array([row]), ready.eligible[row : row + 1])[0]
    return Choice(arms=arms.astype(np.int64, copy=False), scores=scores)


def _highest(scores: Array, exploring: NDArray[np.int64],
             rngs: Sequence[np.random.Generator]) -> NDArray[np.int64]:
    """Each row's arm with the highest score, equal highest split uniformly (drawn only by
    the rows not in ``exploring``, which choose among their unexplored arms instead)."""
    batch = scores.shape[0]
    arms = scores.argmax(axis=1)
    best = scores.max(axis=1, keepdims=True)  # the highest (a NaN if the row holds one)
    top = scores == best
    # One count over the batch first (per-row counts cost several times more):
    # a row has one top score, none if it holds a NaN, or a tie.
    if np.count_nonzero(top) > batch - np.count_nonzero(np.isnan(best)):  # rare: a tie
        tied = np.count_nonzero(top, axis=1) > 1
        tied[exploring] = False  # chosen by the caller, among the unexplored arms
        tied_rows = np.flatnonzero(tied)
        if tied_rows.size:
            arms[tied_rows] = _uniform(rngs, tied_rows, top[tied_rows])
    return arms


def _uniform(
    rngs: Sequence[np.random.Generator], rows: NDArray[np.int64], allowed: NDArray[np.bool_]
) -> NDArray[np.int64]:
    """For each of ``rows``, one of its ``allowed`` positions (a row each), uniformly.

    Row ``rows[i]`` draws a uniform integer below its count of allowed
    positions from its own generator (:func:`policies.ridge.uniform_integers`)
    and takes that allowed position in order: the first pass of a batch of 100
    draws for every experiment in each of its first K rounds.
    """
    running = np.cumsum(allowed, axis=1, dtype=np.int64)  # the last column: the counts
    picks = uniform_integers(rngs, rows, running[:, -1])
    # The pick-th allowed position (from 0) is the first whose running count exceeds it.
    return np.argmax(running > picks[:, None], axis=1)


def update(
    config: PolicyConfig, state: State, arms: NDArray[np.int64], x: Array, rewards: Array,
    numbers: Array | None = None,
) -> State:
    """Add one observation per experiment (in place) and return the state.

    Parameters
    ----------
    arms : ndarray of int, shape (B,)
    x : ndarray, shape (B, d)
        The context each reward was observed with.
    rewards : ndarray, shape (B,)
    numbers : ndarray, shape (B,), optional
        With forgetting (``config.discount < 1``), the decision number of each
        observation, whole numbers from 1 (the service's decision numbers);
        default: one after the latest decision each experiment has an
        outcome of. Ignored without forgetting.

    Raises
    ------
    ValueError
        If a reward or context is not finite: one NaN would spoil the sums for good;
        or a decision number is not a whole number from 1.
    """
    if not (np.isfinite(rewards).all() and np.isfinite(x).all()):
        raise ValueError("rewards and contexts must be finite")
    if numbers is not None and config.discounted:
        numbers = np.asarray(numbers, dtype=np.float64)
        if not (np.all(numbers >= 1) and np.all(numbers < 2.0**53)
                and np.array_equal(numbers, np.floor(numbers))):
            raise ValueError("decision numbers must be whole numbers from 1")
    apply_observations(config, state, arms, x, rewards, numbers)
    return state
