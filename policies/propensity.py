"""Propensities: the probability that :func:`policies.draw` chooses an arm.

Given a :class:`policies.Ready` (the statistics and contexts of a decision),
``draw`` picks, per experiment:

1. uniformly among eligible arms never pulled, if there are any;
2. else the argmax of the policy's random index over the eligible arms, ties
   (equal scores) split evenly;
3. and with probability ``epsilon`` (a hyperparameter of every policy,
   default 0) instead uniformly among all eligible arms.

So ``P(a) = (1 - epsilon) p(a) + epsilon / K_eligible``, with ``p`` the
probability of steps 1-2, computed from the index's :class:`~policies.indices.Law`:

* **Point masses** (LinUCB, greedy, an arm with no residual spread): the
  highest wins (ties split evenly) if every random index stays below it.
* **Independent arms** (LinReBoot; the baselines in the covariates setting,
  where every arm has its own model): ``p(a) = int prod_(k != a) F_k(t) dF_a(t)``,
  a one-dimensional integral of normal CDFs (Student t for LinTS-IG), by
  quadrature that resolves spreads differing by many orders of magnitude;
  error below ``1e-4`` (:class:`_Window`).
* **One shared model** (the baselines in the stochastic and contextual
  settings): the indices ``x_k' theta~`` are *correlated* (rank d), so the
  product-of-CDFs integral does not hold. ``p(a)`` is the normal (or
  multivariate t) measure of a polyhedron in R^d, estimated by randomised
  quasi-Monte Carlo with a standard error of at most ``SHARED_TARGET_SE``
  unless ``SHARED_MAX_POINTS`` are used first (:func:`shared_propensity`).

Only the requested arms are computed: the service asks for the chosen one.

References
----------
Genz, A. and Bretz, F. (2009). *Computation of Multivariate Normal and t
Probabilities*. Springer. Sections 4.1.1-4.1.3 (separation of variables,
variable ordering), 4.2 (randomised quasi-Monte Carlo).
Owen, A. B. (1995). Randomly permuted (t,m,s)-nets and (t,s)-sequences.
(scipy.stats.qmc.Sobol's scrambling.)
Trefethen, L. N. and Weideman, J. A. C. (2014). The exponentially convergent
trapezoidal rule. SIAM Review 56(3), 385-458.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy import special

from policies.authors import index_of
from policies.indices import Law
from policies.policy import Ready
from policies.ridge import Array

Z = 6.0
"""Half-width of every index's window, in quantiles of the standard normal:
outside it an index has probability ``Phi(-6) = 1e-9``."""
STEP = 0.25
"""Node spacing of the merged rule, in units of an arm's spread (see ``_Window.merged``);
a quarter of that for Student t indices, whose arms' grids do not nest."""
SMOOTH = 0.1
"""The smooth rule serves when no factor is narrower than this times arm a (``_Window``).
Its nodes are spaced 0.75 of the narrowest factor's spread, so its accuracy does not
depend on this bound, only its cost: at most 134 nodes here, where the merged rule took
3-4 times as long (0.1-0.25: 300-360 µs against 70-90 at K = 100, BENCHMARKS.md §21)."""
RANKED_SMOOTH = 0.25
"""A ranking's integrals take the widest spacing when no counted arm is narrower than
this times a placed one (:mod:`policies.ranking`)."""
SHARED_TARGET_SE = 1e-4
"""Standard error at which :func:`shared_propensity` stops."""


@dataclass(frozen=True)
class Accuracy:
    """How hard :func:`propensities` works: each index's window (``z`` normal quantiles),
    the merged rule's node spacing (``step`` spreads) and a shared model's standard error."""

    z: float
    step: float
    shared_se: float
    # A ranking's slots (policies.ranking): the smooth rule's node spacing is this over
    # the square root of the arms counted, in the narrowest counted spread's units (the
    # merged rule's ``step`` where one is narrow).
    ranked_step: float = 1.2

    @property
    def tail(self) -> float:
        return float(special.ndtr(-self.z))


FINE = Accuracy(Z, STEP, SHARED_TARGET_SE)
"""The default: errors below ``1e-4`` (tests/test_propensity.py)."""
SERVICE = Accuracy(5.0, 0.5, 1e-3, ranked_step=2.0)
"""What ``/choose`` asks: errors below ``1e-3`` (tests/test_propensity.py), at a third to
a half of the work of :data:`FINE` where the merged rule serves (BENCHMARKS.md §8); a
ranking's slots below ``1e-3`` too (tests/test_ranking.py), at 0.6-0.8 of the work."""
_SEED = 20240611  # scrambles of the shared-model estimate: the same for the same statistics


def propensities(
    ready: Ready, arms: NDArray[np.int64] | None = None, *, accuracy: Accuracy = FINE
) -> Array:
    """The probability that :func:`policies.draw` of ``ready`` picks each arm.

    Parameters
    ----------
    ready : Ready
        From :func:`policies.prepare`, batch size B, K arms.
    arms : ndarray of int, shape (B,), optional
        One arm per experiment (e.g. the chosen one): only those are computed.
    accuracy : Accuracy
        :data:`FINE` (the default) or :data:`SERVICE`.

    Returns
    -------
    ndarray, shape (B, K), or (B,) with ``arms``
        Each row sums to 1 (up to the errors in the module notes); an
        ineligible arm has 0.
    """
    return _propensities(ready, arms, accuracy, single=True)


