"""The authors' variants of the baselines against direct transcriptions.

Each direct computation below is written from the authors' ``Algorithms.py``
(ShuangWu22/LinReBoot_Experiments: ``Linear_UCB``, ``Linear_TS_IG``,
``Linear_PHE``, ``Linear_TS_G``, ``Linear_GIRO``) as plain loops over the raw
history, step by step as their code updates: not from the policy's state or
from :mod:`policies.authors`.

* LinUCB is deterministic: its scores must match to rounding.
* LinTS-IG is reproduced draw for draw from identically seeded generators.
* LinPHE is drawn from the normal with its perturbation's mean and
  covariance; the authors' binomial-multinomial perturbation is simulated
  explicitly, and both are checked against the closed-form moments.
* LinGIRO is drawn from the normal with the first two moments of its
  resample's perturbation of the normal equations, computed here from the
  augmented history their loop builds; their resample itself is simulated, and
  their start without a first pass is checked arm by arm.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.special import ndtr

from loadtest.environments import Environment, Reading, make_spec, seeded_rngs
from loadtest.simulate import Cell
from policies import (
    PolicyConfig,
    State,
    choose,
    init_state,
    layout,
    paper_config,
    prepare,
    update,
)
from policies.authors import index_of
from policies.config import PolicyName, Setting
from policies.propensity import propensities
from tests.test_policies_baselines import (
    DIM,
    N_ARMS,
    RTOL,
    SETTINGS,
    assert_moments,
    contexts_of,
    histories_for,
    model_of,
    n_models,
    replicate,
    rows_of,
)
from tests.test_policies_math import History, build_state
from tests.test_propensity import check_against_monte_carlo

Array = NDArray[Any]
SHARED_AND_PER_ARM: list[Setting] = ["contextual", "covariates"]


def authors(name: PolicyName, setting: Setting, **overrides: Any) -> PolicyConfig:
    return paper_config(name, setting, DIM, variant="authors", **overrides)


# --------------------------------------------------------------------------- configuration


def test_the_authors_hyperparameters_come_with_the_variant() -> None:
    # Linear_UCB has no noise scale (R = 1); LB_covariates_Exp.py runs
    # Linear_TS_IG with tau = sqrt(10), i.e. prior precision 1/10.
    assert authors("linucb", "covariates").noise_sd == 1.0
    assert authors("lints-ig", "covariates").ig_prior_precision == 0.1
    assert authors("lints-ig", "contextual").ig_prior_precision == 0.2
    assert paper_config("linucb", "covariates", DIM).noise_sd == 0.1  # ours unchanged
    assert authors("linucb", "covariates", noise_sd=0.5).noise_sd == 0.5  # overrides win


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [("linucb-const", {}, "only linreboot, lints-g, lints-ig, lingiro, linphe, linucb"),
     ("greedy", {}, "only linreboot"),
     ("linreboot", {"spread": "pooled"}, "spread must be 'paper'"),
     ("linucb", {"epsilon": 0.1}, "epsilon must be 0"),
     ("linucb", {"discount": 0.99}, "do not forget"),
     ("lingiro", {"giro_a": 1.5}, "whole number")],
)
def test_a_variant_that_does_not_exist_is_refused(
    name: PolicyName, overrides: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig(name, "contextual", DIM, variant="authors", **overrides)  # type: ignore[arg-type]


def test_only_the_authors_variants_keep_more_than_sums() -> None:
    # The store adds sums only: the extra fields must never reach a service layout.
    assert "theta_norm_max" in layout(authors("linucb", "contextual"))
    assert "sum_x" in layout(authors("linphe", "covariates"))
    assert "refreshed" in layout(authors("linreboot", "covariates"))
    assert "refreshed" not in layout(authors("linreboot", "contextual"))  # theirs refreshes it
    extra = {"theta_norm_max", "sum_x", "late_n", "late_xtx", "r2_xtx", "r_x3", "aug_x4",
             "refreshed"}
    assert extra - {"theta_norm_max", "sum_x", "refreshed"} <= set(
        layout(authors("lingiro", "covariates")))
    for name in ("linucb", "linphe", "lints-ig", "lingiro", "linreboot"):
        for setting in SHARED_AND_PER_ARM:
            fields = layout(paper_config(name, setting, DIM))
            assert not extra & set(fields)


# --------------------------------------------------------------------------- LinReBoot


def direct_authors_reboot(config: PolicyConfig, contexts: Array, arms: list[int],
                          rewards: Array) -> list[tuple[Array, Array]]:
    """``Linear_ReBoot_G`` with ``coefficient_sharing=False``, round by round: the mean
    and sd of its bootstrapped means in every round after the first pass.

    Rounds 1..K pull arm t (no estimate is refreshed); from round K + 1 on the
    loop first refreshes ``beta`` of the arm pulled in the round before, then
    scores every arm at this round's context ``c``: ``mu = c' beta_k`` and
    ``Sigma = (Sum2 + n mu^2 - 2 mu Sum1) / n^2``.
    """
    n_arms, d, lam = len(set(arms)), config.dim, config.reg
    v = [lam * np.eye(d) for _ in range(n_arms)]
    g = [np.zeros(d) for _ in range(n_arms)]
    beta = np.zeros((d, n_arms))
    sum1, sum2, count = np.zeros(n_arms), np.zeros(n_arms), np.zeros(n_arms)
    laws = []
    for t, (c, a, r) in enumerate(zip(contexts, arms, rewards, strict=True)):
        if t >= n_arms:
            previous = arms[t - 1]
            beta[:, previous] = np.linalg.inv(v[previous]) @ g[previous]
            mu = c @ beta
            sigma = (sum2 + count * mu * mu - 2 * mu * sum1) / (count * count)
            laws.append((mu, config.sigma_omega * np.sqrt(sigma)))
        v[a] = v[a] + np.outer(c, c)
        g[a] = g[a] + r * c
        sum1[a] += r
        sum2[a] += r * r
        count[a] += 1
    return laws


def test_authors_linreboot_per_arm_keeps_beta_zero_until_refreshed() -> None:
    config = authors("linreboot", "covariates")
    rng = np.random.default_rng(5)
    # First pass 0, 1, 2 in their order, then arm 2 twice, arm 0, arm 2: arm 1 is
    # never pulled again, so their loop never fits it.
    arms = [0, 1, 2, 2, 2, 0, 2]
    contexts = rng.normal(size=(len(arms) + 1, DIM)) / math.sqrt(DIM)
    rewards = rng.normal(0.5, 0.3, size=len(arms) + 1)
    expected = direct_authors_reboot(config, contexts, [*arms, 0], rewards)
    state = init_state(config, 3)
    for t, (arm, r) in enumerate(zip(arms, rewards, strict=False)):
        update(config, state, np.array([arm]), contexts[None, t], np.array([r]))
        if t + 1 < 3:
            continue
        round_contexts = np.broadcast_to(contexts[t + 1], (1, 3, DIM))
        mean, cov = law_moments(config, state, round_contexts)
        mu, sd = expected[t + 1 - 3]
        np.testing.assert_allclose(mean, mu, rtol=RTOL, atol=1e-12)
        np.testing.assert_allclose(np.sqrt(np.diag(cov)), sd, rtol=RTOL)
    assert mean[1] == 0.0  # arm 1: beta = 0 to the end
    # Ours fits arm 1 from its first reward: the variant is not ours.
    ours = paper_config("linreboot", "covariates", DIM)
    ours_state = build_from(ours, arms, contexts, rewards)
    ours_mean, _ = law_moments(ours, ours_state, round_contexts)
    assert ours_mean[1] != 0.0
    np.testing.assert_allclose(ours_mean[[0, 2]], mean[[0, 2]], rtol=RTOL)


def test_authors_linreboot_per_arm_takes_the_first_pass_in_arm_order() -> None:
    # Their loop pulls arm t in round t, so the last arm of the pass (the one
    # refreshed) is always arm K; ours picks the unexplored arms at random.
    theirs = authors("linreboot", "covariates")
    ours = paper_config("linreboot", "covariates", DIM, first_pass=True)
    assert theirs.first_pass_in_order and not ours.first_pass_in_order
    assert not authors("linreboot", "contextual").first_pass_in_order
    rng = np.random.default_rng(4)
    passes = {}
    for config in (theirs, ours):
        state = init_state(config, 5, 3)
        picked = []
        for _ in range(5):
            contexts = np.broadcast_to(rng.normal(size=(3, 1, DIM)), (3, 5, DIM))
            ready = prepare(config, state, contexts)
            choice = choose(config, state, contexts, [np.random.default_rng(s) for s in range(3)])
            if config is theirs:  # the lowest unexplored arm, for sure
                assert propensities(ready, choice.arms).tolist() == [1.0, 1.0, 1.0]
            update(config, state, choice.arms, contexts[:, 0], rng.normal(size=3))
            picked.append(choice.arms.tolist())
        passes[config.variant] = picked
    assert passes["authors"] == [[k] * 3 for k in range(5)]
    assert passes["project"] != passes["authors"]
    assert sorted(np.array(passes["project"]).T.tolist()[0]) == list(range(5))  # still a pass


def test_authors_linreboot_with_one_model_is_ours() -> None:
    histories = histories_for("contextual", (1, 2))
    contexts = contexts_of(histories)
    ours = paper_config("linreboot", "contextual", DIM)
    theirs = authors("linreboot", "contextual")
    for config in (ours, theirs):
        assert config.sigma_omega == ours.sigma_omega
    mine = prepare(ours, build_state(ours, histories, N_ARMS), contexts).prepared
    them = prepare(theirs, build_state(theirs, histories, N_ARMS), contexts).prepared
    for key in ("mu_hat", "spread"):
        np.testing.assert_array_equal(mine[key], them[key])


def build_from(config: PolicyConfig, arms: list[int], contexts: Array, rewards: Array) -> State:
    state = init_state(config, 3)
    for t, arm in enumerate(arms):
        update(config, state, np.array([arm]), contexts[None, t], np.array([rewards[t]]))
    return state


# --------------------------------------------------------------------------- LinUCB


def direct_authors_ucb(config: PolicyConfig, h: History) -> Array:
    """``Linear_UCB``: after every update V, theta, the running max of ||theta|| and
    ``radius = sqrt(lam) max + sqrt(2 log(1/delta) + log(det V / lam^d))``."""
    lam, d = config.reg, config.dim
    v = [lam * np.eye(d) for _ in range(n_models(config))]
    g = [np.zeros(d) for _ in range(n_models(config))]
    norm_max = np.zeros(n_models(config))
    radius = np.zeros(n_models(config))
    for arm, x, r in zip(h.arms, h.x, h.rewards, strict=True):
        m = model_of(config, int(arm))
        v[m] = v[m] + np.outer(x, x)
        g[m] = g[m] + r * x
        theta = np.linalg.inv(v[m]) @ g[m]
        norm_max[m] = max(norm_max[m], float(np.linalg.norm(theta)))
        log_det_ratio = math.log(np.linalg.det(v[m]) / lam**d)
        radius[m] = math.sqrt(lam) * norm_max[m] + math.sqrt(
            2 * math.log(1 / config.ucb_delta) + log_det_ratio)
    scores = np.empty(N_ARMS)
    for k in range(N_ARMS):
        m, x = model_of(config, k), h.current[k]
        v_inv = np.linalg.inv(v[m])
        scores[k] = x @ v_inv @ g[m] + radius[m] * math.sqrt(x @ v_inv @ x)
    return scores


@pytest.mark.parametrize("setting", SETTINGS)
def test_authors_linucb_matches_their_update_step_by_step(setting: Setting) -> None:
    config = authors("linucb", setting, ucb_delta=0.01)  # a non-default delta shows if ignored
    histories = histories_for(setting, (1, 2, 3))
    state = build_state(config, histories, N_ARMS)
    rngs = [np.random.default_rng(s) for s in range(3)]
    scores = choose(config, state, contexts_of(histories), rngs).scores
    ours = choose(paper_config("linucb", setting, DIM), build_state(
        paper_config("linucb", setting, DIM), histories, N_ARMS), contexts_of(histories), rngs)
    for b, h in enumerate(histories):
        np.testing.assert_allclose(scores[b], direct_authors_ucb(config, h), rtol=RTOL)
    # And it is not our LinUCB: R = 1, not the noise sd, widens every arm's bonus.
    assert np.all(np.abs(scores - ours.scores) > 1e-3)


def test_the_running_max_remembers_a_larger_past_estimate() -> None:
    # Two rewards of 5 then many of 0 on one arm: ||theta_hat|| rises then falls,
    # and the radius keeps the peak (the authors' beta_norm_max).
    config = PolicyConfig("linucb", "stochastic", 1, variant="authors", noise_sd=1.0)
    state = init_state(config, 1)
    x = np.ones((1, 1))
    peaks = []
    for r in [5.0, 5.0] + [0.0] * 20:
        update(config, state, np.array([0]), x, np.array([r]))
        peaks.append(float(state["theta_norm_max"][0, 0]))
    assert peaks[1] == pytest.approx(10.0 / 2.1)  # (X'X + 0.1)^-1 X'y after two fives
    assert peaks[-1] == peaks[1]  # the estimate is near 0.45 by now; the max stays


# --------------------------------------------------------------------------- LinTS-IG


@pytest.mark.parametrize("setting", SETTINGS)
def test_authors_lints_ig_reproduces_their_seeded_draw(setting: Setting) -> None:
    # Linear_TS_IG: V = I / tau^2 + X'X, mean = V^-1 g, eta_a = alpha + n/2,
    # eta_b = alpha + g' mean / 2, sigma ~ invgamma(eta_a, scale=eta_b) = eta_b / Gamma(eta_a);
    # theta ~ N(mean, sigma^2 V^-1) with a shared model, N(mean, sigma V^-1) per arm.
    config = authors("lints-ig", setting)
    histories = histories_for(setting, (7, 8))
    state = build_state(config, histories, N_ARMS)
    seeds = (13, 14)
    scores = index_of(config)(
        config, state, contexts_of(histories), [np.random.default_rng(s) for s in seeds])
    tau2 = 5.0 if setting != "covariates" else 10.0
    for b, h in enumerate(histories):
        rng = np.random.default_rng(seeds[b])
        shapes, rates, means, chols = [], [], [], []
        for m in range(n_models(config)):
            x_rows, y = rows_of(h, config, m)
            v = np.eye(DIM) / tau2 + x_rows.T @ x_rows
            g = x_rows.T @ y
            mean = np.linalg.inv(v) @ g
            shapes.append(2.0 + y.size / 2.0)
            rates.append(2.0 + 0.5 * g @ mean)
            means.append(mean)
            chols.append(np.linalg.cholesky(v))
        gammas = rng.standard_gamma(np.array(shapes))
        z = rng.standard_normal((n_models(config), DIM))
        for k in range(N_ARMS):
            m = model_of(config, k)
            sigma = rates[m] / gammas[m]
            sd = sigma if config.shared else math.sqrt(sigma)
            theta = means[m] + sd * np.linalg.solve(chols[m].T, z[m])
            assert scores[b, k] == pytest.approx(h.current[k] @ theta, rel=RTOL)


# --------------------------------------------------------------------------- LinTS-G


@pytest.mark.parametrize("setting", SETTINGS)
def test_authors_lints_g_reproduces_their_seeded_draw(setting: Setting) -> None:
    # Linear_TS_G: sigma = np.std(Y) of the model's rewards, theta ~ N(mean, sigma^2 V^-1),
    # V = I / tau^2 + X'X with tau^2 = 10 (= 1 / lambda).
    config = authors("lints-g", setting)
    histories = histories_for(setting, (5, 6))
    state = build_state(config, histories, N_ARMS)
    seeds = (11, 12)
    scores = index_of(config)(
        config, state, contexts_of(histories), [np.random.default_rng(s) for s in seeds])
    for b, h in enumerate(histories):
        z = np.random.default_rng(seeds[b]).standard_normal((n_models(config), DIM))
        for k in range(N_ARMS):
            m = model_of(config, k)
            x_rows, y = rows_of(h, config, m)
            v = np.eye(DIM) / 10.0 + x_rows.T @ x_rows
            theta = np.linalg.inv(v) @ x_rows.T @ y + np.std(y) * np.linalg.solve(
                np.linalg.cholesky(v).T, z[m])
            assert scores[b, k] == pytest.approx(h.current[k] @ theta, rel=RTOL)


def test_authors_lints_g_scores_an_arm_with_one_reward_greedily() -> None:
    # np.std of one reward is 0: no spread at all, where ours keeps v = 1.
    config = authors("lints-g", "covariates")
    state = init_state(config, N_ARMS)
    update(config, state, np.array([0]), np.ones((1, DIM)), np.array([0.7]))
    contexts = np.ones((1, N_ARMS, DIM))
    draws = [index_of(config)(config, state, contexts, [np.random.default_rng(s)])[0, 0]
             for s in range(5)]
    assert np.ptp(draws) == 0.0
    ours = paper_config("lints-g", "covariates", DIM)
    ours_draws = [index_of(ours)(ours, state, contexts, [np.random.default_rng(s)])[0, 0]
                  for s in range(5)]
    assert np.ptp(ours_draws) > 0.1


# --------------------------------------------------------------------------- LinPHE


def phe_closed_form(config: PolicyConfig, h: History) -> tuple[list[Array], list[Array]]:
    """Each model's theta mean and covariance under the authors' perturbation.

    Round i's pseudo-reward is ``-U + 2 U S_i``, ``(S_1..S_n, rest)`` multinomial
    with ``m = ceil(a n)`` trials, cell probabilities ``1/(2n)`` and ``1/2``:
    ``E S_i = m/(2n)``, ``Var S_i = m/(2n) - m/(4n^2)``, ``Cov(S_i, S_j) = -m/(4n^2)``.
    """
    a, u, lam, d = config.phe_a, config.reward_bound, config.reg, config.dim
    n = h.arms.size
    m = math.ceil(a * n)
    means, covariances = [], []
    for model in range(n_models(config)):
        x_rows, y = rows_of(h, config, model)
        v_inv = np.linalg.inv((1 + a) * (lam * np.eye(d) + x_rows.T @ x_rows))
        ones = np.ones(y.size)
        cov_s = m / (2 * n) * np.eye(y.size) - m / (4 * n**2) * np.outer(ones, ones)
        mean_z = (-u + 2 * u * m / (2 * n)) * ones
        means.append(v_inv @ x_rows.T @ (y + mean_z))
        covariances.append(v_inv @ x_rows.T @ (4 * u**2 * cov_s) @ x_rows @ v_inv)
    return means, covariances


def simulate_authors_phe(config: PolicyConfig, h: History, draws: int, seed: int) -> Array:
    """``Linear_PHE``'s scores, ``draws`` times, shape (draws, K): its binomial spread
    by a multinomial over all n past rounds; model k takes its own rounds' share."""
    rng = np.random.default_rng(seed)
    a, u, lam, d = config.phe_a, config.reward_bound, config.reg, config.dim
    n = h.arms.size
    total = rng.binomial(math.ceil(a * n), 0.5, size=draws)
    z = -u + 2 * u * rng.multinomial(total, np.full(n, 1.0 / n))  # (draws, n)
    scores = np.empty((draws, N_ARMS))
    for k in range(N_ARMS):
        model = model_of(config, k)
        rows = np.ones(n, dtype=bool) if config.shared else h.arms == model
        x_rows, y = h.x[rows], h.rewards[rows]
        v = (a + 1) * (lam * np.eye(d) + x_rows.T @ x_rows)
        thetas = np.linalg.solve(v, x_rows.T @ (y[None, :] + z[:, rows]).T).T
        scores[:, k] = thetas @ h.current[k]
    return scores


