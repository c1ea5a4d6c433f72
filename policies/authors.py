"""The baselines as the paper's authors' experiment code runs them.

The paper's Figure 1 was made with the authors' ``Algorithms.py`` (public
repository ShuangWu22/LinReBoot_Experiments). Its five baselines differ
from the textbook forms that :mod:`policies.indices` implements, and those
differences, not noise, separate our baseline curves from theirs
(RESULTS.md, "The authors' baselines"). ``PolicyConfig(variant="authors")``
selects these forms; they are transcribed from that code, vectorised over
experiments like every index:

* **LinUCB**: radius ``sqrt(lambda) max_s ||theta_hat_s|| + R sqrt(2 log(1/delta)
  + log(det V / lambda^d))`` with ``R = 1`` (no noise scale), the exact
  log-determinant of ``V = X'X + lambda I`` instead of its bound, and the
  largest norm of the ridge estimate after every update so far instead of a
  known bound ``S`` (the state keeps it: ``theta_norm_max``).
* **LinTS-IG**: the inverse gamma's rate is ``beta + 1/2 X'y' mu`` (the
  textbook's is ``beta + 1/2 (y'y - mu' V mu)``), and with one shared model
  the sampled ``sigma^2`` scales the covariance squared:
  ``theta ~ N(mu, (sigma^2)^2 V^-1)``. With a model per arm it scales it once.
* **LinPHE**: pseudo-rewards ``-U + 2 U S_i``, where
  ``Binomial(ceil(a n), 1/2)`` successes are spread uniformly over the
  ``n`` past rounds (``S_i`` those of round ``i``), and the Gram matrix
  ``(1 + a) (X'X + lambda I)``. The perturbation ``X'z`` has mean
  ``U (m/n - 1) sum x`` (``m = ceil(a n)``; a pessimistic shift, since ``a < 1``)
  and covariance ``U^2 (m/n) (2 X'X - sum x sum x' / n)``; it is drawn
  from the normal with those two moments, as our LinPHE draws from its
  Gaussian limit (the cost per decision stays independent of ``n``). With a
  model per arm ``n`` still counts every past round (the code spreads one
  binomial over the whole history), and the arms' perturbations, correlated
  through that one binomial by ``-U^2 m / n^2 sum x_k sum x_j'``, are drawn
  independently.

* **LinReBoot** (``Linear_ReBoot_G``) with one shared model is the paper's
  and ours. With a model per arm their loop takes the first pass in arm
  order (``PolicyConfig.first_pass_in_order``) and refreshes ``beta`` only for
  the arm pulled in the round before, and only from round K + 1 on: after the
  first pass every arm but the last keeps ``beta = 0``, so scores ``0`` with
  spread ``sigma_omega sqrt(sum r^2) / s`` (its residuals about 0), until it
  is pulled again. The state marks the arms refreshed (``refreshed``).

Where the code forces a first pass over the arms or not is followed for
LinGIRO only (below): every other policy here pulls each arm once first
(:func:`policies.choose`), which the authors' covariates LinTS-G and LinTS-IG
do not; their untried arms draw from a prior of variance 10, so they are
tried at once anyway (at most K = 10 rounds of regret). LinGIRO's untried arms
score exactly 0, which makes its start cost far more than that.

* **LinTS-G**: ``theta ~ N(theta_hat, v^2 V^-1)`` with ``v`` the ``np.std`` of
  the model's rewards: the n (not n - 1) form, 1 before any reward and **0
  after exactly one**, so with a model per arm an arm is scored greedily from
  its first reward until it is pulled again (ours keeps 1 until the second).

* **LinGIRO**: each reward adds its row and ``a`` rows ``(x, +U)`` and ``a``
  rows ``(x, -U)`` to the history, except, with one shared model, the rewards
  of the first pass over the K arms (no pseudo-rows); each decision fits ridge
  regression ``(X*'X* + lambda I)^-1 X*'y*`` (``lambda`` not scaled) on a
  with-replacement resample of all ``s`` augmented rows of each model. With a
  model per arm there is **no first pass**: an arm never pulled has no rows and
  scores 0, and ``np.argmax`` takes the first of equal scores, so the
  arms are first tried in index order, each only when every arm tried so far
  scores below 0 (``PolicyConfig.forces_pass`` is off for this variant; this
  start alone costs 67 regret at d = 5 in the covariates setting, RESULTS.md).
  The resample costs O(s d^2) per decision and a stored history, so, as their
  LinPHE, it is drawn from the normal with the exact first two moments of its
  perturbation of the normal equations at ``theta_bar = A^-1 X'y``,
  ``A = X'X + 2a X_late'X_late + lambda I``: ``theta = theta_bar + A^-1 u``,
  ``u = sum_i (w_i - 1) x_i e_i`` with multinomial counts ``w``, mean 0 and
  covariance ``sum_i e_i^2 x_i x_i' - (lambda theta_bar)(lambda theta_bar)' / s``
  over the augmented rows (:func:`giro_authors_moments`). The squared residuals
  are not pooled as ours pools them, so the state keeps sums to fourth order in
  ``x`` (``O(d^4 / 4)`` per model; simulation only). What the normal form drops
  is the resample's second order (the randomness of ``X*'X*``, of relative size
  ``d / s``) and its discreteness; a model's first rows share one context, for
  which the linear form is exact. Played literally
  (``benchmarks/giro_resample.py``), their resample gives the same regret within
  one standard error (covariates, d = 5, 1,000 rounds). The arms of a model
  per arm are drawn apart, as their loop resamples each arm's history apart.

References
----------
S. Wu, C.-H. Wang, Y. Li, G. Cheng. Residual Bootstrap Exploration for
Stochastic Linear Bandit. UAI 2022; experiment code ``Algorithms.py``
(``Linear_UCB``, ``Linear_TS_IG``, ``Linear_PHE``, ``Linear_TS_G``,
``Linear_GIRO``).
"""

