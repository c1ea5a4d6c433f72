"""API keys that rotate (issue 29): an experiment takes its current key and, after a
rotation, the one before it until that is revoked; no request fails in between, and
a revocation holds at once on every worker."""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import pytest

from service.definition import hash_key
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.errors import Forbidden, NotFound
from service.experiments import ExperimentService
from tests.conftest import ADMIN, COVARIATES, Api

pytestmark = pytest.mark.anyio

SPEC = ExperimentSpec(id="keys", setting="covariates", dim=2,
                      arms=(ArmSpec("a"), ArmSpec("b")))
CONTEXT = ChooseRequest(context=(1.0, 0.5))
COV_CONTEXT = {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]}


async def test_a_rotation_keeps_the_old_key_until_it_is_revoked_on_every_worker(
    service: ExperimentService, other_service: ExperimentService
) -> None:
    _, old = await service.create(SPEC)
    await service.choose("keys", CONTEXT, old)  # this worker now holds a view and the key
    new = await other_service.rotate_key("keys")  # rotated through another worker
    assert new != old and (await service.get("keys")).previous_key_valid
    for key in (old, new, old):  # both taken, by the worker whose view predates the new one
        decision = await service.choose("keys", CONTEXT, key)
        (outcome,) = await service.reward("keys", [(decision.decision_id, 1.0)], key)
        assert outcome.status == "applied"
    assert await other_service.revoke_previous_key("keys") is True
    assert await other_service.revoke_previous_key("keys") is False  # nothing left to revoke
    assert not (await service.get("keys")).previous_key_valid
    decision = await service.choose("keys", CONTEXT, new)
    with pytest.raises(Forbidden):  # this worker's view still names the old key
        await service.choose("keys", CONTEXT, old)
    with pytest.raises(Forbidden):
        await service.reward("keys", [(decision.decision_id, 1.0)], old)
    (outcome,) = await service.reward("keys", [(decision.decision_id, 1.0)], new)
    assert outcome.status == "applied"
    # A second rotation leaves only the last two keys valid.
    newer = await service.rotate_key("keys")
    with pytest.raises(Forbidden):
        await other_service.choose("keys", CONTEXT, old)
    for key in (new, newer):
        await other_service.choose("keys", CONTEXT, key)
    with pytest.raises(NotFound):
        await service.rotate_key("ghost")
    with pytest.raises(NotFound):
        await service.revoke_previous_key("ghost")


async def test_a_rotation_delivered_again_keeps_the_key_before_it(service: ExperimentService
                                                                ) -> None:
    """keys.lua run twice with the same new key as two calls (a call held up in the
    network and delivered after its resend was answered: once.lua's answer no longer
    serves it): the key before the rotation stays valid."""
    _, old = await service.create(SPEC)
    new_hash = "ab" * 32
    assert await service._store.rotate_key("keys", new_hash, hash_key(old), "") == 1
    assert await service._store.rotate_key("keys", new_hash, hash_key(old), "") == 1
    assert await service._store.key_hashes("keys") == (new_hash, hash_key(old))


async def test_a_rotation_held_up_behind_a_later_one_changes_nothing(
        service: ExperimentService) -> None:
    """A rotation made from a key read before another rotation (an attempt held up in
    the network while its retry and a later rotation were made) finds the current key
    another and changes nothing: made, it would bring back a key already replaced."""
    _, old = await service.create(SPEC)
    first, later = "ab" * 32, "cd" * 32
    assert await service._store.rotate_key("keys", first, hash_key(old), "") == 1
    assert await service._store.rotate_key("keys", later, first, "") == 1
    assert await service.revoke_previous_key("keys") is True  # the first key revoked
    assert await service._store.rotate_key("keys", first, hash_key(old), "") == -1
    assert await service._store.key_hashes("keys") == (later,)


