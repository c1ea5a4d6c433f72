"""Off-policy evaluation: the value of a target policy from logged decisions.

A log holds, per round ``i``, the context, the arm ``a_i`` the logging policy
chose with probability ``p_i`` (its propensity) and the reward ``r_i``. The
value of a target policy ``pi`` (the mean reward it would earn on the same
contexts) is estimated by

* **IPS**, inverse propensity scoring: the mean of ``w_i r_i`` with
  ``w_i = pi(a_i | x_i) / p_i``; unbiased when every ``p_i > 0`` where
  ``pi`` is;
* **SNIPS**, self-normalised IPS: ``sum w_i r_i / sum w_i``; slightly biased,
  far less variable when the weights are large;
* **DR**, doubly robust: ``sum_a pi(a | x_i) q(x_i, a) + w_i (r_i - q(x_i, a_i))``
  with a reward model ``q`` (here ridge regression per arm, cross-fitted so
  that no round's model saw its own reward); unbiased if either the
  propensities or the model are right, and usually the least variable.

Each comes with a normal 95% interval from the per-round terms (the delta
method for SNIPS). :func:`fitted_target` gives the target of ``linreboot
evaluate``: a policy fitted on the log's first rounds, then held fixed.

References
----------
Dudik, Langford, Li. Doubly Robust Policy Evaluation and Learning. ICML 2011.
Swaminathan, Joachims. The Self-Normalized Estimator for Counterfactual
Learning. NeurIPS 2015. Open Bandit Pipeline, ``obp.ope``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from policies.config import PolicyConfig
from policies.policy import prepare, update
from policies.propensity import FINE, Accuracy, propensities
from policies.ranking import placement_propensities
from policies.ridge import ridge
from policies.state import init_state

Array = NDArray[np.floating[Any]]
IntArray = NDArray[np.int64]

Z_95 = 1.959963984540054  # the 97.5% standard normal quantile


@dataclass(frozen=True)
class Estimate:
    """A policy value with its standard error and 95% interval."""

    value: float
    stderr: float

    @property
    def low(self) -> float:
        return self.value - Z_95 * self.stderr

    @property
    def high(self) -> float:
        return self.value + Z_95 * self.stderr

    def covers(self, truth: float) -> bool:
        return self.low <= truth <= self.high


def _mean_of(terms: Array) -> Estimate:
    n = terms.shape[0]
    stderr = float(np.std(terms, ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return Estimate(float(np.mean(terms)), stderr)


def _weights(target: Array, actions: IntArray, propensities: Array) -> Array:
    if np.any(propensities <= 0) or np.any(propensities > 1):
        raise ValueError("propensities must lie in (0, 1]")
    return target[np.arange(actions.shape[0]), actions] / propensities


def ips(rewards: Array, actions: IntArray, propensities: Array, target: Array) -> Estimate:
    """Inverse propensity scoring.

    Parameters
    ----------
    rewards : ndarray, shape (n,)
    actions : ndarray of int, shape (n,)
        The arm logged in each round.
    propensities : ndarray, shape (n,)
        The logging policy's probability of that arm.
    target : ndarray, shape (n, K)
        The target policy's probability of every arm in each round.
    """
    return _mean_of(_weights(target, actions, propensities) * rewards)


def snips(rewards: Array, actions: IntArray, propensities: Array, target: Array) -> Estimate:
    """Self-normalised IPS, with the delta-method standard error."""
    w = _weights(target, actions, propensities)
    value = float(np.sum(w * rewards) / np.sum(w))
    influence = w * (rewards - value) / np.mean(w)
    return Estimate(value, _mean_of(influence).stderr)


def doubly_robust(
    rewards: Array, actions: IntArray, propensities: Array, target: Array, model: Array
) -> Estimate:
    """Doubly robust, with ``model`` the predicted reward of every arm, shape (n, K)."""
    rows = np.arange(actions.shape[0])
    w = _weights(target, actions, propensities)
    terms = np.sum(target * model, axis=1) + w * (rewards - model[rows, actions])
    return _mean_of(terms)


def slate_ips(rewards: Array, slates: IntArray, propensities: Array, target: Array
              ) -> Estimate:
    """Independent IPS of a ranking (Li et al. 2018; Open Bandit Pipeline's ``IIPS``):
    the mean over rankings of ``sum_j w_ij r_ij``, ``w_ij`` the target's probability of
    slot j's arm at slot j's position over the logging policy's. Unbiased for the
    target's expected sum of slot rewards when a slot's reward depends on the context,
    its arm and its position only (the position-based click model among others); the
    interval from the per-ranking sums, which are independent.

    Parameters
    ----------
    rewards, propensities, target : ndarray, shape (n,)
        Each logged slot's reward, its logged placement probability and the target's.
    slates : ndarray of int, shape (n,)
        Each slot's ranking, numbered 0 .. m - 1.
    """
    if np.any(propensities <= 0) or np.any(propensities > 1):
        raise ValueError("propensities must lie in (0, 1]")
    sums = np.asarray(np.bincount(slates, weights=target / propensities * rewards), np.float64)
    return _mean_of(sums)


def fitted_slate_target(
    config: PolicyConfig, contexts: Array, actions: IntArray, positions: IntArray,
    learnt: Array, eligible: NDArray[np.bool_], slates: IntArray, train: NDArray[np.bool_],
) -> Array:
    """A ranking target's probability of each evaluated slot's placement: the policy
    fitted on the ``train`` slots (in order, from ``learnt``: each slot's reward as the
    service learns it, over its position's weight), then held fixed (no first pass, as
    :func:`fitted_target`), asked of each evaluated ranking at once.

    Parameters
    ----------
    contexts : ndarray, shape (n, K, d)
        Every arm's context at each logged slot (a ranking's slots share theirs).
    actions, positions, slates : ndarray of int, shape (n,)
        Each slot's arm, position (from 0) and ranking.
    learnt : ndarray, shape (n,)
    eligible : ndarray of bool, shape (n, K)
    train : ndarray of bool, shape (n,)
        The slots the target learns from (whole rankings, before the others).

    Returns
    -------
    ndarray, shape (number of slots not in ``train``,), in their order.
    """
    if config.forces_pass:
        raise ValueError("a target held fixed after its training rounds takes no first pass "
                         "(first_pass must be false)")
    state = init_state(config, contexts.shape[1], 1)
    for i in np.flatnonzero(train):
        update(config, state, actions[i:i + 1], contexts[i:i + 1, actions[i]],
               learnt[i:i + 1])
    evaluated = np.flatnonzero(~train)
    out = np.empty(evaluated.size)
    for slate in np.unique(slates[evaluated]):
        here = np.flatnonzero(slates[evaluated] == slate)
        first = evaluated[here[0]]
        ready = prepare(config, state, contexts[first][None], eligible[first][None])
        out[here] = placement_propensities(ready, actions[evaluated[here]][None],
                                           positions[evaluated[here]][None])[0]
    return out


def ridge_reward_model(
    contexts: Array, actions: IntArray, rewards: Array, reg: float = 1.0, folds: int = 2
) -> Array:
    """Cross-fitted per-arm ridge predictions of every arm's reward, shape (n, K).

    Parameters
    ----------
    contexts : ndarray, shape (n, K, d)
        Every arm's context in each round (the same row repeated when one
        context serves all arms).
    folds : int
        Rounds are split into this many interleaved folds; each fold is
        predicted by models fitted on the others.
    """
    n, n_arms, _ = contexts.shape
    rows = np.arange(n)
    chosen = contexts[rows, actions]  # (n, d)
    fold = rows % folds
    out = np.empty((n, n_arms))
    for f in range(folds):
        train = fold != f
        one_hot = (actions[train, None] == np.arange(n_arms)).astype(float)  # (m, K)
        x = chosen[train]
        gram = np.einsum("mk,mi,mj->kij", one_hot, x, x)
        xty = np.einsum("mk,mi,m->ki", one_hot, x, rewards[train])
        theta = ridge(gram, xty, reg)  # (K, d)
        out[fold == f] = np.einsum("mkd,kd->mk", contexts[fold == f], theta)
    return out


def fitted_target(
    config: PolicyConfig,
    contexts: Array,
    actions: IntArray,
    rewards: Array,
    eligible: NDArray[np.bool_],
    train: int,
    accuracy: Accuracy = FINE,
    numbers: Array | None = None,
) -> Array:
    """The target of an evaluation: a policy fitted on the first ``train`` rounds of each
    log, then held fixed; its probability of each arm in every later round.

    A policy that keeps learning would act on outcomes the log does not have,
    so its value is not identified by a log; the fitted-then-frozen policy's
    is, and it is what one would deploy warm-started from the log. A frozen
    policy takes no first pass (it would pull the arms the training rounds
    never tried, uniformly, for ever: another policy than the one named), so
    a ``config`` with one is refused; an arm never pulled in training is
    scored from the prior.

    Parameters
    ----------
    contexts : ndarray, shape (B, n, K, d)
        Every arm's context in each round of each of B logs.
    actions, rewards : ndarray, shape (B, n)
        The logged arm and reward, rounds in the order the outcomes were applied.
    eligible : ndarray of bool, shape (B, n, K)
    train : int
        Rounds the target learns from (0 <= train < n).
    numbers : ndarray, shape (B, n), optional
        Each round's decision number, which a target with ``discount < 1`` weighs by.

    Returns
    -------
    ndarray, shape (B, n - train, K)
        From :func:`policies.propensity.propensities`: rows sum to 1, ineligible arms 0.

    Raises
    ------
    ValueError
        If ``config`` takes a first pass, or ``train`` is out of range.
    """
    if config.forces_pass:
        raise ValueError("a target held fixed after its training rounds takes no first pass "
                         "(first_pass must be false)")
    batch, n, n_arms, _ = contexts.shape
    if not 0 <= train < n:
        raise ValueError(f"train must be between 0 and {n - 1}")
    state = init_state(config, n_arms, batch)
    rows = np.arange(batch)
    for i in range(train):
        update(config, state, actions[:, i], contexts[rows, i, actions[:, i]], rewards[:, i],
               None if numbers is None else numbers[:, i])
    out = np.empty((batch, n - train, n_arms))
    previous: tuple[Array, NDArray[np.bool_], Array] | None = None
    for j, i in enumerate(range(train, n)):
        if previous is not None and np.array_equal(previous[0], contexts[:, i]) \
                and np.array_equal(previous[1], eligible[:, i]):
            out[:, j] = previous[2]  # a frozen policy on the same arms: the same law
            continue
        ready = prepare(config, state, contexts[:, i], eligible[:, i])
        out[:, j] = propensities(ready, accuracy=accuracy)
        previous = (contexts[:, i], eligible[:, i], out[:, j])
    return out