def score_moments(config: PolicyConfig, h: History) -> tuple[Array, Array]:
    means, covs = phe_closed_form(config, h)
    mean = np.array([h.current[k] @ means[model_of(config, k)] for k in range(N_ARMS)])
    cov = np.array([[h.current[k] @ covs[model_of(config, k)] @ h.current[j]
                     if model_of(config, k) == model_of(config, j) else 0.0
                     for j in range(N_ARMS)] for k in range(N_ARMS)])
    return mean, cov


def assert_score_moments(config: PolicyConfig, draws: Array, mean: Array, cov: Array) -> None:
    """The whole covariance with a shared model; per arm only each arm's own moments
    (the authors' one binomial correlates the arms slightly; ours draws them apart)."""
    if config.shared:
        assert_moments(draws, mean, cov)
        return
    for k in range(N_ARMS):
        assert_moments(draws[:, k : k + 1], mean[k : k + 1], cov[k : k + 1, k : k + 1])


N_DRAWS = 20_000


@pytest.mark.parametrize("setting", SETTINGS)
def test_authors_linphe_has_the_moments_of_their_perturbation(setting: Setting) -> None:
    config = authors("linphe", setting)
    (h,) = histories_for(setting, (9,), rounds=45)
    mean, cov = score_moments(config, h)
    # The closed form is that of the authors' explicit perturbation ...
    explicit = simulate_authors_phe(config, h, N_DRAWS, seed=3)
    assert_score_moments(config, explicit, mean, cov)
    # ... and of the variant's draws.
    state = build_state(config, [h], N_ARMS)
    rngs = np.random.default_rng(15).spawn(N_DRAWS)
    draws = index_of(config)(config, replicate(state, N_DRAWS),
                             np.repeat(h.current[None], N_DRAWS, axis=0), rngs)
    assert_score_moments(config, draws, mean, cov)
    # The shift is what sets it apart from ours: a = 0.5 pulls every estimate down.
    ours = paper_config("linphe", setting, DIM)
    ours_ready = prepare(ours, build_state(ours, [h], N_ARMS), h.current[None])
    ours_mean = index_of(ours).law(ours, ours_ready.prepared).mean[0]
    assert np.max(np.abs(ours_mean - mean)) > 0.05