from __future__ import annotations

import math

import numpy as np

from policies.config import PolicyConfig
from policies.indices import (
    INDEX,
    Index,
    Law,
    Prepared,
    Rngs,
    _factor,
    _law,
    _linucb_with,
    _stored,
    _stored_system,
    _whitened,
    draw_deterministic,
    draw_linreboot,
    draw_lints_gaussian,
    draw_perturbed_ridge,
    law_deterministic,
    law_linreboot,
    law_lints_gaussian,
    law_perturbed_ridge,
    linreboot_at,
    prepare_linreboot,
    prepare_lints_gaussian,
)
from policies.ridge import (
    Array,
    Equilibrated,
    factorise,
    predict,
    regularised,
    ridge,
    standard_gammas,
    standard_normals,
)
from policies.state import State, kept_theta


def authors_ucb_radius(config: PolicyConfig, state: State) -> Array:
    """``sqrt(lambda) max ||theta_hat|| + R sqrt(2 log(1/delta) + log det V - d log lambda)``.

    ``R`` is ``config.noise_sd`` (1 in :func:`policies.paper_config` for this
    variant), shape (B, M).
    """
    reg = config.reg
    _, log_det = np.linalg.slogdet(regularised(state["xtx"], reg))
    width = 2.0 * math.log(1.0 / config.ucb_delta) + log_det - config.dim * math.log(reg)
    return math.sqrt(reg) * state["theta_norm_max"] + config.noise_sd * np.sqrt(width)


