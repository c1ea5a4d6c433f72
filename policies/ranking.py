"""Rankings: k distinct arms in order, from the same random index as one decision.

:func:`rank` orders k eligible arms per experiment. Its first position is
:func:`policies.draw`'s choice, from the same generators used in the same
order, so that k = 1 is a decision of ``/choose`` bit for bit; each later
position is what ``draw`` would choose were the arms not yet placed the only
eligible ones, from the *same* draw of the index: an unexplored arm first
(uniformly, with the paper's first pass), else the highest score (equal
scores split evenly), and with probability ``epsilon`` a uniformly random
remaining eligible arm instead. Every policy ranks by its own randomised (or,
LinUCB, optimistic) index.

:func:`position_propensities` gives the marginal probability that each placed
arm is at its position (what the independent IPS estimator of a slate needs:
Li et al. 2018, "Offline evaluation of ranking policies with click models";
Open Bandit Pipeline's ``pscore_item_position``). Where the arms' indices are
independent normals (LinReBoot; the baselines with a model per arm), every
arm random, no epsilon and no arm left to explore, it is a one-dimensional
integral: arm a is at position j when exactly j - 1 of the others score
higher, so ``P(a at j) = int phi_a(t) PB_(j-1)(t) dt`` with ``PB_m(t)`` the
Poisson-binomial probability that m of the other arms exceed t (each with
probability ``1 - F_b(t)``), by the trapezoidal rule on arm a's normal grid
(a recursion over the other arms per node; for j = 1 the product of their
CDFs, :func:`policies.propensity.propensities`' integrand). Elsewhere it is
estimated by drawing the ranking again with a seeded generator: a standard
error of at most ``sqrt(p (1 - p) / draws)``, the same for the same statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import special

from policies.authors import index_of
from policies.policy import Ready, _highest, _uniform, chosen, scores_of
from policies.propensity import FINE, RANKED_SMOOTH, Accuracy
from policies.ridge import Array

_WIDEST = 0.75  # the smooth rule's spacing with few arms counted (policies.propensity's)
_MAX_NODES = 20_000  # beyond (spreads many orders apart), the estimate instead
_MAX_CELLS = 2_000_000  # a group's values at a time (members x columns x nodes), 16 MB


@dataclass(frozen=True)
class Ranking:
    """Rankings for a batch of experiments.

    Attributes
    ----------
    arms : ndarray of int, shape (B, k)
        The arm at each position, the first the most preferred.
    scores : ndarray, shape (B, K)
        The index of every arm the ranking was made from (as ``Choice.scores``).
    """

    arms: NDArray[np.int64]
    scores: Array


def rank(ready: Ready, rngs: Sequence[np.random.Generator], k: int) -> Ranking:
    """Order ``k`` distinct eligible arms per experiment (see the module notes).

    Raises
    ------
    ValueError
        If an experiment has fewer than ``k`` eligible arms, or ``k < 1``.
    """
    batch, n_arms = ready.eligible.shape
    fewest = n_arms if ready.every_arm_eligible else int(
        np.count_nonzero(ready.eligible, axis=1).min())
    if k < 1 or fewest < k:
        raise ValueError(f"k must be between 1 and the eligible arms ({fewest})")
    scores = scores_of(ready, rngs)
    rows = np.arange(batch)
    if k > 1 and ready.config.epsilon == 0.0 and not ready.exploring_rows.size:
        # No arm to explore, no epsilon: draw takes the highest score, and each next
        # position is the highest score left, drawing nothing unless scores tie (then
        # draw's split and the loop below, which split ties with the generators). One
        # sort instead of draw's choice and k - 1 passes; the same arms. Few NumPy calls:
        # in a server each costs several µs more than in a tight loop. (An ineligible
        # arm's score is -inf already; a NaN sorts first here, and fails the check.)
        order = scores.argsort(axis=1)[:, :-k - 2:-1]  # the k placed and the next
        top = scores[rows[:, None], order]
        # No tie: draw would have taken the first. (count_nonzero: one C call, where
        # all() goes through NumPy's Python wrapper.)
        if np.count_nonzero(top[:, :-1] > top[:, 1:]) == batch * (top.shape[1] - 1):
            # A copy: the view would keep the whole argsort (B x K) alive.
            return Ranking(arms=np.ascontiguousarray(order[:, :k]), scores=scores)
    first = chosen(ready, scores, rngs)
    arms = np.empty((batch, k), dtype=np.int64)
    arms[:, 0] = first.arms
    left = ready.eligible.copy()
    left[rows, first.arms] = False
    for position in range(1, k):
        arms[:, position] = _next(ready, first.scores, left, rngs)
        left[rows, arms[:, position]] = False
    return Ranking(arms=arms, scores=first.scores)


def _next(ready: Ready, scores: Array, left: NDArray[np.bool_],
          rngs: Sequence[np.random.Generator]) -> NDArray[np.int64]:
    """Each experiment's next arm among those ``left``, from the same ``scores``."""
    unexplored = ready.unexplored & left
    exploring = np.flatnonzero(unexplored.any(axis=1))
    masked = np.where(left, np.where(unexplored, np.inf, scores), -np.inf)
    arms = _highest(masked, exploring, rngs)
    if exploring.size:
        arms[exploring] = _uniform(rngs, exploring, unexplored[exploring])
    if ready.config.epsilon > 0.0:
        for row in range(arms.shape[0]):
            if rngs[row].random() < ready.config.epsilon:
                arms[row] = _uniform(rngs, np.array([row]), left[row: row + 1])[0]
    return arms


