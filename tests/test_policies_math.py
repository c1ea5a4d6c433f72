"""Closed forms and equivalences behind the policies' sufficient statistics.

* Ridge regression and the factor's solves equal ``np.linalg.solve`` of the floored system.
* The state built by ``update`` equals sums computed directly from a history.
* The incremental RSS of Section 3.3 equals the sum of squared residuals.
* The efficient Gaussian LinReBoot index has the distribution of the explicit
  residual bootstrap of Algorithm 1 with Gaussian weights; with Rademacher
  weights only its mean and variance (the law is discrete).

Floating-point tolerances: every matrix here is well conditioned (condition
number below ~1e3 by construction), so a backward-stable solve is accurate to
about ``cond * d * eps ~ 1e-12`` relative; ``RTOL = 1e-9`` leaves a wide margin
while still catching any algebraic slip (which would be O(1)).
"""

from __future__ import annotations

import copy
import functools
import math
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from policies import PolicyConfig, State, init_state, layout, paper_config, prepare, update
from policies.config import PolicyName, Residuals, Setting
from policies.explicit import (
    Weights,
    explicit_bootstrap_index,
    explicit_bootstrap_index_from_residuals,
)
from policies.indices import INDEX, residual_sum_of_squares
from policies.ridge import JITTER, factorise, perturbed_systems, predict, ridge, solve

Array = NDArray[Any]  # float64 throughout; Any because numpy stubs widen linalg results
RTOL = 1e-9
ATOL = 1e-11


# --------------------------------------------------------------------------- histories


@dataclass(frozen=True)
class History:
    """One experiment's raw history and the contexts of the round being scored."""

    arms: NDArray[np.int64]  # (T,)
    x: Array  # (T, d) context each reward was observed with
    rewards: Array  # (T,)
    current: Array  # (K, d) this round's context of every arm


