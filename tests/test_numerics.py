"""Numeric torture: ill-conditioned statistics and large rewards keep every policy serving.

Issue 8, finding 1: with raw contexts of 1e6 (inside the documented bound)
repeated a few hundred times, ``X'X + lambda I`` had a condition number near
1e16 and Cholesky failed: every ``/choose`` and ``GET`` of the experiment
answered 500 for good. ``policies.ridge`` now solves the equilibrated system
with a relative floor (module notes there); these tests hold it to a
high-precision reference (mpmath, 60 digits, on the same float64 sums).

Tolerances. The floored, equilibrated system has condition number at most
``kappa = (d + JITTER) / JITTER`` (unit diagonal, so lambda_max <= d;
lambda_min >= JITTER). A backward-stable solve (LU with partial pivoting,
backward error about ``d * eps`` relative) is then accurate to
``tol = 8 d eps kappa`` relative, with a factor 8 for the growth and the
scaling's own rounding. Predictions for the contexts that were observed must
match the *exact* ridge fit (no floor) to the same ``tol``: along
well-determined directions the floor moves them by about ``JITTER``, far below it.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
import pytest
from numpy.typing import NDArray

from policies import (
    HYPERPARAMETERS,
    POLICIES,
    RANGES,
    PolicyConfig,
    PolicyName,
    State,
    choose,
    init_state,
    paper_config,
    update,
)
from policies.indices import residual_sum_of_squares, reward_variance
from policies.ridge import JITTER, Equilibrated, cholesky, factorise, lu_solve, ridge, solve
from tests.conftest import Api

Array = NDArray[Any]
EPS = float(np.finfo(np.float64).eps)
REG = 0.1


def tolerance(d: int) -> float:
    return 8 * d * EPS * (d + JITTER) / JITTER


def reference(gram: Array, xty: Array, reg: float, floor: bool) -> Array:
    """High-precision ridge estimate from the float64 sums (with ``floor``: the floored system)."""
    with mpmath.workdps(60):
        d = gram.shape[0]
        a = mpmath.matrix(d, d)
        for i in range(d):
            for j in range(d):
                a[i, j] = mpmath.mpf(float(gram[i, j]))
            a[i, i] += reg
            if floor:
                a[i, i] *= 1 + mpmath.mpf(JITTER)
        b = mpmath.matrix([mpmath.mpf(float(v)) for v in xty])
        return np.array([float(v) for v in mpmath.lu_solve(a, b)])


def repeated_context(d: int, n: int) -> Array:
    """The issue's case: the context [1e6, ..., 1e6] every time."""
    return np.full((n, d), 1e6)