async def test_no_request_fails_while_the_key_rotates_under_load(api: Api) -> None:
    """Clients keep deciding and rewarding while the key rotates; each moves to the new
    key when it next looks; the old key is revoked only once all have moved. Every
    request answers 200; afterwards the old key answers 403."""
    old = await api.create(COVARIATES)
    holder = {"key": old}
    statuses: list[int] = []
    moved = asyncio.Event()
    counter = itertools.count()

    async def client() -> None:
        mine = old
        while not moved.is_set() or mine != holder["key"]:
            if next(counter) % 7 == 0:
                mine = holder["key"]  # picks the new key up at its own pace
            chosen = await api.choose(mine, COV_CONTEXT)
            statuses.append(chosen.status_code)
            if chosen.status_code == 200:
                rewarded = await api.reward(mine, {
                    "experiment_id": "cov", "decision_id": chosen.json()["decision_id"],
                    "reward": 1.0})
                statuses.append(rewarded.status_code)
            await asyncio.sleep(0)

    clients = [asyncio.ensure_future(client()) for _ in range(6)]
    await asyncio.sleep(0.3)
    rotated = await api.http.post("/experiments/cov/keys", headers=ADMIN)
    assert rotated.status_code == 201, rotated.text
    holder["key"] = rotated.json()["api_key"]
    moved.set()
    await asyncio.gather(*clients)
    assert statuses and set(statuses) == {200}
    revoked = await api.http.delete("/experiments/cov/keys/previous", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json() == {"revoked": True}
    assert (await api.choose(old, COV_CONTEXT)).status_code == 403
    assert (await api.choose(holder["key"], COV_CONTEXT)).status_code == 200
    view = await api.experiment("cov")
    assert view["previous_key_valid"] is False and view["rewards"] == statuses.count(200) // 2
    for method, path in (("POST", "/experiments/ghost/keys"),
                         ("DELETE", "/experiments/ghost/keys/previous")):
        response = await api.http.request(method, path, headers=ADMIN)
        assert response.status_code == 404, (method, path)
        assert (await api.http.request(method, "/experiments/cov/keys"
                                       + ("/previous" if method == "DELETE" else ""))
                ).status_code == 401  # the admin token is needed


async def test_the_admin_token_file_rotates_without_a_restart(
    redis_db: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 29: one admin token, from the environment, could not change without a
    restart. LINREBOOT_ADMIN_TOKEN_FILE may hold several tokens, one a line, and is read
    again when it changes; a file that cannot serve keeps the tokens it held last."""
    import httpx
    from pydantic import SecretStr

    from app.main import create_app
    from service.settings import Settings

    secret = tmp_path / "admin_tokens"
    secret.write_text("old-token\n")
    settings = Settings(redis_url=redis_db, admin_token=SecretStr("change-me"),
                        admin_token_file=secret)
    app = create_app(settings)

    async def status(http: httpx.AsyncClient, token: str) -> int:
        response = await http.get("/experiments", headers={"Authorization": f"Bearer {token}"})
        return response.status_code

    def rewrite(text: str) -> None:
        before = secret.stat().st_mtime_ns if secret.exists() else 0
        secret.write_text(text)
        os.utime(secret, ns=(before + 10**9, before + 10**9))  # a change, however fast

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            assert [await status(http, t) for t in ("old-token", "new-token")] == [200, 403]
            rewrite("old-token\n\nnew-token\n")  # both, while the callers move
            assert [await status(http, t) for t in ("old-token", "new-token")] == [200, 200]
            rewrite("new-token\n")
            assert [await status(http, t) for t in ("old-token", "new-token")] == [403, 200]
            secret.unlink()  # gone: the last tokens serve, with one warning
            with caplog.at_level("WARNING", logger="linreboot.app"):
                for _ in range(3):
                    assert await status(http, "new-token") == 200
            warned = [r for r in caplog.records if "ADMIN_TOKEN_FILE" in r.getMessage()]
            assert len(warned) == 1
            rewrite("")  # empty: refused as a source, the last tokens serve
            assert await status(http, "new-token") == 200
            rewrite("newest-token\n")  # serving again
            assert [await status(http, t) for t in ("new-token", "newest-token")] == [403, 200]
            rewrite("newest-token\nchange-me\n")  # the documented default: refused
            assert [await status(http, t) for t in ("newest-token", "change-me")] == [200, 403]
    secret.write_text("a-secret\nchange-me\n")
    with pytest.raises(ValueError, match=r"ADMIN_TOKEN_FILE: .* holds the documented default"):
        Settings(redis_url=redis_db, admin_token_file=secret)