def prepare_lints_g_authors(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """The authors' LinTS-G: ours with ``v = np.std(y)`` (1 before any reward)."""
    n, total, squares = state["n"], state["sum_dy"], state["sum_dy2"]
    mean = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
    variance = np.divide(squares - total * mean, n, out=np.ones_like(total), where=n > 0)
    prepared = prepare_lints_gaussian(config, state, contexts)
    prepared["scale"] = np.sqrt(np.maximum(variance, 0.0))[..., None]
    return prepared


def prepare_linucb_authors(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """The authors' LinUCB: ``x_k' theta_hat + radius ||x_k||_(V^-1)``."""
    return _linucb_with(authors_ucb_radius(config, state), state, contexts, config.reg)


def prepare_lints_ig_authors(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """The authors' LinTS-IG: ``sigma^2 ~ IG(alpha + n/2, beta + 1/2 X'y' mu)``.

    ``mu = (X'X + p I)^-1 X'y``; the draw is ``mu + sigma^2 colour(z)`` with a
    shared model and ``mu + sigma colour(z)`` with a model per arm.
    """
    precision = config.ig_prior_precision
    theta = ridge(state["xtx"], state["xty"], precision)
    shape = config.ig_alpha + 0.5 * state["n"]
    fit = np.einsum("bmd,bmd->bm", state["xty"], theta)
    rate = config.ig_beta + 0.5 * np.maximum(fit, 0.0)
    return {"theta": theta, **_stored("posterior", factorise(state["xtx"], precision)),
            "shape": shape, "rate": rate, "contexts": contexts}


def draw_lints_ig_authors(config: PolicyConfig, prepared: Prepared, rngs: Rngs) -> Array:
    theta = prepared["theta"]
    variance = prepared["rate"] / standard_gammas(rngs, prepared["shape"])
    scale = variance if config.shared else np.sqrt(variance)
    z = standard_normals(rngs, theta.shape[1:])
    direction = _factor(prepared, "posterior").colour(z)
    return predict(theta + scale[..., None] * direction, prepared["contexts"])


def law_lints_ig_authors(config: PolicyConfig, prepared: Prepared) -> Law:
    """A model per arm: Student t as ours. A shared model: not a normal or t law.

    ``sigma^2 z`` with ``sigma^2 = rate / G`` is a normal scaled by ``1 / G``,
    not by ``1 / sqrt(G)``, so its propensities are not computable here.

    Raises
    ------
    ValueError
        With a shared model.
    """
    if config.shared:
        raise ValueError("the authors' LinTS-IG with a shared model has no propensity here")
    whitened = _whitened(_factor(prepared, "posterior"), prepared["contexts"])
    shape = prepared["shape"]
    scale = np.sqrt(prepared["rate"] / shape)[..., None]
    mean = predict(prepared["theta"], prepared["contexts"])
    return _law(config, mean, scale * whitened, 2.0 * shape)


def phe_authors_moments(config: PolicyConfig, state: State) -> tuple[Array, Array, Array]:
    """Mean (B, M, d), scale (B, M) and matrix (B, M, d, d) of the authors' perturbation.

    ``X'z`` has mean ``U (m/n - 1) sum x`` and covariance
    ``scale^2 (2 X'X - sum x sum x' / n)`` with ``scale = U sqrt(m / n)``,
    ``m = ceil(a n)``, ``n`` every past round of the experiment.
    """
    total = np.maximum(state["n"].sum(axis=1, keepdims=True), 1.0)  # (B, 1)
    m = np.ceil(config.phe_a * total)
    bound = config.reward_bound
    sum_x = state["sum_x"]
    mean = (bound * (m / total - 1.0))[..., None] * sum_x
    matrix = 2.0 * state["xtx"] - sum_x[..., :, None] * sum_x[..., None, :] / total[..., None, None]
    scale = np.broadcast_to(bound * np.sqrt(m / total), state["n"].shape)
    return mean, scale, matrix


def giro_authors_moments(config: PolicyConfig, state: State) -> tuple[Equilibrated, Array, Array]:
    """Gram system ``A``, centre ``theta_bar`` (B, M, d) and covariance (B, M, d, d) of ``u``.

    ``A = X'X + 2a X_late'X_late + lambda I`` is the augmented history's
    (``X_late``: the rows that brought pseudo-rows), ``theta_bar = A^-1 X'y``
    (the pseudo-rewards cancel in pairs). ``u = sum_i (w_i - 1) x_i e_i`` over
    the ``s`` augmented rows, ``e_i = y_i - x_i' theta_bar``, with multinomial
    counts ``w``: covariance ``sum_i e_i^2 x_i x_i' - (lambda theta_bar)(lambda theta_bar)' / s``
    (``sum_i x_i e_i = lambda theta_bar``), where ``sum_i e_i^2 x_i x_i'`` is
    ``sum r^2 x x' + 2 a U^2 X_late'X_late - 2 sum r (x' theta_bar) x x'
    + sum_aug (x' theta_bar)^2 x x'`` (each pseudo pair's ``+U`` and ``-U`` cancel
    in the odd term).
    """
    a, bound, reg = config.giro_a, config.reward_bound, config.reg
    late_xtx = state["late_xtx"]
    gram = Equilibrated.of(state["xtx"] + 2.0 * a * late_xtx, reg)
    theta = gram.solve(state["xty"][..., None])[..., 0]
    d = config.dim
    rows, cols = np.triu_indices(d)
    # (x' theta)^2 = sum_(i <= j) c_ij theta_i theta_j x_i x_j, c_ij = 2 off the diagonal.
    pairs = theta[..., rows] * theta[..., cols] * np.where(rows == cols, 1.0, 2.0)
    fourth_upper = np.einsum("...pq,...q->...p", state["aug_x4"], pairs)
    fourth = np.empty((*theta.shape, d))
    fourth[..., rows, cols] = fourth_upper
    fourth[..., cols, rows] = fourth_upper
    third = np.einsum("...ijk,...k->...ij", state["r_x3"], theta)
    squares = state["r2_xtx"] + 2.0 * a * bound**2 * late_xtx - 2.0 * third + fourth
    rows_total = np.maximum(state["n"] + 2.0 * a * state["late_n"], 1.0)
    score = reg * theta
    covariance = squares - score[..., :, None] * score[..., None, :] / rows_total[..., None, None]
    return gram, theta, covariance


def prepare_lingiro_authors(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """The authors' LinGIRO: ``A^-1 (X'y + u)``, ``u`` normal with the resample's moments.

    Laid out as :func:`policies.indices.draw_perturbed_ridge` reads it (``root``
    the covariance of :func:`giro_authors_moments`, unit ``noise_scale``), with
    each model's count of rewards ``n``.
    """
    gram, _, covariance = giro_authors_moments(config, state)
    return {**_stored("root", factorise(covariance)), **_stored_system("gram", gram),
            "xty": state["xty"], "noise_scale": np.ones(state["n"].shape), "contexts": contexts,
            "n": state["n"]}


def draw_lingiro_authors(config: PolicyConfig, prepared: Prepared, rngs: Rngs) -> Array:
    """Scores of one draw; with a model per arm, their loop's start without a first pass.

    An arm never pulled has no rows, so its estimate is 0 and it scores 0; as
    ``np.argmax`` takes the first of equal scores, of the arms never pulled only
    the first can be chosen (the others score ``-inf`` here).
    """
    scores = draw_perturbed_ridge(config, prepared, rngs)
    if config.shared:
        return scores
    never = prepared["n"] == 0
    # (The normal form of an empty model is 0 but for the factor's floor: made exact.)
    first = np.where(never & (np.cumsum(never, axis=1) == 1), 0.0, -np.inf)
    return np.where(never, first, scores)


def law_lingiro_authors(config: PolicyConfig, prepared: Prepared) -> Law:
    """The normal law of :func:`policies.indices.law_perturbed_ridge` once every arm was pulled.

    Raises
    ------
    ValueError
        With a model per arm while an arm was never pulled (arms tied at 0 go to
        the first of them, not evenly).
    """
    if not config.shared and np.any(prepared["n"] == 0):
        raise ValueError("the authors' LinGIRO has no propensity here before every arm is pulled")
    return law_perturbed_ridge(config, prepared)


def prepare_linphe_authors(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """The authors' LinPHE: ``((1+a)(X'X + lambda I))^-1 (X'y + X'z)``, ``X'z`` as above.

    Laid out as :func:`policies.indices.draw_perturbed_ridge` reads it, so the
    draw and the law are ours: ``xty`` carries the shift, ``root`` the
    covariance's matrix and ``noise_scale`` its scale.
    """
    weight = 1.0 + config.phe_a
    mean, scale, matrix = phe_authors_moments(config, state)
    return {**_stored("root", factorise(matrix)),
            **_stored_system("gram", Equilibrated.of(weight * state["xtx"], weight * config.reg)),
            "xty": state["xty"] + mean, "noise_scale": np.array(scale), "contexts": contexts}


def prepare_linreboot_authors(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """``Linear_ReBoot_G``: ours, but with a model per arm an arm not yet refreshed has beta = 0."""
    if config.shared:
        return prepare_linreboot(config, state, contexts)
    theta = kept_theta(state, config.reg) * state["refreshed"][..., None]
    return linreboot_at(config, state, contexts, theta)


AUTHORS_INDEX: dict[str, Index] = {
    "linreboot": Index(prepare_linreboot_authors, draw_linreboot, law_linreboot),
    "lints-g": Index(prepare_lints_g_authors, draw_lints_gaussian, law_lints_gaussian, True),
    "linucb": Index(prepare_linucb_authors, draw_deterministic, law_deterministic),
    "lints-ig": Index(prepare_lints_ig_authors, draw_lints_ig_authors, law_lints_ig_authors,
                      True, student_t=True),
    "lingiro": Index(prepare_lingiro_authors, draw_lingiro_authors, law_lingiro_authors, True),
    "linphe": Index(prepare_linphe_authors, draw_perturbed_ridge, law_perturbed_ridge, True),
}


def index_of(config: PolicyConfig) -> Index:
    """The index a config runs: its policy's, or the authors' variant of it."""
    if config.variant == "authors":
        return AUTHORS_INDEX[config.name]
    return INDEX[config.name]
