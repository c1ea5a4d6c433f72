"""The index (score) each policy gives every arm, vectorised over experiments.

Every index is two functions: ``prepare(config, state, contexts) -> Prepared``
does everything that does not depend on randomness (ridge solves, equilibrated
systems, Cholesky factors, residual sums), and ``draw(config, prepared, rngs)
-> (B, K)`` draws the random part: for a Thompson or perturbed draw with a
shared model, one solve of the prepared system with a perturbed right-hand
side; with a model per arm, a product per model with a kept basis
(:func:`_prepared_basis`). ``contexts`` has shape ``(B, K, d)`` (in the covariates
setting every arm sees the same context), ``rngs`` one
``numpy.random.Generator`` per experiment. The simulator prepares and draws
every round; the service prepares once per state and context set and then
only draws, until a reward changes the state.

References
----------
Wu, Wang, Li, Cheng. Residual Bootstrap Exploration for Stochastic Linear
Bandit. UAI 2022: Section 3.2 (eq. 6, the index), Section 3.3 (efficient
Gaussian form), appendix "Other Linear Bandit Algorithms" (baselines).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from policies.config import PolicyConfig, PolicyName
from policies.ridge import (
    Array,
    Equilibrated,
    Factor,
    perturbed_systems,
    predict,
    quadratic,
    standard_gammas,
    standard_normals,
)
from policies.state import (
    State,
    derived,
    kept_draw_basis,
    kept_ridge_and_inverse,
    kept_theta,
    raw_reward_sums,
)

Rngs = Sequence[np.random.Generator]
Prepared = dict[str, Array]
PrepareFn = Callable[[PolicyConfig, State, Array], Prepared]
DrawFn = Callable[[PolicyConfig, Prepared, Rngs], Array]


@dataclass(frozen=True)
class Law:
    """The distribution of the scores that ``draw`` returns from a :data:`Prepared`.

    Either **independent** arms, ``score_k = mean_k + spread_k T_k`` with the
    ``T_k`` independent (``spread`` given; 0 is a point mass), or one draw
    **shared** by the arms, ``score = mean + loadings @ T`` with ``T`` in R^d
    (``loadings`` given): the indices of one shared model are correlated.
    ``T`` is standard normal, or with ``dof`` Student t (a normal divided by
    ``sqrt(chi2_dof / dof)``; shared: one divisor for the whole vector).

    Attributes
    ----------
    mean : ndarray, shape (B, K)
    spread : ndarray, shape (B, K), or None
    loadings : ndarray, shape (B, K, d), or None
    dof : ndarray, shape (B, K) (independent) or (B,) (shared), or None (normal)
    """

    mean: Array
    spread: Array | None = None
    loadings: Array | None = None
    dof: Array | None = None


LawFn = Callable[[PolicyConfig, Prepared], Law]

def _stored(name: str, factor: Factor) -> Prepared:
    """A factor as two named arrays of a :data:`Prepared` dict."""
    return {f"{name}.scale": factor.scale, f"{name}.root": factor.root}


def _factor(prepared: Prepared, name: str) -> Factor:
    return Factor(prepared[f"{name}.scale"], prepared[f"{name}.root"])


def _stored_system(name: str, system: Equilibrated) -> Prepared:
    """An equilibrated system as two named arrays (its scale is its factor's)."""
    return {f"{name}.system": system.system, f"{name}.scale": system.scale}


def _system(prepared: Prepared, name: str) -> Equilibrated:
    return Equilibrated(prepared[f"{name}.system"], prepared[f"{name}.scale"])


def per_arm(values: Array, n_arms: int) -> Array:
    """Broadcast per-model values (B, M, ...) to per-arm (B, K, ...)."""
    return np.broadcast_to(values, (values.shape[0], n_arms, *values.shape[2:]))


def residual_sum_of_squares(
    config: PolicyConfig, state: State, mu_hat: Array, theta: Array
) -> Array:
    """RSS_k of Section 3.3 from the incremental sums, shape (B, K).

    ``current`` residuals (Algorithms 1-3) use the decomposition
    ``RSS_k = sum r^2 - 2 mu_k sum r + s_k mu_k^2`` with this round's ``mu_k``,
    written about the arm's first reward ``c_k`` (``policies.state``):
    ``sum (r - c)^2 - 2 (mu_k - c) sum (r - c) + s_k (mu_k - c)^2``, whose terms
    are of the size of the rewards' spread, not of their mean.
    ``observed`` residuals use each reward's own context:
    ``RSS_k = sum r^2 - 2 theta' sum(x r) + theta' sum(x x') theta``.
    That form is rebuilt from raw sums, so it keeps the old limit: with
    rewards large against their spread (mean/sd above about 1e5) its terms
    cancel and the RSS can round to 0. (LinTS-IG's rate and LinGIRO's
    residual sum have the same form.) Shifting it too would need per-arm
    ``sum x`` and ``sum x (r - c)``: not done.
    """
    n_arms = mu_hat.shape[1]
    pulls, shift = state["pulls"], state["shift_r"]
    if config.residuals == "current" or config.setting == "stochastic":
        centre = mu_hat - shift
        rss = state["sum_dr2"] - 2.0 * centre * state["sum_dr"] + pulls * centre**2
    else:
        theta_k = per_arm(theta, n_arms)
        if config.shared:
            gram, xty = state["arm_xtx"], state["arm_xty"]
        else:
            gram, xty = state["xtx"], state["xty"]
        fitted = np.einsum("bkd,bkd->bk", theta_k, xty)
        _, squares = raw_reward_sums(pulls, shift, state["sum_dr"], state["sum_dr2"])
        rss = squares - 2.0 * fitted + quadratic(theta_k, gram)
    # Rounding can leave tiny negative values. (In place: rss is ours, and a
    # maximum into a fresh array costs twice as much.)
    return np.maximum(rss, 0.0, out=rss)


def prepare_linreboot(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """LinReBoot with Gaussian weights: ``mu_k + sigma_omega sqrt(RSS_k) / s_k * z_k``.

    The efficient form of Section 3.3: given the history the bootstrapped mean is
    ``N(mu_hat_k, sigma_omega^2 RSS_k / s_k^2)``, so one normal per arm replaces
    the inner loop over residual weights. With forgetting (``policies.state``),
    ``RSS_k`` and ``s_k`` are the discounted sums: the spread of an arm grows as
    its outcomes age (``sqrt(RSS_k) / s_k`` scales as ``1 / sqrt(weight)``), so
    an arm left alone is explored again. With ``spread="pooled"`` the scale of
    the normal is :func:`pooled_scale` instead.
    """
    if config.spread == "pooled":
        theta, leverage = ridge_and_leverage(state, contexts, config.reg)
        mu_hat = predict(theta, contexts)
        rss = residual_sum_of_squares(config, state, mu_hat, theta)
        return {"mu_hat": mu_hat, "spread": config.sigma_omega * pooled_scale(state, rss, leverage)}
    return linreboot_at(config, state, contexts, kept_theta(state, config.reg))


def linreboot_at(config: PolicyConfig, state: State, contexts: Array, theta: Array) -> Prepared:
    """The paper's LinReBoot index about the estimate ``theta``, shape (B, M, d)."""
    mu_hat = predict(theta, contexts)
    rss = residual_sum_of_squares(config, state, mu_hat, theta)
    pulls = state["pulls"]
    spread = np.sqrt(rss, out=rss)
    if np.count_nonzero(pulls > 0) == pulls.size:  # every arm pulled: the common case
        spread /= pulls
    else:  # 0 for an arm never pulled: sqrt(RSS) / inf (a divide's where= costs more)
        spread /= np.where(pulls > 0, pulls, np.inf)
    spread *= config.sigma_omega
    return {"mu_hat": mu_hat, "spread": spread}


def pooled_scale(state: State, rss: Array, leverage: Array) -> Array:
    """The spread of ``spread="pooled"`` before ``sigma_omega``, shape (B, K); never 0.

    Every arm gets one pseudo-residual of the residual variance pooled over
    the arms, ``v = (sum_k RSS_k + v_0) / (sum_k s_k + 1)``, so an arm never
    pulled (``s_k = 0``), or whose rewards so far are fitted exactly
    (``RSS_k = 0``: 0/1 rewards that were all 0), keeps a spread. Its own
    variance is then ``v_k = (RSS_k + v) / (s_k + 1)`` and the spread

        ``min( sqrt(RSS_k + v) / (s_k + 1),  sqrt(v_k x_k' V^-1 x_k) )``:

    the first is the paper's ``sqrt(RSS_k) / s_k`` with the pseudo-residual
    (one more pull), the second the model's own uncertainty about
    ``x_k' theta``. With one theta shared by many arms the second is far
    smaller than what an arm's few pulls suggest: sigma_omega then sets the
    width in units of the model's posterior sd (docs/DEFAULT.md).
    ``v_0 = (SS + 1) / (n + 1)``, with ``SS`` the rewards' sum of squares
    about their model's mean and ``n`` the rewards so far: their variance,
    with one pseudo-reward of unit deviation so that it is positive even when
    every reward so far was the same (its weight in ``v`` falls as
    ``1 / n^2``). No arm needs a first pull.
    """
    # (Its terms of the sums alone are kept with a frozen state: a request's context
    # changes the rest, policies.state.derived.)
    prior, pulls_total, pulls_next = derived(state, "pooled scale",
                                             functools.partial(_pooled_terms, state))
    pooled = (rss.sum(axis=1) + prior) / pulls_total
    own = rss + pooled[:, None]
    by_arm = np.sqrt(own) / pulls_next
    by_model = np.sqrt(own / pulls_next * leverage)
    return np.minimum(by_arm, by_model)


def _pooled_terms(state: State) -> tuple[Array, Array, Array]:
    """:func:`pooled_scale`'s terms that the statistics alone give: ``v_0``, and
    ``sum_k s_k + 1`` and ``s_k + 1``."""
    n, deviations, squares = state["n"], state["sum_dy"], state["sum_dy2"]
    within = squares - deviations**2 / np.where(n > 0, n, np.inf)  # 0 where n is 0
    prior = (np.maximum(within, 0.0).sum(axis=1) + 1.0) / (n.sum(axis=1) + 1.0)
    pulls = state["pulls"]
    return prior, pulls.sum(axis=1) + 1.0, pulls + 1.0


def draw_linreboot(config: PolicyConfig, prepared: Prepared, rngs: Rngs) -> Array:
    mu_hat = prepared["mu_hat"]
    z = standard_normals(rngs, mu_hat.shape[1:])
    if config.sigma_omega == 0.0:
        return mu_hat
    return mu_hat + prepared["spread"] * z


def law_linreboot(config: PolicyConfig, prepared: Prepared) -> Law:
    """Independent normals ``N(mu_hat_k, spread_k^2)``; greedy's spreads are all 0."""
    return Law(prepared["mu_hat"], spread=prepared["spread"])


def reward_variance(state: State) -> Array:
    """Sample variance of each model's rewards so far (1 before two rewards), (B, M).

    From the sums about the first reward, so no digit is lost to a large mean.
    """
    n, total, squares = state["n"], state["sum_dy"], state["sum_dy2"]
    # Safe denominators instead of divide's where= (several times dearer at B = 1).
    several = n > 1
    count = np.where(several, n, 2.0)
    var = np.where(several, (squares - total * (total / count)) / (count - 1.0), 1.0)
    return np.maximum(var, 0.0)


def reward_squares(state: State) -> Array:
    """``y'y`` of each model, (B, M)."""
    return raw_reward_sums(state["n"], state["shift_y"], state["sum_dy"], state["sum_dy2"])[1]


def prepare_lints_gaussian(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """LinTS-G: ``theta ~ N(theta_hat, v^2 V^-1)`` with ``V = X'X + lambda I``.

    The Gaussian prior ``N(0, v^2 / lambda I)``: with ``v^2 = 1`` its variance is
    ``1 / lambda = 10`` as in the appendix. As in the authors' code, ``v^2`` is the
    variance of the rewards seen so far (here the unbiased n-1 form; 1 before
    two rewards).
    """
    scale = np.sqrt(reward_variance(state))[..., None]
    common = {"xty": state["xty"], "scale": scale, "contexts": contexts}
    if not config.shared:
        return {**common, **_prepared_basis(state, 1.0, config.reg, False)}
    system = Equilibrated.of(state["xtx"], config.reg)  # solve and factor
    return {**_stored_system("posterior", system), "posterior.root": system.factor().root,
            **common}


def draw_lints_gaussian(config: PolicyConfig, prepared: Prepared, rngs: Rngs) -> Array:
    """``theta = V^-1 (X'y + v L z)`` with ``L L' = V``: ``theta_hat + v V^-1 L z``.

    ``V^-1 L z ~ N(0, V^-1)``, so this is the posterior draw in one solve (a
    shared model), or ``theta_hat + v W z`` with the kept ``W = V^-1 L`` (a
    model per arm: :func:`_prepared_basis`).
    """
    xty = prepared["xty"]
    z = standard_normals(rngs, xty.shape[1:])
    if "basis.lift" in prepared:  # models per arm: theta_hat + v W z (_prepared_basis)
        theta, direction = _from_basis(prepared, z)
        return predict(theta + prepared["scale"] * direction, prepared["contexts"])
    noise = prepared["scale"] * _factor(prepared, "posterior").times_root(z)
    theta = _system(prepared, "posterior").solve((xty + noise)[..., None])[..., 0]
    return predict(theta, prepared["contexts"])


def _prepared_basis(state: State, weight: float, reg: float, bare_root: bool) -> Prepared:
    """What a sampler with a model per arm prepares: the kept ``theta_hat`` and ``W`` of
    :func:`policies.state.kept_draw_basis`, with which its draw
    ``G^-1 (X'y + c S^-1 R z)`` is ``theta_hat + c W z``, a product per model: a reward
    changes one model, yet every draw uses all K. A shared model changes with every
    reward; its draw solves with the perturbed right-hand side instead (one solve)."""
    theta, lift = kept_draw_basis(state, weight, reg, bare_root)
    return {"basis.theta": theta, "basis.lift": lift}


def _from_basis(prepared: Prepared, z: Array) -> tuple[Array, Array]:
    """``theta_hat`` and the direction ``W z`` of a draw from :func:`_prepared_basis`'s basis."""
    return prepared["basis.theta"], np.matmul(prepared["basis.lift"], z[..., None])[..., 0]


def _basis_law(config: PolicyConfig, prepared: Prepared, theta: Array, scale: Array,
               dof: Array | None = None) -> Law:
    """The law of ``x_k' (theta + scale W z)`` (a model per arm): loadings ``scale W' x_k``."""
    contexts = prepared["contexts"]
    loadings = np.einsum("bkij,bki->bkj", prepared["basis.lift"], contexts)
    return _law(config, predict(theta, contexts), scale * loadings, dof)


def _whitened(factor: Factor, contexts: Array) -> Array:
    """``R^-1 S x_k`` for every arm, shape (B, K, d): ``x_k' colour(z)`` is its dot with z.

    ``colour(z) = S R'^-1 z``, so ``x' S R'^-1 z = (R^-1 S x)' z``. One solve
    with K right-hand sides when the model is shared.
    """
    scaled = factor.scale * contexts
    if factor.root.shape[1] == 1:
        return np.swapaxes(np.linalg.solve(factor.root[:, 0], np.swapaxes(scaled, 1, 2)), 1, 2)
    return np.linalg.solve(factor.root, scaled[..., None])[..., 0]


def _inverse_times(factor: Factor, contexts: Array) -> Array:
    """``A^-1 x_k = S R'^-1 (R^-1 S x_k)`` for every arm, shape (B, K, d)."""
    whitened = _whitened(factor, contexts)
    upper = np.swapaxes(factor.root, -1, -2)
    if upper.shape[1] == 1:
        lifted = np.swapaxes(np.linalg.solve(upper[:, 0], np.swapaxes(whitened, 1, 2)), 1, 2)
    else:
        lifted = np.linalg.solve(upper, whitened[..., None])[..., 0]
    return factor.scale * lifted


def _law(config: PolicyConfig, mean: Array, loadings: Array, dof: Array | None = None) -> Law:
    """Shared model: the loadings; a model per arm: independent arms (the loadings' norms)."""
    if config.shared:
        return Law(mean, loadings=loadings, dof=None if dof is None else dof[:, 0])
    return Law(mean, spread=np.linalg.norm(loadings, axis=-1), dof=dof)


def law_lints_gaussian(config: PolicyConfig, prepared: Prepared) -> Law:
    """``x_k' theta_hat + scale x_k' S R'^-1 z``: normal, loadings ``scale R^-1 S x_k``."""
    if "basis.lift" in prepared:  # W = S R'^-1 (kept_draw_basis), so W' x = R^-1 S x
        return _basis_law(config, prepared, prepared["basis.theta"], prepared["scale"])
    whitened = _whitened(_factor(prepared, "posterior"), prepared["contexts"])
    theta = _system(prepared, "posterior").solve(prepared["xty"][..., None])[..., 0]
    mean = predict(theta, prepared["contexts"])
    return _law(config, mean, prepared["scale"] * whitened)


def prepare_lints_inverse_gamma(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """LinTS-IG: normal-inverse-gamma posterior (Riquelme et al. 2018).

    Prior ``sigma^2 ~ IG(alpha, beta)``, ``theta | sigma^2 ~ N(0, sigma^2 / p I)``
    with ``alpha = beta = 2`` (prior mean of sigma^2 is 2) and ``p = 0.2``, so the
    prior variance of theta is ``2 / 0.2 = 10 = 1 / lambda`` as in the appendix.
    With a shared model the posterior mean and its rate are left to the draw,
    which solves for the mean and the direction together
    (:func:`draw_lints_inverse_gamma`); with a model per arm both come from the
    kept basis (:func:`_prepared_basis`) here.
    """
    precision = config.ig_prior_precision
    common = {"xty": state["xty"], "shape": config.ig_alpha + 0.5 * state["n"],
              "squares": reward_squares(state), "contexts": contexts}
    if not config.shared:  # the rate depends on theta_hat only: once per state
        prepared = {**common, **_prepared_basis(state, 1.0, precision, False)}
        prepared["rate"] = _inverse_gamma_rate(config, prepared, prepared["basis.theta"])
        return prepared
    system = Equilibrated.of(state["xtx"], precision)  # solve and factor
    return {**_stored_system("posterior", system), "posterior.root": system.factor().root,
            **common}


def _inverse_gamma_rate(config: PolicyConfig, prepared: Prepared, theta: Array) -> Array:
    """``beta + (y'y - mu' V mu) / 2``, with ``mu' V mu = mu' X'y`` as ``V mu = X'y``."""
    fit = np.vecdot(theta, prepared["xty"])
    return config.ig_beta + 0.5 * np.maximum(prepared["squares"] - fit, 0.0)


def draw_lints_inverse_gamma(config: PolicyConfig, prepared: Prepared, rngs: Rngs) -> Array:
    """``mu + sigma V^-1 S^-1 R z`` (``S^-1 R z ~ N(0, V)``, so the second term is
    ``N(0, sigma^2 V^-1)``), with ``mu`` and the direction from one solve (a shared
    model) or the kept basis (a model per arm)."""
    xty, shape = prepared["xty"], prepared["shape"]
    gammas = standard_gammas(rngs, shape)
    z = standard_normals(rngs, xty.shape[1:])
    if "basis.lift" in prepared:  # models per arm (_prepared_basis)
        theta, direction = _from_basis(prepared, z)
        rate = prepared["rate"]
    else:
        lifted = _factor(prepared, "posterior").times_root(z)
        solved = _system(prepared, "posterior").solve(np.stack([xty, lifted], axis=-1))
        theta, direction = solved[..., 0], solved[..., 1]
        rate = _inverse_gamma_rate(config, prepared, theta)
    sigma = np.sqrt(rate / gammas)[..., None]
    return predict(theta + sigma * direction, prepared["contexts"])


def law_lints_inverse_gamma(config: PolicyConfig, prepared: Prepared) -> Law:
    """Student t with ``2 shape`` degrees of freedom, loadings ``sqrt(rate / shape) R^-1 S x_k``.

    ``sigma = sqrt(rate / G)`` with ``G ~ Gamma(shape)``, so ``sigma z`` is
    ``sqrt(rate / shape)`` times ``z / sqrt(chi2_(2 shape) / (2 shape))``.
    """
    shape = prepared["shape"]
    if "basis.lift" in prepared:
        scale = np.sqrt(prepared["rate"] / shape)[..., None]
        return _basis_law(config, prepared, prepared["basis.theta"], scale, 2.0 * shape)
    whitened = _whitened(_factor(prepared, "posterior"), prepared["contexts"])
    theta = _system(prepared, "posterior").solve(prepared["xty"][..., None])[..., 0]
    scale = np.sqrt(_inverse_gamma_rate(config, prepared, theta) / shape)[..., None]
    mean = predict(theta, prepared["contexts"])
    return _law(config, mean, scale * whitened, 2.0 * shape)


def _prepare_perturbed_ridge(
    config: PolicyConfig, state: State, weight: float, contexts: Array, **scale: Array
) -> Prepared:
    """The fixed parts of ``(w X'X + reg I)^-1 (X'y + s X' xi)`` with ``X' xi ~ N(0, X'X)``.

    The common core of LinPHE and LinGIRO: both perturb the history, and for
    many past rounds the perturbation ``X' xi`` of the normal equations is
    Gaussian with covariance proportional to ``X'X`` (central limit theorem).
    ``G = w X'X + reg I``; ``scale`` holds ``s`` itself
    (``noise_scale``, LinPHE) or what :func:`_noise_scale` makes it of (LinGIRO).
    A model per arm keeps its draw basis (:func:`_prepared_basis`), a shared model
    ``G`` equilibrated and the root of ``X'X`` in G's scaling
    (``policies.ridge.perturbed_systems``).
    """
    common = {"xty": state["xty"], "contexts": contexts, **scale}
    if not config.shared:
        prepared = {**common, **_prepared_basis(state, weight, config.reg, True)}
        # LinGIRO's s depends on theta_bar only: once per state, not per draw.
        prepared["noise_scale"] = _noise_scale(config, prepared, prepared["basis.theta"])
        return prepared
    gram, bare = perturbed_systems(state["xtx"], weight, config.reg)
    return {**_stored("root", bare.factor()), **_stored_system("gram", gram), **common}


def _noise_scale(config: PolicyConfig, prepared: Prepared, theta_bar: Array) -> Array:
    """``s`` of the perturbed ridge, (B, M): LinPHE's fixed one, or LinGIRO's from ``theta_bar``.

    LinGIRO's is the root mean square residual of the augmented rows,
    ``c = 2 a U^2 + (RSS(theta_bar) + 2 a theta_bar' X'X theta_bar) / n``.
    """
    if "noise_scale" in prepared:
        return prepared["noise_scale"]
    fit = quadratic(theta_bar, prepared["giro.xtx"])
    cross = np.vecdot(theta_bar, prepared["xty"])
    rss = np.maximum(prepared["giro.squares"] - 2.0 * cross + fit, 0.0)
    a, bound = config.giro_a, config.reward_bound
    return np.sqrt(2.0 * a * bound**2 + (rss + 2.0 * a * fit) / prepared["giro.n"])


def draw_perturbed_ridge(config: PolicyConfig, prepared: Prepared, rngs: Rngs) -> Array:
    """Scores ``x_k' theta`` for one perturbed ridge estimate ``theta``, shape (B, K).

    ``theta = G^-1 (X'y + s S^-1 R z)``: one solve with a shared model. When ``s``
    depends on ``theta_bar = G^-1 X'y`` (LinGIRO), the solve takes both right-hand
    sides, ``theta_bar + s G^-1 S^-1 R z``: still one factorisation per draw. With a
    model per arm, ``theta_bar + s W z`` from the kept basis (:func:`_prepared_basis`).
    """
    xty = prepared["xty"]
    z = standard_normals(rngs, xty.shape[1:])
    if "basis.lift" in prepared:  # models per arm: theta_bar + s W z (_prepared_basis)
        theta_bar, direction = _from_basis(prepared, z)
    else:
        lifted = _factor(prepared, "root").times_root(z)
        gram = _system(prepared, "gram")
        if "noise_scale" in prepared:
            theta = gram.solve((xty + prepared["noise_scale"][..., None] * lifted)[..., None])
            return predict(theta[..., 0], prepared["contexts"])
        solved = gram.solve(np.stack([xty, lifted], axis=-1))
        theta_bar, direction = solved[..., 0], solved[..., 1]
    theta = theta_bar + _noise_scale(config, prepared, theta_bar)[..., None] * direction
    return predict(theta, prepared["contexts"])


def law_perturbed_ridge(config: PolicyConfig, prepared: Prepared) -> Law:
    """``x_k' G^-1 (X'y + c S^-1 R z)``: normal, loadings ``c R' S^-1 G^-1 x_k``.

    ``G`` is the Gram factor, ``S^-1 R`` the root of ``X'X`` (``times_root``).
    """
    if "basis.lift" in prepared:  # W = G^-1 S^-1 R, so W' x = R' S^-1 G^-1 x
        theta_bar = prepared["basis.theta"]
        scale = _noise_scale(config, prepared, theta_bar)[..., None]
        return _basis_law(config, prepared, theta_bar, scale)
    system, root = _system(prepared, "gram"), _factor(prepared, "root")
    gram = system.factor()
    contexts = prepared["contexts"]
    theta_bar = system.solve(prepared["xty"][..., None])[..., 0]
    mean = predict(theta_bar, contexts)
    weighted = _inverse_times(gram, contexts) / root.scale
    if config.shared:
        loadings = np.matmul(weighted, root.root[:, 0])
    else:
        loadings = np.einsum("bki,bkij->bkj", weighted, root.root)
    return _law(config, mean, _noise_scale(config, prepared, theta_bar)[..., None] * loadings)


def prepare_linphe(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """LinPHE (Kveton et al. 2019b) with ``a`` pseudo-rewards per past round.

    Pseudo-rewards are ``-U`` or ``+U`` with probability 1/2 (U = reward bound),
    so with ``(1 + a) X'X + lambda I`` as Gram matrix the perturbed estimate is
    ``((1+a) X'X + lambda I)^-1 (X'y + sum_i x_i z_i)`` where ``z_i`` sums round
    ``i``'s pseudo-rewards: mean 0 and variance ``a U^2``. Drawing the pseudo-
    rewards round by round costs O(t) per decision (and a stored history), so
    ``sum_i x_i z_i`` is drawn from its Gaussian limit ``N(0, a U^2 X'X)``.

    The authors' code spreads ``Binomial(ceil(a (t-1)), 1/2)`` successes over the
    past rounds and gives round ``i`` the pseudo-reward ``-U + 2 U S_i``: that
    perturbation has mean ``U (ceil(a n)/n - 1) sum_i x_i``, a pessimistic shift
    that Kveton et al.'s zero-mean perturbation does not have; we follow Kveton
    et al. (README, "Deviations from the authors' code").
    """
    scale = np.full(state["n"].shape, math.sqrt(config.phe_a) * config.reward_bound)
    weight = 1.0 + config.phe_a
    return _prepare_perturbed_ridge(config, state, weight, contexts, noise_scale=scale)


def prepare_lingiro(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """LinGIRO (Kveton et al. 2019a): bootstrap of the history plus pseudo-rewards.

    Each past round adds ``a`` pseudo-rounds at the upper bound ``+U`` and ``a``
    at the lower bound ``-U`` with the same context; GIRO fits ridge regression
    on a with-replacement resample of the whole augmented history. The resample's
    estimate is, to first order, ``N(theta_bar, c A^-1 X'X A^-1)`` with
    ``A = (1 + 2a) X'X + lambda I``, ``theta_bar = A^-1 X'y`` and ``c`` the mean
    squared residual of the augmented rows:
    ``c = 2 a U^2 + (RSS(theta_bar) + 2 a theta_bar' X'X theta_bar) / n``.
    Drawing from that limit keeps the cost per round independent of ``t``.
    """
    giro = {"giro.xtx": state["xtx"], "giro.squares": reward_squares(state),
            "giro.n": np.maximum(state["n"], 1.0)}
    weight = 1.0 + 2.0 * config.giro_a  # theta_bar's and the draws' Gram
    return _prepare_perturbed_ridge(config, state, weight, contexts, **giro)


def ucb_radius(config: PolicyConfig, n_obs: Array) -> Array:
    """Confidence radius ``sqrt(beta_t)`` of Abbasi-Yadkori et al. (2011), Theorem 2.

    ``R sqrt(2 log(1/delta) + d log(1 + n L^2 / (lambda d))) + sqrt(lambda) S``.
    """
    d, reg = config.dim, config.reg
    log_det = d * np.log1p(n_obs * config.context_bound**2 / (reg * d))
    return config.noise_sd * np.sqrt(2.0 * math.log(1.0 / config.ucb_delta) + log_det) + math.sqrt(
        reg
    ) * config.theta_bound


def ridge_and_leverage(state: State, contexts: Array, reg: float) -> tuple[Array, Array]:
    """``theta_hat`` per model (B, M, d) and ``x_k' V^-1 x_k`` per arm (B, K).

    Both from one floored solve of ``[X'y, I]`` per model
    (:func:`policies.state.kept_ridge_and_inverse`: kept with a model per arm,
    whose models a reward changes one at a time): the K leverages are then
    products with ``V^-1``, d + 1 right-hand sides instead of K + 1 for a
    shared model, and K matrix-vector products instead of K solves for a model
    per arm.
    """
    theta, inverse = kept_ridge_and_inverse(state, reg)
    if inverse.shape[1] == 1:  # one model: (V^-1 x_k)' for every arm in one product
        lifted = np.matmul(contexts, np.swapaxes(inverse[:, 0], -1, -2))
    else:  # a model per arm, each with its arm's context
        lifted = np.matmul(inverse, contexts[..., None])[..., 0]
    return theta, np.maximum(np.vecdot(lifted, contexts), 0.0)


def _linucb_with(radius: Array, state: State, contexts: Array, reg: float) -> Prepared:
    """Scores ``x_k' theta_hat + radius ||x_k||_(A^-1)``, from one solve for both terms."""
    theta, squares = ridge_and_leverage(state, contexts, reg)
    width = np.sqrt(squares)
    # radius is (B, M): it broadcasts against (B, K) whether M is 1 or K
    return {"scores": predict(theta, contexts) + radius * width}


def prepare_linucb(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """LinUCB / OFUL with the theoretical radius at confidence ``1 - delta``."""
    return _linucb_with(ucb_radius(config, state["n"]), state, contexts, config.reg)


def prepare_linucb_constant(config: PolicyConfig, state: State, contexts: Array) -> Prepared:
    """LinUCB with a constant width ``alpha`` (Li et al. 2010), as most libraries ship it."""
    radius = np.full(state["n"].shape, config.ucb_alpha)
    return _linucb_with(radius, state, contexts, config.reg)


def draw_deterministic(config: PolicyConfig, prepared: Prepared, rngs: Rngs) -> Array:
    """An index without randomness: the prepared scores."""
    return prepared["scores"]


def law_deterministic(config: PolicyConfig, prepared: Prepared) -> Law:
    """Point masses at the prepared scores."""
    scores = prepared["scores"]
    return Law(scores, spread=np.zeros_like(scores))


@dataclass(frozen=True)
class Index:
    """A policy's index in two steps: :attr:`prepare` once per state, :attr:`draw` per decision;
    :attr:`law` is the distribution of what :attr:`draw` returns (for propensities);
    :attr:`one_draw` says that a shared model's draw moves every arm's score at once
    (correlated scores: their propensity is estimated, not integrated);
    :attr:`student_t` that :attr:`law` has degrees of freedom (Student t scores)."""

    prepare: PrepareFn
    draw: DrawFn
    law: LawFn
    one_draw: bool = False
    student_t: bool = False

    def __call__(
        self, config: PolicyConfig, state: State, contexts: Array, rngs: Rngs
    ) -> Array:
        """Both steps: the scores of one decision per experiment, shape (B, K)."""
        return self.draw(config, self.prepare(config, state, contexts), rngs)


INDEX: dict[PolicyName, Index] = {
    "linreboot": Index(prepare_linreboot, draw_linreboot, law_linreboot),
    "greedy": Index(prepare_linreboot, draw_linreboot, law_linreboot),
    "lints-g": Index(prepare_lints_gaussian, draw_lints_gaussian, law_lints_gaussian, True),
    "lints-ig": Index(prepare_lints_inverse_gamma, draw_lints_inverse_gamma,
                      law_lints_inverse_gamma, True, student_t=True),
    "linphe": Index(prepare_linphe, draw_perturbed_ridge, law_perturbed_ridge, True),
    "lingiro": Index(prepare_lingiro, draw_perturbed_ridge, law_perturbed_ridge, True),
    "linucb": Index(prepare_linucb, draw_deterministic, law_deterministic),
    "linucb-const": Index(prepare_linucb_constant, draw_deterministic, law_deterministic),
}
