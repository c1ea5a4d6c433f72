"""Off-policy estimators against a world whose truth is known.

The logging policy is a known stochastic policy (softmax of noisy linear
scores, so every arm has probability >= 0.05); the target a deterministic
policy that the log rarely follows. Each seed draws a fresh log of 2,000
rounds; the estimand is the target's mean reward over the context
distribution, computed on a million contexts.

Tolerances: a correct 95% interval covers the truth with probability 0.95,
so out of 100 seeds at least 88 cover it except with probability below 1%
(binomial tail). The mean of 100 unbiased estimates lies within 4 of its
standard errors of the truth except with probability 6e-5.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from policies.evaluation import Estimate, doubly_robust, ips, ridge_reward_model, snips

Array = NDArray[Any]
K, D, N, SEEDS = 3, 2, 2_000, 100
THETA = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.6]])  # arm means x' theta_k
TARGET_W = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, -0.5]])  # not the best policy


def contexts(rng: np.random.Generator, n: int) -> Array:
    return rng.normal(size=(n, D))


def target_probabilities(x: Array) -> Array:
    """A deterministic policy: argmax of x' w_k."""
    return np.eye(K)[np.argmax(x @ TARGET_W.T, axis=1)]


def logging_probabilities(x: Array) -> Array:
    scores = 2.0 * (x @ THETA.T)
    soft = np.exp(scores - scores.max(axis=1, keepdims=True))
    soft /= soft.sum(axis=1, keepdims=True)
    return 0.85 * soft + 0.05  # each arm at least 0.05


def truth() -> float:
    x = contexts(np.random.default_rng(12345), 1_000_000)
    return float(np.mean(np.sum(target_probabilities(x) * (x @ THETA.T), axis=1)))


def one_log(seed: int) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    x = contexts(rng, N)
    probs = logging_probabilities(x)
    actions = (rng.random(N)[:, None] > np.cumsum(probs, axis=1)).sum(axis=1)
    rewards = np.sum(x * THETA[actions], axis=1) + rng.normal(scale=0.5, size=N)
    return {"x": x, "actions": actions, "pscore": probs[np.arange(N), actions],
            "rewards": rewards, "target": target_probabilities(x)}


def estimates(log: dict[str, Array]) -> dict[str, Estimate]:
    args = (log["rewards"], log["actions"], log["pscore"], log["target"])
    per_arm = np.repeat(log["x"][:, None, :], K, axis=1)
    model = ridge_reward_model(per_arm, log["actions"], log["rewards"])
    return {"ips": ips(*args), "snips": snips(*args), "dr": doubly_robust(*args, model)}


@pytest.fixture(scope="module")
def runs() -> tuple[float, list[dict[str, Estimate]]]:
    return truth(), [estimates(one_log(seed)) for seed in range(SEEDS)]


@pytest.mark.parametrize("estimator", ["ips", "snips", "dr"])
def test_intervals_cover_the_truth(
    runs: tuple[float, list[dict[str, Estimate]]], estimator: str
) -> None:
    value, results = runs
    covered = sum(r[estimator].covers(value) for r in results)
    assert covered >= 88, covered


@pytest.mark.parametrize("estimator", ["ips", "dr"])
def test_unbiased_estimators_average_to_the_truth(
    runs: tuple[float, list[dict[str, Estimate]]], estimator: str
) -> None:
    value, results = runs
    values = np.array([r[estimator].value for r in results])
    assert abs(values.mean() - value) <= 4 * values.std(ddof=1) / np.sqrt(SEEDS)


def test_doubly_robust_is_less_variable_than_ips(
    runs: tuple[float, list[dict[str, Estimate]]],
) -> None:
    _, results = runs
    assert np.mean([r["dr"].stderr for r in results]) < np.mean([r["ips"].stderr for r in results])


def test_propensities_outside_zero_one_are_refused() -> None:
    log = one_log(0)
    with pytest.raises(ValueError, match="propensities"):
        ips(log["rewards"], log["actions"], np.zeros(N), log["target"])


def test_a_target_equal_to_the_logging_policy_is_the_logged_mean() -> None:
    log = one_log(1)
    same = logging_probabilities(log["x"])
    estimate = snips(log["rewards"], log["actions"], log["pscore"], same)
    # Weights are all 1: SNIPS is the plain mean of the rewards.
    assert estimate.value == pytest.approx(float(np.mean(log["rewards"])), rel=1e-12)
