"""Tests for loadtest.environments: the paper's three seeded synthetic worlds.

Statistical checks use fixed seeds and tolerances derived from the sampling
distribution (5 standard errors); float checks use rounding-error bounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from loadtest.environments import (
    READINGS,
    SETTINGS,
    Environment,
    EnvSpec,
    Reading,
    Setting,
    instant_regret,
    make_spec,
    optimal_arm,
    seeded_rngs,
    split_rngs,
)

EPS = float(np.finfo(np.float64).eps)
ALL = [(s, r) for s in SETTINGS for r in READINGS]
Z = 5.0  # standard errors allowed in statistical checks


def _env(
    setting: Setting,
    reading: Reading = "authors",
    *,
    batch: int = 3,
    seed: int = 0,
    dim: int = 5,
    start: int = 0,
    block_rounds: int | None = None,
) -> Environment:
    spec = make_spec(setting, dim, reading=reading)
    return Environment(spec, seeded_rngs(seed, batch, start=start), block_rounds=block_rounds)


def _arms(t: int, reps: np.ndarray, n_arms: int) -> np.ndarray:
    """A deterministic arm schedule that depends on the round and the repetition index."""
    return (7 * t + 3 * reps) % n_arms


def _run(env: Environment, rounds: int, start: int = 0) -> tuple[np.ndarray, ...]:
    """Play `rounds` rounds; returns contexts (T,B,K,d), means (T,B,K), arms, rewards (T,B)."""
    reps = np.arange(start, start + env.batch)
    xs, mus, arms, rs = [], [], [], []
    for t in range(rounds):
        x = env.contexts()
        a = _arms(t, reps, env.spec.n_arms)
        xs.append(x)
        mus.append(env.means(x))
        arms.append(a)
        rs.append(env.rewards(x, a))
    return np.stack(xs), np.stack(mus), np.stack(arms), np.stack(rs)


def _norm_rtol(dim: int) -> float:
    # Normalising and then re-measuring a norm each cost at most about (d + 2) eps of
    # relative rounding (d products and sums, one sqrt, one division); a factor 2 of slack.
    return 4 * (dim + 2) * EPS


# --------------------------------------------------------------------------- specs


def test_make_spec_uses_the_paper_arm_counts() -> None:
    assert make_spec("stochastic", 5).n_arms == 100
    assert make_spec("contextual", 5).n_arms == 100
    assert make_spec("covariates", 5).n_arms == 10
    assert make_spec("covariates", 5, n_arms=4).n_arms == 4
    assert make_spec("stochastic", 5).reading == "authors"


@pytest.mark.parametrize(
    ("setting", "reading", "variance"),
    [
        ("stochastic", "authors", 0.1),
        ("stochastic", "literal", 0.1),
        ("contextual", "authors", 0.5),
        ("contextual", "literal", 0.5),
        ("covariates", "authors", 0.01),  # the authors' code: sd 0.1
        ("covariates", "literal", 0.1),
    ],
)
def test_noise_sd_per_setting_and_reading(
    setting: Setting, reading: Reading, variance: float
) -> None:
    assert make_spec(setting, 5, reading=reading).noise_sd == pytest.approx(math.sqrt(variance))


def test_a_noise_sd_replaces_the_settings_and_changes_only_the_noise() -> None:
    """Worlds of other shapes (issue 24's test set): the same truth and contexts, the
    noise scaled."""
    plain = Environment(make_spec("contextual", 3, n_arms=7), seeded_rngs(4, 2))
    loud = Environment(make_spec("contextual", 3, n_arms=7, noise=1.0), seeded_rngs(4, 2))
    assert loud.noise_sd == 1.0 and plain.noise_sd == pytest.approx(math.sqrt(0.5))
    np.testing.assert_array_equal(plain.theta, loud.theta)
    np.testing.assert_array_equal(plain.contexts(), loud.contexts())
    np.testing.assert_allclose(loud.noise(), plain.noise() / math.sqrt(0.5), rtol=1e-15)
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="noise"):
            make_spec("stochastic", 3, noise=bad)


@pytest.mark.parametrize(
    ("setting", "dim", "n_arms", "reading"),
    [
        ("bogus", 5, 10, "authors"),
        ("stochastic", 5, 10, "bogus"),
        ("stochastic", 0, 10, "authors"),
        ("stochastic", -3, 10, "authors"),
        ("stochastic", 2.5, 10, "authors"),
        ("stochastic", True, 10, "authors"),
        ("covariates", 5, 0, "authors"),
    ],
)
def test_invalid_spec_is_rejected(setting: Any, dim: Any, n_arms: Any, reading: Any) -> None:
    with pytest.raises(ValueError):
        EnvSpec(setting=setting, dim=dim, n_arms=n_arms, reading=reading)


def test_make_spec_rejects_unknown_setting() -> None:
    bogus: Any = "bogus"
    with pytest.raises(ValueError):
        make_spec(bogus, 5)


# --------------------------------------------------------------------------- seeding


def _first_draws(rngs: list[np.random.Generator]) -> np.ndarray:
    return np.stack([rng.random(4) for rng in rngs])


def test_seeded_rngs_are_seedsequence_children() -> None:
    children = np.random.SeedSequence(42).spawn(5)
    expected = _first_draws([np.random.default_rng(c) for c in children])
    np.testing.assert_array_equal(_first_draws(seeded_rngs(42, 5)), expected)


def test_seeded_rngs_start_reproduces_one_repetition() -> None:
    full = _first_draws(seeded_rngs(42, 5))
    np.testing.assert_array_equal(_first_draws(seeded_rngs(42, 1, start=3))[0], full[3])


def test_split_rngs_gives_distinct_streams_and_respects_start() -> None:
    env, policy = split_rngs(42, 4)
    env_draws, policy_draws = _first_draws(env), _first_draws(policy)
    assert not np.any(env_draws == policy_draws)
    assert not np.any(env_draws == _first_draws(seeded_rngs(42, 4)))
    env2, policy2 = split_rngs(42, 1, start=2)
    np.testing.assert_array_equal(_first_draws(env2)[0], env_draws[2])
    np.testing.assert_array_equal(_first_draws(policy2)[0], policy_draws[2])


@pytest.mark.parametrize(("batch", "start"), [(0, 0), (2, -1)])
def test_seeded_rngs_rejects_bad_ranges(batch: int, start: int) -> None:
    with pytest.raises(ValueError):
        seeded_rngs(0, batch, start=start)


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(("setting", "reading"), ALL)
def test_shapes(setting: Setting, reading: Reading) -> None:
    env = _env(setting, reading, batch=3, dim=4)
    k, d = env.spec.n_arms, 4
    x = env.contexts()
    assert env.batch == 3
    assert x.shape == (3, k, d)
    assert env.means(x).shape == (3, k)
    assert env.rewards(x, np.zeros(3, dtype=int)).shape == (3,)
    if setting == "covariates":
        assert env.theta.shape == (3, k, d)
        assert env.arm_features is None
    else:
        assert env.theta.shape == (3, d)
        assert env.arm_features is not None
        assert env.arm_features.shape == (3, k, d)


@pytest.mark.parametrize(("setting", "reading"), ALL)
def test_contexts_and_truth_are_read_only(setting: Setting, reading: Reading) -> None:
    env = _env(setting, reading)
    x = env.contexts()
    with pytest.raises(ValueError):
        x[0, 0, 0] = 1.0
    with pytest.raises(ValueError):
        env.theta[0, 0] = 1.0


# --------------------------------------------------------------------------- truth


@pytest.mark.parametrize("setting", ["stochastic", "contextual"])
def test_shared_theta_and_arm_features_have_unit_norm(setting: Setting) -> None:
    dim = 7
    env = _env(setting, batch=6, dim=dim)
    assert env.arm_features is not None
    rtol = _norm_rtol(dim)
    np.testing.assert_allclose(np.linalg.norm(env.theta, axis=-1), 1.0, rtol=rtol)
    np.testing.assert_allclose(np.linalg.norm(env.arm_features, axis=-1), 1.0, rtol=rtol)
    assert np.all(env.arm_features >= 0.0)  # U(0, 1) entries, positively scaled
    assert np.all(np.abs(env.theta) <= 1.0)


def test_covariates_theta_norms_are_k_over_k() -> None:
    dim = 6
    env = _env("covariates", batch=4, dim=dim)
    n_arms = env.spec.n_arms
    target = np.arange(1, n_arms + 1) / n_arms
    norms = np.linalg.norm(env.theta, axis=-1)
    np.testing.assert_allclose(norms, np.broadcast_to(target, norms.shape), rtol=_norm_rtol(dim))


def test_covariates_theta_sign_structure() -> None:
    dim, batch = 20, 50
    env = _env("covariates", batch=batch, dim=dim)
    magnitudes = np.abs(env.theta)
    # Entries are +-1 + U(-0.95, 0.95) before a common scaling: |entry| in [0.05, 1.95].
    ratio = magnitudes.max(axis=-1) / magnitudes.min(axis=-1)
    assert np.all(ratio <= (1.95 / 0.05) * (1 + 8 * EPS))
    # The number of negative entries is Binomial(d, 1/2): mean d/2, variance d/4.
    n_minus = np.sum(env.theta < 0, axis=-1).ravel()
    n = n_minus.size
    assert abs(n_minus.mean() - dim / 2) <= Z * math.sqrt(dim / 4 / n)


def test_stochastic_contexts_are_fixed_and_consume_no_randomness() -> None:
    a, b = _env("stochastic", seed=3), _env("stochastic", seed=3)
    first = a.contexts()
    for _ in range(5):
        np.testing.assert_array_equal(a.contexts(), first)
    arms = np.array([0, 1, 2])
    np.testing.assert_array_equal(a.rewards(first, arms), b.rewards(b.contexts(), arms))


@pytest.mark.parametrize("reading", READINGS)
def test_covariates_context_is_shared_by_all_arms(reading: Reading) -> None:
    env = _env("covariates", reading, batch=4)
    for _ in range(3):
        x = env.contexts()
        np.testing.assert_array_equal(x, np.broadcast_to(x[:, :1, :], x.shape))


@pytest.mark.parametrize("setting", ["contextual", "covariates"])
def test_authors_contexts_are_the_literal_draws_rescaled(setting: Setting) -> None:
    dim = 6
    authors = _env(setting, "authors", seed=9, dim=dim)
    literal = _env(setting, "literal", seed=9, dim=dim)
    for _ in range(40):
        x_a, x_l = authors.contexts(), literal.contexts()
        np.testing.assert_allclose(np.linalg.norm(x_a, axis=-1), 1.0, rtol=_norm_rtol(dim))
        expected = x_l / np.linalg.norm(x_l, axis=-1, keepdims=True)
        np.testing.assert_allclose(x_a, expected, rtol=_norm_rtol(dim), atol=0.0)


@pytest.mark.parametrize("setting", ["contextual", "covariates"])
def test_literal_context_draws_have_promised_mean_and_variance(setting: Setting) -> None:
    rounds = 400
    env = _env(setting, "literal", batch=2, seed=5)
    draws = np.stack([env.contexts() for _ in range(rounds)])  # (T, B, K, d)
    if setting == "contextual":
        assert env.arm_features is not None
        centre, var = env.arm_features, 1.0 / (2 * env.spec.n_arms)
    else:
        draws = draws[:, :, :1, :]  # one context per repetition and round
        centre, var = np.zeros(draws.shape[1:]), 1.0
    resid = draws - centre
    # Per coordinate, the mean of T draws is N(0, var / T): standardised, these are
    # independent N(0, 1) across coordinates.
    z = resid.mean(axis=0) / math.sqrt(var / rounds)
    n_coords = z.size
    assert abs(z.mean()) <= Z / math.sqrt(n_coords)
    assert abs(np.mean(z**2) - 1.0) <= Z * math.sqrt(2.0 / n_coords)
    # Pooled variance about the known centre: chi-square with n degrees of freedom.
    n = resid.size
    assert abs(np.mean(resid**2) - var) <= Z * var * math.sqrt(2.0 / n)


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.parametrize(("setting", "reading"), ALL)
def test_same_seed_gives_identical_draws(setting: Setting, reading: Reading) -> None:
    one = _run(_env(setting, reading, seed=11), 20)
    two = _run(_env(setting, reading, seed=11), 20)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    other = _env(setting, reading, seed=12)
    assert not np.array_equal(other.theta, _env(setting, reading, seed=11).theta)


@pytest.mark.parametrize(("setting", "reading"), ALL)
def test_batch_equals_separate_single_runs_bitwise(setting: Setting, reading: Reading) -> None:
    rounds, batch, seed = 40, 5, 21  # 40 rounds cross a context-buffer refill at d = 5
    together = _run(_env(setting, reading, batch=batch, seed=seed), rounds)
    for i in range(batch):
        alone = _run(_env(setting, reading, batch=1, seed=seed, start=i), rounds, start=i)
        for joint, single in zip(together, alone, strict=True):
            np.testing.assert_array_equal(joint[:, i], single[:, 0])


@pytest.mark.parametrize("setting", SETTINGS)
def test_block_size_does_not_change_any_value(setting: Setting) -> None:
    runs = [_run(_env(setting, seed=2, block_rounds=b), 25) for b in (1, 3, None)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- means, rewards


@pytest.mark.parametrize(("setting", "reading"), ALL)
def test_means_equal_explicit_loop(setting: Setting, reading: Reading) -> None:
    env = _env(setting, reading, batch=2, dim=6)
    x = env.contexts()
    got = env.means(x)
    b_size, k_size, d = x.shape
    # A float dot product is within gamma_d * sum |x_i theta_i| of the exact value
    # (Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.5). The reference,
    # math.fsum of the rounded products, is itself within 2u of it: u per product, u for
    # the final rounding; hence gamma_d + 3u of slack in all.
    u = EPS / 2
    gamma = d * u / (1 - d * u)
    for b in range(b_size):
        for k in range(k_size):
            theta = env.theta[b, k] if setting == "covariates" else env.theta[b]
            terms = [float(x[b, k, i] * theta[i]) for i in range(d)]
            bound = (gamma + 3 * u) * math.fsum(abs(t) for t in terms)
            assert abs(got[b, k] - math.fsum(terms)) <= bound


@pytest.mark.parametrize(("setting", "reading"), ALL)
def test_noise_has_the_promised_variance(setting: Setting, reading: Reading) -> None:
    _, means, arms, rewards = _run(_env(setting, reading, batch=4, seed=8), 2000)
    chosen = np.take_along_axis(means, arms[..., None], axis=-1)[..., 0]
    noise = (rewards - chosen).ravel()
    n, var = noise.size, make_spec(setting, 5, reading=reading).noise_sd ** 2
    assert abs(noise.mean()) <= Z * math.sqrt(var / n)
    # Sample variance: (n - 1) s^2 / var ~ chi-square(n - 1), sd of s^2 = var sqrt(2/(n-1)).
    assert abs(noise.var(ddof=1) - var) <= Z * var * math.sqrt(2.0 / (n - 1))


@pytest.mark.parametrize(
    "arms",
    [
        np.array([0, 1]),  # wrong length
        np.array([[0, 1, 2]]),  # wrong shape
        np.array([0.0, 1.0, 2.0]),  # not integers
        np.array([0, -1, 2]),  # negative
        np.array([0, 1, 10]),  # K = 10 is out of range
    ],
)
def test_invalid_arms_are_rejected(arms: np.ndarray) -> None:
    env = _env("covariates")
    with pytest.raises(ValueError):
        env.rewards(env.contexts(), arms)


def test_wrong_context_shape_is_rejected() -> None:
    env = _env("stochastic")
    x = env.contexts()
    with pytest.raises(ValueError):
        env.means(x[:, :-1])
    with pytest.raises(ValueError):
        env.rewards(x[:2], np.zeros(3, dtype=int))


def test_environment_rejects_empty_batch_and_bad_block() -> None:
    spec = make_spec("stochastic", 3)
    with pytest.raises(ValueError):
        Environment(spec, [])
    with pytest.raises(ValueError):
        Environment(spec, seeded_rngs(0, 1), block_rounds=0)


# --------------------------------------------------------------------------- regret helpers


def test_optimal_arm_and_instant_regret() -> None:
    means = np.array([[0.1, 0.5, 0.3], [0.9, -1.0, 0.9]])
    np.testing.assert_array_equal(optimal_arm(means), [1, 0])
    regret = instant_regret(means, np.array([2, 1]))
    np.testing.assert_allclose(regret, [0.5 - 0.3, 0.9 + 1.0])
    np.testing.assert_array_equal(instant_regret(means, optimal_arm(means)), [0.0, 0.0])
