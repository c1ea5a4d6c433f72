"""Live settings (issue 29): PATCH /experiments/{id} changes how decisions are made and
kept (epsilon, reward window, default reward's value, max_stale_rewards, log bounds),
never what the statistics mean; every worker's next decision sees the change, and the
decision log records it."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from service import shards
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.errors import InvalidInput, NotFound
from service.experiments import ExperimentService
from tests.conftest import ADMIN, COVARIATES, TEST_SHARDS, Api

pytestmark = pytest.mark.anyio

ARMS = (ArmSpec("a"), ArmSpec("b"), ArmSpec("c"))
CONTEXT = ChooseRequest(context=(1.0, 0.5))


async def _trained(service: ExperimentService, **spec: object) -> None:
    """A greedy experiment where arm b pays and the others do not: it picks b for sure."""
    await service.create(ExperimentSpec(id="live", setting="covariates", dim=2, arms=ARMS,
                                        policy="greedy", log_max_entries=1000,
                                        **spec))  # type: ignore[arg-type]
    for arm, reward in (("a", 0.0), ("b", 1.0), ("c", 0.0)) * 3:
        decision = await service.choose("live", ChooseRequest(context=(1.0, 0.5),
                                                              eligible=(arm,)))
        await service.reward("live", [(decision.decision_id, reward)])


async def test_every_worker_decides_with_the_new_settings_at_its_next_decision(
    service: ExperimentService, other_service: ExperimentService
) -> None:
    await _trained(service)
    before = await other_service.choose("live", CONTEXT)  # this worker holds a view now
    assert (before.arm_id, before.propensity) == ("b", 1.0)
    view = await service.update_settings("live", {"epsilon": 1.0, "reward_window_seconds": 90})
    assert view.config["epsilon"] == 1.0 and view.spec.reward_window_seconds == 90
    after = await other_service.choose("live", CONTEXT)  # its view predates the change
    assert after.propensity == pytest.approx(1 / 3) and after.expires_in_seconds == 90
    assert view.spec.hyperparameters["epsilon"] == 1.0
    # The statistics are untouched: the same pulls before and after.
    assert [a.pulls for a in view.arms] == [a.pulls for a in (await service.get("live")).arms]
    log, _ = await service.read_log("live", limit=1000)
    (entry,) = [e for e in log if e.type == "settings"]
    assert entry.changes == {"epsilon": 1.0, "reward_window_seconds": 90}
    assert [e.type for e in log].index("settings") < len(log) - 1  # before the decision after


async def test_the_default_reward_changes_for_decisions_settled_afterwards(
    service: ExperimentService,
) -> None:
    await service.create(ExperimentSpec(id="live", setting="covariates", dim=2, arms=ARMS,
                                        reward_window_seconds=1, default_reward=0.0,
                                        log_max_entries=1000))
    made = [await service.choose("live", CONTEXT) for _ in range(3)]
    await service.update_settings("live", {"default_reward": -2.5})
    await asyncio.sleep(1.2)
    assert await service.sweep() == 3
    log, _ = await service.read_log("live", limit=1000)
    defaults = [e.reward for e in log if e.type == "default"]
    assert defaults == [-2.5] * len(made)


async def test_what_would_change_the_statistics_meaning_is_refused(
    service: ExperimentService, api: Api
) -> None:
    await api.create(COVARIATES)
    for body, says in (({"reg": 1.0}, "reg: not a live setting"),
                       ({"sigma_omega": 2, "epsilon": 0.1}, "sigma_omega: not a live setting"),
                       ({"policy": "greedy"}, "only epsilon, reward_window_seconds"),
                       ({"ev{il}": 1}, "<key>: not a live setting"),
                       ({}, "give one of"),
                       ({"epsilon": 2.0}, "less than or equal to 1"),
                       ({"default_reward": 1.0}, "one cannot be added"),
                       ({"reward_window_seconds": 10**9}, "reward_window_seconds")):
        before = await api.experiment("cov")
        response = await api.http.patch("/experiments/cov", json=body, headers=ADMIN)
        assert response.status_code == 422, (body, response.text)
        assert says in response.json()["message"], (body, response.text)
        assert "ev{il}" not in response.text
        assert await api.experiment("cov") == before  # nothing changed
    missing = await api.http.patch("/experiments/ghost", json={"epsilon": 0.1}, headers=ADMIN)
    assert missing.status_code == 404
    assert (await api.http.patch("/experiments/cov", json={"epsilon": 0.1})).status_code == 401
    changed = await api.http.patch("/experiments/cov", headers=ADMIN, json={
        "epsilon": 0.2, "max_stale_rewards": 3, "log_max_entries": 50,
        "log_max_age_seconds": 120})
    assert changed.status_code == 200, changed.text
    view = changed.json()
    assert (view["config"]["epsilon"], view["max_stale_rewards"], view["log_max_entries"],
            view["log_max_age_seconds"]) == (0.2, 3, 50, 120)
    with pytest.raises(NotFound):
        await service.update_settings("ghost", {"epsilon": 0.1})
    with pytest.raises(InvalidInput, match="only these settings"):
        await service.update_settings("cov", {"dim": 4})


async def test_a_window_with_a_default_reward_may_grow_but_not_shrink(
    service: ExperimentService,
) -> None:
    """Decisions waiting for their default are kept in deadline order; a shorter window
    would let a new deadline come before an older one, and the sweeper (which stops at the
    first decision not due) would leave the older ones without their default."""
    await service.create(ExperimentSpec(id="live", setting="covariates", dim=2, arms=ARMS,
                                        reward_window_seconds=2, default_reward=0.5,
                                        log_max_entries=1000))
    early = await service.choose("live", CONTEXT)
    with pytest.raises(InvalidInput, match=r"cannot shrink .* default_reward"):
        await service.update_settings("live", {"reward_window_seconds": 1})
    assert (await service.get("live")).spec.reward_window_seconds == 2
    await service.update_settings("live", {"reward_window_seconds": 3})  # growing is fine
    late = await service.choose("live", CONTEXT)
    assert (early.expires_in_seconds, late.expires_in_seconds) == (2, 3)
    await asyncio.sleep(3.2)
    assert await service.sweep() == 2  # both got their default, in order
    log, _ = await service.read_log("live", limit=1000)
    assert sorted(e.decision_id for e in log if e.type == "default") == sorted(
        [early.decision_id, late.decision_id])
    # Without a default reward nothing waits in that order: the window may shrink.
    await service.create(ExperimentSpec(id="free", setting="covariates", dim=2, arms=ARMS,
                                        reward_window_seconds=5))
    view = await service.update_settings("free", {"reward_window_seconds": 1})
    assert view.spec.reward_window_seconds == 1


async def test_a_decision_made_with_a_window_from_before_a_patch_keeps_the_deadline_order(
    service: ExperimentService, redis_db: str
) -> None:
    """A worker retrying without the version (decide.lua's ARGV[3] '') may still hold the
    window from before a PATCH made it longer: its decision is listed no earlier than the
    last one, so the sweeper, which reads the list in order, misses no default."""
    import redis

    from service import keys
    from service.store import Store

    await service.create(ExperimentSpec(id="live", setting="covariates", dim=2, arms=ARMS,
                                        reward_window_seconds=60, default_reward=0.0))
    # Both decisions on the home member's list (with LINREBOOT_TEST_SHARDS the id decides it).
    home_id = next(f"first-{n}" for n in range(100)
                   if shards.shard_of(f"first-{n}", TEST_SHARDS) == 0)
    await service.choose("live", dataclasses.replace(CONTEXT, decision_id=home_id))
    client = redis.Redis.from_url(redis_db)
    store = Store.from_url(redis_db, 5.0)
    try:
        incarnation = client.hget(keys.meta("live"), "incarnation").decode()  # type: ignore[union-attr]
        reply = await store.decide(
            "live", "with-the-old-window", key_hash=None, incarnation=incarnation, seen=None,
            number=None, reserved=False, ttl_seconds=2, max_lag=0, grace_seconds=60,
            record=b"model:a\narm:a\na\n1\n0\n0.0\n0.5\n" + b"\0" * 16)
        assert reply.status == "recorded"
        entries: list[bytes] = client.lrange(keys.pending("live"), 0, -1)  # type: ignore[assignment]
        listed = [float(e.split()[0]) for e in entries]
        assert len(listed) == 2 and listed[1] >= listed[0]  # in order: not now + 2 s
        left: int = client.ttl(keys.decision("live", "with-the-old-window"))  # type: ignore[assignment]
        assert left >= 60 + 60 - 2  # its record outlives its later deadline and the grace
    finally:
        client.close()
        await store.close()