def _propensities(ready: Ready, arms: NDArray[np.int64] | None, accuracy: Accuracy,
                  single: bool) -> Array:
    """:func:`propensities`; ``single``: try one experiment's lean path first
    (:func:`_pairs`)."""
    batch, n_arms = ready.eligible.shape
    if arms is None:
        rows, cols = np.nonzero(ready.eligible)
    else:
        arms = np.asarray(arms, dtype=np.int64)
        if arms.shape != (batch,) or not 0 <= arms.min() <= arms.max() < n_arms:
            raise ValueError(f"arms must be {batch} arm indexes below {n_arms}")
        rows, cols = np.arange(batch), arms
    values = _pairs(ready, rows, cols, accuracy, single)
    epsilon = ready.config.epsilon
    if epsilon > 0.0:
        share = ready.eligible[rows, cols] / ready.eligible.sum(axis=1)[rows]
        values = (1.0 - epsilon) * values + epsilon * share
    if arms is not None:
        return values
    out = np.zeros((batch, n_arms))
    out[rows, cols] = values
    return out


def estimated(ready: Ready) -> bool:
    """Whether :func:`propensities` of ``ready`` estimates a shared model's correlated
    scores (milliseconds at K = 100) rather than integrating (microseconds)."""
    return ready.config.shared and index_of(ready.config).one_draw


def off_the_loop(ready: Ready) -> bool:
    """Whether :func:`propensities` of one arm of ``ready`` may take milliseconds, so that
    a server should not run it on its event loop: a shared model's estimate
    (:func:`estimated`), or Student t indices (LinTS-IG), whose integral takes a node
    grid four times finer and no single-arm shortcut (2 ms at K = 10, d = 20 in the
    covariates setting, 0.1 s at K = 100)."""
    return estimated(ready) or index_of(ready.config).student_t


def _pairs(
    ready: Ready, rows: NDArray[np.int64], cols: NDArray[np.int64], accuracy: Accuracy,
    single: bool = True,
) -> Array:
    """``p`` (steps 1-2 of the module notes) of arm ``cols[i]`` in experiment ``rows[i]``;
    with ``single``, one experiment's arm by :func:`_one_normal` where that serves."""
    law = None
    if single and rows.size == 1 and not ready.exploring_rows.size:  # a decision's
        law = index_of(ready.config).law(ready.config, ready.prepared)
        value = _one_normal(ready, law, int(cols[0]), accuracy)
        if value is not None:
            return np.array([value])
    out = np.zeros(rows.shape)
    todo = ready.eligible[rows, cols]
    candidates = ready.eligible
    if ready.exploring_rows.size:
        exploring = np.zeros(ready.eligible.shape[0], dtype=bool)
        exploring[ready.exploring_rows] = True
        explore = exploring[rows]
        counts = ready.unexplored.sum(axis=1)[rows[explore]]
        out[explore] = ready.unexplored[rows[explore], cols[explore]] / counts
        todo &= ~explore
        candidates = candidates & ~exploring[:, None]
    # An arm that is the only candidate is chosen for sure: 1, not an integral's 1 - 1e-7.
    lone = todo & (candidates.sum(axis=1)[rows] == 1)
    if lone.any():
        out[lone] = 1.0
        todo &= ~lone
    if not todo.any():
        return out
    if law is None:
        law = index_of(ready.config).law(ready.config, ready.prepared)
    if law.loadings is not None and np.any(law.loadings):
        out[todo] = _shared(law, candidates, rows[todo], cols[todo], accuracy)
    else:
        spread = law.spread if law.spread is not None else np.zeros_like(law.mean)
        out[todo] = _independent(law.mean, spread, law.dof, candidates, rows[todo], cols[todo],
                                 accuracy)
    return out


_ROW_0 = np.zeros(1, dtype=np.int64)


def arm_propensity(ready: Ready, accuracy: Accuracy = FINE) -> Callable[[int], float]:
    """``propensities(ready, [arm], accuracy=accuracy)[0]`` as a function of ``arm``, for
    one experiment (B = 1): the service's propensity of each decision's arm, the same bits.

    What every arm's integral shares (the index's law, the windows, the floor a random
    index must beat, the arms alive) is computed here, once: a view's decisions ask for
    one arm after another from the same statistics (BENCHMARKS.md §37)."""
    if ready.eligible.shape[0] != 1:
        raise ValueError("arm_propensity is for one experiment (B = 1)")

    def general(arm: int) -> float:  # (where the lean path does not serve: not tried again)
        return float(_propensities(ready, np.array([arm]), accuracy, single=False)[0])

    if ready.exploring_rows.size:
        return general
    law = index_of(ready.config).law(ready.config, ready.prepared)
    normal = _NormalArms.of(ready, law, accuracy)
    if normal is None:
        return general
    epsilon = ready.config.epsilon
    eligible = ready.eligible[0]
    count = int(np.count_nonzero(eligible))

    def one(arm: int) -> float:
        value = normal.value(arm) if 0 <= arm < eligible.size else None
        if value is None:
            return general(arm)
        if epsilon > 0.0:  # as propensities mixes in the uniform choice
            value = (1.0 - epsilon) * value + epsilon * (float(eligible[arm]) / count)
        return value

    return one


