"""Idempotent decisions (issue 29): a ``/choose`` that names its own ``decision_id``
gets the same decision when it is sent again, recorded once; the same id with another
request is a 409. So a client may retry a ``/choose`` whose reply was lost."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from service.domain import ArmSpec, ChooseRequest, Decision, ExperimentSpec
from service.errors import Conflict
from service.experiments import ExperimentService
from service.settings import Settings
from tests.conftest import Api, decision_numbers

pytestmark = pytest.mark.anyio

SPEC = ExperimentSpec(id="idem", setting="covariates", dim=2,
                      arms=(ArmSpec("a"), ArmSpec("b"), ArmSpec("c")), log_max_entries=1000)


def _but_window(decision: Decision) -> Decision:
    return dataclasses.replace(decision, expires_in_seconds=0)


async def test_a_repeat_says_how_long_its_reward_may_still_come_in(
    service: ExperimentService,
) -> None:
    """A retry's expires_in_seconds is what is left of the window (the record's time to
    live; with a default reward, until the deadline), not the whole window again."""
    for spec in (dataclasses.replace(SPEC, reward_window_seconds=60),
                 dataclasses.replace(SPEC, id="idem-d", reward_window_seconds=60,
                                     default_reward=0.0)):
        await service.create(spec)
        request = ChooseRequest(context=(0.3, -1.0), decision_id="late-retry")
        first = await service.choose(spec.id, request)
        assert first.expires_in_seconds == 60
        await asyncio.sleep(2.1)
        again = await service.choose(spec.id, request)
        assert 56 <= again.expires_in_seconds <= 58, spec.id  # 60 - 2.1, as Redis rounds


async def test_the_same_request_under_the_same_id_is_the_same_decision_recorded_once(
    service: ExperimentService, other_service: ExperimentService
) -> None:
    await service.create(SPEC)
    request = ChooseRequest(context=(0.3, -1.0), decision_id="order-17:slot-1")
    first = await service.choose("idem", request)
    assert first.decision_id == "order-17:slot-1"
    # Rewards in between change the statistics: a retry still gets the first answer.
    for _ in range(3):
        other = await service.choose("idem", ChooseRequest(context=(1.0, 1.0)))
        await service.reward("idem", [(other.decision_id, 1.0)])
    again = [await w.choose("idem", request) for w in (service, other_service, service)]
    # the same decision, with the time its reward may still come in (no more than before)
    assert all(_but_window(d) == _but_window(first) for d in again)
    assert all(0 < d.expires_in_seconds <= first.expires_in_seconds for d in again)
    view = await service.get("idem")
    assert view.decisions == 4  # the three others and this one, once
    log, _ = await service.read_log("idem", limit=1000)
    assert [e.decision_id for e in log if e.type == "decision"].count("order-17:slot-1") == 1
    (outcome,) = await service.reward("idem", [("order-17:slot-1", 0.5)])
    assert outcome.status == "applied"
    rewarded = await service.choose("idem", request)  # after its reward too
    assert _but_window(rewarded) == _but_window(first) and rewarded.expires_in_seconds == 0
    with pytest.raises(Conflict, match="another request"):
        await service.choose("idem", ChooseRequest(context=(0.3, -0.9),
                                                   decision_id="order-17:slot-1"))
    assert (await service.get("idem")).decisions == 4


async def test_an_id_answered_before_a_delete_is_a_fresh_decision_of_the_new_experiment(
    service: ExperimentService,
) -> None:
    """The kept answer belongs to the experiment as it was: deleted and created again, the
    experiment decides afresh under the same id (it has none of the old decisions)."""
    await service.create(SPEC)
    request = ChooseRequest(context=(0.3, -1.0), decision_id="reused")
    await service.choose("idem", request)
    await service.delete("idem")
    await service.create(SPEC)
    fresh = await service.choose("idem", request)
    assert fresh.decision_number == decision_numbers(["reused"])[0]  # the first (1 unsharded)
    assert (await service.get("idem")).decisions == 1  # recorded, not an old answer repeated
    log, _ = await service.read_log("idem", limit=1000)
    assert [e.decision_id for e in log if e.type == "decision"] == ["reused"]
    (outcome,) = await service.reward("idem", [("reused", 1.0)])
    assert outcome.status == "applied"
    repeated = await service.choose("idem", request)  # and its retries repeat it
    assert _but_window(repeated) == _but_window(fresh)
    assert repeated.expires_in_seconds == 0  # (rewarded: nothing more to wait for)


async def test_an_id_whose_answer_is_no_longer_kept_is_refused_while_its_decision_lives(
    app_settings: Settings,
) -> None:
    """After LINREBOOT_IDEMPOTENCY_SECONDS the answer is gone but the decision (its window
    is longer) is not: a fresh answer under the id would contradict the recorded one."""
    settings = app_settings.model_copy(update={"idempotency_seconds": 1})
    service = await ExperimentService.open(settings)
    try:
        await service.create(SPEC)  # a reward window of an hour
        request = ChooseRequest(context=(0.3, -1.0), decision_id="slow-retry")
        first = await service.choose("idem", request)
        again = await service.choose("idem", request)  # within the second
        assert _but_window(again) == _but_window(first)
        await asyncio.sleep(1.3)
        with pytest.raises(Conflict, match=r"no longer kept .* choose a new id"):
            await service.choose("idem", request)
        assert (await service.get("idem")).decisions == 1
        (outcome,) = await service.reward("idem", [("slow-retry", 1.0)])
        assert outcome.status == "applied"  # the decision itself is intact
    finally:
        await service.close()


async def test_concurrent_retries_record_one_decision(
    service: ExperimentService, other_service: ExperimentService
) -> None:
    await service.create(SPEC)
    request = ChooseRequest(context=(0.3, -1.0), decision_id="burst")
    answers = await asyncio.gather(*(w.choose("idem", request)
                                     for w in (service, other_service) * 8))
    assert len({(d.arm_id, d.decision_number, d.propensity) for d in answers}) == 1
    assert (await service.get("idem")).decisions == 1


async def test_over_http_a_retry_is_the_same_answer_and_a_bad_id_is_refused(api: Api) -> None:
    key = await api.create({"id": "cov", "setting": "covariates", "dim": 3,
                            "arms": [{"id": "a"}, {"id": "b"}]})
    body = {"experiment_id": "cov", "context": [0.1, 0.2, 0.3], "decision_id": "req-1"}
    first, second = [await api.choose(key, body) for _ in range(2)]
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() and first.json()["decision_id"] == "req-1"
    other = await api.choose(key, {**body, "context": [0.1, 0.2, 0.4]})
    assert other.status_code == 409 and other.json()["error"] == "conflict"
    for bad in ("has space", "{tag}", "x" * 129, ""):
        refused = await api.choose(key, {**body, "decision_id": bad})
        assert refused.status_code == 422, bad
    assert (await api.experiment("cov"))["decisions"] == 1


async def test_an_answer_kept_by_the_version_before_incarnations_is_still_repeated(
    service: ExperimentService, redis_db: str
) -> None:
    """A retry across the upgrade: the request key as the previous version wrote it (no
    incarnation in front) is the current experiment's."""
    import redis

    from service import keys

    await service.create(SPEC)
    request = ChooseRequest(context=(0.3, -1.0), decision_id="upgraded")
    first = await service.choose("idem", request)
    client = redis.Redis.from_url(redis_db)
    try:
        key = keys.request("idem", "upgraded")
        kept: bytes = client.get(key)  # type: ignore[assignment]
        assert kept.startswith(b"p")
        client.set(key, kept.split(b"\n", 1)[1], keepttl=True)  # the old format
        assert _but_window(await service.choose("idem", request)) == _but_window(first)
    finally:
        client.close()
    assert (await service.get("idem")).decisions == 1
