"""``first_pass``: an explicit option of every policy, off unless asked for (issue 24).

The paper gives every algorithm a first pass over the K arms; a comparison that
gives it to some rows and not others measures the pass, not the rule. Here:
every policy takes the option, the default is off (in ``paper_config``, the
service, the simulator's cells and the HTTP replays), the reproduction turns
it on, and experiments stored before the option existed keep the start they
were created with.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from loadtest.simulate import Cell, grid, play
from policies import HYPERPARAMETERS, POLICIES, PolicyConfig, paper_config
from policies.config import PolicyName, parse_hyperparameter, stored_config
from tests.conftest import ADMIN, Api


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_takes_first_pass_and_it_is_off_by_default(name: PolicyName) -> None:
    assert "first_pass" in HYPERPARAMETERS[name]
    assert not paper_config(name, "stochastic", 3).first_pass
    assert paper_config(name, "stochastic", 3, first_pass=True).forces_pass


def test_first_pass_must_be_a_boolean() -> None:
    with pytest.raises(ValueError, match="first_pass must be true or false"):
        PolicyConfig("greedy", "stochastic", 3, first_pass=1)  # type: ignore[arg-type]


def test_configs_stored_before_the_option_keep_their_start() -> None:
    """The paper's spread (every baseline, and LinReBoot unless pooled) had the pass."""
    for config, had_pass in ((paper_config("lints-g", "contextual", 3), True),
                             (paper_config("linreboot", "covariates", 3), True),
                             (paper_config("linreboot", "covariates", 3, spread="pooled"),
                              False)):
        fields = dataclasses.asdict(config)
        del fields["first_pass"]
        assert stored_config(json.loads(json.dumps(fields))).first_pass is had_pass
    now = dataclasses.asdict(paper_config("lints-g", "contextual", 3))
    assert stored_config(now).first_pass is False  # stored with the field: as stored


@pytest.mark.parametrize(("name", "key", "text", "value"), [
    ("linreboot", "spread", "pooled", "pooled"),
    ("linreboot", "residuals", "observed", "observed"),
    ("greedy", "first_pass", "true", True),
    ("lints-ig", "first_pass", "false", False),
    ("linucb-const", "ucb_alpha", "0.5", 0.5),
])
def test_a_set_pair_is_read_by_the_kind_of_its_hyperparameter(
    name: PolicyName, key: str, text: str, value: object
) -> None:
    assert parse_hyperparameter(name, key, text) == value


@pytest.mark.parametrize(("name", "key", "text", "says"), [
    ("linreboot", "spread", "wide", "spread must be one of paper, pooled"),
    ("greedy", "first_pass", "yes", "first_pass must be one of true, false"),
    ("linucb-const", "ucb_alpha", "wide", "ucb_alpha must be a number"),
    ("linucb-const", "sigma_omega", "1", "linucb-const takes only these hyperparameters: reg, "
     "ucb_alpha, discount, epsilon, first_pass"),
])
def test_a_wrong_set_pair_names_what_is_allowed(name: PolicyName, key: str, text: str,
                                                says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_hyperparameter(name, key, text)


def test_the_simulator_starts_without_a_pass_unless_its_cells_ask() -> None:
    without, with_pass = (Cell("stochastic", 3, "linucb-const", first_pass=f)
                          for f in (False, True))
    assert grid(["stochastic"], [3], ["linucb-const"]) == [without]
    assert grid(["stochastic"], [3], ["linucb-const"], first_pass=True) == [with_pass]
    arms = {cell.first_pass: play(cell, 4, 100, seed=2).arms for cell in (without, with_pass)}
    for row in arms[True]:
        assert sorted(row[:100].tolist()) == list(range(100))  # the paper's first K rounds
    assert all(len(set(row[:100].tolist())) < 100 for row in arms[False])


@pytest.mark.anyio
async def test_the_service_takes_first_pass_as_a_strict_boolean(api: Api) -> None:
    arms = [{"id": f"a{i}"} for i in range(3)]
    for value in ("true", 1, "yes"):
        response = await api.http.post("/experiments", headers=ADMIN, json={
            "id": "e", "setting": "covariates", "dim": 2, "arms": arms,
            "hyperparameters": {"first_pass": value}})
        assert response.status_code == 422, (value, response.text)
        assert "first_pass" in response.text
    key = await api.create({"id": "e", "setting": "covariates", "dim": 2, "arms": arms,
                            "policy": "greedy", "hyperparameters": {"first_pass": True}})
    view = await api.experiment("e")
    assert view["config"]["first_pass"] is True and view["hyperparameters"]["first_pass"] is True
    seen = []
    for _ in range(3):
        decision = (await api.choose(key, {"experiment_id": "e", "context": [1.0, 0.5]})).json()
        assert decision["exploring"] and decision["index"] is None
        seen.append(decision["arm_id"])
        await api.reward(key, {"experiment_id": "e", "decision_id": decision["decision_id"],
                               "reward": 0.0})
    assert sorted(seen) == ["a0", "a1", "a2"]
    plain = await api.create({"id": "f", "setting": "covariates", "dim": 2, "arms": arms})
    assert (await api.experiment("f"))["config"]["first_pass"] is False
    decision = (await api.choose(plain, {"experiment_id": "f", "context": [1.0, 0.5]})).json()
    assert not decision["exploring"] and np.isfinite(decision["index"])
