"""The baselines as the paper's authors' experiment code runs them.

The paper's Figure 1 was made with the authors' ``Algorithms.py`` (public
repository ShuangWu22/LinReBoot_Experiments). Four of its five baselines differ
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

Where the code forces a first pass over the arms or not is not followed: every
policy here pulls each arm once first (:func:`policies.choose`), which the
authors' covariates LinTS-G, LinTS-IG and LinGIRO do not (at most K = 10
rounds of regret).

* **LinTS-G**: ``theta ~ N(theta_hat, v^2 V^-1)`` with ``v`` the ``np.std`` of
  the model's rewards: the n (not n - 1) form, 1 before any reward and **0
  after exactly one**, so with a model per arm an arm is scored greedily from
  its first reward until it is pulled again (ours keeps 1 until the second).

Not transcribed: LinGIRO (an explicit bootstrap of the history, which our
Gaussian limit replaces).

References
----------
S. Wu, C.-H. Wang, Y. Li, G. Cheng. Residual Bootstrap Exploration for
Stochastic Linear Bandit. UAI 2022; experiment code ``Algorithms.py``
(``Linear_UCB``, ``Linear_TS_IG``, ``Linear_PHE``).
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
    draw_lints_gaussian,
    draw_perturbed_ridge,
    law_deterministic,
    law_lints_gaussian,
    law_perturbed_ridge,
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
from policies.state import State


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


AUTHORS_INDEX: dict[str, Index] = {
    "lints-g": Index(prepare_lints_g_authors, draw_lints_gaussian, law_lints_gaussian, True),
    "linucb": Index(prepare_linucb_authors, draw_deterministic, law_deterministic),
    "lints-ig": Index(prepare_lints_ig_authors, draw_lints_ig_authors, law_lints_ig_authors,
                      True),
    "linphe": Index(prepare_linphe_authors, draw_perturbed_ridge, law_perturbed_ridge, True),
}


def index_of(config: PolicyConfig) -> Index:
    """The index a config runs: its policy's, or the authors' variant of it."""
    if config.variant == "authors":
        return AUTHORS_INDEX[config.name]
    return INDEX[config.name]