def position_propensities(ready: Ready, ranking: Ranking, *, draws: int = 4096,
                          seed: int = 20261128, accuracy: Accuracy = FINE) -> Array:
    """The probability that :func:`rank` of ``ready`` puts each of ``ranking``'s arms at
    its position, shape (B, k): :func:`placement_propensities` of the ranking made (so
    an estimate counts it among its draws)."""
    positions = np.broadcast_to(np.arange(ranking.arms.shape[1]), ranking.arms.shape)
    return placement_propensities(ready, ranking.arms, positions, draws=draws, seed=seed,
                                  made=True, accuracy=accuracy)


def placement_propensities(ready: Ready, arms: NDArray[np.int64], positions: NDArray[np.int64],
                           *, draws: int = 4096, seed: int = 20261128,
                           made: bool = False, accuracy: Accuracy = FINE) -> Array:
    """The probability that :func:`rank` of ``ready`` puts ``arms[b, i]`` at position
    ``positions[b, i]`` (from 0), shape (B, n): what a slate's estimator asks of a
    target that did not make the ranking. The integral where it serves (module notes);
    for a deterministic index (every spread 0: LinUCB, greedy) 1 or 0 by the order of
    the scores, unless scores tie; else estimated from ``draws`` rankings drawn with a
    generator seeded by ``seed`` (and the experiment's row), each estimate within
    ``sqrt(p (1 - p) / draws)`` of the probability at one standard error; with
    ``made``, the placements are a ranking this law made, counted among the draws (so
    that an arm placed never gets 0, which inverse-propensity weights could not use:
    ``+ 1 / draws`` at most). ``accuracy``: the integral's (:data:`policies.propensity.FINE`,
    below 1e-4: 1e-6 against adaptive quadrature in the tests; ``SERVICE``, below
    1e-3)."""
    exact = _normal_positions(ready, arms, positions, accuracy)
    if exact is None:
        exact = _ordered_positions(ready, arms, positions)
    if exact is not None:
        return exact
    return _estimated(ready, arms, positions, draws, seed, made)


def placement_table(ready: Ready, k: int, *, accuracy: Accuracy = FINE) -> Array | None:
    """The probability that :func:`rank` of ``ready`` puts each arm at each position
    below ``k``, shape (B, K, k) (0 for an arm not eligible), where the integral serves
    or the index is deterministic (as :func:`placement_propensities`); None where only
    the estimate would (its draws answer the placements asked, not a table) or one
    grid would not do (:func:`_at_positions`). One pass for every pair: a server keeps
    it while the statistics stay the same."""
    batch, size = ready.eligible.shape
    arms = np.broadcast_to(np.repeat(np.arange(size), k), (batch, size * k))
    positions = np.broadcast_to(np.tile(np.arange(k), size), (batch, size * k))
    # (not arm by arm where one grid would not do: a ranking's own pairs are cheaper)
    table = _normal_positions(ready, arms, positions, accuracy, split=False)
    if table is None:
        table = _ordered_positions(ready, arms, positions)
    return None if table is None else table.reshape(batch, size, k)


def _normal_positions(ready: Ready, placed: NDArray[np.int64], positions: NDArray[np.int64],
                      accuracy: Accuracy = FINE, split: bool = True) -> Array | None:
    """The integral of the module notes for every experiment, or None where it does
    not serve (another law, epsilon, an arm to explore, a point mass, spreads too far
    apart)."""
    if ready.config.epsilon > 0.0 or ready.exploring_rows.size:
        return None
    law = index_of(ready.config).law(ready.config, ready.prepared)
    if law.spread is None or law.dof is not None or law.loadings is not None:
        return None
    out = np.zeros(placed.shape)
    for row in range(placed.shape[0]):
        arms = np.flatnonzero(ready.eligible[row])
        mean, spread = law.mean[row, arms], law.spread[row, arms]
        if not np.all(spread > 0.0):
            return None
        asked = ready.eligible[row, placed[row]]  # an arm not eligible is nowhere: 0
        values = _at_positions(mean, spread, np.searchsorted(arms, placed[row, asked]),
                               positions[row, asked], accuracy, split)
        if values is None:
            return None
        out[row, asked] = values
    return out