def collinear_raw_features(d: int, n: int) -> Array:
    """Prices, counts, a constant column, and scaled copies of them."""
    rng = np.random.default_rng(d)
    price = rng.uniform(1e5, 1e6, n)
    base = [price, rng.poisson(1e3, n).astype(float), np.ones(n), 2.0 * price]
    columns = [base[i % 4] * (1 + i // 4) if i % 5 else rng.uniform(0, 1e6, n) for i in range(d)]
    return np.column_stack(columns)


CASES = [
    ("repeated", 3, 399),  # the reproduction
    ("repeated", 3, 100_000),
    ("repeated", 64, 71),  # the reproduction at dim 64
    ("repeated", 64, 100_000),
    ("collinear", 20, 100_000),
    ("collinear", 64, 20_000),
]


def sums(kind: str, d: int, n: int) -> tuple[Array, Array, Array]:
    x = repeated_context(d, n) if kind == "repeated" else collinear_raw_features(d, n)
    rewards = np.random.default_rng(n).normal(1.0, 1.0, n)
    return x, x.T @ x, x.T @ rewards


@pytest.mark.parametrize(("kind", "d", "n"), CASES)
def test_ridge_matches_a_high_precision_reference(kind: str, d: int, n: int) -> None:
    x, gram, xty = sums(kind, d, n)
    theta = ridge(gram[None], xty[None], REG)[0]
    assert np.isfinite(theta).all()
    floored = reference(gram, xty, REG, floor=True)
    error = np.linalg.norm(theta - floored) / np.linalg.norm(floored)
    assert error <= tolerance(d)
    exact = reference(gram, xty, REG, floor=False)
    observed = np.unique(x[:200], axis=0)
    scale = np.abs(observed) @ np.abs(exact)
    assert np.all(np.abs(observed @ theta - observed @ exact) <= tolerance(d) * scale)


@pytest.mark.parametrize(("kind", "d", "n"), CASES)
def test_factor_solves_and_draws_stay_finite(kind: str, d: int, n: int) -> None:
    x, gram, xty = sums(kind, d, n)
    factor = factorise(gram[None, None], REG)
    z = np.random.default_rng(0).standard_normal((1, 1, d))
    assert np.isfinite(factor.colour(z)).all()
    assert np.isfinite(factor.times_root(z)).all()
    probes = np.vstack([x[:1] / 1e6, np.eye(d)[:3]]).T  # (d, 4)
    norms = np.einsum("ij,ij->j", probes, solve(gram, REG, probes))  # x' A^-1 x, as LinUCB
    assert np.isfinite(norms).all() and (norms >= 0).all()
    # A^-1 b by the factor agrees with the solve (same floored system).
    theta = ridge(gram[None, None], xty[None, None], REG)
    np.testing.assert_allclose(factor.solve(xty[None, None]), theta, rtol=tolerance(d))


def torture_state(name: str, setting: str, d: int, n: int) -> tuple[PolicyConfig, State]:
    """Every one of 3 arms rewarded n times with the context [1e6, ...] (as the service would)."""
    config = paper_config(name, setting, d)  # type: ignore[arg-type]
    state = init_state(config, 3)
    rewards = np.random.default_rng(1).normal(1.0, 1.0, 3 * n)
    x = np.full((1, d), 1e6)
    for i, reward in enumerate(rewards):
        update(config, state, np.array([i % 3]), x, np.array([reward]))
    return config, state


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("setting", ["stochastic", "contextual", "covariates"])
def test_every_policy_decides_on_ill_conditioned_statistics(name: str, setting: str) -> None:
    d = 3
    config, state = torture_state(name, setting, d, 399)
    contexts = np.tile(np.array([1.0, -2.0, 0.5]), (1, 3, 1))
    for seed in range(5):
        choice = choose(config, state, contexts, [np.random.default_rng(seed)])
        assert np.isfinite(choice.scores).all()


def test_an_indefinite_row_is_redone_alone_and_does_not_disturb_the_batch() -> None:
    d = 4
    rng = np.random.default_rng(3)
    good = rng.normal(size=(50, d))
    good_gram = good.T @ good
    # Far more indefinite than rounding could make it: only the spectral path copes.
    v = np.ones(d) / 2
    bad_gram = 1e3 * np.outer(v, v) - 5.0 * np.eye(d)
    xty = rng.normal(size=(2, d))
    stack = np.stack([good_gram, bad_gram])
    together = ridge(stack, xty, REG)
    for row in range(2):
        alone = ridge(stack[row: row + 1], xty[row: row + 1], REG)
        np.testing.assert_array_equal(together[row], alone[0])
    assert np.isfinite(together).all()
    # The fallback clips the negative eigenvalues: the floored estimate of the PSD part.
    factor = factorise(stack, REG)
    assert np.isfinite(factor.solve(xty)).all()


def test_the_lapack_gufuncs_give_numpy_linalgs_bits_and_nan_for_a_refused_row() -> None:
    """ridge.lu_solve and ridge.cholesky call numpy.linalg's gufuncs without the wrapper:
    the same numbers, and a NaN row where numpy.linalg raises for the whole stack."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 2, 30, 7))
    grams = np.swapaxes(x, -1, -2) @ x + np.eye(7)
    rhs = rng.normal(size=(3, 2, 7, 4))
    assert np.array_equal(lu_solve(grams, rhs), np.linalg.solve(grams, rhs))
    assert np.array_equal(cholesky(grams), np.linalg.cholesky(grams))
    grams[1, 0] = np.zeros((7, 7))  # singular, and not positive definite
    solved, root = lu_solve(grams, rhs), cholesky(grams)
    assert np.isnan(solved[1, 0]).all() and np.isnan(root[1, 0]).all()
    for row in ((0, 0), (1, 1), (2, 1)):
        assert np.array_equal(solved[row], np.linalg.solve(grams[row], rhs[row]))
        assert np.array_equal(root[row], np.linalg.cholesky(grams[row]))


def test_a_singular_row_of_an_equilibrated_system_is_solved_spectrally_alone() -> None:
    """LU gives NaN for an exactly singular row; the check sends it, and only it, down
    the spectral path (the pseudo-inverse solution of the floored system)."""
    system = np.stack([np.eye(3) * 2.0, np.zeros((3, 3))])[:, None]
    rhs = np.ones((2, 1, 3, 1))
    solved = Equilibrated(system, np.ones((2, 1, 3))).solve(rhs)
    assert np.array_equal(solved[0], np.full((1, 3, 1), 0.5))
    np.testing.assert_allclose(solved[1], np.full((1, 3, 1), 1.0 / JITTER))
    root = Equilibrated(system, np.ones((2, 1, 3))).factor().root
    np.testing.assert_allclose(root[1, 0] @ root[1, 0].T, JITTER * np.eye(3), rtol=1e-12)


def test_a_bare_gram_with_a_rounded_negative_diagonal_is_factorised_as_untouched() -> None:
    """Without a ridge, a diagonal entry that is 0 or rounded below it (a second-moment
    matrix made by cancellation: the authors' LinGIRO) gets scale 1 and the floor, in a
    stack with or without an exact 0 elsewhere, alone or beside others: finite, and
    the same bits either way."""
    bad = np.diag([4.0, -1e-17, 9.0])
    rows = np.stack([bad, np.diag([1.0, 2.0, 3.0]), np.diag([0.0, 1.0, 1.0])])
    for stack in (rows[:1], rows[:2], rows):
        root = factorise(stack[:, None], 0.0).root
        assert np.isfinite(root).all()
        np.testing.assert_array_equal(root[0, 0], factorise(bad[None, None], 0.0).root[0, 0])
    floored = Equilibrated.of(bad[None, None], 0.0)
    assert np.array_equal(floored.scale[0, 0], [0.5, 1.0, 1.0 / 3.0])
    assert floored.system[0, 0, 1, 1] == JITTER


@pytest.mark.parametrize("reg", [0.1, 0.0])
def test_perturbed_systems_share_one_scaling(reg: float) -> None:
    """LinPHE's and LinGIRO's ``G = w X'X + reg I`` equilibrated as on its own (the same
    scale, bit for bit; the entries to a couple of ulps: the product's order differs), and
    ``X'X`` in G's scaling, whose factor's root is ``X'X`` floored by JITTER of G's
    diagonal (features of scales 1e-2 to 1e3; a coordinate no data touched, without a
    ridge, gets scale 1 and the floor)."""
    from policies.ridge import perturbed_systems

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 1, 30, 4)) * np.array([1.0, 1e3, 1e-2, 10.0])
    x[1, ..., 2] = 0.0  # untouched
    xtx = np.swapaxes(x, -1, -2) @ x
    weight = 1.5
    gram, bare = perturbed_systems(xtx, weight, reg)
    alone = Equilibrated.of(weight * xtx, reg)
    np.testing.assert_array_equal(gram.scale, alone.scale)
    np.testing.assert_allclose(gram.system, alone.system, rtol=4e-16, atol=0.0)
    assert np.array_equal(bare.scale, gram.scale)
    # X'X in G's scaling plus the floor: in the original coordinates X'X + JITTER diag(G).
    scale = gram.scale
    expected = scale[..., :, None] * xtx * scale[..., None, :] + JITTER * np.eye(4)
    np.testing.assert_allclose(bare.system, expected, rtol=4e-16, atol=1e-300)
    root = bare.factor().root
    np.testing.assert_allclose(root @ np.swapaxes(root, -1, -2), expected, rtol=1e-12,
                               atol=1e-15)
    untouched = 1.0 if reg == 0.0 else 1.0 / math.sqrt(reg)
    assert scale[1, 0, 2] == untouched and bare.system[1, 0, 2, 2] == JITTER


@pytest.mark.anyio
@pytest.mark.parametrize(("d", "n"), [(3, 399), (64, 71)])
async def test_the_service_keeps_serving_an_ill_conditioned_experiment(
    api: Api, d: int, n: int
) -> None:
    # The reproduction: these n rewards made /choose, GET and the list 500.
    spec = {"id": "big", "setting": "covariates", "dim": d, "seed": 5,
            "arms": [{"id": "only"}]}
    key = await api.create(spec)
    context = {"experiment_id": "big", "context": [1e6] * d}
    rewards = np.random.default_rng(2).normal(1.0, 1.0, n)
    for reward in rewards:
        decision_id = await api.decide(key, context)
        response = await api.reward(
            key, {"experiment_id": "big", "decision_id": decision_id, "reward": float(reward)})
        assert response.status_code == 200, response.text
    other = {"experiment_id": "big", "context": [1.0] + [0.0] * (d - 1)}
    assert (await api.choose(key, other)).status_code == 200
    assert await api.ids() == ["big"]
    theta = np.array((await api.experiment("big"))["theta_hat"]["only"])
    x = np.full(d, 1e6)
    exact = reference(n * np.outer(x, x), rewards.sum() * x, REG, floor=False)
    np.testing.assert_allclose(x @ theta, x @ exact, rtol=tolerance(d))


# -- finding 2: sums about the first reward ---------------------------------------
#
# RSS_k = sum r^2 - 2 mu sum r + s mu^2 cancels catastrophically when rewards are
# large against their spread. The state now keeps sums about each arm's first
# reward (policies.state). The reference below is exact to ~1e-16: for rewards
# and mu within a factor of 2 of each other, r - mu is exact in float64
# (Sterbenz), and math.fsum adds the squares with one rounding.

LARGE_MEANS = [  # (mean, sd, pulls): the cases
    (1e3, 1e-3, 1_000_000),
    (1e6, 1.0, 100_000),
    (1e6, 1e-2, 100_000),  # mean / sd = 1e8: the raw RSS goes negative
]


def arm_state(config: PolicyConfig, rewards: Array) -> State:
    """One arm's state after ``rewards``, added one by one as ``update`` adds them.

    ``np.cumsum`` adds left to right like a sequence of updates (checked bit
    for bit below), at a fraction of the cost of a million ``update`` calls.
    """
    state = init_state(config, 1)
    deviation = rewards - rewards[0]
    state["pulls"][0, 0] = state["n"][0, 0] = rewards.size
    state["shift_r"][0, 0] = state["shift_y"][0, 0] = rewards[0]
    state["sum_dr"][0, 0] = state["sum_dy"][0, 0] = np.cumsum(deviation)[-1]
    state["sum_dr2"][0, 0] = state["sum_dy2"][0, 0] = np.cumsum(deviation * deviation)[-1]
    return state


def test_update_adds_rewards_one_by_one_like_cumsum() -> None:
    config = paper_config("linreboot", "stochastic", 1)
    rewards = np.random.default_rng(4).normal(1e6, 1.0, 2_000)
    state = init_state(config, 1)
    for reward in rewards:
        update(config, state, np.array([0]), np.ones((1, 1)), np.array([reward]))
    shortcut = arm_state(config, rewards)
    for name in ("pulls", "shift_r", "sum_dr", "sum_dr2", "n", "shift_y", "sum_dy", "sum_dy2"):
        np.testing.assert_array_equal(state[name], shortcut[name], err_msg=name)


@pytest.mark.parametrize(("mean", "sd", "pulls"), LARGE_MEANS)
def test_rss_and_reward_variance_keep_their_digits(mean: float, sd: float, pulls: int) -> None:
    config = paper_config("linreboot", "stochastic", 1)
    rewards = np.random.default_rng(pulls).normal(mean, sd, pulls)
    state = arm_state(config, rewards)
    mu = np.array([[mean + 0.5 * sd]])
    rss = residual_sum_of_squares(config, state, mu, np.zeros((1, 1, 1)))[0, 0]
    exact = math.fsum(float(e) * float(e) for e in rewards - mu[0, 0])
    assert abs(rss - exact) <= 1e-9 * exact
    sample_mean = math.fsum(rewards) / pulls
    exact_variance = math.fsum((float(r) - sample_mean) ** 2 for r in rewards) / (pulls - 1)
    variance = reward_variance(state)[0, 0]
    assert abs(variance - exact_variance) <= 1e-9 * exact_variance
    # The raw decomposition the sums replaced misses by far more than that.
    total, squares = rewards.sum(), np.cumsum(rewards * rewards)[-1]
    raw = squares - 2 * mu[0, 0] * total + pulls * mu[0, 0] ** 2
    assert abs(raw - exact) > 1e-6 * exact


@pytest.mark.anyio
async def test_the_api_reports_mean_and_rss_of_large_rewards_precisely(api: Api) -> None:
    key = await api.create({"id": "big", "setting": "covariates", "dim": 1, "seed": 1,
                            "arms": [{"id": "only"}]})
    rewards = np.random.default_rng(6).normal(999_000.0, 1.0, 300)
    for reward in rewards:
        decision_id = await api.decide(key, {"experiment_id": "big", "context": [1.0]})
        response = await api.reward(
            key, {"experiment_id": "big", "decision_id": decision_id, "reward": float(reward)})
        assert response.json()["status"] == "applied"
    arm = (await api.experiment("big"))["arms"][0]
    mean = math.fsum(rewards) / rewards.size
    exact = math.fsum((float(r) - mean) ** 2 for r in rewards)
    assert arm["mean_reward"] == pytest.approx(mean, rel=1e-15)
    assert arm["rss"] == pytest.approx(exact, rel=1e-9)  # the raw formula: 4e-4


# -- finding 3: every hyperparameter at either end of its range ---------------------


def corner(policy: PolicyName, end: str) -> dict[str, float]:
    """Every hyperparameter the policy takes at the low or the high end of its range."""
    return {name: getattr(RANGES[name], end) for name in HYPERPARAMETERS[policy]
            if name in RANGES}


@pytest.mark.anyio
@pytest.mark.parametrize("end", ["low", "high"])
@pytest.mark.parametrize("policy", [*POLICIES, "linreboot:paper", "linreboot:paper:pass",
                                    "linucb:pass"])
async def test_hyperparameters_at_their_extremes_keep_every_policy_serving(
    api: Api, policy: str, end: str
) -> None:
    # linreboot runs the service's default spread (pooled); linreboot:paper the paper's;
    # ":pass" adds the paper's first pass.
    name, *options = policy.split(":")
    hyper: dict[str, object] = {**corner(name, end)}  # type: ignore[arg-type]
    if "paper" in options:
        hyper["spread"] = "paper"
    if "pass" in options:
        hyper["first_pass"] = True
    spec = {"id": "edge", "setting": "covariates", "dim": 3, "seed": 9, "policy": name,
            "arms": [{"id": "a"}, {"id": "b"}], "hyperparameters": hyper}
    key = await api.create(spec)
    first_pass = (await api.experiment("edge"))["config"]["first_pass"]
    rng = np.random.default_rng(3)
    pulled: set[str] = set()
    for i in range(24):
        context = [1e6, -1e6, 1e6] if i % 3 else rng.normal(size=3).tolist()
        response = await api.choose(key, {"experiment_id": "edge", "context": context})
        assert response.status_code == 200, response.text
        decision = response.json()
        # An arm pulled before has a number for its index (with epsilon 1 an arm
        # may be left unexplored longer: every choice is uniform); without a
        # first pass no arm is chosen for being unexplored.
        assert decision["exploring"] is (first_pass and decision["arm_id"] not in pulled)
        assert decision["exploring"] or math.isfinite(decision["index"])
        pulled.add(decision["arm_id"])
        reward = float(rng.choice([-1e6, 1e6, 0.5]))
        assert (await api.reward(key, {"experiment_id": "edge", "reward": reward,
                                       "decision_id": decision["decision_id"]})).status_code \
            == 200
    view = await api.experiment("edge")
    assert all(math.isfinite(v) for theta in view["theta_hat"].values() for v in theta)