# --------------------------------------------------------------------------- LinGIRO


def giro_history(config: PolicyConfig, h: History) -> list[tuple[Array, Array]]:
    """``Linear_GIRO``'s (X, Y) per model: each reward's row, then ``a`` rows
    ``(x, R_upper)`` and ``(x, R_lower)`` in turn, but for the shared model's
    first pass over the K arms (its rounds 1..K append the reward alone)."""
    a, u = int(config.giro_a), config.reward_bound
    xs: list[list[Array]] = [[] for _ in range(n_models(config))]
    ys: list[list[float]] = [[] for _ in range(n_models(config))]
    for t, (arm, x, r) in enumerate(zip(h.arms, h.x, h.rewards, strict=True)):
        m = model_of(config, int(arm))
        xs[m].append(x)
        ys[m].append(float(r))
        if config.shared and t < N_ARMS:
            continue
        for _ in range(a):
            xs[m] += [x, x]
            ys[m] += [u, -u]
    return [(np.array(x_rows).reshape(-1, config.dim), np.array(y))
            for x_rows, y in zip(xs, ys, strict=True)]


def giro_resample_moments(config: PolicyConfig, x_rows: Array, y: Array) -> tuple[Array, Array]:
    """Mean and covariance of ``theta_bar + A^-1 X*'(w - 1) e`` for their resample's counts
    ``w ~ Multinomial(s, 1/s)``: ``Cov w = I - 1 1'/s``, so ``X' (diag e^2 - e e'/s) X``."""
    a_matrix = x_rows.T @ x_rows + config.reg * np.eye(config.dim)
    a_inv = np.linalg.inv(a_matrix)
    theta = a_inv @ x_rows.T @ y
    e = y - x_rows @ theta
    meat = (x_rows.T * e**2) @ x_rows - np.outer(x_rows.T @ e, x_rows.T @ e) / y.size
    return theta, a_inv @ meat @ a_inv