def _ordered_positions(ready: Ready, arms: NDArray[np.int64],
                       positions: NDArray[np.int64]) -> Array | None:
    """A deterministic index's placements (every eligible arm's spread 0, no epsilon,
    nothing to explore): 1 where the arm's score is the position's in the order of the
    scores, else 0; None where that does not serve (another law; scores that tie)."""
    if ready.config.epsilon > 0.0 or ready.exploring_rows.size:
        return None
    law = index_of(ready.config).law(ready.config, ready.prepared)
    if law.spread is None or law.loadings is not None:
        return None
    out = np.empty(arms.shape)
    for row in range(arms.shape[0]):
        eligible = np.flatnonzero(ready.eligible[row])
        if np.any(law.spread[row, eligible] != 0.0):
            return None
        scores = law.mean[row, eligible]
        if np.unique(scores).size < scores.size:
            return None  # ties split at random
        order = eligible[np.argsort(-scores, kind="stable")]
        # A position beyond the eligible arms holds none of them.
        held = np.concatenate([order, [-1]])
        out[row] = held[np.minimum(positions[row], order.size)] == arms[row]
    return out


def _at_positions(mean: Array, spread: Array, placed: NDArray[np.int64],
                  positions: NDArray[np.int64] | None = None,
                  accuracy: Accuracy = FINE, split: bool = True) -> Array | None:
    """``P(placed[i] at positions[i])`` (from 0; default i) among independent normal
    indices, for every i at once (the module notes' integral): a ranking's slots, or
    every (arm, position) pair of a table (:func:`placement_table`) in one pass.

    Each index lives in its window, mean +- ``accuracy.z`` spreads (the tail beyond holds
    ``Phi(-z)``). Below the (c + 2)-th highest window start (c the highest position
    asked), c + 1 arms other than the placed one score higher for sure: no integrand
    asked is above 0 there, so the integrals start at it. The placed arms whose windows
    overlap share one grid (:func:`_group`); an arm whose window lies above the group's
    is above every node for sure and only shifts the count, one below it never counts;
    the rest, those that may cross a node, enter the Poisson-binomial recursion once per
    group, and each placed arm's own factor is left out by prefix and suffix products
    (no division). Nodes are :func:`policies.propensity`'s smooth trapezoid rule, spaced
    ``accuracy.ranked_step / sqrt(n)`` (at most 0.75; n the arms counted) of the
    narrowest counted spread, or the finer ``accuracy.step`` where a counted arm is
    narrower than ``RANKED_SMOOTH`` times a placed one: the integrand narrows as arms crowd
    (K identical arms: tests/test_ranking.py). A group that would take more than
    ``_MAX_NODES`` nodes, or ``_MAX_CELLS`` values at a time (a wide arm among narrow
    ones), is taken arm by arm (with ``split``), each on its own grid; None (the
    estimate instead) where even that would."""
    z = accuracy.z
    low, high = mean - z * spread, mean + z * spread
    at = np.arange(placed.size) if positions is None else np.asarray(positions)
    out = np.zeros(placed.size)
    if placed.size == 0:
        return out
    starts = np.sort(low)[::-1]

    def floor_of(deepest: int, arm: int | None = None) -> float:
        """Below it, more others than ``deepest`` score higher for sure (others than
        ``arm``; than any placed arm, when None: one rank lower)."""
        among = starts if arm is None else np.sort(np.delete(low, arm))[::-1]
        at_least = deepest + (1 if arm is None else 0)
        return float(among[at_least]) if at_least < among.size else -np.inf

    def place(members: NDArray[np.int64], floor: float) -> bool:
        asked = np.flatnonzero(np.isin(pair_of, members))
        found = _group_values(mean, spread, low, high, distinct[members], floor,
                              int(at[asked].max()), accuracy)
        if found is None:
            return False
        shift, values = found  # positions from the group's first column
        row = np.searchsorted(distinct[members], placed[asked])
        column = at[asked] - shift
        out[asked] = np.where(column >= 0, values[row, np.maximum(column, 0)], 0.0)
        return True

    distinct, pair_of = np.unique(placed, return_inverse=True)
    floor = floor_of(int(at.max()))
    for members in _group(np.maximum(low[distinct], floor), high[distinct]):
        if place(members, floor):
            continue
        if not split or members.size == 1:
            return None
        # A grid too fine or too large for the group (a wide arm among narrow ones):
        # each arm on its own, from its own floor.
        for member in members:
            own = int(at[pair_of == member].max())
            if not place(np.array([member]), floor_of(own, int(distinct[member]))):
                return None
    return np.clip(out, 0.0, 1.0)