def _one_normal(ready: Ready, law: Law, arm: int, accuracy: Accuracy) -> float | None:
    """:func:`_independent`'s value for one experiment (B = 1) whose indices are independent
    normals, arm a not a point mass (:class:`_NormalArms`); None where that does not serve,
    and the general path decides."""
    normal = _NormalArms.of(ready, law, accuracy)
    return None if normal is None else normal.value(arm)


@dataclass(frozen=True)
class _NormalArms:
    """:func:`_independent`'s arrays for one experiment (B = 1) whose indices are independent
    normals: what the integral of each of its arms starts from, made with a third of that
    path's array operations on K values (the same operations on the same numbers: the same
    bits). Other arms' point masses (an arm with no residual spread yet) only raise the
    floor a random index must beat, as in :func:`_independent`."""

    eligible: NDArray[np.bool_]
    mean: Array
    spread: Array
    point: NDArray[np.bool_]
    low: Array
    high: Array
    alive: NDArray[np.bool_]
    floor: float
    top: float  # the highest point mass (-inf: none)
    alone: bool  # a single arm is eligible
    family: _Family

    @classmethod
    def of(cls, ready: Ready, law: Law, accuracy: Accuracy) -> _NormalArms | None:
        """None where the law is another (Student t, a shared model's, point masses only)."""
        eligible = ready.eligible[0]
        if law.spread is None or law.dof is not None or law.loadings is not None \
                or eligible.size == 1:
            return None
        mean, spread = law.mean[0], law.spread[0]
        if not spread.any():
            return None
        point = spread <= np.maximum(_POINT * np.abs(mean), _TINY)
        family = _Family(None, accuracy)
        reach = family.quantile(None) * spread
        low, high = mean - reach, mean + reach
        top = -math.inf
        if point.any():  # a random index must beat the highest point mass too
            random = eligible & ~point
            top = float(np.where(eligible & point, mean, -np.inf).max())
            floor = max(float(np.where(random, low, -np.inf).max()), top)
            alive = random & (high > floor)
        elif ready.every_arm_eligible:
            floor = float(low.max())
            alive = high > floor
        else:
            floor = float(np.where(eligible, low, -np.inf).max())
            alive = eligible & (high > floor)
        alone = not ready.every_arm_eligible and np.count_nonzero(eligible) == 1
        return cls(eligible, mean, spread, point, low, high, alive, floor, top, bool(alone),
                   family)

    def value(self, arm: int) -> float | None:
        """Arm ``arm``'s integral; None where the general path decides: arm a a point mass
        (ties, the CDFs at its value), not eligible, alone (chosen for sure: the general
        path says 1 exactly), or not alive."""
        if not self.eligible[arm] or self.point[arm] or self.alone or not self.alive[arm]:
            return None
        low = float(self.low[arm])
        if self.top <= low:  # no point mass inside arm a's window
            value = _smooth_one(self.mean, self.spread, self.alive, self.high,
                                max(low, self.floor), arm)
            if value is not None:
                return value
        # A factor too narrow for the smooth rule, or a point mass inside arm a's window:
        # the general rule, on the arrays made here.
        window = _Window(self.family, self.mean[None], self.spread[None], self.low[None],
                         self.high[None], self.alive[None], np.array([self.floor]),
                         np.array([self.top]), _ROW_0, np.array([arm]))
        return float(window.integrals()[0])


# --------------------------------------------------------------------------- independent


@dataclass(frozen=True)
class _Family:
    """Standardised CDF and first-moment antiderivative of an arm's index: normal or t."""

    dof: Array | None  # per arm, or None for normal
    accuracy: Accuracy = FINE

    def cdf(self, u: Array, dof: Array | None) -> Array:
        return special.ndtr(u) if dof is None else special.stdtr(dof, u)

    def moment(self, u: Array, dof: Array | None) -> Array:
        """An antiderivative of ``u f(u)``: ``-phi(u)``, or ``-(nu + u^2) f_nu(u) / (nu - 1)``,
        and ``log(1 + u^2) / (2 pi)`` at ``nu = 1`` (Cauchy: LinTS-IG's prior with
        ``alpha = 1/2``, an arm never pulled has ``nu = 2 alpha = 1``); ``u`` finite."""
        square = u * u
        if dof is None:
            return np.exp(-0.5 * square) * (-1.0 / _ROOT_TAU)
        cauchy = dof == 1.0
        log_density = (special.gammaln(0.5 * (dof + 1.0)) - special.gammaln(0.5 * dof)
                       - 0.5 * np.log(dof * math.pi) - 0.5 * (dof + 1.0) * np.log1p(square / dof))
        general = -(dof + square) / np.where(cauchy, 1.0, dof - 1.0) * np.exp(log_density)
        if not np.any(cauchy):
            return general
        return np.where(cauchy, np.log1p(square) / (2.0 * math.pi), general)

    @property
    def step(self) -> float:
        step = self.accuracy.step
        return step if self.dof is None else step / 4

    def quantile(self, dof: Array | None) -> Array | float:
        """How many spreads out the index has tail probability ``Phi(-Z)``."""
        z = self.accuracy.z
        return z if dof is None else -special.stdtrit(dof, self.accuracy.tail)


