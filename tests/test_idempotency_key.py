"""Changes of an experiment sent again under their ``Idempotency-Key``: a creation, a key
rotation and an addition of arms whose reply was lost (or answered 503 after they were
made) are answered as made, once, with the key they made; anything else under the same
key is refused as before."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from service import keys
from service.definition import IdempotencyKey
from service.domain import ArmSpec, ExperimentSpec
from service.errors import Conflict
from service.experiments import ExperimentService
from service.settings import Settings
from tests.conftest import ADMIN, ADMIN_TOKEN, COVARIATES, STOCHASTIC, Api

pytestmark = pytest.mark.anyio

CONTEXT = {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]}


def _under(key: str) -> dict[str, str]:
    return {**ADMIN, "Idempotency-Key": key}


async def _post(api: Api, path: str, key: str | None, body: Any = None) -> tuple[int, Any]:
    response = await api.http.post(path, json=body, headers=ADMIN if key is None else _under(key))
    return response.status_code, response.json()


async def test_a_creation_sent_again_answers_its_key_and_the_experiment_as_it_is(
        api: Api) -> None:
    status, first = await _post(api, "/experiments", "create-cov-1", COVARIATES)
    assert status == 201, first
    key = first["api_key"]
    assert (await api.choose(key, CONTEXT)).status_code == 200  # in use before the retry
    status, again = await _post(api, "/experiments", "create-cov-1", COVARIATES)
    assert status == 201, again
    assert again["api_key"] == key
    assert again["experiment"]["decisions"] == 1  # the same experiment, not made again
    assert (await api.choose(key, CONTEXT)).status_code == 200
    # Without the key, or under another key, the id is taken as before.
    for other in (None, "create-cov-2"):
        status, refused = await _post(api, "/experiments", other, COVARIATES)
        assert (status, refused["error"]) == (409, "conflict"), refused
    # The same key with another body is another request.
    status, refused = await _post(api, "/experiments", "create-cov-1",
                                  {**COVARIATES, "dim": 2})
    assert status == 409, refused
    assert (await api.experiment("cov"))["decisions"] == 2


async def test_a_creation_is_not_answered_again_once_its_key_is_replaced(api: Api) -> None:
    status, first = await _post(api, "/experiments", "create-1", COVARIATES)
    assert status == 201
    status, _ = await _post(api, "/experiments/cov/keys", None)
    assert status == 201
    status, refused = await _post(api, "/experiments", "create-1", COVARIATES)
    assert status == 409, refused  # the key it would answer is no longer the current one
    # Deleted and made again under the same Idempotency-Key: another incarnation, another
    # key; the first is refused by the new experiment.
    assert (await api.http.delete("/experiments/cov", headers=ADMIN)).status_code == 204
    status, second = await _post(api, "/experiments", "create-1", COVARIATES)
    assert status == 201
    assert second["api_key"] != first["api_key"]
    assert (await api.choose(first["api_key"], CONTEXT)).status_code == 403
    assert (await api.choose(second["api_key"], CONTEXT)).status_code == 200


async def test_a_creation_under_another_admin_token_is_another_request(
        service: ExperimentService) -> None:
    spec = ExperimentSpec(id="tok", setting="covariates", dim=2,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    _, key = await service.create(spec, IdempotencyKey("k", "first admin token"))
    _, again = await service.create(spec, IdempotencyKey("k", "first admin token"))
    assert again == key
    with pytest.raises(Conflict):
        await service.create(spec, IdempotencyKey("k", "second admin token"))


async def test_a_rotation_sent_again_answers_its_key_and_keeps_the_one_before(
        api: Api) -> None:
    original = await api.create(COVARIATES)
    status, first = await _post(api, "/experiments/cov/keys", "rotate-1")
    assert status == 201
    status, again = await _post(api, "/experiments/cov/keys", "rotate-1")
    assert (status, again["api_key"]) == (201, first["api_key"])
    # Rotated once: the original key is still the previous one, not revoked by a second.
    for key in (original, first["api_key"]):
        assert (await api.choose(key, CONTEXT)).status_code == 200
    status, second = await _post(api, "/experiments/cov/keys", "rotate-2")
    assert status == 201 and second["api_key"] != first["api_key"]
    assert (await api.choose(original, CONTEXT)).status_code == 403
    # The first Idempotency-Key sent again once its key was replaced: a new rotation,
    # which never brings a replaced key back.
    status, third = await _post(api, "/experiments/cov/keys", "rotate-1")
    assert status == 201
    assert third["api_key"] not in (original, first["api_key"], second["api_key"])
    assert (await api.choose(third["api_key"], CONTEXT)).status_code == 200


async def test_arms_added_again_are_answered_as_added(api: Api) -> None:
    await api.create(STOCHASTIC)
    arm = {"arms": [{"id": "c", "features": [0.5, 0.5]}]}
    for _ in range(2):
        status, view = await _post(api, "/experiments/sto/arms", "add-c", arm)
        assert status == 200, view
        assert [a["id"] for a in view["arms"]] == ["a", "b", "c"]
    for other in (None, "add-c-again"):  # not the request that added it: taken
        status, refused = await _post(api, "/experiments/sto/arms", other, arm)
        assert (status, refused["error"]) == (409, "conflict"), refused
    # Not as asked (other features), or no longer active: not an addition made before.
    status, refused = await _post(api, "/experiments/sto/arms", "add-c",
                                  {"arms": [{"id": "c", "features": [0.5, 0.25]}]})
    assert status == 409, refused
    retired = await api.http.post("/experiments/sto/arms/retire", json={"arm_ids": ["c"]},
                                  headers=ADMIN)
    assert retired.status_code == 200
    status, refused = await _post(api, "/experiments/sto/arms", "add-c", arm)
    assert status == 409, refused


@pytest.mark.parametrize("header", [b"", b"with space", b"x" * 129, "ü".encode()])
async def test_a_malformed_idempotency_key_is_refused_and_nothing_made(
        api: Api, header: bytes) -> None:
    response = await api.http.post("/experiments", json=COVARIATES,
                                   headers=[*((k.encode(), v.encode()) for k, v in ADMIN.items()),
                                            (b"Idempotency-Key", header)])
    assert response.status_code == 422, response.text
    assert "Idempotency-Key" in response.json()["message"]
    assert await api.ids() == []


async def test_an_idempotency_key_without_the_admin_token_is_refused(api: Api) -> None:
    response = await api.http.post("/experiments", json=COVARIATES,
                                   headers={"Idempotency-Key": "k"})
    assert response.status_code == 401
    wrong = await api.http.post("/experiments", json=COVARIATES, headers={
        "Authorization": f"Bearer not-{ADMIN_TOKEN}", "Idempotency-Key": "k"})
    assert wrong.status_code == 403
    assert await api.ids() == []


async def test_a_change_is_answered_again_only_within_the_idempotency_window(
        service: ExperimentService, app_settings: Settings, redis_db: str) -> None:
    """Made again from the request, a key could be had again for as long as the change
    is answered again: LINREBOOT_IDEMPOTENCY_SECONDS, like a decision's answer."""
    spec = ExperimentSpec(id="old", setting="covariates", dim=2,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    header = IdempotencyKey("k", ADMIN_TOKEN)
    _, key = await service.create(spec, header)
    rotated = await service.rotate_key("old", header)
    assert await service.rotate_key("old", header) == rotated  # within the window
    long_ago = repr(time.time() - app_settings.idempotency_seconds - 1)
    with redis.Redis.from_url(redis_db) as client:
        client.hset(keys.meta("old"), mapping={"created_at": long_ago,
                                               "key_rotated_at": long_ago})
    with pytest.raises(Conflict):
        await service.create(spec, header)
    # Rotating again would revoke the key the lost reply's replaced, which the clients
    # may still use: refused, and nothing changes.
    with pytest.raises(Conflict, match="new Idempotency-Key"):
        await service.rotate_key("old", header)
    again = await service.rotate_key("old", IdempotencyKey("k2", ADMIN_TOKEN))
    assert again not in (key, rotated)
    assert await service.revoke_previous_key("old") is True  # rotated's, revoked
    # A time that cannot be read (a damaged field) is as none: the experiment is read,
    # the rotation not answered again.
    with redis.Redis.from_url(redis_db) as client:
        client.hset(keys.meta("old"), "key_rotated_at", "garbage")
    assert (await service.get("old")).previous_key_valid is False
    with pytest.raises(Conflict):
        await service.rotate_key("old", IdempotencyKey("k2", ADMIN_TOKEN))


async def test_the_same_addition_sent_twice_at_once_is_made_once(
        service: ExperimentService, other_service: ExperimentService,
        app_settings: Settings) -> None:
    """Two attempts of one addition at once (a retry overtaking its first attempt), the
    arms filling the experiment: one adds them, the other finds them added under its key
    and answers as made, not 'at most N arms'."""
    room = app_settings.max_arms - 2
    await service.create(ExperimentSpec(id="full", setting="covariates", dim=2,
                                        arms=(ArmSpec("a"), ArmSpec("b"))))
    await other_service.get("full")
    arms = [ArmSpec(f"x{i}") for i in range(room)]
    header = IdempotencyKey("fill", ADMIN_TOKEN)
    views = await asyncio.gather(service.add_arms("full", arms, header),
                                 other_service.add_arms("full", arms, header))
    assert [len(v.arms) for v in views] == [app_settings.max_arms] * 2


async def test_a_change_under_an_idempotency_key_says_it_back(api: Api) -> None:
    """Whatever its status, so that a client knows it may send the change again: a
    service that ignores the header would make it twice."""
    made = await api.http.post("/experiments", json=COVARIATES, headers=_under("c-1"))
    taken = await api.http.post("/experiments", json=COVARIATES, headers=_under("c-2"))
    assert (made.status_code, taken.status_code) == (201, 409)
    assert made.headers["Idempotency-Key"] == "c-1" and taken.headers["Idempotency-Key"] == "c-2"
    plain = await api.http.post("/experiments/cov/keys", headers=ADMIN)
    assert plain.status_code == 201 and "Idempotency-Key" not in plain.headers
    ignored = await api.http.get("/experiments/cov", headers=_under("read"))
    assert ignored.status_code == 200 and "Idempotency-Key" not in ignored.headers


async def test_two_attempts_of_one_rotation_at_once_answer_one_key(
        service: ExperimentService, other_service: ExperimentService, redis_db: str) -> None:
    """A retry sent while its first attempt still runs reads the same current key; the
    first rotates, the retry's compare-and-set fails and it answers the key the first
    made (not a 409 that would leave the new key known to nobody). And a worker whose
    clock is behind the one that rotated still answers it again."""
    spec = ExperimentSpec(id="race", setting="covariates", dim=2,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    _, original = await service.create(spec)
    header = IdempotencyKey("rotate", ADMIN_TOKEN)
    keys_made = await asyncio.gather(service.rotate_key("race", header),
                                     other_service.rotate_key("race", header))
    assert keys_made[0] == keys_made[1] != original
    assert (await service.get("race")).previous_key_valid  # rotated once
    with redis.Redis.from_url(redis_db) as client:  # made by a clock 2 s ahead
        client.hset(keys.meta("race"), "key_rotated_at", repr(time.time() + 2))
    assert await other_service.rotate_key("race", header) == keys_made[0]
    assert await service.revoke_previous_key("race") is True
    assert await service.revoke_previous_key("race") is False  # the original, only


async def test_a_sharded_creation_sent_again_does_not_wait_for_a_claim(
        service: ExperimentService, redis_db: str) -> None:
    """A sharded creation takes a claim on its id while it makes the members; sent again
    while a claim is still held (its first attempt's, not yet released), it answers as
    made from the home rather than 503 'being created' for up to the claim's 15 s."""
    spec = ExperimentSpec(id="wide", setting="covariates", dim=2, shards=3,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    header = IdempotencyKey("wide-1", ADMIN_TOKEN)
    _, key = await service.create(spec, header)
    with redis.Redis.from_url(redis_db) as client:
        client.set(keys.creating("wide"), "an attempt's claim", ex=15)
    view, again = await service.create(spec, header)
    assert again == key and view.spec.shards == 3