def giro_score_moments(config: PolicyConfig, h: History) -> tuple[Array, Array]:
    moments = [giro_resample_moments(config, x_rows, y) for x_rows, y in giro_history(config, h)]
    mean = np.array([h.current[k] @ moments[model_of(config, k)][0] for k in range(N_ARMS)])
    cov = np.array([[h.current[k] @ moments[model_of(config, k)][1] @ h.current[j]
                     if model_of(config, k) == model_of(config, j) else 0.0
                     for j in range(N_ARMS)] for k in range(N_ARMS)])
    return mean, cov


def law_moments(config: PolicyConfig, state: State, contexts: Array) -> tuple[Array, Array]:
    """Mean and covariance of one experiment's scores from the index's law."""
    law = index_of(config).law(config, prepare(config, state, contexts).prepared)
    if law.loadings is not None:
        return law.mean[0], law.loadings[0] @ law.loadings[0].T
    assert law.spread is not None
    return law.mean[0], np.diag(law.spread[0] ** 2)


def test_authors_lingiro_by_hand() -> None:
    # One coordinate, two arms, U = 2, lambda = 0.1, a = 1. Shared model: the first
    # pass (0.5 on arm 0, -0.5 on arm 1) brings no pseudo-rows, the third reward
    # (1 on arm 0) brings (1, 2) and (1, -2): y = (0.5, -0.5, 1, 2, -2), x = 1.
    config = PolicyConfig("lingiro", "contextual", 1, variant="authors", reward_bound=2.0)
    state = init_state(config, 2)
    for arm, r in ((0, 0.5), (1, -0.5), (0, 1.0)):
        update(config, state, np.array([arm]), np.ones((1, 1)), np.array([r]))
    y = np.array([0.5, -0.5, 1.0, 2.0, -2.0])
    theta = y.sum() / (5 + 0.1)  # 1 / 5.1
    sum_e2 = (y**2).sum() - 2 * theta * y.sum() + 5 * theta**2
    variance = (sum_e2 - (0.1 * theta) ** 2 / 5) / 5.1**2  # 9.3997 / 26.01
    mean, cov = law_moments(config, state, np.ones((1, 2, 1)))
    np.testing.assert_allclose(mean, [theta, theta], rtol=RTOL)
    np.testing.assert_allclose(cov, np.full((2, 2), variance), rtol=RTOL)
    # A model per arm: every reward brings its pseudo-rows. Arm 0: (0.5, 2, -2) and
    # (1, 2, -2); arm 1: (-0.5, 2, -2).
    config = replace(config, setting="covariates")
    state = init_state(config, 2)
    for arm, r in ((0, 0.5), (1, -0.5), (0, 1.0)):
        update(config, state, np.array([arm]), np.ones((1, 1)), np.array([r]))
    mean, cov = law_moments(config, state, np.ones((1, 2, 1)))
    for k, y in enumerate([np.array([0.5, 2, -2, 1, 2, -2]), np.array([-0.5, 2, -2])]):
        theta = y.sum() / (y.size + 0.1)
        e = y - theta
        variance = ((e**2).sum() - (0.1 * theta) ** 2 / y.size) / (y.size + 0.1) ** 2
        assert mean[k] == pytest.approx(theta, rel=RTOL)
        assert cov[k, k] == pytest.approx(variance, rel=RTOL)