_ROOT_TAU = math.sqrt(2.0 * math.pi)
# Below this spread (relative to the mean) an index is a point mass: its draws
# differ from the mean in the last few bits only (and its nodes, multiples of
# STEP / 8 spreads, stay exact integers times a power of two).
_POINT = 2.0**-50
_TINY = 1e-280  # nor does arithmetic on spreads go subnormal


def _independent(
    mean: Array, spread: Array, dof: Array | None, candidates: NDArray[np.bool_],
    rows: NDArray[np.int64], cols: NDArray[np.int64], accuracy: Accuracy = FINE,
) -> Array:
    """``P(argmax = cols[i])`` in row ``rows[i]`` for independent indices.

    Point masses (``spread`` 0) first: the highest, ``m0``, wins when every
    random index falls below it (ties split evenly); a random index must
    exceed ``m0``, so the integral of arm ``a`` starts there. Arms whose
    window ``mean +- q spread`` (q: the ``Phi(-Z)`` quantile) ends below the
    highest window start, or below ``m0``, are dropped: each has probability
    at most ``2 Phi(-Z) = 2e-9``, and dropping one changes the others' by no
    more in total.
    """
    family = _Family(dof, accuracy)
    point = candidates & (spread <= np.maximum(_POINT * np.abs(mean), _TINY))
    points = bool(point.any())
    random = candidates & ~point if points else candidates
    reach = family.quantile(dof) * spread
    low, high = mean - reach, mean + reach
    floor = np.where(random, low, -np.inf).max(axis=1)
    top = np.where(point, mean, -np.inf).max(axis=1) if points else np.full_like(floor, -np.inf)
    out = np.zeros(rows.size)
    if points:
        floor = np.maximum(floor, top)
    alive = random & (high > floor[:, None])
    if points:
        at_top = point[rows, cols] & (mean[rows, cols] == top[rows])
        tied = (point & (mean == top[:, None])).sum(axis=1)
        below = family.cdf((top[:, None] - mean) / np.where(alive, spread, 1.0), dof)
        stays = np.where(alive, below, 1.0).prod(axis=1)
        out[at_top] = (stays / np.maximum(tied, 1))[rows[at_top]]
    integrate = alive[rows, cols]
    if rows.size == 1 and dof is None and not points and integrate[0]:  # the service's case
        row, arm = int(rows[0]), int(cols[0])
        value = _smooth_one(mean[row], spread[row], alive[row], high[row],
                            max(float(low[row, arm]), float(floor[row])), arm)
        if value is not None:
            return np.array([value])
    if integrate.all():  # the usual case: no copies
        return _Window(family, mean, spread, low, high, alive, floor, top, rows, cols).integrals()
    if integrate.any():
        out[integrate] = _Window(family, mean, spread, low, high, alive, floor, top,
                                 rows[integrate], cols[integrate]).integrals()
    return out


# The smooth rule's nodes and weights when no factor is narrower than arm a, made once
# (each node and weight is its own product and exponential: a slice has the same bits).
_UNIT_STEP = 0.75
_UNIT_NODES = np.arange(-math.floor(5.0 / _UNIT_STEP), math.floor(5.0 / _UNIT_STEP) + 1) \
    * _UNIT_STEP
_UNIT_WEIGHTS = np.exp(-0.5 * _UNIT_NODES * _UNIT_NODES)


def _smooth_one(
    mean: Array, spread: Array, alive: NDArray[np.bool_], high: Array, start: float, arm: int
) -> float | None:
    """:meth:`_Window.trapezoid` for one pair of normal arms, the same numbers with a
    third of the NumPy calls (a decision's propensity in the service); None where
    the smooth rule does not serve (a factor narrower than ``SMOOTH`` times arm a)."""
    factors = alive & (high > start)
    factors[arm] = False
    shifted, scale = mean[factors], spread[factors]
    mu, sd = float(mean[arm]), float(spread[arm])
    ratio = float(scale.min()) / sd if scale.size else math.inf
    if ratio < SMOOTH:
        return None
    step = 0.75 * min(ratio, 1.0)
    last = math.floor(5.0 / step)
    first = max(-last, math.ceil((start - mu) / sd / step))
    if step == _UNIT_STEP and first <= last:  # no factor narrower than arm a: the usual
        g, weights = _UNIT_NODES[first + last:], _UNIT_WEIGHTS[first + last:]
    else:
        g = np.arange(first, max(last, first) + 1) * step
        weights = np.exp(-0.5 * g * g) if last >= first else np.zeros(1)
    u = ((mu + sd * g)[:, None] - shifted) / scale
    total = float(np.cumsum(weights * special.ndtr(u).prod(axis=1))[-1])
    return min(total * (step / _ROOT_TAU), 1.0)