def make_history(setting: Setting, n_arms: int, dim: int, rounds: int, seed: int) -> History:
    """A random history: every arm once, then arms uniformly at random.

    Stochastic: fixed unit-norm arm features. Contextual: each arm's context
    jitters around a fixed unit-norm centre every round. Covariates: one
    ``N(0, I / d)`` context per round shared by all arms, a parameter per arm.
    Parameters have unit norm, as in the paper, so mean rewards lie in about
    [-1, 1]; rewards add Gaussian noise of sd 0.3, so residuals never vanish.
    """
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.0, 1.0, (n_arms, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    theta = rng.normal(size=(n_arms, dim))  # row k: arm k's parameter (covariates)
    theta /= np.linalg.norm(theta, axis=1, keepdims=True)
    arms = np.concatenate([np.arange(n_arms), rng.integers(n_arms, size=rounds - n_arms)])

    def contexts() -> Array:
        if setting == "stochastic":
            return centres.copy()
        if setting == "contextual":
            return centres + 0.3 * rng.normal(size=(n_arms, dim))
        return np.tile(rng.normal(size=dim) / np.sqrt(dim), (n_arms, 1))

    xs, rewards = [], []
    for arm in arms:
        x = contexts()[arm]
        slope = theta[0] if setting != "covariates" else theta[arm]
        xs.append(x)
        rewards.append(float(x @ slope + 0.3 * rng.normal()))
    return History(arms.astype(np.int64), np.array(xs), np.array(rewards), contexts())


def build_state(config: PolicyConfig, histories: list[History], n_arms: int) -> State:
    """Batch the histories (equal lengths) through the public ``update``."""
    state = init_state(config, n_arms, batch=len(histories))
    for t in range(histories[0].arms.shape[0]):
        update(
            config,
            state,
            np.array([h.arms[t] for h in histories]),
            np.stack([h.x[t] for h in histories]),
            np.array([h.rewards[t] for h in histories]),
        )
    return state


def model_rows(history: History, shared: bool, model: int) -> NDArray[np.bool_]:
    """Rounds whose observation belongs to ``model`` (all of them for a shared theta)."""
    return np.ones_like(history.arms, dtype=bool) if shared else history.arms == model


def direct_theta(history: History, shared: bool, model: int, reg: float) -> Array:
    rows = model_rows(history, shared, model)
    x, y = history.x[rows], history.rewards[rows]
    return np.linalg.solve(x.T @ x + reg * np.eye(x.shape[1]), x.T @ y)


def config_for(setting: Setting, residuals: Residuals = "current", dim: int = 3) -> PolicyConfig:
    return PolicyConfig(
        name="linreboot", setting=setting, dim=dim, sigma_omega=0.7, residuals=residuals
    )


# --------------------------------------------------------------------------- ridge


def floored(gram: Array) -> Array:
    """``gram + JITTER diag(gram)``: the system every solve in policies.ridge works on."""
    diagonal = np.diagonal(gram, axis1=-2, axis2=-1)
    return gram + JITTER * diagonal[..., None] * np.eye(gram.shape[-1])


@pytest.mark.parametrize("setting", ["stochastic", "contextual", "covariates"])
def test_ridge_equals_normal_equations_from_raw_history(setting: Setting) -> None:
    n_arms, dim, reg = 4, 3, 0.1
    config = config_for(setting)
    histories = [make_history(setting, n_arms, dim, 40, seed) for seed in (1, 2, 3)]
    state = build_state(config, histories, n_arms)
    theta = ridge(state["xtx"], state["xty"], reg)
    factor = factorise(state["xtx"], reg)
    n_models = 1 if config.shared else n_arms
    assert theta.shape == (3, n_models, dim)
    for b, history in enumerate(histories):
        for m in range(n_models):
            rows = model_rows(history, config.shared, m)
            x, y = history.x[rows], history.rewards[rows]
            gram = x.T @ x + reg * np.eye(dim)
            exact = np.linalg.solve(gram, x.T @ y)
            np.testing.assert_allclose(theta[b, m], np.linalg.solve(floored(gram), x.T @ y),
                                       rtol=RTOL)
            # The floor moves the estimate by about JITTER * cond(S A S) <= 1e-7 here.
            np.testing.assert_allclose(theta[b, m], exact, rtol=1e3 * JITTER)
            root = factor.root[b, m] / factor.scale[b, m][:, None]
            np.testing.assert_allclose(root @ root.T, floored(gram), rtol=RTOL, atol=ATOL)


def spd_stack(stack: tuple[int, ...], dim: int, seed: int) -> Array:
    """Well-conditioned SPD matrices ``A = G G' / d + I`` with rows of different scales."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(*stack, dim, dim)) * np.logspace(-3, 3, dim)[:, None]
    return np.asarray(g @ np.swapaxes(g, -1, -2) / dim + np.eye(dim))


@pytest.mark.parametrize("stack", [1, 7, 60])
def test_factor_solves_draws_and_roots_match_dense_algebra(stack: int) -> None:
    dim = 4
    a = spd_stack((stack,), dim, seed=3 + stack)
    factor = factorise(a)
    rhs = np.random.default_rng(5).normal(size=(stack, dim))
    np.testing.assert_allclose(factor.solve(rhs), np.linalg.solve(floored(a), rhs[..., None])[
        ..., 0], rtol=RTOL, atol=ATOL)
    # S R'^-1 z has covariance A^-1: A^-1 = (colour I)(colour I)'.
    eye = np.broadcast_to(np.eye(dim), (stack, dim, dim))
    columns = np.stack([factor.colour(eye[..., j]) for j in range(dim)], axis=-1)
    np.testing.assert_allclose(columns @ np.swapaxes(columns, -1, -2),
                               np.linalg.inv(floored(a)), rtol=1e-7, atol=ATOL)
    rows = np.stack([factor.times_root(eye[..., j]) for j in range(dim)], axis=-1)
    np.testing.assert_allclose(rows @ np.swapaxes(rows, -1, -2), floored(a), rtol=RTOL)


def _drawn_from_histories(config: PolicyConfig, setting: Setting) -> tuple[State, Array, Array]:
    """Two experiments' statistics, this round's contexts and one draw (generators 7, 8)."""
    histories = [make_history(setting, 3, 4, 40, seed) for seed in (1, 2)]
    state = build_state(config, histories, 3)
    contexts = np.stack([h.current for h in histories])
    index = INDEX[config.name]
    scores = index.draw(config, index.prepare(config, state, contexts),
                        [np.random.default_rng(s) for s in (7, 8)])
    return state, contexts, scores


@pytest.mark.parametrize("name", ["lints-g", "linphe", "lingiro"])
@pytest.mark.parametrize("setting", ["stochastic", "covariates"])
def test_one_solve_draws_equal_the_mean_plus_coloured_noise(name: str, setting: Setting) -> None:
    """A draw ``V^-1 (X'y + c L z)`` (one solve) is ``theta_hat + c V^-1 L z`` with the same z.

    LinTS-G: ``V^-1 L z = S R'^-1 z`` (the factor's ``colour``); LinPHE and
    LinGIRO: ``G^-1 (X'y + c S^-1 R z)`` through the factors of G and X'X.
    """
    from policies.indices import reward_variance

    config = PolicyConfig(name=name, setting=setting, dim=4)  # type: ignore[arg-type]
    state, contexts, scores = _drawn_from_histories(config, setting)
    z = np.stack([np.random.default_rng(s).standard_normal(state["xty"].shape[1:])
                  for s in (7, 8)])
    xtx, xty = state["xtx"], state["xty"]
    if name == "lints-g":
        spread = np.sqrt(reward_variance(state))[..., None]
        theta: Array = ridge(xtx, xty, config.reg) + spread * factorise(xtx, config.reg).colour(z)
    else:
        weight = 1.0 + (config.phe_a if name == "linphe" else 2.0 * config.giro_a)
        # The root of X'X in G's scaling (floored by JITTER of G's diagonal)
        noise: Array = perturbed_systems(xtx, weight, config.reg)[1].factor().times_root(z)
        if name == "linphe":
            noise *= np.sqrt(config.phe_a) * config.reward_bound
        else:  # c from theta_bar = G^-1 X'y, as the docstring of prepare_lingiro has it
            from policies.indices import reward_squares

            theta_bar = ridge(weight * xtx, xty, config.reg)
            fit = np.einsum("bmi,bmij,bmj->bm", theta_bar, xtx, theta_bar)
            rss = reward_squares(state) - 2.0 * np.einsum("bmd,bmd->bm", theta_bar, xty) + fit
            a, bound = config.giro_a, config.reward_bound
            c = 2.0 * a * bound**2 + (np.maximum(rss, 0.0) + 2.0 * a * fit) / np.maximum(
                state["n"], 1.0)
            noise *= np.sqrt(c)[..., None]
        theta = factorise(weight * xtx, config.reg).solve(xty + noise)
    np.testing.assert_allclose(scores, predict(theta, contexts), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("setting", ["stochastic", "covariates"])
def test_lints_ig_draws_the_textbook_posterior_from_one_solve(setting: Setting) -> None:
    """The draw solves for the mean and the direction together; it must equal
    ``theta_hat + sqrt(rate / G) colour(z)`` with the textbook rate
    ``beta + (y'y - theta_hat' V theta_hat) / 2``, the same G and z."""
    from policies.indices import reward_squares

    config = PolicyConfig(name="lints-ig", setting=setting, dim=4)
    state, contexts, scores = _drawn_from_histories(config, setting)
    xtx, xty, p = state["xtx"], state["xty"], config.ig_prior_precision
    shape = config.ig_alpha + 0.5 * state["n"]
    generators = [np.random.default_rng(s) for s in (7, 8)]
    gammas = np.stack([g.standard_gamma(k) for g, k in zip(generators, shape, strict=True)])
    z = np.stack([g.standard_normal(xty.shape[1:]) for g in generators])
    theta_hat = ridge(xtx, xty, p)
    fit = np.einsum("bmi,bmij,bmj->bm", theta_hat, xtx + p * np.eye(4), theta_hat)
    rate = config.ig_beta + 0.5 * np.maximum(reward_squares(state) - fit, 0.0)
    theta = theta_hat + np.sqrt(rate / gammas)[..., None] * factorise(xtx, p).colour(z)
    np.testing.assert_allclose(scores, predict(theta, contexts), rtol=RTOL, atol=ATOL)


def test_scalar_gamma_draws_equal_the_one_element_array_draws() -> None:
    """The shared model's Gamma draws take a float (faster); the values must not change."""
    from policies.ridge import standard_gammas

    shapes = np.random.default_rng(3).uniform(2.0, 600.0, (5, 1))
    fast = standard_gammas([np.random.default_rng(s) for s in range(5)], shapes)
    generators = [np.random.default_rng(s) for s in range(5)]
    slow = np.stack([g.standard_gamma(s) for g, s in zip(generators, shapes, strict=True)])
    np.testing.assert_array_equal(fast, slow)
    assert fast.shape == shapes.shape


@pytest.mark.parametrize("n_models", [1, 3])
@pytest.mark.parametrize("batch", [2, 50])
def test_solve_with_many_right_hand_sides_and_predict_match_direct(
    n_models: int, batch: int
) -> None:
    dim, n_arms = 3, 3
    a = spd_stack((batch, n_models), dim, seed=21)
    rng = np.random.default_rng(22)
    contexts = rng.normal(size=(batch, n_arms, dim))
    theta = rng.normal(size=(batch, n_models, dim))
    rhs = rng.normal(size=(batch, n_models, dim, 4))
    solved, means = solve(a, 0.0, rhs), predict(theta, contexts)
    for b in range(batch):
        for m in range(n_models):
            np.testing.assert_allclose(solved[b, m], np.linalg.solve(floored(a[b, m]), rhs[b, m]),
                                       rtol=RTOL, atol=ATOL)
        for k in range(n_arms):
            m = 0 if n_models == 1 else k
            assert means[b, k] == pytest.approx(contexts[b, k] @ theta[b, m], rel=RTOL, abs=ATOL)


# --------------------------------------------------------------------------- state


STATE_CASES: list[tuple[Setting, Residuals]] = [
    ("stochastic", "current"),
    ("contextual", "current"),
    ("contextual", "observed"),
    ("covariates", "current"),
    ("covariates", "observed"),
]


@pytest.mark.parametrize(("setting", "residuals"), STATE_CASES)
def test_update_equals_sums_over_the_history(setting: Setting, residuals: Residuals) -> None:
    n_arms, dim = 4, 3
    config = config_for(setting, residuals)
    histories = [make_history(setting, n_arms, dim, 30, seed) for seed in (4, 5)]
    state = build_state(config, histories, n_arms)
    has_arm_gram = setting == "contextual" and residuals == "observed"
    assert ("arm_xtx" in state) == has_arm_gram
    n_models = 1 if config.shared else n_arms
    for b, h in enumerate(histories):
        for m in range(n_models):
            rows = model_rows(h, config.shared, m)
            x, y = h.x[rows], h.rewards[rows]
            np.testing.assert_allclose(state["xtx"][b, m], x.T @ x, rtol=RTOL)
            np.testing.assert_allclose(state["xty"][b, m], x.T @ y, rtol=RTOL)
            assert state["n"][b, m] == rows.sum()
            assert_shifted(state, ("shift_y", "sum_dy", "sum_dy2"), (b, m), y)
        for k in range(n_arms):
            rows = h.arms == k
            r = h.rewards[rows]
            assert state["pulls"][b, k] == rows.sum()
            assert_shifted(state, ("shift_r", "sum_dr", "sum_dr2"), (b, k), r)
            if has_arm_gram:
                x = h.x[rows]
                np.testing.assert_allclose(state["arm_xtx"][b, k], x.T @ x, rtol=RTOL)
                np.testing.assert_allclose(state["arm_xty"][b, k], x.T @ r, rtol=RTOL)


def assert_shifted(state: State, names: tuple[str, str, str], slot: tuple[int, int],
                   rewards: Array) -> None:
    """The slot's sums about its first reward (all zero before one)."""
    shift, sum_d, sum_d2 = (state[name][slot] for name in names)
    first = rewards[0] if rewards.size else 0.0
    assert shift == first
    assert sum_d == pytest.approx((rewards - first).sum(), rel=RTOL, abs=ATOL)
    assert sum_d2 == pytest.approx(((rewards - first) ** 2).sum(), rel=RTOL)


def test_layout_orders_each_blob_count_shift_then_shifted_sums() -> None:
    # A blob's fields are added in layout order (the stored recipe names them
    # so), and the shift needs the count (whether the slot is new) first, the
    # shifted sums the shift.
    residual_kinds: tuple[Residuals, ...] = ("current", "observed")
    for residuals in residual_kinds:
        config = config_for("contextual", residuals)
        for axis in ("model", "arm"):
            kinds = [spec.adds for spec in layout(config).values() if spec.axis == axis]
            assert kinds.index("one") < kinds.index("first_r") < kinds.index("dr")
            assert kinds.index("first_r") < kinds.index("dr2")


# --------------------------------------------------------------------------- RSS


def direct_residuals(h: History, config: PolicyConfig, k: int, reg: float) -> Array:
    """Residuals of arm k's rewards, computed from the raw history (Section 3.2)."""
    model = 0 if config.shared else k
    theta = direct_theta(h, config.shared, model, reg)
    rows = h.arms == k
    if config.residuals == "observed":
        return h.rewards[rows] - h.x[rows] @ theta
    return h.rewards[rows] - h.current[k] @ theta


@pytest.mark.parametrize(("setting", "residuals"), [*STATE_CASES, ("stochastic", "observed")])
def test_incremental_rss_equals_direct_sum_of_squares(
    setting: Setting, residuals: Residuals
) -> None:
    n_arms, dim = 4, 3
    config = config_for(setting, residuals)
    histories = [make_history(setting, n_arms, dim, 40, seed) for seed in (7, 8, 9)]
    state = build_state(config, histories, n_arms)
    n_models = 1 if config.shared else n_arms
    theta = np.array(
        [
            [direct_theta(h, config.shared, m, config.reg) for m in range(n_models)]
            for h in histories
        ]
    )
    contexts = np.stack([h.current for h in histories])
    mu_hat = predict(theta, contexts)
    rss = residual_sum_of_squares(config, state, mu_hat, theta)
    for b, h in enumerate(histories):
        for k in range(n_arms):
            e = direct_residuals(h, config, k, config.reg)
            assert rss[b, k] == pytest.approx(e @ e, rel=1e-8)


# --------------------------------------------------------------------------- LinReBoot


N_DRAWS = 10_000
# Standard errors allowed per moment. About 100 moment checks run in this
# section; a two-sided 5-sigma Gaussian tail is 5.7e-7, so a correct
# implementation fails one of them with probability below 1e-4.
K_SE = 5.0


def closed_form_moments(
    h: History, config: PolicyConfig, n_arms: int
) -> tuple[Array, Array, list[Array]]:
    """Section 3.3: given the history, index_k ~ (mu_hat_k, sigma_omega^2 RSS_k / s_k^2)."""
    means, variances, residuals = [], [], []
    for k in range(n_arms):
        model = 0 if config.shared else k
        means.append(h.current[k] @ direct_theta(h, config.shared, model, config.reg))
        e = direct_residuals(h, config, k, config.reg)
        residuals.append(e)
        variances.append(config.sigma_omega**2 * (e @ e) / e.size**2)
    return np.array(means), np.array(variances), residuals


def assert_mean_and_variance(draws: Array, mean: Array, variance: Array) -> None:
    """Sample mean and variance of each column within K_SE standard errors.

    SE of the mean: sqrt(v / N). SE of the sample variance: v sqrt(2 / (N - 1))
    for Gaussian draws; for Rademacher weights the index is a weighted sum of
    +-1 signs, whose kurtosis is below 3, so the Gaussian SE is an upper bound.
    """
    n = draws.shape[0]
    se_mean = np.sqrt(variance / n)
    se_var = variance * np.sqrt(2.0 / (n - 1))
    assert np.all(np.abs(draws.mean(axis=0) - mean) <= K_SE * se_mean), (
        draws.mean(axis=0),
        mean,
    )
    assert np.all(np.abs(draws.var(axis=0, ddof=1) - variance) <= K_SE * se_var), (
        draws.var(axis=0, ddof=1),
        variance,
    )


EQUIVALENCE_CASES: list[tuple[Setting, Residuals]] = [
    ("stochastic", "current"),
    ("contextual", "current"),
    ("contextual", "observed"),
    ("covariates", "current"),
]


@pytest.mark.parametrize(("setting", "residuals"), EQUIVALENCE_CASES)
def test_efficient_linreboot_matches_explicit_residual_bootstrap(
    setting: Setting, residuals: Residuals
) -> None:
    n_arms, dim = 4, 3
    config = config_for(setting, residuals)
    history = make_history(setting, n_arms, dim, 30, seed=10)
    mean, variance, residuals_by_arm = closed_form_moments(history, config, n_arms)
    # The variances differ across arms (different s_k and RSS_k), so matching
    # them arm by arm is a real test of the s_k^-2 RSS_k scaling.
    assert np.ptp(variance) > 0.1 * variance.max()

    # Efficient form: N_DRAWS copies of the state, one generator each.
    single = build_state(config, [history], n_arms)
    batch = {name: np.repeat(value, N_DRAWS, axis=0) for name, value in single.items()}
    contexts = np.repeat(history.current[None], N_DRAWS, axis=0)
    rngs = np.random.default_rng(100).spawn(N_DRAWS)
    efficient = INDEX["linreboot"](config, batch, contexts, rngs)
    assert_mean_and_variance(efficient, mean, variance)

    # Explicit form (Algorithm 1), one weight per residual, both weight laws:
    # the same mean and variance (Gaussian weights: the same law, below).
    rewards_by_arm = [history.rewards[history.arms == k] for k in range(n_arms)]
    laws: tuple[tuple[Weights, int], ...] = (("gaussian", 101), ("rademacher", 102))
    for weights, seed in laws:
        rng = np.random.default_rng(seed)
        if residuals == "current":
            explicit = np.array(
                [
                    explicit_bootstrap_index(mean, rewards_by_arm, config.sigma_omega, weights, rng)
                    for _ in range(N_DRAWS)
                ]
            )
        else:
            explicit = np.array(
                [
                    explicit_bootstrap_index_from_residuals(
                        mean, residuals_by_arm, config.sigma_omega, weights, rng
                    )
                    for _ in range(N_DRAWS)
                ]
            )
        assert_mean_and_variance(explicit, mean, variance)


def test_gaussian_weights_give_the_efficient_law_and_rademacher_weights_do_not() -> None:
    """Gaussian weights: the explicit index is exactly N(mu, sigma^2 RSS / s^2), so a
    Kolmogorov-Smirnov test against that law passes. Rademacher weights: same mean and
    variance, but an arm with s residuals takes at most 2^s values (8 here), a
    distance from the normal that 20,000 draws show beyond doubt."""
    from scipy import stats

    mu, rewards, sigma = np.array([0.2]), [[0.9, -0.4, 0.1]], 0.5
    residuals = np.array(rewards[0]) - mu[0]
    sd = sigma * math.sqrt(residuals @ residuals) / residuals.size
    laws: tuple[tuple[Weights, int], ...] = (("gaussian", 201), ("rademacher", 202))
    for weights, seed in laws:
        rng = np.random.default_rng(seed)
        draws = np.array([explicit_bootstrap_index(mu, rewards, sigma, weights, rng)[0]
                          for _ in range(N_DRAWS)])
        p_value = stats.kstest(draws, "norm", args=(mu[0], sd)).pvalue
        if weights == "gaussian":
            assert p_value > 1e-3
        else:
            assert np.unique(draws).size <= 8 and p_value < 1e-12


def test_explicit_bootstrap_with_rademacher_weights_takes_two_values_per_single_residual() -> None:
    # One pull: the index is mu_hat +- sigma_omega * e, nothing else.
    rng = np.random.default_rng(0)
    draws = np.array(
        [explicit_bootstrap_index([0.5], [[0.9]], 0.5, "rademacher", rng) for _ in range(200)]
    )
    np.testing.assert_allclose(np.unique(draws), [0.3, 0.7])


def test_explicit_bootstrap_zero_sigma_and_unpulled_arm_return_mu_hat() -> None:
    rng = np.random.default_rng(0)
    mu = np.array([0.1, -0.2])
    np.testing.assert_array_equal(
        explicit_bootstrap_index(mu, [[1.0, 2.0], [3.0]], 0.0, "gaussian", rng), mu
    )
    got = explicit_bootstrap_index(mu, [[1.0, 2.0], []], 1.0, "gaussian", rng)
    assert got[1] == mu[1]
    assert got[0] != mu[0]


@pytest.mark.parametrize(
    ("mu_hat", "rewards", "sigma_omega", "weights"),
    [
        (np.zeros((2, 1)), [[1.0], [1.0]], 1.0, "gaussian"),  # mu_hat not 1-D
        (np.zeros(2), [[1.0]], 1.0, "gaussian"),  # one reward array missing
        (np.zeros(1), [[[1.0]]], 1.0, "gaussian"),  # rewards not 1-D
        (np.zeros(1), [[1.0]], -1.0, "gaussian"),  # negative sigma
        (np.zeros(1), [[1.0]], float("nan"), "gaussian"),  # non-finite sigma
        (np.zeros(1), [[1.0]], 1.0, "uniform"),  # unknown weights
    ],
)
def test_explicit_bootstrap_rejects_invalid_input(
    mu_hat: Array, rewards: list[list[float]], sigma_omega: float, weights: Any
) -> None:
    with pytest.raises(ValueError):
        explicit_bootstrap_index(mu_hat, rewards, sigma_omega, weights, np.random.default_rng(0))


# --------------------------------------------------------------------------- kept solutions


@pytest.mark.parametrize("batch", [1, 4])
def test_kept_solutions_equal_fresh_solves_bit_for_bit(batch: int) -> None:
    # A model per arm: each update changes one model per row, and only that one
    # is solved again; what is kept must be what a fresh solve of every model
    # gives, bit for bit, after every update (one changed model, several, all).
    from policies.state import kept_theta

    config = PolicyConfig("linreboot", "covariates", 3)
    state = init_state(config, 4, batch)
    rng = np.random.default_rng(11)
    for step in range(12):
        arms = rng.integers(0, 4, size=batch)
        update(config, state, arms, rng.normal(size=(batch, 3)) * 10.0 ** (step % 3),
               rng.normal(size=batch))
        if step % 3 == 2:
            continue  # two updates between looks: both models marked
        theta = kept_theta(state, config.reg)
        np.testing.assert_array_equal(theta, ridge(state["xtx"], state["xty"], config.reg))
    # Another regulariser is solved afresh, not served from the kept one.
    np.testing.assert_array_equal(kept_theta(state, 5.0), ridge(state["xtx"], state["xty"], 5.0))
    assert not np.array_equal(kept_theta(state, 5.0), ridge(state["xtx"], state["xty"], 0.1))


def _looks(config: PolicyConfig, state: State, seed: int) -> Iterator[None]:
    """Update ``state`` (4 arms, features of scales 1 to 100) 12 times, yielding after
    each update but every third: a look sees one or two models changed per row."""
    batch = state["pulls"].shape[0]
    rng = np.random.default_rng(seed)
    for step in range(12):
        arms = rng.integers(0, 4, size=(batch,))
        update(config, state, arms, rng.normal(size=(batch, 3)) * 10.0 ** (step % 3),
               rng.normal(size=(batch,)))
        if step % 3 != 2:  # two updates between some looks: both models marked
            yield


def _assert_kept_as_fresh(kept: Callable[[], tuple[Array, Array]], fresh: Array,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``kept()``'s ``theta_hat`` and matrix, kept, have the bits of ``fresh`` (..., d, 1 + d)
    and are read-only; unkept (a threshold no state reaches) the same bits again."""
    monkeypatch.setattr("policies.state.KEEP_INVERSES_FROM", 0)  # so small a state keeps
    theta, matrix = kept()
    np.testing.assert_array_equal(theta, fresh[..., 0])
    np.testing.assert_array_equal(matrix, fresh[..., 1:])
    assert not (theta.flags.writeable or matrix.flags.writeable)
    monkeypatch.setattr("policies.state.KEEP_INVERSES_FROM", 10**9)  # unkept: the same
    np.testing.assert_array_equal(kept()[1], matrix)


@pytest.mark.parametrize("batch", [1, 4])
def test_kept_inverses_equal_fresh_ones_bit_for_bit(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LinUCB's and the pooled spread's theta_hat and (X'X + reg I)^-1 per model, kept
    # and redone for the models that changed (one or two per look): the bits of a
    # fresh solve of [X'y, I] for every model, and of the unkept path.
    from policies.state import Sums, kept_ridge_and_inverse

    config = PolicyConfig("linucb", "covariates", 3)
    state = init_state(config, 4, batch)
    identity = np.broadcast_to(np.eye(3), state["xtx"].shape)
    for _ in _looks(config, state, 13):
        fresh = solve(state["xtx"], config.reg,
                      np.concatenate([state["xty"][..., None], identity], axis=-1))
        _assert_kept_as_fresh(lambda: kept_ridge_and_inverse(state, config.reg), fresh,
                              monkeypatch)
    assert isinstance(state, Sums) and len(state.kept) == 4


@pytest.mark.parametrize("batch", [1, 4])
def test_kept_draw_bases_equal_fresh_ones_bit_for_bit(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The samplers' theta_hat and W = G^-1 S^-1 R per model (a model per arm), kept and
    # redone for the models that changed: the bits of a fresh solve of every model, and
    # of the unkept path; the root of G itself (LinTS), and of X'X with a weighted G
    # (LinPHE's and LinGIRO's).
    from policies.state import Sums, _draw_basis, kept_draw_basis

    config = PolicyConfig("lints-g", "covariates", 3)
    state = init_state(config, 4, batch)
    for _ in _looks(config, state, 14):
        for weight, bare_root in ((1.0, False), (1.5, True)):
            fresh = _draw_basis(state["xtx"], state["xty"], config.reg, weight=weight,
                                bare_root=bare_root)
            _assert_kept_as_fresh(
                functools.partial(kept_draw_basis, state, weight, config.reg, bare_root), fresh,
                monkeypatch)
    assert isinstance(state, Sums) and len(state.kept) == 2 * 4


_UNITS = np.array([1.0, 1e3, 1e-2, 10.0])  # features of very different scales


def _scaled_history(config: PolicyConfig, seed: int) -> tuple[State, np.random.Generator]:
    """Two experiments, 3 arms, d = 4: 40 rewards with features of scales 1e-2 to 1e3;
    the generator, to draw more from."""
    state = init_state(config, 3, 2)
    rng = np.random.default_rng(seed)
    for _ in range(40):
        update(config, state, rng.integers(0, 3, size=2), rng.normal(size=(2, 4)) * _UNITS,
               rng.normal(size=2))
    return state, rng


@pytest.mark.parametrize("policy", ["lints-g", "lints-ig", "linphe", "lingiro"])
def test_a_draw_from_the_basis_equals_a_solve_of_the_perturbed_equations(
    policy: PolicyName,
) -> None:
    """A model per arm draws ``theta_hat + c W z``; a shared model solves
    ``G (theta_hat + c w) = [X'y, S^-1 R z]``. Equal to rounding: features of scales
    1e-2 to 1e3, but the floored systems' condition numbers are below 1e3, so 1e-10 of
    the largest entry is a wide bound."""
    from policies.indices import _from_basis
    from policies.ridge import Equilibrated

    config = PolicyConfig(policy, "covariates", 4)
    state, rng = _scaled_history(config, 8)
    prepared = INDEX[policy].prepare(config, state, rng.normal(size=(2, 3, 4)))
    z = rng.normal(size=(2, 3, 4))
    theta, direction = _from_basis(prepared, z)
    if policy in ("lints-g", "lints-ig"):  # the root of G itself
        reg = config.reg if policy == "lints-g" else config.ig_prior_precision
        gram = rooted = Equilibrated.of(state["xtx"], reg)
    else:  # the root of X'X, in G's scaling
        weight = 1.0 + (config.phe_a if policy == "linphe" else 2.0 * config.giro_a)
        gram, rooted = perturbed_systems(state["xtx"], weight, config.reg)
    assert max(np.linalg.cond(gram.system).max(), np.linalg.cond(rooted.system).max()) < 1e3
    lifted = rooted.factor().times_root(z)
    solved = gram.solve(np.stack([state["xty"], lifted], axis=-1))
    for ours, direct in ((theta, solved[..., 0]), (direction, solved[..., 1])):
        assert np.abs(ours - direct).max() <= 1e-10 * np.abs(direct).max()


@pytest.mark.parametrize("keep_from", [0, 10**9])  # kept, and solved afresh
@pytest.mark.parametrize("n_models", [1, 3])
def test_leverage_equals_a_solve(
    n_models: int, keep_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``x_k' V^-1 x_k`` from the kept inverses (a model per arm) or the shared
    model's solve equals a direct solve of the same floored system ``S V S + JITTER I``
    to rounding: its condition number is below 3 here (features of scales 1e-2 to 1e3,
    V's own about 4e8), so relative 1e-12 is a wide bound."""
    from policies.indices import ridge_and_leverage
    from policies.ridge import Equilibrated

    setting: Setting = "contextual" if n_models == 1 else "covariates"
    config = PolicyConfig("linucb", setting, 4)
    state, rng = _scaled_history(config, 4)
    units = _UNITS
    contexts = rng.normal(size=(2, 3, 4)) * units
    monkeypatch.setattr("policies.state.KEEP_INVERSES_FROM", keep_from)
    ridge_and_leverage(state, contexts, config.reg)  # kept, if at all, before the last update
    update(config, state, np.array([1, 2]), rng.normal(size=(2, 4)) * units, rng.normal(size=2))
    theta, leverage = ridge_and_leverage(state, contexts, config.reg)
    floored = Equilibrated.of(state["xtx"], config.reg)
    model = slice(None) if n_models == 3 else [0, 0, 0]
    assert np.linalg.cond(floored.system).max() < 3.0
    scaled = floored.scale[:, model] * contexts
    direct = np.einsum("bkd,bkd->bk", np.linalg.solve(floored.system[:, model],
                                                      scaled[..., None])[..., 0], scaled)
    np.testing.assert_allclose(leverage, direct, rtol=1e-12)
    np.testing.assert_allclose(theta, ridge(state["xtx"], state["xty"], config.reg), rtol=1e-12)


def test_nothing_is_kept_with_forgetting() -> None:
    # Every model changes with the clock: a kept solution would be stale.
    from policies.state import Sums, kept_theta

    config = PolicyConfig("linreboot", "covariates", 2, discount=0.9)
    state = init_state(config, 3)
    update(config, state, np.array([1]), np.ones((1, 2)), np.array([1.0]))
    kept_theta(state, config.reg)
    assert isinstance(state, Sums) and state.kept == {}


def test_what_is_kept_is_not_part_of_the_sums() -> None:
    # Iterating, copying or storing a state sees its sums only; a plain dict keeps nothing.
    from policies.state import Sums, kept_theta

    config = PolicyConfig("linucb", "covariates", 2)
    state = init_state(config, 3)
    update(config, state, np.array([1]), np.ones((1, 2)), np.array([1.0]))
    kept_theta(state, config.reg)
    assert isinstance(state, Sums) and "theta" in state.kept
    assert list(state) == list(layout(config))
    plain = dict(state)
    assert not hasattr(plain, "kept")
    np.testing.assert_array_equal(kept_theta(plain, config.reg), kept_theta(state, config.reg))
    assert not kept_theta(state, config.reg).flags.writeable
    assert copy.copy(state).kept == {} and pickle.loads(pickle.dumps(state)).kept == {}
    # Sums written directly, not through update: what is kept follows them.
    state["xtx"][0, 2] += np.eye(2)
    state["xty"][0, 0] -= 1.0
    np.testing.assert_array_equal(kept_theta(state, config.reg),
                                  ridge(state["xtx"], state["xty"], config.reg))


@pytest.mark.parametrize(("policy", "setting"), [
    ("linreboot", "covariates"), ("linreboot", "contextual"), ("linucb", "contextual"),
    ("lints-g", "covariates")])
def test_frozen_sums_prepare_each_context_with_the_bits_of_fresh_ones(
    policy: PolicyName, setting: Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A frozen Sums (the service's view of a request's arms) keeps its solutions, a shared
    # model's too, and the pooled spread's terms of the sums alone: decisions from a new
    # context each time have the bits of a plain dict's, which keeps nothing. Then each
    # is computed once: the sums are not compared again, nor a shared model solved again.
    from policies.state import Sums, inherit_kept

    monkeypatch.setattr("policies.state.KEEP_INVERSES_FROM", 0)  # so small a state keeps
    config = paper_config(policy, setting, 3, **({"spread": "pooled"} if policy == "linreboot"
                                                  else {}))
    rng = np.random.default_rng(5)
    grown = init_state(config, 4)
    for _ in range(30):
        update(config, grown, rng.integers(0, 4, size=1), rng.normal(size=(1, 3)),
               rng.normal(size=1))
    frozen = Sums(dict(grown), frozen=True)
    for _ in range(3):
        contexts = rng.normal(size=(1, 4, 3))
        fresh = prepare(config, dict(grown), contexts).prepared
        kept = prepare(config, frozen, contexts).prepared
        assert fresh.keys() == kept.keys()
        for name in fresh:
            np.testing.assert_array_equal(kept[name], fresh[name])
    assert frozen.kept and frozen.checked
    assert not any(array.flags.writeable for array in frozen.derived.get("pooled scale", ()))
    # Computed once: sums written behind its back (a frozen state's maker promises none)
    # do not reach what it keeps (the solutions; LinReBoot's terms of the counts).
    before = prepare(config, frozen, contexts).prepared
    frozen["xtx"] += 5.0 * np.eye(3)
    frozen["xty"] += 1.0
    if policy == "linreboot":
        frozen["n"] += 3.0
    after = prepare(config, frozen, contexts).prepared
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    # A new frozen state inherits the solutions, compared once with its own sums, but
    # neither that comparison nor the terms of the sums alone.
    successor = Sums(dict(frozen), frozen=True)
    inherit_kept(successor, frozen)
    assert not successor.checked and not successor.derived
    fresh = prepare(config, dict(frozen), contexts).prepared
    for name, value in prepare(config, successor, contexts).prepared.items():
        np.testing.assert_array_equal(value, fresh[name])
    assert successor.checked
    inherit_kept(successor, frozen)  # solutions inherited again are compared again
    assert not successor.checked


@pytest.mark.parametrize("setting", ["contextual", "covariates"])
def test_one_experiment_updates_with_the_bits_of_a_row_of_a_batch(setting: Setting) -> None:
    """A batch of one adds its shifted sums as scalars, a batch of two with array
    calls: the same IEEE operations, so row 0 of the pair ends with the bits of the
    experiment alone (rewards of mean 3, so every shift and deviation matters)."""
    config = PolicyConfig("linreboot", setting, 3)
    alone, pair = init_state(config, 4, 1), init_state(config, 4, 2)
    rng = np.random.default_rng(17)
    for _ in range(200):
        arms, x, rewards = (rng.integers(0, 4, size=2), rng.normal(size=(2, 3)),
                            rng.normal(3.0, 1.0, size=2))
        update(config, alone, arms[:1], x[:1], rewards[:1])
        update(config, pair, arms, x, rewards)
    for name, value in alone.items():
        assert np.array_equal(value[0], pair[name][0]), name


@pytest.mark.parametrize(("name", "setting", "options"), [
    ("linreboot", "stochastic", {}),
    ("linreboot", "covariates", {}),
    ("linreboot", "contextual", {"residuals": "observed"}),  # per-arm Gram matrices too
    ("lints-ig", "covariates", {}),
    ("linucb", "contextual", {}),
    ("linreboot", "covariates", {"discount": 0.9}),  # forgetting: one call per observation
    ("linphe", "stochastic", {"variant": "authors"}),
])
def test_a_sequence_of_one_experiment_adds_up_as_its_observations_one_by_one(
    name: str, setting: Setting, options: dict[str, Any]
) -> None:
    """apply_sequence (the service adds its recorded outcomes with it) gives the bits of
    apply_observations called once per observation: arms met several times, some for
    the first time (their shift is their first reward in the sequence), after some
    observations already in the state."""
    from policies import paper_config
    from policies.state import apply_observations, apply_sequence

    config = paper_config(name, setting, 4, **options)  # type: ignore[arg-type]
    rng = np.random.default_rng(21)
    n_arms, n = 6, 40
    arms = rng.integers(0, n_arms - 1, size=n)  # the last arm never met
    arms[:3] = [2, 2, 0]
    x = rng.normal(size=(n, 4))
    rewards = rng.normal(3.0, 1.0, size=n)
    numbers = rng.permutation(np.arange(5.0, 5.0 + n))
    before = init_state(config, n_arms, 1)
    for i in range(3):  # arms 3 and 4 already observed, with their own shifts
        apply_observations(config, before, np.array([3 + i % 2]), x[i:i + 1] * 2.0,
                           rewards[i:i + 1] - 1.0, numbers[i:i + 1] - 4.0)
    one_by_one = copy.deepcopy(before)
    for i in range(n):
        apply_observations(config, one_by_one, arms[i:i + 1], x[i:i + 1], rewards[i:i + 1],
                           numbers[i:i + 1])
    together = copy.deepcopy(before)
    apply_sequence(config, together, arms, x, rewards, numbers)
    assert together.keys() == one_by_one.keys()
    for field_name, value in one_by_one.items():
        assert np.array_equal(together[field_name], value), field_name
    # and the sequence did change every slot it met
    assert not np.array_equal(together["pulls"], before["pulls"])