def test_authors_lingiro_per_arm_starts_as_their_loop() -> None:
    # Linear_GIRO with coefficient_sharing=False has no first pass: an arm without
    # rows has beta = 0 and scores 0, and np.argmax takes the first of equal scores.
    config = authors("lingiro", "covariates")
    assert not config.forces_pass and authors("lingiro", "contextual").forces_pass
    # ours pulls each arm first when asked to (the reproduction)
    assert paper_config("lingiro", "covariates", DIM, first_pass=True).forces_pass
    state = init_state(config, N_ARMS)
    contexts = np.ones((1, N_ARMS, DIM)) / math.sqrt(DIM)
    rngs = [np.random.default_rng(3)]
    assert choose(config, state, contexts, rngs).arms[0] == 0  # all tied at 0: the first
    update(config, state, np.array([0]), contexts[:, 0], np.array([0.9]))
    scores = index_of(config)(config, state, contexts, rngs)[0]
    assert scores[1] == 0.0 and scores[2] == -np.inf  # arm 1 stands for the untried arms
    # Arm 0 wins where its draw is above 0, else arm 1 is tried: never arm 2 before arm 1.
    arms = [choose(config, state, contexts, [np.random.default_rng(s)]).arms[0]
            for s in range(200)]
    assert set(arms) == {0, 1}
    with pytest.raises(ValueError, match="before every arm is pulled"):
        propensities(prepare(config, state, contexts))