@dataclass(frozen=True)
class _Window:
    """Arm a's integral ``int_L^U prod_(k != a) F_k(t) dF_a(t)`` for pairs (row, a = col).

    ``[L, U]`` is arm a's window above the floor (the highest window start,
    or point mass). The factors are the other arms alive that reach into it;
    every other arm's CDF is 1 there (to ``Phi(-Z)``).

    Two rules, both checked against adaptive quadrature in tests/test_propensity.py:

    * **Smooth** (normal arms, every factor at least ``SMOOTH`` times as
      wide as arm a, no point mass inside the window): the trapezoid rule in
      arm a's standard units (:meth:`trapezoid`), spectrally accurate for
      such an analytic, fast decaying integrand: below ``6e-6`` in 3,000
      random cases, below ``2e-6`` in 4,300 more with the narrowest factor
      0.1-0.25 times arm a; 15 nodes when no factor is narrower than arm a.
    * **Merged** (anything else: a CDF a million times narrower than arm a's
      density, point masses, Student t): see :meth:`merged`.
    """

    family: _Family
    mean: Array
    spread: Array
    low: Array
    high: Array
    alive: NDArray[np.bool_]
    floor: Array
    top: Array
    rows: NDArray[np.int64]
    cols: NDArray[np.int64]

    def integrals(self) -> Array:
        rows, cols = self.rows, self.cols
        own, low = self.spread[rows, cols], self.low[rows, cols]
        start = np.maximum(low, self.floor[rows])
        factors = self.alive[rows] & (self.high[rows] > start[:, None])
        factors[np.arange(rows.size), cols] = False
        columns = factors.any(axis=0)
        factors = factors[:, columns]
        spreads = self.spread[rows][:, columns]
        shifted = np.where(factors, self.mean[rows][:, columns], -np.inf)  # CDF 1 if not a factor
        scale = np.where(factors, spreads, np.inf)
        ratio = scale.min(axis=1, initial=np.inf) / own
        smooth = (ratio >= SMOOTH) & (self.top[rows] <= low)
        scale[~factors] = 1.0
        if self.family.dof is not None:
            smooth[:] = False
        if smooth.all():  # the usual case: no copies
            return self.trapezoid(np.minimum(ratio, 1.0), shifted, scale, start)
        out = np.empty(rows.size)
        if smooth.any():
            part = replace(self, rows=rows[smooth], cols=cols[smooth])
            out[smooth] = part.trapezoid(np.minimum(ratio[smooth], 1.0), shifted[smooth],
                                         scale[smooth], start[smooth])
        rough = ~smooth
        dof = None if self.family.dof is None else self.family.dof[rows[rough]][:, columns]
        part = replace(self, rows=rows[rough], cols=cols[rough])
        out[rough] = part.merged(start[rough], shifted[rough], scale[rough], dof)
        return out

    def trapezoid(self, ratio: Array, shifted: Array, scale: Array, start: Array) -> Array:
        """The smooth rule: ``sum_j h phi(g_j) prod_k Phi((mu_a + s_a g_j - mu_k) / s_k)``.

        Nodes ``g_j = j h`` with ``h = 0.75 min(1, ratio)``, from the floor (below
        it the product is below ``Phi(-Z)``) to ``+5``; the tails beyond ``+-5``
        hold ``6e-7``.
        """
        step = 0.75 * ratio
        mu, sd = self.mean[self.rows, self.cols], self.spread[self.rows, self.cols]
        last = np.floor(5.0 / step)
        first = np.maximum(-last, np.ceil((start - mu) / sd / step))
        # Each pair's nodes first, then padding (weight 0): its sum does not depend
        # on the batch (products and cumulative sums run in order).
        j = first[:, None] + np.arange(max(int((last - first).max()) + 1, 1))
        g = j * step[:, None]
        weights = np.where(j <= last[:, None], np.exp(-0.5 * g * g), 0.0)
        t = mu[:, None] + sd[:, None] * g
        u = (t[:, :, None] - shifted[:, None, :]) / scale[:, None, :]
        total = np.cumsum(weights * special.ndtr(u).prod(axis=2), axis=1)[:, -1]
        return np.minimum(total * (step / _ROOT_TAU), 1.0)  # rounding only: the terms are >= 0

    def merged(self, start: Array, shifted: Array, scale: Array, dof: Array | None) -> Array:
        """The general rule, on the merged nodes of arm a and every narrower arm.

        Nodes are those of arm a and of every narrower arm whose window meets
        arm a's, each spaced ``STEP`` of its arm's spread (see :func:`_nodes`):
        where any arm's CDF turns, the nodes are as close as that arm's spread
        needs, so a CDF a million times narrower than arm a's density is a
        resolved step, not a missed one. Between nodes the product of CDFs is
        interpolated linearly and integrated exactly against arm a's
        distribution (moments of the normal or t over each interval): the
        error is second order in the spacing, and extrapolating from every
        other node (Richardson) leaves at most ``6e-5`` in 2,500 random cases.
        """
        rows, cols, family = self.rows, self.cols, self.family
        n_pairs = rows.size
        mu_a, own = self.mean[rows, cols], self.spread[rows, cols]
        end = self.high[rows, cols]
        sources = self.alive[rows] & (self.spread[rows] < own[:, None])
        sources &= (self.high[rows] > start[:, None]) & (self.low[rows] < end[:, None])
        sources[np.arange(n_pairs), cols] = True
        pair, t, coarse = _nodes(family, self.mean, self.spread, self.low, self.high, rows,
                                 sources, start, end)
        if n_pairs > 1:  # one pair broadcasts without a copy
            shifted, scale = shifted[pair], scale[pair]
            dof = None if dof is None else dof[pair]
        product = family.cdf((t[:, None] - shifted) / scale, dof).prod(axis=1)
        a_dof = None if family.dof is None else family.dof[rows, cols][pair]
        u = (t - mu_a[pair]) / own[pair]
        cdf, moment = family.cdf(u, a_dof), family.moment(u, a_dof)
        fine = _integrate(pair, t, product, cdf, moment, mu_a, own, n_pairs)
        rough = _integrate(pair[coarse], t[coarse], product[coarse], cdf[coarse],
                           moment[coarse], mu_a, own, n_pairs)
        return np.clip((4.0 * fine - rough) / 3.0, 0.0, 1.0)


