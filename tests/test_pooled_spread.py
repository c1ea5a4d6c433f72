"""LinReBoot with ``spread="pooled"``: no forced first pass, and no collapse on 0/1 rewards.

The paper's LinReBoot (``spread="paper"``, the default) must keep its draws:
that is checked against the closed form of Section 3.3 computed here from
the raw history, and by every reproduction test elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from policies import SETTINGS, PolicyConfig, choose, init_state, paper_config, prepare, update
from policies.config import POOLED_SIGMA_OMEGA, Setting
from policies.propensity import propensities
from tests.conftest import ADMIN, COVARIATES, Api
from tests.test_propensity import check_against_monte_carlo, state_after


def _contexts(setting: Setting, batch: int, n_arms: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if setting == "covariates":
        return np.repeat(rng.standard_normal((batch, 1, dim)), n_arms, axis=1)
    return rng.standard_normal((batch, n_arms, dim))


def test_the_paper_spread_is_the_default_and_keeps_section_3_3() -> None:
    """``mu_k + sigma_omega sqrt(RSS_k) / s_k z_k`` from the raw history, draw for draw."""
    config = paper_config("linreboot", "stochastic", 2)
    assert config.spread == "paper" and not config.first_pass
    assert config == paper_config("linreboot", "stochastic", 2, spread="paper")
    features = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    history = [(0, 0.3), (1, 1.1), (2, -0.2), (0, 0.5), (1, 0.7), (1, 0.9)]
    state = init_state(config, 3)
    for arm, reward in history:
        update(config, state, np.array([arm]), features[None, arm], np.array([reward]))
    x = np.array([features[a] for a, _ in history])
    y = np.array([r for _, r in history])
    theta = np.linalg.solve(x.T @ x + config.reg * np.eye(2), x.T @ y)
    mu = features @ theta
    rss = np.array([sum((r - mu[k]) ** 2 for a, r in history if a == k) for k in range(3)])
    pulls = np.array([2.0, 3.0, 1.0])
    z = np.random.default_rng(5).standard_normal(3)
    scores = choose(config, state, features[None], [np.random.default_rng(5)]).scores[0]
    expected = mu + config.sigma_omega * np.sqrt(rss) / pulls * z
    # The solve is floored (policies.ridge JITTER): agreement to 1e-9, not to the last bit.
    np.testing.assert_allclose(scores, expected, rtol=1e-9, atol=1e-9)


def test_the_pooled_spread_is_an_option_of_linreboot_only() -> None:
    # The model's own width where the arms are fixed, half of it where contexts vary.
    assert POOLED_SIGMA_OMEGA == {"stochastic": 1.0, "contextual": 0.5, "covariates": 0.5}
    for setting, sigma in POOLED_SIGMA_OMEGA.items():
        assert paper_config("linreboot", setting, 5, spread="pooled").sigma_omega == sigma
    assert paper_config("linreboot", "contextual", 5, spread="pooled",
                        sigma_omega=0.2).sigma_omega == 0.2
    with pytest.raises(ValueError, match="only linreboot"):
        PolicyConfig("greedy", "stochastic", 2, spread="pooled")
    with pytest.raises(ValueError, match="spread must be"):
        PolicyConfig("linreboot", "stochastic", 2, spread="wide")  # type: ignore[arg-type]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("rewards", ["gaussian", "all zero"])
def test_cold_start_has_no_forced_pass_and_every_arm_a_spread(
    setting: Setting, rewards: str
) -> None:
    """Batched (B = 3): never an infinite (forced) score; every spread positive, and arms
    never pulled are chosen by chance, not first."""
    config = paper_config("linreboot", setting, 3, spread="pooled")
    batch, n_arms = 3, 6
    state = init_state(config, n_arms, batch)
    rngs = [np.random.default_rng([7, b]) for b in range(batch)]
    noise = np.random.default_rng(8)
    repeated = False
    for t in range(n_arms):
        contexts = _contexts(setting, batch, n_arms, 3, seed=t)
        ready = prepare(config, state, contexts)
        assert not ready.unexplored.any() and not ready.masked
        spread = ready.prepared["spread"]
        assert np.all(spread > 0.0), spread
        choice = choose(config, state, contexts, rngs)
        assert np.all(np.isfinite(choice.scores))
        repeated |= bool(np.any(state["pulls"][np.arange(batch), choice.arms] > 0))
        r = np.zeros(batch) if rewards == "all zero" else noise.standard_normal(batch)
        update(config, state, choice.arms, contexts[np.arange(batch), choice.arms], r)
    # With a forced pass no arm is pulled twice in the first K rounds; here one is.
    assert repeated


@pytest.mark.parametrize("setting", SETTINGS)
def test_pooled_propensities_against_a_million_draws(setting: Setting) -> None:
    """After 2 rounds (arms never pulled compete) and after 30; tolerance of test_propensity."""
    for rounds, seed in [(2, 11), (30, 12)]:
        _, ready = state_after("linreboot", setting, rounds=rounds, seed=seed, spread="pooled")
        assert not ready.unexplored.any()
        p = check_against_monte_carlo(ready, seed=seed, draws=1_000_000)
        assert p.sum() == pytest.approx(1.0, abs=1e-3)


# -- 0/1 rewards: an arm whose first pull returned 0 -------------------------------

# Two arms with features e1 and e2 (stochastic, d = 2, lambda = 0.1). Arm 0's one
# pull returned 0; arm 1 has 50 pulls and keeps paying 1, 0, 0, 0, 0 (mean 0.2).
# As long as arm 0 is not pulled again, theta_hat = (0, S / (s + lambda)) with s
# arm 1's pulls and S its sum, so mu_0 = 0 and RSS_0 = 0: the paper's spread of
# arm 0 is 0 and it can win only if arm 1's normal index falls below 0.
_PATTERN = (1.0, 0.0, 0.0, 0.0, 0.0)
_START = 50
_REG = 0.1


def _arm1_sums(s: int) -> float:
    return float(sum(_PATTERN[i % 5] for i in range(s)))


def _pooled_odds(s: int, sigma: float) -> float:
    """A lower bound on P(arm 0 wins) with s pulls of arm 1, from the closed forms.

    mu_1 = S / (s + lambda); RSS_1 = S - 2 mu_1 S + s mu_1^2 (0/1 rewards);
    the rewards' sum of squares about their mean over n = s + 1 rewards is
    SS = S - S^2 / n, so v_0 = (SS + 1) / (n + 1) and v = (RSS_1 + v_0) / (n + 1).
    Arm 0's spread is sigma min(sqrt(v) / 2, sqrt(v / 2 x'V^-1x)) with
    x'V^-1 x = 1 / (1 + lambda): sigma sqrt(v) / 2. Two independent normals:
    P(N(0, a^2) > N(mu_1, b^2)) = Phi(-mu_1 / sqrt(a^2 + b^2)) >= Phi(-mu_1 / a).
    """
    total = _arm1_sums(s)
    mu1 = total / (s + _REG)
    rss1 = total - 2.0 * mu1 * total + s * mu1**2
    n = s + 1
    prior = (total - total**2 / n + 1.0) / (n + 1)
    v = (rss1 + prior) / (n + 1)
    spread0 = sigma * min(math.sqrt(v) / 2.0, math.sqrt(v / 2.0 / (1.0 + _REG)))
    return float(special.ndtr(-mu1 / spread0))


def _rounds_until_arm0(config: PolicyConfig, limit: int, seed: int) -> int | None:
    features = np.eye(2)[None]
    state = init_state(config, 2)
    update(config, state, np.array([0]), features[:, 0], np.array([0.0]))
    for i in range(_START):
        update(config, state, np.array([1]), features[:, 1], np.array([_PATTERN[i % 5]]))
    rng = [np.random.default_rng(seed)]
    for t in range(limit):
        arm = int(choose(config, state, features, rng).arms[0])
        if arm == 0:
            return t + 1
        s = int(state["pulls"][0, 1])
        update(config, state, np.array([1]), features[:, 1], np.array([_PATTERN[s % 5]]))
    return None


def _bound(sigma: float, cap: int = 3_000) -> int:
    """Rounds N after which arm 0 is still untried with probability at most 1e-6.

    Each round arm 0 wins with probability at least ``worst`` whatever came
    before, so it stays untried for N rounds with probability <= (1 - worst)^N.
    """
    worst = min(_pooled_odds(s, sigma) for s in range(_START, _START + cap))
    bound = math.ceil(math.log(1e-6) / math.log1p(-worst))
    assert worst > 0.01 and bound <= cap  # the minimum was taken over enough rounds
    return bound


def test_an_arm_whose_first_pull_returned_0_is_tried_again_within_the_bound() -> None:
    config = paper_config("linreboot", "stochastic", 2, spread="pooled")
    bound = _bound(config.sigma_omega)
    rounds = _rounds_until_arm0(config, bound, seed=3)
    assert rounds is not None and rounds <= bound
    # Its spread is positive before that pull, although RSS_0 = 0.
    state = init_state(config, 2)
    update(config, state, np.array([0]), np.eye(2)[None, 0], np.array([0.0]))
    update(config, state, np.array([1]), np.eye(2)[None, 1], np.array([1.0]))
    ready = prepare(config, state, np.eye(2)[None])
    assert ready.prepared["spread"][0, 0] > 0.0
    assert 0.0 < propensities(ready)[0, 0] < 1.0


def test_the_paper_spread_never_tries_that_arm_again_within_the_same_bound() -> None:
    """Arm 0 wins only if arm 1's index falls below 0: mu_1 >= 0.19 and its spread is at most
    sigma sqrt(RSS_1) / s <= 0.5 sqrt(0.17 s) / s <= 0.03, about 6.5 spreads: below 1e-10
    per round, so below 1e-6 in the bound's rounds."""
    config = paper_config("linreboot", "stochastic", 2)
    assert config.sigma_omega == 0.5
    assert _rounds_until_arm0(config, _bound(POOLED_SIGMA_OMEGA["stochastic"]), seed=3) is None


@pytest.mark.anyio
async def test_the_service_takes_the_pooled_spread(api: Api) -> None:
    """Over HTTP: accepted, shown in the config, no exploring decision (no forced pass)."""
    key = await api.create({**COVARIATES, "hyperparameters": {"spread": "pooled"}})
    experiment = await api.experiment("cov")
    assert experiment["config"]["spread"] == "pooled"
    assert experiment["config"]["sigma_omega"] == POOLED_SIGMA_OMEGA["covariates"]
    response = await api.choose(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
    decision = response.json()
    assert response.status_code == 200 and decision["exploring"] is False
    assert 0.0 < decision["propensity"] < 1.0
    wrong = await api.http.post("/experiments", headers=ADMIN, json={
        **COVARIATES, "id": "bad", "hyperparameters": {"spread": "wide"}})
    assert wrong.status_code == 422
    greedy = await api.http.post("/experiments", headers=ADMIN, json={
        **COVARIATES, "id": "bad", "policy": "greedy", "hyperparameters": {"spread": "pooled"}})
    assert greedy.status_code == 422
