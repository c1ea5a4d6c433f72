"""``linreboot evaluate``'s estimate against the truth, on the paper's worlds.

Each of ``LOGS`` seeded logs is made by LinReBoot with ``epsilon = 0.2``
(so every arm keeps a propensity of at least ``0.2 / K``), its propensities
logged as the service logs them. The target, LinUCB with a constant width
fitted on the first ``TRAIN`` rounds and then held fixed
(:func:`policies.evaluation.fitted_target`), is evaluated on the remaining
rounds; its true value is its on-policy value in the same world: the mean,
over fresh contexts, of the expected reward of its choice (exact in the
stochastic setting, whose contexts never change; over ``TRUTH_CONTEXTS``
contexts in the covariates setting, whose own error is a fifth of the
estimators' or less).

Tolerance: a correct 95% interval misses with probability 0.05, so 11 or
more misses out of 100 logs happen with probability 1.1% (binomial tail);
at least 90 of 100 must cover, the issue's bar of 90%. IPS and DR are held
to it. SNIPS is not: its delta-method interval is first order, and with
weights as skewed as here (``1 / 0.02 = 50`` about once in a hundred
rounds) it covered 85 of 100 in the covariates setting (93 in the
stochastic one); docs/API.md says so, and ``linreboot evaluate`` prints
the effective sample size that warns of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from loadtest.environments import Environment, make_spec, seeded_rngs
from policies import draw, init_state, paper_config, prepare, update
from policies.config import PolicyName, Setting
from policies.evaluation import (
    Estimate,
    doubly_robust,
    fitted_target,
    ips,
    ridge_reward_model,
    snips,
)
from policies.propensity import propensities

Array = NDArray[Any]
LOGS, ROUNDS, TRAIN, DIM, ARMS = 100, 1200, 400, 5, 10
TRUTH_CONTEXTS = 2000
TARGET: tuple[PolicyName, dict[str, float]] = ("linucb-const", {"ucb_alpha": 0.5})


def logged(setting: Setting, seed: int) -> tuple[Environment, dict[str, Array]]:
    """LOGS logs of ROUNDS rounds each, and the worlds they were made in."""
    config = paper_config("linreboot", setting, DIM, epsilon=0.2)
    env = Environment(make_spec(setting, DIM, n_arms=ARMS), seeded_rngs(seed, LOGS))
    rngs = seeded_rngs(seed + 1, LOGS)
    state = init_state(config, ARMS, LOGS)
    rows = np.arange(LOGS)
    log: dict[str, list[Array]] = {"contexts": [], "actions": [], "pscore": [], "rewards": []}
    for _ in range(ROUNDS):
        contexts = env.contexts()
        ready = prepare(config, state, contexts)
        arms = draw(ready, rngs).arms
        rewards = env.rewards(contexts, arms)
        for name, value in zip(log, (contexts, arms, propensities(ready, arms), rewards),
                               strict=True):
            log[name].append(value)
        update(config, state, arms, contexts[rows, arms], rewards)
    return env, {name: np.stack(values, axis=1) for name, values in log.items()}


def target_value(env: Environment, setting: Setting, log: dict[str, Array]) -> Array:
    """The fitted target's on-policy value in each log's world."""
    name, hyperparameters = TARGET
    config = paper_config(name, setting, DIM, **hyperparameters)
    draws = 1 if setting == "stochastic" else TRUTH_CONTEXTS
    contexts = np.stack([env.contexts() for _ in range(draws)], axis=1)  # (B, draws, K, d)
    means = np.stack([env.means(contexts[:, i]) for i in range(draws)], axis=1)
    combined = {name: np.concatenate([log[name][:, :TRAIN], extra], axis=1)
                for name, extra in (("contexts", contexts),
                                    ("actions", np.zeros((LOGS, draws), dtype=np.int64)),
                                    ("rewards", np.zeros((LOGS, draws))))}
    policy = fitted_target(config, combined["contexts"], combined["actions"],
                           combined["rewards"], np.ones((LOGS, TRAIN + draws, ARMS), bool),
                           TRAIN)
    values: Array = np.mean(np.sum(policy * means, axis=2), axis=1)
    return values


def estimates(setting: Setting, log: dict[str, Array]) -> dict[str, list[Estimate]]:
    name, hyperparameters = TARGET
    config = paper_config(name, setting, DIM, **hyperparameters)
    target = fitted_target(config, log["contexts"], log["actions"], log["rewards"],
                           np.ones(log["contexts"].shape[:3], bool), TRAIN)
    out: dict[str, list[Estimate]] = {"ips": [], "snips": [], "dr": []}
    for b in range(LOGS):
        rest = slice(TRAIN, None)
        x, a, p, r = (log[k][b, rest] for k in ("contexts", "actions", "pscore", "rewards"))
        out["ips"].append(ips(r, a, p, target[b]))
        out["snips"].append(snips(r, a, p, target[b]))
        out["dr"].append(doubly_robust(r, a, p, target[b], ridge_reward_model(x, a, r)))
    return out


@pytest.mark.parametrize(("setting", "seed"), [("covariates", 3), ("stochastic", 4)])
def test_intervals_cover_the_fitted_targets_on_policy_value(setting: Setting, seed: int
                                                            ) -> None:
    env, log = logged(setting, seed)
    truth = target_value(env, setting, log)
    found = estimates(setting, log)
    for name in ("ips", "dr"):
        covered = sum(e.covers(float(t)) for e, t in zip(found[name], truth, strict=True))
        assert covered >= 90, (name, covered)
    # The target differs from the logging policy: the test is not the logged mean's.
    logged_value = log["rewards"][:, TRAIN:].mean(axis=1)
    assert np.mean(np.abs(logged_value - truth)) > 0.01


# --------------------------------------------------------------------------- the policy named

NAMED_LOGS, NAMED_TRAIN, NAMED_ROUNDS, NAMED_ARMS = 100, 1000, 1500, 100


def named_logs(seed: int) -> tuple[Environment, dict[str, Array]]:
    """Logs of the service's default policy with epsilon 0.1 in the stochastic world with
    K = 100: the first NAMED_TRAIN rounds leave some arms never pulled."""
    config = paper_config("linreboot", "stochastic", DIM, spread="pooled", epsilon=0.1)
    env = Environment(make_spec("stochastic", DIM, n_arms=NAMED_ARMS),
                      seeded_rngs(seed, NAMED_LOGS))
    rngs = seeded_rngs(seed + 1, NAMED_LOGS)
    state = init_state(config, NAMED_ARMS, NAMED_LOGS)
    rows = np.arange(NAMED_LOGS)
    contexts = env.contexts()  # the stochastic world's arms never change
    log: dict[str, list[Array]] = {"actions": [], "pscore": [], "rewards": []}
    for _ in range(NAMED_ROUNDS):
        ready = prepare(config, state, contexts)
        arms = draw(ready, rngs).arms
        rewards = env.rewards(contexts, arms)
        for name, value in zip(log, (arms, propensities(ready, arms), rewards), strict=True):
            log[name].append(value)
        update(config, state, arms, contexts[rows, arms], rewards)
    out = {name: np.stack(values, axis=1) for name, values in log.items()}
    out["contexts"] = np.broadcast_to(contexts[:, None], (NAMED_LOGS, NAMED_ROUNDS,
                                                          *contexts.shape[1:]))
    out["means"] = env.means(contexts)
    return env, out


def frozen_value(name: PolicyName, log: dict[str, Array], alpha: float) -> Array:
    """The value of ``name`` fitted on the training rounds, by hand: a ridge solve with
    NumPy, then the arm of the highest ``x' theta_hat + alpha ||x||_(V^-1)`` (greedy:
    alpha 0). An arm never pulled in training is scored like any other."""
    values = np.empty(NAMED_LOGS)
    reg = paper_config(name, "stochastic", DIM).reg
    for b in range(NAMED_LOGS):
        features = log["contexts"][b, 0]
        x = features[log["actions"][b, :NAMED_TRAIN]]
        gram = x.T @ x + reg * np.eye(DIM)
        theta = np.linalg.solve(gram, x.T @ log["rewards"][b, :NAMED_TRAIN])
        width = np.sqrt(np.einsum("kd,kd->k", features, np.linalg.solve(gram, features.T).T))
        values[b] = log["means"][b, np.argmax(features @ theta + alpha * width)]
    return values


@pytest.mark.parametrize(("name", "hyperparameters"),
                         [("greedy", {}), ("linucb-const", {"ucb_alpha": 0.5})])
def test_intervals_cover_the_named_policy_on_logs_that_leave_arms_unpulled(
    name: PolicyName, hyperparameters: dict[str, float]
) -> None:
    """The target is the policy named, not a first pass over the arms training left
    unpulled (issue 24: such a target was "uniform over the unpulled arms")."""
    _, log = named_logs(9)
    pulled = np.zeros((NAMED_LOGS, NAMED_ARMS), bool)
    np.put_along_axis(pulled, log["actions"][:, :NAMED_TRAIN], True, axis=1)
    unpulled = ~pulled
    assert unpulled.any(axis=1).mean() > 0.9  # nearly every log leaves some arm unpulled
    truth = frozen_value(name, log, hyperparameters.get("ucb_alpha", 0.0))
    # What a forced pass would be worth: uniform over the arms never pulled.
    passing = np.where(unpulled.any(axis=1),
                       (log["means"] * unpulled).sum(axis=1) / np.maximum(unpulled.sum(1), 1),
                       truth)
    assert np.mean(truth - passing) > 0.1  # far apart: a test that tells them apart

    config = paper_config(name, "stochastic", DIM, **hyperparameters)
    target = fitted_target(config, log["contexts"], log["actions"], log["rewards"],
                           np.ones(log["contexts"].shape[:3], bool), NAMED_TRAIN)
    rest = slice(NAMED_TRAIN, None)
    for estimator in ("ips", "dr"):
        covered = 0
        for b in range(NAMED_LOGS):
            x, a, p, r = (log[k][b, rest] for k in ("contexts", "actions", "pscore", "rewards"))
            found = (ips(r, a, p, target[b]) if estimator == "ips" else
                     doubly_robust(r, a, p, target[b], ridge_reward_model(x, a, r)))
            covered += found.covers(float(truth[b]))
        assert covered >= 90, (estimator, covered)


def test_a_frozen_target_refuses_a_first_pass() -> None:
    config = paper_config("greedy", "stochastic", DIM, first_pass=True)
    contexts = np.zeros((1, 4, 3, DIM))
    with pytest.raises(ValueError, match="takes no first pass"):
        fitted_target(config, contexts, np.zeros((1, 4), np.int64), np.zeros((1, 4)),
                      np.ones((1, 4, 3), bool), 2)