@pytest.mark.parametrize("setting", SETTINGS)
def test_authors_lingiro_has_the_moments_of_their_resample(setting: Setting) -> None:
    config = authors("lingiro", setting)
    (h,) = histories_for(setting, (19,), rounds=45)
    mean, cov = giro_score_moments(config, h)
    state = build_state(config, [h], N_ARMS)
    law_mean, law_cov = law_moments(config, state, h.current[None])
    np.testing.assert_allclose(law_mean, mean, rtol=RTOL, atol=1e-12)
    # The variant assembles sum e^2 x x' from sums in r and x' theta_bar that cancel
    # (r^2 - 2 r x' theta + (x' theta)^2): a few digits fewer than the direct residuals.
    np.testing.assert_allclose(law_cov, cov, rtol=1e-7, atol=1e-7 * np.max(np.diag(cov)))
    # The draws have them too.
    rngs = np.random.default_rng(21).spawn(N_DRAWS)
    draws = index_of(config)(config, replicate(state, N_DRAWS),
                             np.repeat(h.current[None], N_DRAWS, axis=0), rngs)
    assert_score_moments(config, draws, mean, cov)
    # Ours pools the residuals and, with one shared model, gives the first pass
    # pseudo-rows too: another law, by far more than the tolerance above.
    ours = paper_config("lingiro", setting, DIM)
    _, ours_cov = law_moments(ours, build_state(ours, [h], N_ARMS), h.current[None])
    assert np.max(np.abs(np.diag(ours_cov) / np.diag(cov) - 1.0)) > 0.02