def _integrate(
    pair: NDArray[np.int64], t: Array, product: Array, cdf: Array, moment: Array,
    mu: Array, sd: Array, n_pairs: int,
) -> Array:
    """Sum over each pair's intervals of the linear interpolant of ``product`` times ``dF_a``.

    On ``[t0, t1]``, ``int (H0 + (H1 - H0) (t - t0) / (t1 - t0)) dF_a`` is
    ``H0 (m0 - m1) + H1 m1`` with ``m0 = F_a(t1) - F_a(t0)`` and
    ``m1 = int (t - t0) dF_a / (t1 - t0) = ((mu - t0) m0 + sd (A(u1) - A(u0))) / (t1 - t0)``
    (``A``: :meth:`_Family.moment`). Nodes are sorted and distinct within a pair.
    """
    p = pair[1:]
    same = p == pair[:-1]
    m0 = cdf[1:] - cdf[:-1]
    m1 = (mu[p] - t[:-1]) * m0 + sd[p] * (moment[1:] - moment[:-1])
    np.divide(m1, t[1:] - t[:-1], out=m1, where=same)
    np.clip(m1, 0.0, m0, out=m1)  # within [0, m0] but for rounding
    parts = (product[:-1] * (m0 - m1) + product[1:] * m1) * same
    return np.asarray(np.bincount(p, weights=parts, minlength=n_pairs), dtype=np.float64)


def _nodes(
    family: _Family, mean: Array, spread: Array, low: Array, high: Array,
    rows: NDArray[np.int64], sources: NDArray[np.bool_], start: Array, end: Array,
) -> tuple[NDArray[np.int64], Array, NDArray[np.bool_]]:
    """Every pair's nodes, sorted by pair then position, and which are coarse (every other).

    Each source arm ``k`` of pair ``p`` adds its nodes inside both its window
    and ``[start_p, end_p]``, which are added too. Normal arms: multiples of
    ``STEP`` times the power of two at or below the arm's spread, so arms of
    about the same spread share nodes, and the coarse grid (even multiples)
    is nested in the fine one. Student t arms: the t quantiles of normal
    quantiles ``STEP`` apart (the tails are long).
    """
    pair_of, arm_of = np.nonzero(sources)
    row_of = rows[pair_of]
    lo = np.maximum(low[row_of, arm_of], start[pair_of])
    hi = np.minimum(high[row_of, arm_of], end[pair_of])
    z = family.accuracy.z
    count = round(2 * z / family.step)
    if family.dof is None:
        # A step of at least STEP / 2 spreads: 2 * count intervals cover a window.
        # Every source's nodes begin at its pair's start (an alive arm's window
        # begins at or below the floor, arm a's at or below its start), so a pair's
        # sources of one step share their nodes, up to the highest of their ends: one
        # grid per pair and step, not per arm (90 arms of one spread were 90 grids).
        exponent = np.frexp(spread[row_of, arm_of])[1]
        shift = int(exponent.min())
        group = pair_of * (int(exponent.max()) - shift + 1) + (exponent - shift)
        groups, first, member = np.unique(group, return_index=True, return_inverse=True)
        top = np.full(groups.size, -np.inf)
        np.maximum.at(top, member, hi)
        pair_of, lo, hi = pair_of[first], lo[first], top
        step = np.ldexp(family.step, exponent[first] - 1)[:, None]
        index = np.ceil(lo / step[:, 0])[:, None] + np.arange(2 * count + 1)
        t = index * step
        coarse = index % 2 == 0
    else:
        grid = np.arange(count + 1) * family.step - z
        dof = family.dof[row_of, arm_of][:, None]
        quantiles = special.stdtrit(dof, special.ndtr(grid))
        t = mean[row_of, arm_of][:, None] + spread[row_of, arm_of][:, None] * quantiles
        coarse = np.broadcast_to(np.arange(count + 1) % 2 == 0, t.shape)
    keep = (t >= lo[:, None]) & (t <= hi[:, None])
    ends = np.tile(np.arange(start.size), 2)
    pair = np.concatenate([np.broadcast_to(pair_of[:, None], t.shape)[keep], ends])
    t = np.concatenate([t[keep], start, end])
    coarse = np.concatenate([coarse[keep], np.ones(ends.size, dtype=bool)])
    order = np.lexsort((~coarse, t, pair))  # of equal nodes, a coarse one first
    pair, t, coarse = pair[order], t[order], coarse[order]
    first = np.ones(t.size, dtype=bool)
    first[1:] = (pair[1:] != pair[:-1]) | (t[1:] != t[:-1])
    return pair[first], t[first], coarse[first]


