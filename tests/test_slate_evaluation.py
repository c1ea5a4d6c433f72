"""Off-policy evaluation of rankings (issue 28): independent IPS against the truth.

Logs of ``LOGS`` worlds (covariates, d = 3, K = 6 arms, rankings of k = 3 with position
weights 1, 0.6, 0.3: slot j's arm is examined with probability w_j, the position-based
click model under which independent IPS is unbiased), ``SLATES`` rankings each. The
target, LinUCB with a constant width, is fitted on the first ``TRAIN`` rankings' slots
(each reward over its weight, as the service learns) and held fixed
(:func:`policies.evaluation.fitted_slate_target`); its true value, the expected sum of a
ranking's slot rewards, is its on-policy value in the same world: ``sum_j w_j mu`` of
its j-th arm, averaged over ``TRUTH_CONTEXTS`` fresh contexts.

* Coverage: a correct 95% interval misses with probability 0.05, so 11 or more misses
  out of 100 logs happen with probability 1.1% (binomial tail): at least 90 of 100 must
  cover. The logs are uniformly random rankings (every arm at every position with
  probability 1 / K): bounded weights, as the single-slot test bounds them with epsilon.
* Unbiasedness under the service's policy: logs of LinReBoot (its slot propensities the
  integral the service logs) have placements as unlikely as 2e-5, whose weights skew
  the intervals (89-91 of 100 covered in trials); the mean over the logs of the estimate
  minus the truth must be within 4 standard errors (their spread over the logs) of 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from loadtest.environments import Environment, make_spec, seeded_rngs
from policies import PolicyName, init_state, paper_config, prepare, update
from policies.evaluation import Estimate, fitted_slate_target, slate_ips
from policies.ranking import position_propensities, rank

Array = NDArray[Any]
LOGS, SLATES, TRAIN, DIM, ARMS, K = 100, 400, 200, 3, 6, 3
WEIGHTS = np.array([1.0, 0.6, 0.3])
TRUTH_CONTEXTS = 500


def logged(seed: int, logger: PolicyName | None) -> tuple[Environment, dict[str, Array]]:
    """LOGS logs of SLATES rankings (uniformly random with ``logger`` None, else that
    policy learning as the service does), and their worlds."""
    config = paper_config(logger or "linreboot", "covariates", DIM, spread="pooled")
    env = Environment(make_spec("covariates", DIM, n_arms=ARMS), seeded_rngs(seed, LOGS))
    rngs = seeded_rngs(seed + 1, LOGS)
    looks = np.random.default_rng([seed, 2])
    state = init_state(config, ARMS, LOGS)
    rows = np.arange(LOGS)
    log: dict[str, list[Array]] = {"contexts": [], "arms": [], "pscore": [], "rewards": []}
    for _ in range(SLATES):
        contexts = env.contexts()
        if logger is None:
            arms = np.stack([rng.permutation(ARMS)[:K] for rng in rngs])
            pscore = np.full((LOGS, K), 1.0 / ARMS)
        else:
            ranking = rank(prepare(config, state, contexts), rngs, K)
            arms, pscore = ranking.arms, position_propensities(
                prepare(config, state, contexts), ranking)
        rewards = np.empty((LOGS, K))
        for j in range(K):
            seen = looks.random(LOGS) < WEIGHTS[j]
            rewards[:, j] = np.where(seen, env.rewards(contexts, arms[:, j]), 0.0)
            if logger is not None:
                update(config, state, arms[:, j], contexts[rows, arms[:, j]],
                       rewards[:, j] / WEIGHTS[j])
        for name, value in zip(log, (contexts, arms, pscore, rewards), strict=True):
            log[name].append(value)
    return env, {name: np.stack(values, axis=1) for name, values in log.items()}


def estimates_and_truths(env: Environment, log: dict[str, Array]
                         ) -> tuple[list[Estimate], Array]:
    config = paper_config("linucb-const", "covariates", DIM, ucb_alpha=0.5)
    fresh = np.stack([env.contexts() for _ in range(TRUTH_CONTEXTS)], axis=1)
    means = np.stack([env.means(fresh[:, i]) for i in range(TRUTH_CONTEXTS)], axis=1)
    slates = np.repeat(np.arange(SLATES), K)
    positions = np.tile(np.arange(K), SLATES)
    train = slates < TRAIN
    found, truths = [], []
    for b in range(LOGS):
        contexts = np.repeat(log["contexts"][b], K, axis=0)
        arms = log["arms"][b].reshape(-1)
        rewards, pscore = log["rewards"][b].reshape(-1), log["pscore"][b].reshape(-1)
        learnt = rewards / WEIGHTS[positions]
        target = fitted_slate_target(config, contexts, arms, positions, learnt,
                                     np.ones((arms.size, ARMS), bool), slates, train)
        found.append(slate_ips(rewards[~train], slates[~train] - TRAIN, pscore[~train],
                               target))
        # The same fitted, frozen target on fresh contexts: its rankings, their value.
        state = init_state(config, ARMS, 1)
        for i in np.flatnonzero(train):
            update(config, state, arms[i:i + 1], contexts[i:i + 1, arms[i]], learnt[i:i + 1])
        many = type(state)({k: np.repeat(v, TRUTH_CONTEXTS, axis=0) for k, v in state.items()})
        order = rank(prepare(config, many, fresh[b]), [np.random.default_rng(0)] * TRUTH_CONTEXTS,
                     K).arms  # (deterministic: the generators draw nothing but ties)
        picked = means[b][np.arange(TRUTH_CONTEXTS)[:, None], order]
        truths.append(float(np.mean(picked @ WEIGHTS)))
    return found, np.array(truths)


def test_independent_ips_intervals_cover_the_fitted_targets_value() -> None:
    env, log = logged(3, None)
    found, truth = estimates_and_truths(env, log)
    covered = sum(e.covers(float(t)) for e, t in zip(found, truth, strict=True))
    assert covered >= 90, covered
    # The target is not the logging policy: uniformly random rankings earn less.
    logged_value = log["rewards"][:, TRAIN:].sum(axis=2).mean(axis=1)
    assert np.all(truth > logged_value.mean() + 0.1)


def test_independent_ips_of_linreboots_logs_is_unbiased() -> None:
    env, log = logged(5, "linreboot")
    found, truth = estimates_and_truths(env, log)
    errors = np.array([e.value for e in found]) - truth
    assert abs(errors.mean()) <= 4 * errors.std(ddof=1) / np.sqrt(LOGS), errors.mean()
    assert np.median([e.stderr for e in found]) < 0.1  # an estimate worth the name