N_RESAMPLES, N_GAUSSIAN = 6_000, 12_000
# Sampling error of a ratio of two sample variances.
RESAMPLE_RATIO_SE = math.sqrt(2.0 / N_RESAMPLES + 2.0 / N_GAUSSIAN)
# What the Gaussian form neglects: the second-order terms of the resample's ratio
# (G*^-1 b*, of relative size d / s) with s >= 300 augmented rows per model.
SECOND_ORDER = 0.03


@pytest.mark.parametrize("setting", SHARED_AND_PER_ARM)
def test_authors_lingiro_matches_their_resample(setting: Setting) -> None:
    """``Linear_GIRO``'s ``np.random.choice(s, s)`` resample, fitted by ridge, against
    the Gaussian form on a 400-round history: means within 4 two-sample standard
    errors, each score's variance within ``4 RESAMPLE_RATIO_SE + SECOND_ORDER``
    (6% + 3%)."""
    config = authors("lingiro", setting)
    (h,) = histories_for(setting, (16,), rounds=400)
    state = build_state(config, [h], N_ARMS)
    rngs = np.random.default_rng(17).spawn(N_GAUSSIAN)
    drawn = index_of(config)(config, replicate(state, N_GAUSSIAN),
                             np.repeat(h.current[None], N_GAUSSIAN, axis=0), rngs)
    rng = np.random.default_rng(18)
    history = giro_history(config, h)
    explicit = np.empty((N_RESAMPLES, N_ARMS))
    for k in range(N_ARMS):
        x_rows, y = history[model_of(config, k)]
        assert y.size >= 300
        idx = rng.integers(0, y.size, size=(N_RESAMPLES, y.size))  # np.random.choice(s, s)
        xb, yb = x_rows[idx], y[idx]
        gram = np.einsum("bni,bnj->bij", xb, xb) + config.reg * np.eye(DIM)
        theta = np.linalg.solve(gram, np.einsum("bni,bn->bi", xb, yb)[..., None])[..., 0]
        explicit[:, k] = theta @ h.current[k]
    se = np.sqrt(explicit.var(axis=0) / N_RESAMPLES + drawn.var(axis=0) / N_GAUSSIAN)
    np.testing.assert_array_less(np.abs(explicit.mean(axis=0) - drawn.mean(axis=0)), 4 * se)
    ratio = explicit.var(axis=0) / drawn.var(axis=0)
    np.testing.assert_array_less(np.abs(ratio - 1.0), 4 * RESAMPLE_RATIO_SE + SECOND_ORDER)