def _group(starts: Array, ends: Array) -> list[NDArray[np.int64]]:
    """The placed arms whose windows (from ``starts`` to ``ends``) overlap, chained: each
    group's arms share a grid; an arm whose window is empty (it ends below the floor) is
    in no group, and its probability stays 0."""
    order = [int(i) for i in np.argsort(starts, kind="stable") if ends[i] > starts[i]]
    groups: list[list[int]] = []
    reach = -np.inf
    for i in order:
        if not groups or starts[i] > reach:
            groups.append([])
        groups[-1].append(i)
        reach = max(reach, float(ends[i]))
    return [np.array(sorted(g), dtype=np.int64) for g in groups]


def _group_values(mean: Array, spread: Array, low: Array, high: Array,
                  members: NDArray[np.int64], floor: float, deepest: int,
                  accuracy: Accuracy) -> tuple[int, Array] | None:
    """``shift``, the arms above the group's grid for sure, and ``P(member at column +
    shift)`` for each of a group's ``members`` and every column up to ``deepest - shift``,
    shape (members, columns) (see :func:`_at_positions`)."""
    start = max(float(low[members].min()), floor)
    end = float(high[members].max())
    shift = int(np.count_nonzero(low > end))
    columns = deepest - shift + 1
    if columns <= 0:  # more arms above the whole group for sure than any position asked
        return shift, np.zeros((members.size, 1))
    counted = np.flatnonzero((high > start) & (low <= end))
    narrowest = float(spread[counted].min())
    # The integrand is a bump of a member's density and the probability that exactly
    # `column` of n counted arms score higher: about 1 / sqrt(n) as wide as the member's
    # spread (K identical arms: 0.15 spreads at n = 100 holds 6e-8 relative, 0.25 only
    # 3e-4), so the nodes close in as sqrt(n) grows, in the narrowest counted spread's
    # units (a crowd of narrow arms narrows it as much; review, session 16).
    crowd = accuracy.ranked_step / math.sqrt(max(counted.size - 1, 1))
    smooth = narrowest >= RANKED_SMOOTH * float(spread[members].max())
    step = (min(_WIDEST, crowd) if smooth else min(accuracy.step, crowd)) * narrowest
    nodes = math.floor((end - start) / step) + 1
    if nodes > _MAX_NODES or members.size * columns * nodes > _MAX_CELLS:
        return None
    t = start + step * np.arange(nodes)
    rest = np.setdiff1d(counted, members, assume_unique=True)
    arms = np.concatenate([rest, members])
    below = special.ndtr((t - mean[arms, None]) / spread[arms, None])
    # P(exactly m of the other counted arms above t), m < columns, by node: the rest's,
    # then the members' own factors as prefix (on top of the rest's) and suffix products.
    before = np.zeros((members.size, columns, t.size))
    after = np.zeros_like(before)
    before[0, 0] = 1.0
    after[-1, 0] = 1.0
    _add(before[0], below[:rest.size])
    for i in range(1, members.size):
        _add(before[i], below[rest.size + i - 1], before[i - 1])
        _add(after[-1 - i], below[-i], after[-i])
    others = np.zeros_like(before)
    for s in range(columns):
        others[:, s:] += before[:, s: s + 1] * after[:, : columns - s]
    u = (t - mean[members, None]) / spread[members, None]
    density = np.exp(-0.5 * u * u) * (step / math.sqrt(2.0 * np.pi) / spread[members, None])
    return shift, np.einsum("ag,acg->ac", density, others)


def _add(count: Array, below: Array, source: Array | None = None) -> None:
    """The Poisson-binomial recursion, in place: ``count`` (P(exactly m above), by m and
    node) becomes ``source``'s (default its own) with the arms of ``below`` (each arm's
    probability of scoring below each node, one row or several) added."""
    rows = below.reshape(-1, below.shape[-1])
    if source is not None:
        np.copyto(count, source)
    for under in rows:
        shifted = count[:-1] * (1.0 - under)
        count *= under
        count[1:] += shifted


def _estimated(ready: Ready, arms: NDArray[np.int64], positions: NDArray[np.int64],
               draws: int, seed: int, made: bool) -> Array:
    batch = arms.shape[0]
    rngs = [np.random.default_rng([seed, row]) for row in range(batch)]
    k = int(positions.max()) + 1
    rows = np.arange(batch)[:, None]
    hits = np.ones(arms.shape) if made else np.zeros(arms.shape)
    for _ in range(draws):
        hits += rank(ready, rngs, k).arms[rows, positions] == arms
    return hits / (draws + 1 if made else draws)