# --------------------------------------------------------------------------- shared model


def _shared(
    law: Law, candidates: NDArray[np.bool_], rows: NDArray[np.int64], cols: NDArray[np.int64],
    accuracy: Accuracy,
) -> Array:
    """``P(argmax = cols[i])`` in row ``rows[i]`` when the scores share one draw (see
    :func:`shared_propensity`)."""
    assert law.loadings is not None
    out = np.empty(rows.size)
    for i, (row, arm) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
        dof = None if law.dof is None else float(law.dof[row])
        out[i] = shared_propensity(
            law.mean[row], law.loadings[row], dof, candidates[row], arm, accuracy)[0]
    return out


def shared_propensity(
    mean: Array, loadings: Array, dof: float | None, candidates: NDArray[np.bool_], arm: int,
    accuracy: Accuracy = FINE,
) -> tuple[float, float]:
    """``P(argmax = arm)`` for ``score = mean + loadings @ T`` (one experiment), and its
    standard error.

    Arm a wins where ``(L_a - L_k) T >= mean_k - mean_a`` for every other arm
    k: a polyhedron in R^d, whose normal (or t) measure is estimated by
    Genz's separation of variables. The constraints are rotated into lower
    trapezoidal form (greedily taking next the one least likely to hold,
    Genz and Bretz 2009, 4.1.3), so each variable in turn is drawn from its
    normal truncated to the interval that the constraints ending at it
    leave, and the estimate is the product of those intervals'
    probabilities: smooth in the uniforms, which come from scrambled Sobol'
    sequences (at the same number of points, a standard error a third to a
    half of randomly shifted Richtmyer lattices' in the paper's worlds).
    ``SHIFTS`` independent scrambles give an unbiased standard error; points
    double until it is at most ``accuracy.shared_se`` or
    ``SHARED_MAX_POINTS`` are used.

    Arms with identical scores in every draw (the same mean and loadings,
    e.g. identical contexts) are tied: they share their group's probability
    evenly, as ``draw`` breaks ties evenly. Arms that cannot win (window
    below another's, as in :func:`_independent`) are left out.
    """
    spread = np.linalg.norm(loadings, axis=1)
    reach = (accuracy.z if dof is None
             else -float(special.stdtrit(dof, accuracy.tail))) * spread
    floor = np.max(np.where(candidates, mean - reach, -np.inf))
    alive = candidates & (mean + reach >= floor)
    if not alive[arm]:
        return 0.0, 0.0
    tied = alive & (mean == mean[arm]) & (loadings == loadings[arm]).all(axis=1)
    rivals = alive & ~tied
    rise = loadings[arm] - loadings[rivals]  # C: how much faster arm a's score climbs
    gap = mean[rivals] - mean[arm]  # l: how far arm a starts below
    flat = ~rise.any(axis=1)
    if (flat & (gap > 0)).any():  # a rival always ahead
        return 0.0, 0.0
    rise, gap = rise[~flat], gap[~flat]
    share = 1.0 / int(tied.sum())
    if gap.size == 0:
        return share, 0.0
    value, error = _separation_of_variables(*_trapezoidal(rise, gap), dof, accuracy.shared_se)
    return value * share, error * share


SHIFTS = 8
"""Independent scrambles of the Sobol' sequence in :func:`shared_propensity` (its standard
error's sample)."""
SHARED_MAX_POINTS = 8 * 8192
"""Cap on the points of :func:`shared_propensity` (then its error may exceed the target)."""