# --------------------------------------------------------------------------- propensities


def ready_after(config: PolicyConfig, setting: Setting, seed: int) -> Any:
    (h,) = histories_for(setting, (seed,), rounds=30)
    state = build_state(config, [h], N_ARMS)
    return prepare(config, state, h.current[None])


@pytest.mark.parametrize(("name", "setting"), [
    ("linucb", "contextual"), ("linucb", "covariates"), ("linphe", "contextual"),
    ("linphe", "covariates"), ("lints-ig", "covariates"), ("lints-g", "contextual"),
    ("lints-g", "covariates"), ("lingiro", "contextual"), ("lingiro", "covariates"),
])
def test_the_authors_variants_propensities_against_their_draws(
    name: PolicyName, setting: Setting
) -> None:
    ready = ready_after(authors(name, setting), setting, seed=4)
    p = check_against_monte_carlo(ready, seed=1, draws=400_000)
    assert p.sum() == pytest.approx(1.0, abs=0.01)


def test_the_authors_shared_lints_ig_declares_no_propensity() -> None:
    # sigma^2 z with sigma^2 = rate / G is neither normal nor Student t.
    ready = ready_after(authors("lints-ig", "contextual"), "contextual", seed=4)
    with pytest.raises(ValueError, match="no propensity"):
        propensities(ready)


# --------------------------------------------------------------------------- centres once


def test_centres_drawn_once_are_shared_by_every_repetition() -> None:
    shared = Environment(make_spec("contextual", 4, centres_seed=11), seeded_rngs(0, 3))
    assert shared.arm_features is not None
    assert np.array_equal(shared.arm_features[0], shared.arm_features[2])
    assert not np.array_equal(shared.theta[0], shared.theta[1])  # theta stays per repetition
    # A repetition alone sees the same centres and theta as in the batch.
    alone = Environment(make_spec("contextual", 4, centres_seed=11), seeded_rngs(0, 1, start=2))
    assert alone.arm_features is not None
    assert np.array_equal(alone.arm_features[0], shared.arm_features[2])
    assert np.array_equal(alone.theta[0], shared.theta[2])
    # The default draws them per repetition.
    own = Environment(make_spec("contextual", 4), seeded_rngs(0, 3))
    assert own.arm_features is not None
    assert not np.array_equal(own.arm_features[0], own.arm_features[2])


# --------------------------------------------------------------------------- readings


@pytest.mark.parametrize("reading", ["authors", "literal"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_linucb_noise_scale_is_the_worlds_noise_sd(setting: Setting, reading: Reading) -> None:
    # Our LinUCB's R is the noise sd of the world it plays in; the literal
    # covariates world has variance 0.1 (sd 0.316), not the authors' sd 0.1.
    cell = Cell(setting, 5, "linucb", reading=reading)
    assert cell.config().noise_sd == pytest.approx(cell.env_spec().noise_sd)
    # The authors' LinUCB keeps R = 1 in either world.
    authors_cell = Cell(setting, 5, "linucb", reading=reading, overrides=(("variant", "authors"),))
    assert authors_cell.config().noise_sd == 1.0


@pytest.mark.parametrize("reading", ["authors", "literal"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_the_reward_bound_holds_in_the_world(setting: Setting, reading: Reading) -> None:
    """LinPHE/LinGIRO's U bounds |reward| but for a tail: the authors' rule is a bound
    on the mean plus three noise sd, so each reward exceeds it with probability at
    most 2 Phi(-3) = 0.27% (plus the rare contexts beyond the mean's bound)."""
    cell = Cell(setting, 5, "linphe", reading=reading)
    bound = cell.config().reward_bound
    env = Environment(cell.env_spec(), seeded_rngs(0, 20))
    sd = env.noise_sd
    beyond = []
    for _ in range(100):
        means = env.means(env.contexts())
        beyond.append(ndtr((-bound - means) / sd) + ndtr((means - bound) / sd))
    assert float(np.mean(beyond)) < 0.01
