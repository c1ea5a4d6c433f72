"""Forgetting (``discount`` gamma < 1): the semantics of ``policies.state``.

- discounted statistics are the sums of the history weighted ``gamma^(N - n)``
  (closed form), whatever order the outcomes arrive in;
- the ridge term is not discounted (the prior keeps its weight);
- an arm aged until its weight underflows is explored again;
- ``discount = 1`` is the code without forgetting, bit for bit;
- a switching world switches when it says, and is the still world before;
- on it, LinReBoot that forgets has lower regret than LinReBoot that does not;
- ``linreboot simulate --switch-every --discount`` runs that comparison.

The store's side (the outcomes reward.lua and settle.lua record add up, in the
workers, to what ``policies.update`` adds, bit for bit) is tested by
tests/test_decision_log.py's replay and tests/test_service_durability.py's
seeded service against the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from linreboot.cli import main
from loadtest.environments import Environment, make_spec, seeded_rngs
from loadtest.simulate import Cell, grid, play
from policies import (
    PolicyConfig,
    State,
    choose,
    discounted,
    init_state,
    layout,
    paper_config,
    prepare,
    raw_reward_sums,
    update,
)
from policies.config import Residuals, Setting
from policies.ridge import predict
from policies.state import power
from service import keys
from service.codec import assemble_state, recipe
from service.domain import ArmSpec, ChooseRequest, Decision, ExperimentSpec
from service.experiments import ExperimentService
from tests.conftest import COVARIATES, Api
from tests.test_service_durability import stored_stats

Array = NDArray[Any]
RTOL = 1e-12  # sums of at most 60 positive-weight terms of size ~1: a few ulps each


@dataclass(frozen=True)
class History:
    arms: NDArray[np.int64]  # (T,) in arrival order
    x: Array  # (T, d)
    rewards: Array  # (T,)
    numbers: Array  # (T,) decision numbers, not in order


def history(n_arms: int, dim: int, seed: int, rounds: int = 40) -> History:
    """Outcomes of 40 of the first 60 decisions, arriving in a random order."""
    rng = np.random.default_rng(seed)
    numbers = rng.permutation(np.arange(1, 61))[:rounds].astype(np.float64)
    return History(rng.integers(n_arms, size=rounds), rng.normal(size=(rounds, dim)),
                   rng.normal(3.0, 1.0, size=rounds), numbers)


def played(config: PolicyConfig, histories: list[History], n_arms: int,
           order: NDArray[np.int64] | None = None) -> State:
    state = init_state(config, n_arms, len(histories))
    rounds = histories[0].arms.size
    for t in (range(rounds) if order is None else order):
        update(config, state, np.array([h.arms[t] for h in histories]),
               np.stack([h.x[t] for h in histories]), np.array([h.rewards[t] for h in histories]),
               np.array([h.numbers[t] for h in histories]))
    return state


CASES: list[tuple[Setting, Residuals]] = [
    ("stochastic", "current"), ("contextual", "observed"), ("covariates", "current"),
]


@pytest.mark.parametrize(("setting", "residuals"), CASES)
def test_discounted_sums_are_the_history_weighted_by_age(
    setting: Setting, residuals: Residuals
) -> None:
    gamma, n_arms, dim = 0.9, 4, 3
    config = paper_config("linreboot", setting, dim, discount=gamma, residuals=residuals)
    histories = [history(n_arms, dim, seed) for seed in (1, 2)]
    state = played(config, histories, n_arms)
    later = np.array([h.numbers.max() for h in histories]) + 7.0
    for at, extra in ((None, 0), (later, 7)):
        seen = discounted(config, state, at)
        for b, h in enumerate(histories):
            clock = h.numbers.max() + extra
            weights = gamma ** (clock - h.numbers)
            for m in range(1 if config.shared else n_arms):
                rows = np.ones(h.arms.size, bool) if config.shared else h.arms == m
                w, x, y = weights[rows], h.x[rows], h.rewards[rows]
                assert seen["model_at"][b, m] == clock
                np.testing.assert_allclose(seen["xtx"][b, m], (w[:, None] * x).T @ x, rtol=RTOL)
                np.testing.assert_allclose(seen["xty"][b, m], x.T @ (w * y), rtol=RTOL)
                assert seen["n"][b, m] == pytest.approx(w.sum(), rel=RTOL)
                total, squares = raw_reward_sums(*(seen[f][b, m] for f in (
                    "n", "shift_y", "sum_dy", "sum_dy2")))
                assert (total, squares) == pytest.approx(
                    ((w * y).sum(), (w * y * y).sum()), rel=1e-9)
            for k in range(n_arms):
                rows = h.arms == k
                w, r = weights[rows], h.rewards[rows]
                assert seen["pulls"][b, k] == pytest.approx(w.sum(), rel=RTOL)
                assert seen["total_pulls"][b, k] == rows.sum()
                assert seen["shift_r"][b, k] == r[0]  # the first to arrive
                total, squares = raw_reward_sums(*(seen[f][b, k] for f in (
                    "pulls", "shift_r", "sum_dr", "sum_dr2")))
                assert (total, squares) == pytest.approx(
                    ((w * r).sum(), (w * r * r).sum()), rel=1e-9)
                if "arm_xtx" in seen:
                    x = h.x[rows]
                    np.testing.assert_allclose(seen["arm_xtx"][b, k], (w[:, None] * x).T @ x,
                                               rtol=RTOL)


def test_the_order_outcomes_arrive_in_changes_only_rounding() -> None:
    config = paper_config("linreboot", "covariates", 3, discount=0.8)
    histories = [history(4, 3, 3)]
    one = discounted(config, played(config, histories, 4))
    other = discounted(config, played(config, histories, 4, np.arange(40)[::-1]))
    for name in ("xtx", "xty", "n", "pulls", "model_at", "arm_at", "total_pulls"):
        np.testing.assert_allclose(one[name], other[name], rtol=RTOL, atol=0)
    for names in (("pulls", "shift_r", "sum_dr", "sum_dr2"), ("n", "shift_y", "sum_dy", "sum_dy2")):
        for a, b in zip(raw_reward_sums(*(one[f] for f in names)),
                        raw_reward_sums(*(other[f] for f in names)), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9)


def test_the_ridge_term_is_not_discounted() -> None:
    """mu_hat is the weighted ridge fit with the undiscounted lambda I: as the data age,
    the estimate returns to the prior (0) instead of keeping its value."""
    gamma, reg = 0.95, 0.5
    config = paper_config("linreboot", "covariates", 2, discount=gamma, reg=reg)
    h = History(np.zeros(30, dtype=np.int64), np.random.default_rng(4).normal(size=(30, 2)),
                np.zeros(30), np.arange(1.0, 31.0))
    h = History(h.arms, h.x, h.x @ np.array([1.0, -2.0]), h.numbers)
    state = played(config, [h], 1)
    contexts = np.array([[[0.3, 0.7]]])
    for age in (0, 50, 400):
        mu = prepare(config, discounted(config, state, np.array([30.0 + age])),
                     contexts).prepared["mu_hat"]
        w = gamma ** (30 + age - h.numbers)
        gram = (w[:, None] * h.x).T @ h.x + reg * np.eye(2)  # lambda I undiscounted
        theta = np.linalg.solve(gram, h.x.T @ (w * h.rewards))
        np.testing.assert_allclose(mu, predict(theta[None, None], contexts), rtol=1e-9)
    assert abs(float(mu[0, 0])) < 1e-6  # 400 decisions on: gamma^400 ~ 1e-9 of the data left


def test_an_arm_forgotten_to_nothing_is_explored_again_and_starts_afresh() -> None:
    config = paper_config("linreboot", "stochastic", 1, discount=0.5)
    state = init_state(config, 2, 1)
    x = np.array([[1.0]])
    update(config, state, np.array([0]), x, np.array([100.0]), np.array([1.0]))
    update(config, state, np.array([1]), x, np.array([0.5]), np.array([1200.0]))
    # 0.5^1199 underflows: arm 0 holds nothing, so it is the unexplored one.
    assert discounted(config, state)["pulls"][0, 0] == 0.0
    contexts = np.ones((1, 2, 1))
    assert choose(config, state, contexts, [np.random.default_rng(0)]).arms[0] == 0
    update(config, state, np.array([0]), x, np.array([7.0]), np.array([1201.0]))
    assert state["shift_r"][0, 0] == 7.0 and state["pulls"][0, 0] == 1.0
    assert state["total_pulls"][0, 0] == 2.0


def test_powers_are_the_repeated_squares_of_the_store() -> None:
    """The table and the loop give the same bits, near math.pow (which the store avoids).

    Each squaring doubles the relative error of ``gamma^(2^i)``, so ``gamma^k`` is within
    about ``k`` ulps (``2 k eps``, with room); below 1e-300 results are subnormal or 0.
    """
    ages = np.array([0, 1, 2, 3, 1000, 16383, 16384, 10**6, 2**40])
    for gamma in (0.5, 0.9, 0.99, 1 - 2**-40):
        table = power(gamma, ages[:6])
        loop = power(gamma, ages)
        assert np.array_equal(table, loop[:6])
        expected = np.array([math.pow(gamma, int(a)) for a in ages])
        error = np.abs(loop - expected)
        assert np.all(error <= 2 * np.maximum(ages, 1) * 2**-52 * expected + 1e-300), error
    with pytest.raises(ValueError, match="0 or more"):
        power(0.9, np.array([3, -1]))


@pytest.mark.parametrize("numbers", [[0.0], [1.5], [math.nan], [2.0**53]])
def test_update_refuses_decision_numbers_that_are_not_whole_from_1(numbers: list[float]) -> None:
    config = paper_config("linreboot", "covariates", 1, discount=0.9)
    state = init_state(config, 1, 1)
    with pytest.raises(ValueError, match="whole numbers"):
        update(config, state, np.array([0]), np.ones((1, 1)), np.ones(1), np.array(numbers))


# -- discount = 1 is no forgetting at all ------------------------------------------------


def test_discount_one_is_the_code_without_forgetting() -> None:
    settings: tuple[Setting, ...] = ("stochastic", "contextual", "covariates")
    for setting in settings:
        plain = paper_config("linreboot", setting, 3, residuals="observed")
        one = paper_config("linreboot", setting, 3, residuals="observed", discount=1.0)
        assert layout(one) == layout(plain)
        assert recipe(one, "model") == recipe(plain, "model")
        assert recipe(one, "model") == "outer_upper,r_x,one,first_r,dr,dr2"
        assert recipe(one, "arm").startswith("one,first_r,dr,dr2")
    cell = Cell("covariates", 3, "linreboot")
    still = play(cell, 3, 200, seed=4)
    explicit = play(Cell("covariates", 3, "linreboot", overrides=(("discount", 1.0),)), 3, 200, 4)
    assert np.array_equal(still.arms, explicit.arms)
    assert np.array_equal(still.cumulative, explicit.cumulative)


def test_forgetting_adds_a_clock_to_each_blob_and_a_tally_to_the_arm() -> None:
    config = paper_config("linreboot", "contextual", 2, discount=0.99, residuals="observed")
    assert recipe(config, "model") == "at,outer_upper,r_x,one,first_r,dr,dr2"
    assert recipe(config, "arm") == "at,one,first_r,dr,dr2,outer_upper,r_x,tally"


# -- the drifting world ------------------------------------------------------------------


def _truths_and_rewards(env: Environment, rounds: int) -> tuple[list[Array], list[Array]]:
    thetas, rewards = [], []
    for _ in range(rounds):
        contexts = env.contexts()
        thetas.append(env.theta.copy())
        rewards.append(env.rewards(contexts, np.zeros(env.batch, dtype=np.int64)))
    return thetas, rewards


@pytest.mark.parametrize("setting", ["stochastic", "contextual", "covariates"])
def test_a_switching_world_switches_every_p_rounds_and_is_the_still_world_before(
    setting: Setting,
) -> None:
    every = 7
    switching = Environment(make_spec(setting, 3, n_arms=4, switch_every=every),
                            seeded_rngs(5, 2))
    still = Environment(make_spec(setting, 3, n_arms=4), seeded_rngs(5, 2))
    thetas, rewards = _truths_and_rewards(switching, 3 * every)
    still_thetas, still_rewards = _truths_and_rewards(still, every)
    changed = [t for t in range(1, 3 * every) if not np.array_equal(thetas[t], thetas[t - 1])]
    assert changed == [every, 2 * every]  # rounds P + 1 and 2P + 1 (from 0: P, 2P)
    for t in range(every):
        assert np.array_equal(thetas[t], still_thetas[t])
        assert np.array_equal(rewards[t], still_rewards[t])
    norms = np.linalg.norm(thetas[every], axis=-1)  # drawn like the first truth
    np.testing.assert_allclose(norms, np.linalg.norm(thetas[0], axis=-1), rtol=1e-12)
    # Each repetition's switches are its own: repetition 1 alone sees the same.
    alone = Environment(make_spec(setting, 3, n_arms=4, switch_every=every),
                        seeded_rngs(5, 1, start=1))
    alone_thetas, _ = _truths_and_rewards(alone, 3 * every)
    for t in range(3 * every):
        assert np.array_equal(alone_thetas[t][0], thetas[t][1])


def test_switch_every_must_be_a_whole_number_of_rounds() -> None:
    with pytest.raises(ValueError, match="switch_every"):
        make_spec("stochastic", 3, switch_every=-1)


def test_forgetting_lowers_regret_in_a_switching_world() -> None:
    """Theta switches every 500 rounds. Both policies play the same 12 worlds (same
    seed), so the difference is paired: it must exceed three standard errors of the
    paired difference across repetitions (a one-sided z-test at 0.13%)."""
    reps, horizon = 12, 2000
    cells = [Cell("covariates", 5, "linreboot", overrides=forget, switch_every=500)
             for forget in ((), (("discount", 0.99),))]
    plain, forgetting = (play(c, reps, horizon, seed=3).cumulative[:, -1] for c in cells)
    gain = plain - forgetting
    se = gain.std(ddof=1) / math.sqrt(reps)
    assert gain.mean() > 3 * se, (plain.mean(), forgetting.mean(), se)


def test_the_grid_sweeps_the_discount_for_every_policy() -> None:
    cells = grid(["covariates"], [3], ["linreboot", "linucb"], discounts=[1.0, 0.99],
                 switch_every=100)
    assert sorted(c.label for c in cells) == [
        "linreboot", "linreboot (discount=0.99)", "linucb", "linucb (discount=0.99)"]
    assert {c.config().discount for c in cells} == {1.0, 0.99}
    assert {c.env_spec().switch_every for c in cells} == {100}


def test_the_simulate_command_compares_discounts_in_a_switching_world(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--settings", "covariates", "--dims", "3", "--policies", "linreboot",
                 "--discount", "1", "0.99", "--switch-every", "50", "--reps", "2",
                 "--horizon", "120", "--jobs", "1", "--out", str(tmp_path)])
    assert code == 0
    tables = (tmp_path / "tables.md").read_text()
    assert "theta switching every 50 rounds" in tables
    assert "| linreboot | linreboot (discount=0.99) |" in tables
    with pytest.raises(SystemExit, match=r"--discount values must be from 0\.5 to 1"):
        main(["simulate", "--discount", "0.3"])
    capsys.readouterr()


# -- the service -------------------------------------------------------------------------


async def _decide_and_reward(service: ExperimentService, arm: str, context: tuple[float, ...],
                             reward: float) -> Decision:
    decision = await service.choose("drift", ChooseRequest(context=context, eligible=(arm,)))
    assert decision.arm_id == arm
    assert [o.status for o in await service.reward("drift", [(decision.decision_id, reward)])] \
        == ["applied"]
    return decision


@pytest.mark.anyio
async def test_the_service_scores_and_shows_every_arm_at_the_experiments_clock(
    service: ExperimentService, redis_db: str,
) -> None:
    """Arm a's last outcome is of decision 1, b's of decision 6: a request naming only a
    is scored with a's statistics aged 5 decisions (not at a's own clock), and the view
    shows each arm's outcomes counted (pulls) and weighed (weight, mean_reward)."""
    gamma = 0.8
    await service.create(ExperimentSpec(
        id="drift", setting="covariates", dim=2, arms=(ArmSpec("a"), ArmSpec("b")),
        policy="linucb-const", hyperparameters={"discount": gamma}, seed=1))
    context = (0.6, -0.8)
    await _decide_and_reward(service, "a", context, 2.0)
    b_rewards = [1.0, 3.0, 2.0, 5.0, 4.0]
    for reward in b_rewards:
        await _decide_and_reward(service, "b", context, reward)

    scored = await service.choose("drift", ChooseRequest(context=context, eligible=("a",)))

    config = PolicyConfig(**(await service.get("drift")).config)  # type: ignore[arg-type]
    stats = stored_stats(redis_db, "drift")
    state = assemble_state(config, [stats.get(keys.model_field(a)) for a in "ab"],
                           [stats.get(keys.arm_field(a)) for a in "ab"])
    at_the_clock = choose(config, state, np.array([[context, context]]),
                          [np.random.default_rng(0)], np.array([[True, False]]))
    assert scored.index == pytest.approx(float(at_the_clock.scores[0, 0]), rel=1e-12)
    own_clock = choose(config, {**state, "model_at": np.full((1, 2), 1.0),
                                "arm_at": np.full((1, 2), 1.0)},
                       np.array([[context, context]]), [np.random.default_rng(0)],
                       np.array([[True, False]]))
    assert scored.index != pytest.approx(float(own_clock.scores[0, 0]), rel=1e-3)

    view = await service.get("drift")
    a, b = view.arms
    weights = gamma ** np.arange(4, -1, -1.0)  # decisions 2..6 at clock 6
    assert (a.pulls, b.pulls) == (1, 5)
    assert a.weight == pytest.approx(gamma**5, rel=RTOL) and a.mean_reward == 2.0
    assert b.weight == pytest.approx(weights.sum(), rel=RTOL)
    assert b.mean_reward == pytest.approx(weights @ b_rewards / weights.sum(), rel=1e-12)


@pytest.mark.anyio
async def test_the_api_takes_a_discount_and_shows_the_weights(api: Api) -> None:
    key = await api.create({**COVARIATES, "hyperparameters": {"discount": 0.9}})
    plain_key = await api.create({**COVARIATES, "id": "plain"})
    for experiment_id, secret in (("cov", key), ("plain", plain_key)):
        decision_id = await api.decide(secret, {"experiment_id": experiment_id,
                                                "context": [1.0, 0.0, 0.0]})
        response = await api.reward(secret, {"experiment_id": experiment_id,
                                             "decision_id": decision_id, "reward": 1.0})
        assert response.json()["status"] == "applied"
    forgetting, plain = await api.experiment("cov"), await api.experiment("plain")
    assert forgetting["config"]["discount"] == 0.9 and plain["config"]["discount"] == 1.0
    assert sorted(a["weight"] for a in forgetting["arms"]) == [0.0, 1.0]
    assert [a["weight"] for a in plain["arms"]] == [None, None]
    assert sorted(a["pulls"] for a in forgetting["arms"]) == [0, 1]