def _trapezoidal(rise: Array, gap: Array) -> tuple[Array, Array, NDArray[np.int64]]:
    """The constraints ``rise @ T >= gap`` rotated: ``rows @ W >= bounds`` with ``W = Q' T``
    (also standard), ``rows`` lower trapezoidal; and the last column each row depends on.

    Greedy Gram-Schmidt: each step takes the remaining constraint least
    likely to hold (largest standardised bound, with earlier variables at
    their truncated means) and makes its residual direction the next column.
    """
    norm = np.linalg.norm(rise, axis=1)
    residual = rise.copy()
    basis: list[Array] = []
    means: list[float] = []
    left = np.ones(len(gap), dtype=bool)
    tiny = 1e-12 * norm.max()
    for _ in range(rise.shape[1]):
        size = np.linalg.norm(residual, axis=1)
        usable = left & (size > tiny)
        if not usable.any():
            break
        expected = rise @ (np.array(basis).T @ np.array(means)) if basis else 0.0
        standard = np.where(usable, (gap - expected) / np.where(usable, size, 1.0), -np.inf)
        pick = int(np.argmax(standard))
        direction = residual[pick] / size[pick]
        basis.append(direction)
        bound = float(standard[pick])
        # E[w | w >= bound]: where the chosen variable is expected to land.
        means.append(float(np.exp(-0.5 * bound * bound - special.log_ndtr(-bound)) / _ROOT_TAU))
        left[pick] = False
        residual -= np.outer(residual @ direction, direction)
    rows = rise @ np.array(basis).T
    significant = np.abs(rows) > 1e-10 * norm[:, None]
    last = np.where(significant.any(axis=1),
                    rows.shape[1] - 1 - np.argmax(significant[:, ::-1], axis=1), -1)
    return rows, gap, last


def _separation_of_variables(
    rows: Array, bounds: Array, last: NDArray[np.int64], dof: float | None, target_se: float
) -> tuple[float, float]:
    """``P(rows @ W >= bounds)``, W standard normal (or multivariate t with ``dof``)."""
    if ((last < 0) & (bounds > 0)).any():  # a constraint no variable can meet
        return 0.0, 0.0
    groups = [_Group.of(rows, bounds, np.flatnonzero(last == j), j)
              for j in range(int(last.max()) + 1)]
    # One uniform per variable but the last (integrated exactly), one for t's scale.
    uniforms = max(len(groups) - 1 + (dof is not None), 1)
    # Each doubling adds the next points of every sequence: 2^m points in all.
    done, points, total = 0, 256, np.zeros(SHIFTS)
    while True:
        grid = _sobol(uniforms, points)[:, done:].reshape(-1, uniforms)
        total += _sov_estimates(groups, dof, grid).reshape(SHIFTS, -1).sum(axis=1)
        done = points
        estimates = total / points
        error = float(estimates.std(ddof=1) / math.sqrt(SHIFTS))
        if error <= target_se or 2 * points * SHIFTS > SHARED_MAX_POINTS:
            return float(estimates.mean()), error
        points *= 2


@functools.lru_cache(maxsize=32)
def _sobol(uniforms: int, points: int) -> Array:
    """The first ``points`` of ``SHIFTS`` scrambled Sobol' sequences, (SHIFTS, points,
    uniforms): seeded, so the same statistics get the same estimate; kept, as making
    the scrambles costs more than a small estimate."""
    from scipy.stats import qmc  # here: importing scipy.stats takes about a second

    engines = [qmc.Sobol(uniforms, seed=np.random.default_rng([_SEED, i])) for i in range(SHIFTS)]
    grid = np.stack([engine.random(points) for engine in engines])
    grid.flags.writeable = False
    return grid


@dataclass(frozen=True)
class _Group:
    """The constraints that end at variable j, solved for it: ``W_j >= lower_i - W @ down_i``
    (positive coefficients), ``W_j <= upper_i - W @ up_i`` (negative); W the earlier ones."""

    cuts: Array  # lower, then upper
    n_lower: int
    slopes: Array  # (j, cuts.size): down, then up

    @staticmethod
    def of(rows: Array, bounds: Array, members: NDArray[np.int64], j: int) -> _Group:
        coefficient = rows[members, j]  # significant (see _trapezoidal)
        order = np.argsort(coefficient < 0, kind="stable")  # positive first
        members, coefficient = members[order], coefficient[order]
        slopes = (rows[members, :j] / coefficient[:, None]).T
        return _Group(bounds[members] / coefficient, int(np.sum(coefficient > 0)),
                      np.ascontiguousarray(slopes))


def _sov_estimates(groups: list[_Group], dof: float | None, grid: Array) -> Array:
    """The product of conditional interval probabilities at each point, shape (points,)."""
    uniforms = iter(grid.T)
    # T = W / s with s^2 ~ chi2_dof / dof: every bound scales by s.
    scale = None if dof is None else np.sqrt(special.chdtri(dof, next(uniforms)) / dof)
    w = np.empty((grid.shape[0], len(groups)))
    estimate = np.ones(grid.shape[0])
    for j, group in enumerate(groups):
        cut = np.broadcast_to(group.cuts, (grid.shape[0], group.cuts.size)) if scale is None \
            else scale[:, None] * group.cuts
        if j:
            cut = cut - w[:, :j] @ group.slopes
        low = cut[:, :group.n_lower].max(axis=1, initial=-np.inf)
        high = cut[:, group.n_lower:].min(axis=1, initial=np.inf)
        below = special.ndtr(low)
        inside = np.maximum(special.ndtr(high) - below, 0.0)
        estimate *= inside
        if j < len(groups) - 1:  # draw W_j from its truncated normal
            fraction = below + next(uniforms) * inside
            w[:, j] = special.ndtri(np.clip(fraction, 1e-300, 1.0 - 2**-53))
    return estimate
