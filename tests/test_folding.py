"""Outcomes recorded by the scripts and added to the sums by the workers (service.folding).

The scripts append each reward to the experiment's outcomes string; a
worker's view adds the records it reads; every FOLD_EVERY rewards one worker
writes the sums back and cuts those records. These tests hold the stored
sums, read raw (no outcome left to add), to the policies' own update, bit for
bit, and check that a fold that loses a race or meets a damaged store writes
nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from policies import PolicyConfig, paper_config
from policies.state import Axis
from service import keys
from service.codec import assemble_state, blob_size, pack
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.errors import Forbidden
from service.experiments import ExperimentService
from service.folding import (
    FOLD_EVERY,
    FOLD_LIMIT,
    fields_of,
    fold_into,
    folded_blobs,
    held_blobs,
    split_records,
)
from service.store import Store
from tests import records
from tests.test_service_durability import (
    Observation,
    assert_stats_equal,
    expected_state,
    stored_stats,
)

# Its experiments stay unsharded under LINREBOOT_TEST_SHARDS: the tests read and write
# the home's sums, outcomes and folded tail directly.
pytestmark = [pytest.mark.anyio, pytest.mark.unsharded]

ARMS = ("a", "b", "c")


def _raw(url: str, experiment_id: str) -> tuple[dict[str, bytes], list[bytes]]:
    """The stats hash as stored, and the records waiting in the outcomes string."""
    client = redis.Redis.from_url(url)
    try:
        raw: dict[bytes, bytes] = client.hgetall(keys.stats(experiment_id))  # type: ignore[assignment]
        outcomes: bytes = client.get(keys.outcomes(experiment_id))  # type: ignore[assignment]
    finally:
        client.close()
    return {k.decode(): v for k, v in raw.items()}, split_records(outcomes)[0]


def _counter(stats: dict[str, bytes], name: str) -> int:
    return int(stats.get(name, b"0"))


SPECS = {
    "stochastic": dict(setting="stochastic", dim=2,
                       arms=tuple(ArmSpec(a, (1.0 + i, 0.5 - i)) for i, a in enumerate(ARMS))),
    "covariates": dict(setting="covariates", dim=3, arms=tuple(ArmSpec(a) for a in ARMS)),
    "covariates, forgetting": dict(setting="covariates", dim=3, policy="linucb-const",
                                   arms=tuple(ArmSpec(a) for a in ARMS),
                                   hyperparameters={"discount": 0.9}),
}


@pytest.mark.parametrize("kind", SPECS)
async def test_the_sums_written_back_are_the_policies_update_bit_for_bit(
    service: ExperimentService, redis_db: str, kind: str
) -> None:
    """Single rewards, then a batch that crosses a multiple of FOLD_EVERY.

    After each single reward the sums hold every outcome up to the last
    multiple of FOLD_EVERY (the reward that reached it folded them) and the
    rest wait in the stats hash; the batch folds all. Read raw, the stored sums
    equal the policies' update applied outcome by outcome, in the order the
    rewards were given, bit for bit; at every step in between, so do the sums
    with the waiting outcomes added.
    """
    spec = ExperimentSpec(id="fold", seed=3, **SPECS[kind])  # type: ignore[arg-type]
    _, key = await service.create(spec)
    config = PolicyConfig(**(await service.get("fold")).config)  # type: ignore[arg-type]
    rng = np.random.default_rng(11)
    observations: list[Observation] = []

    async def decide() -> tuple[str, Observation]:
        x = rng.normal(size=spec.dim)
        request = (ChooseRequest(context=tuple(x)) if spec.setting != "stochastic"
                   else ChooseRequest())
        decision = await service.choose("fold", request, key)
        x_used = x if spec.setting != "stochastic" else np.array(
            spec.arms[ARMS.index(decision.arm_id)].features)
        return decision.decision_id, Observation(ARMS.index(decision.arm_id), x_used,
                                                 float(rng.normal()), decision.decision_number)

    singles = 2 * FOLD_EVERY + 5
    for n in range(1, singles + 1):
        decision_id, observation = await decide()
        (outcome,) = await service.reward("fold", [(decision_id, observation.reward)], key)
        assert outcome.status == "applied"
        observations.append(observation)
        await service.drain()  # the fold a reward starts runs in the background
        stats, waiting = _raw(redis_db, "fold")
        assert _counter(stats, keys.FOLDED) == n // FOLD_EVERY * FOLD_EVERY
        assert len(waiting) == n - _counter(stats, keys.FOLDED) == n % FOLD_EVERY
        if n % 7 == 0:  # the statistics a view reads: the sums and the waiting outcomes
            assert_stats_equal(config, ARMS, stored_stats(redis_db, "fold"),
                               expected_state(config, len(ARMS), _numbered(config, observations)))

    batch = [await decide() for _ in range(FOLD_EVERY)]
    outcomes = await service.reward("fold", [(d, o.reward) for d, o in batch], key)
    assert [o.status for o in outcomes] == ["applied"] * FOLD_EVERY
    observations += [o for _, o in batch]
    await service.drain()

    stats, waiting = _raw(redis_db, "fold")
    total = singles + FOLD_EVERY
    assert waiting == [] and _counter(stats, keys.FOLDED) == total
    assert _counter(stats, keys.REWARDS) == total
    assert_stats_equal(config, ARMS, stats,
                       expected_state(config, len(ARMS), _numbered(config, observations)))


def _numbered(config: PolicyConfig, observations: list[Observation]) -> list[Observation]:
    """Without forgetting the decision numbers play no part (as in the store)."""
    if config.discounted:
        return observations
    return [Observation(o.arm, o.x, o.reward) for o in observations]


async def _waiting_outcomes(service: ExperimentService, key: str, n: int) -> None:
    """``n`` (< FOLD_EVERY) rewarded decisions whose outcomes wait in the stats hash."""
    for i in range(n):
        decision = await service.choose("fold", ChooseRequest(context=(1.0, 0.5 * i)), key)
        await service.reward("fold", [(decision.decision_id, float(i))], key)


async def _created(service: ExperimentService) -> str:
    _, key = await service.create(ExperimentSpec(
        id="fold", setting="covariates", dim=2, arms=tuple(ArmSpec(a) for a in ARMS)))
    return key


@pytest.mark.parametrize("meanwhile", ["another fold", "created again"])
async def test_a_fold_that_another_change_overtook_writes_nothing(
    service: ExperimentService, redis_db: str, meanwhile: str
) -> None:
    """Between a fold's read and its write another fold landed, or the experiment was
    deleted and created again: fold.lua refuses, the stats hash is as it was."""
    key = await _created(service)
    await _waiting_outcomes(service, key, 5)
    config = PolicyConfig(**(await service.get("fold")).config)  # type: ignore[arg-type]
    incarnation = (await service.views.definition("fold")).incarnation
    client = redis.Redis.from_url(redis_db)
    store = Store.from_url(redis_db, 5.0)
    try:
        def overtaken(*args: Any) -> dict[str, bytes]:
            if meanwhile == "another fold":
                client.hincrby(keys.stats("fold"), keys.FOLDED, 1)
            else:
                client.hset(keys.meta("fold"), "incarnation", "another")
            return folded_blobs(config, *args)

        before: dict[bytes, bytes] = client.hgetall(keys.stats("fold"))  # type: ignore[assignment]
        waiting = client.get(keys.outcomes("fold"))
        assert await store.fold("fold", incarnation, FOLD_LIMIT, overtaken) == 0
        after: dict[bytes, bytes] = client.hgetall(keys.stats("fold"))  # type: ignore[assignment]
        folded = keys.FOLDED.encode()
        assert after.pop(folded, None) == (b"1" if meanwhile == "another fold" else None)
        assert before.pop(folded, None) is None and after == before
        assert client.get(keys.outcomes("fold")) == waiting and waiting
        # Not overtaken, the same call folds the five.
        client.hset(keys.meta("fold"), "incarnation", incarnation)
        client.hdel(keys.stats("fold"), keys.FOLDED)
        assert await store.fold("fold", incarnation, FOLD_LIMIT,
                                lambda *a: folded_blobs(config, *a)) == 5
        assert _raw(redis_db, "fold")[1] == []
    finally:
        await store.close()
        client.close()


async def test_a_fold_takes_at_most_its_limit_oldest_first(
    service: ExperimentService, redis_db: str
) -> None:
    """After folding stopped for a while, bounded folds catch up, oldest outcomes first:
    the sums are the same as one fold's."""
    key = await _created(service)
    await _waiting_outcomes(service, key, 7)
    config = PolicyConfig(**(await service.get("fold")).config)  # type: ignore[arg-type]
    incarnation = (await service.views.definition("fold")).incarnation
    whole = stored_stats(redis_db, "fold")
    store = Store.from_url(redis_db, 5.0)
    try:
        def fold(*args: Any) -> dict[str, bytes]:
            return folded_blobs(config, *args)
        assert [await store.fold("fold", incarnation, 3, fold) for _ in range(4)] == [3, 3, 1, 0]
    finally:
        await store.close()
    stats, waiting = _raw(redis_db, "fold")
    assert waiting == []
    assert _sums(whole) and _sums(stats) == _sums(whole)


def _sums(stats: dict[str, bytes]) -> dict[str, bytes]:
    """The model and arm blobs of a stats hash."""
    return {f: v for f, v in stats.items() if f.startswith(("model", "arm:"))}


async def test_a_reward_is_applied_when_its_fold_fails(
    service: ExperimentService, redis_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The fold after the reward that reaches FOLD_EVERY meets a damaged blob: the
    reward is applied all the same (its outcome recorded), the fold writes
    nothing and says so in the log. (The worker holds no view of the experiment,
    so the fold reads the stored sums: a fold from a view's reads none.)"""
    key = await _created(service)
    await _waiting_outcomes(service, key, FOLD_EVERY - 1)
    decision = await service.choose("fold", ChooseRequest(context=(1.0, 1.0)), key)
    service.views.forget("fold")
    client = redis.Redis.from_url(redis_db)
    try:
        client.hset(keys.stats("fold"), keys.model_field(decision.arm_id), "\0" * 8)
        (outcome,) = await service.reward("fold", [(decision.decision_id, 1.0)], key)
        assert outcome.status == "applied"
        await service.drain()
        stats, waiting = _raw(redis_db, "fold")
        assert len(waiting) == FOLD_EVERY and keys.FOLDED not in stats
        assert _counter(stats, keys.REWARDS) == FOLD_EVERY
    finally:
        client.close()
    assert "the sums were not written back" in caplog.text


async def test_a_fold_from_a_view_writes_a_damaged_blob_over_with_the_sums_it_holds(
    service: ExperimentService, redis_db: str
) -> None:
    """A fold from the worker's view reads no stored blob: a blob damaged since the view
    read it (nothing the service writes does that) is written over with the sums the
    view holds and the outcomes added, which are the outcomes' sums (decided on purpose:
    the view's copy is the sums as they were written; a fold that reads the blobs
    meets the damage and fails, as above)."""
    key = await _created(service)
    config = PolicyConfig(**(await service.get("fold")).config)  # type: ignore[arg-type]
    observations = []
    for i in range(FOLD_EVERY):
        x = (1.0, 0.5 * i)
        decision = await service.choose("fold", ChooseRequest(context=x), key)
        if i == FOLD_EVERY - 1:
            client = redis.Redis.from_url(redis_db)
            try:
                client.hset(keys.stats("fold"), keys.model_field(decision.arm_id), "\0" * 8)
            finally:
                client.close()
        await service.reward("fold", [(decision.decision_id, float(i))], key)
        observations.append(Observation(ARMS.index(decision.arm_id), np.array(x), float(i)))
    await service.drain()
    stats, waiting = _raw(redis_db, "fold")
    assert waiting == [] and _counter(stats, keys.FOLDED) == FOLD_EVERY
    assert_stats_equal(config, ARMS, stats, expected_state(config, len(ARMS), observations))


async def test_a_worker_whose_view_is_of_a_deleted_namesake_still_folds(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    """The experiment was deleted and created again through another worker; this worker
    still holds a view of the first one when its reward reaches FOLD_EVERY: it reads
    the new definition and folds (the fold of the old one is refused)."""
    await _created(service)
    await service.choose("fold", ChooseRequest(context=(1.0, 0.0)))  # a view of the first
    await other_service.delete("fold")
    key = await _created(other_service)
    for i in range(FOLD_EVERY):
        decision = await other_service.choose("fold", ChooseRequest(context=(1.0, 0.5 * i)), key)
        await service.reward("fold", [(decision.decision_id, float(i))], key)
    await service.drain()
    stats, waiting = _raw(redis_db, "fold")
    assert waiting == [] and _counter(stats, keys.FOLDED) == FOLD_EVERY


async def test_a_reward_does_not_wait_for_the_fold_it_starts(
    service: ExperimentService, redis_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: the reward that crosses a multiple of FOLD_EVERY used to write the sums
    back before it answered (one reward in 16 waited milliseconds). The fold now runs
    in the background: here it is held until the reply is in, and it then completes."""
    key = await _created(service)
    await _waiting_outcomes(service, key, FOLD_EVERY - 1)
    decision = await service.choose("fold", ChooseRequest(context=(1.0, 1.0)), key)
    release = asyncio.Event()
    started = asyncio.Event()
    real_fold = Store.fold

    async def held_fold(self: Store, *args: Any, **kwargs: Any) -> Any:
        started.set()
        await release.wait()
        return await real_fold(self, *args, **kwargs)

    monkeypatch.setattr(Store, "fold", held_fold)
    (outcome,) = await asyncio.wait_for(
        service.reward("fold", [(decision.decision_id, 1.0)], key), timeout=10)
    assert outcome.status == "applied"
    await asyncio.wait_for(started.wait(), timeout=10)  # the fold is under way, not done
    stats, waiting = _raw(redis_db, "fold")
    assert keys.FOLDED not in stats and len(waiting) == FOLD_EVERY
    release.set()
    await service.drain()
    stats, waiting = _raw(redis_db, "fold")
    assert waiting == [] and _counter(stats, keys.FOLDED) == FOLD_EVERY


async def test_the_folded_tail_keeps_the_last_records_folds_took(
    service: ExperimentService, redis_db: str
) -> None:
    """What a worker the folds overtook catches up from: the outcomes the last folds
    took, in order, each fold's count and bytes in the header (here all three folds':
    small records, well within the tail's 32 KB)."""
    await service.create(ExperimentSpec(id="tail", setting="covariates", dim=3,
                                        arms=tuple(ArmSpec(a) for a in ARMS)))
    rng = np.random.default_rng(2)
    numbers = []
    for _ in range(3 * FOLD_EVERY):
        decision = await service.choose("tail", ChooseRequest(
            context=tuple(float(v) for v in rng.normal(size=3))))
        await service.reward("tail", [(decision.decision_id, 1.0)])
        numbers.append(decision.decision_number)
        await service.drain()  # each fold done before the next reward
    stats, waiting = _raw(redis_db, "tail")
    assert waiting == [] and _counter(stats, keys.FOLDED) == 3 * FOLD_EVERY
    tail = records.folded_tail(stats)
    kept = split_records(tail.records)[0]
    assert (tail.ends, tail.outcomes, len(kept)) == (3 * FOLD_EVERY, 3 * FOLD_EVERY, 3 * FOLD_EVERY)
    assert [(slot, n) for slot, n, _ in tail.folds] == [(0, FOLD_EVERY), (1, FOLD_EVERY),
                                                       (2, FOLD_EVERY)]
    for slot, _, size in tail.folds:  # each fold's records in its own field
        assert len(stats[keys.folded_tail_field(slot)]) == size
    # (a record: model field, arm field, decision number, reward, context)
    assert [int(r.split(b"\n")[2]) for r in kept] == numbers


@pytest.mark.parametrize("before", ["an earlier version's", "too large to keep", "a full ring",
                                    "sizes that do not add up", "a space short",
                                    "a slot beyond the ring", "slots out of turn"])
async def test_a_fold_keeps_the_tail_before_it_only_whole_and_sound(
    service: ExperimentService, redis_db: str, before: str
) -> None:
    """The next fold after a tail of ``before``: an earlier version's (the records in the
    index's field after a newline: as if there were none); a fold of more than the
    tail's 32 KB (dropped whole); a ring of TAIL_FOLDS folds (the oldest dropped, its
    slot taken by the new fold); an index whose sizes do not add up to its count, short
    of its space, naming a slot beyond the ring or its slots out of turn (damaged: as if
    there were none, the slots an earlier fold may have left dropped). The new tail holds
    its own fold's records after whatever it kept, its index says so, and no field of a
    fold it dropped is left."""
    await service.create(ExperimentSpec(id="kept", setting="covariates", dim=3,
                                        arms=tuple(ArmSpec(a) for a in ARMS)))
    rng = np.random.default_rng(4)
    numbers = []

    async def fold() -> None:  # FOLD_EVERY rewards, and the fold they start
        for _ in range(FOLD_EVERY):
            decision = await service.choose("kept", ChooseRequest(
                context=tuple(float(v) for v in rng.normal(size=3))))
            await service.reward("kept", [(decision.decision_id, 1.0)])
            numbers.append(decision.decision_number)
        await service.drain()

    await fold()
    stats, _ = _raw(redis_db, "kept")
    body = stats[keys.folded_tail_field(0)]
    assert stats[keys.FOLDED_TAIL] == f"{FOLD_EVERY} {FOLD_EVERY} 0:{FOLD_EVERY}/{len(body)}" \
        .encode()
    first = split_records(body)[0]
    big = b"".join(b"%d:%s" % (1200, b"x" * 1200) for _ in range(FOLD_EVERY))
    # A full ring: the first fold's records two by two in TAIL_FOLDS folds, the slots
    # from 5 round to 4, so that the ring wraps.
    pieces = [b"".join(b"%d:%s" % (len(r), r) for r in first[2 * i:2 * i + 2])
              for i in range(keys.TAIL_FOLDS)]
    ring = {keys.folded_tail_field((5 + i) % keys.TAIL_FOLDS): piece
            for i, piece in enumerate(pieces)}
    sizes = ",".join(f"{(5 + i) % keys.TAIL_FOLDS}:2/{len(p)}" for i, p in enumerate(pieces))
    # Slots an earlier fold may have left: a tail that starts anew drops them.
    stale = {keys.folded_tail_field(3): body, keys.folded_tail_field(15): body}
    tail: dict[str, bytes] = {
        "an earlier version's": {
            keys.FOLDED_TAIL: f"{FOLD_EVERY} {FOLD_EVERY} {FOLD_EVERY}/{len(body)}\n".encode()
            + body, **stale},
        "too large to keep": {keys.FOLDED_TAIL: f"{FOLD_EVERY} {FOLD_EVERY} 0:{FOLD_EVERY}/"
                              f"{len(big)}".encode(), keys.folded_tail_field(0): big},
        "a full ring": {keys.FOLDED_TAIL: f"{FOLD_EVERY} {FOLD_EVERY} {sizes}".encode(), **ring},
        "sizes that do not add up": {
            keys.FOLDED_TAIL: f"{FOLD_EVERY} {FOLD_EVERY + 1} 0:{FOLD_EVERY}/{len(body)}"
            .encode(), **stale},
        "a space short": {keys.FOLDED_TAIL: f"{FOLD_EVERY} {FOLD_EVERY}0:{FOLD_EVERY}/"
                          f"{len(body)}".encode(), **stale},
        "a slot beyond the ring": {
            keys.FOLDED_TAIL: f"{FOLD_EVERY} {FOLD_EVERY} {keys.TAIL_FOLDS}:{FOLD_EVERY}/"
            f"{len(body)}".encode(), **stale},
        "slots out of turn": {
            keys.FOLDED_TAIL: f"{FOLD_EVERY} {FOLD_EVERY} 1:2/{len(pieces[0])},"
            f"0:{FOLD_EVERY - 2}/{len(body) - len(pieces[0])}".encode(),
            keys.folded_tail_field(1): pieces[0], **stale},
    }[before]
    client = redis.Redis.from_url(redis_db)
    try:
        client.hset(keys.stats("kept"), mapping=tail)
    finally:
        client.close()
    await fold()

    stats, _ = _raw(redis_db, "kept")
    now = records.folded_tail(stats)
    kept = split_records(now.records)[0]
    assert now.ends == 2 * FOLD_EVERY
    assert now.outcomes == len(kept) == sum(n for _, n, _ in now.folds)
    assert sum(size for _, _, size in now.folds) == len(now.records)
    full = before == "a full ring"
    assert [slot for slot, _, _ in now.folds] == (
        [(5 + i) % keys.TAIL_FOLDS for i in range(1, keys.TAIL_FOLDS + 1)] if full else
        [1] if before == "too large to keep" else [0])
    fields = {name for name in stats if name.startswith(f"{keys.FOLDED_TAIL}:")}
    assert fields == {keys.folded_tail_field(slot) for slot, _, _ in now.folds}
    # (a record: model field, arm field, decision number, reward, context)
    assert [int(r.split(b"\n")[2]) for r in kept] == numbers[2 if full else FOLD_EVERY:]


def test_the_scripts_and_the_service_agree_on_the_tail_s_ring() -> None:
    """tail.lua's TAIL_FOLDS is keys.TAIL_FOLDS (the upgrade drops that many slots)."""
    script = (Path(keys.__file__).parent / "lua" / "tail.lua").read_text()
    assert f"local TAIL_FOLDS = {keys.TAIL_FOLDS}\n" in script


@pytest.mark.parametrize("kind", SPECS)
async def test_a_view_catches_up_with_new_outcomes_to_the_bits_of_a_full_read(
    service: ExperimentService, other_service: ExperimentService, redis_db: str,
    monkeypatch: pytest.MonkeyPatch, kind: str,
) -> None:
    """A worker that applied a reward, or whose decision decide.lua found stale, adds the
    outcomes it lacks to its view instead of reading the sums again, unless a fold took
    outcomes it never added and the folded tail no longer has (then it reads them).
    Rewards come through both workers (half of this worker's decisions are rewarded
    through the other, so that its next decision is found stale), and folds by the other
    take outcomes this one has not seen now and then: the folded tail has them. After
    every decision this worker's view holds the statistics a full read gives, bit for
    bit."""
    from service.definition import state_for as _state_for

    spec = ExperimentSpec(id="fold", seed=5, **SPECS[kind])  # type: ignore[arg-type]
    _, key = await service.create(spec)
    full_reads = 0
    read_snapshot = Store.read_snapshot

    async def counted(self: Store, experiment_id: str) -> Any:
        nonlocal full_reads
        full_reads += 1
        return await read_snapshot(self, experiment_id)

    monkeypatch.setattr(Store, "read_snapshot", counted)
    partial_replies = 0
    decide = Store.decide

    async def watched(self: Store, *args: Any, **kwargs: Any) -> Any:
        nonlocal partial_replies, full_reads
        reply = await decide(self, *args, **kwargs)
        partial_replies += reply.progress is not None
        full_reads += reply.snapshot is not None  # a stale reply with the whole statistics
        return reply

    monkeypatch.setattr(Store, "decide", watched)
    rng = np.random.default_rng(8)
    store = Store.from_url(redis_db, 5.0)
    try:
        compared = 0
        for i in range(3 * FOLD_EVERY):
            context = tuple(rng.normal(size=spec.dim)) if spec.setting != "stochastic" else None
            mine = await service.choose("fold", ChooseRequest(context=context), key)
            view = service.views.held["fold"]  # caught up before deciding: this reward's after
            read = await store.read_experiment("fold")
            assert read is not None
            config, snapshot = view.definition.config, read[2]
            assert view.rewards == snapshot.rewards
            fresh = _state_for(config, list(view.definition.arms), snapshot.stats,
                               snapshot.unfolded)
            assert fresh.keys() == view.sums.keys()
            for name, value in fresh.items():
                assert np.array_equal(value, view.sums[name]), (i, name)
            compared += 1
            rewarding = service if i % 2 == 0 else other_service
            await rewarding.reward("fold", [(mine.decision_id, float(rng.normal()))], key)
            await other_service.drain()  # its fold, if its reward started one, done
            if i % 3 == 0:  # the other worker's decisions and rewards meanwhile
                theirs = await other_service.choose("fold", ChooseRequest(context=context), key)
                await other_service.reward("fold", [(theirs.decision_id, 1.0)], key)
                await other_service.drain()  # its fold, if that reward started one, done
    finally:
        await store.close()
    assert compared == 3 * FOLD_EVERY
    # Every catching up added outcomes (some from stale replies), across the other
    # worker's folds too (before the folded tail, those forced reads).
    assert full_reads == 0 and partial_replies > 0


async def test_an_experiment_of_the_version_that_added_in_lua_is_refused_until_upgraded(
    app_settings: Any, redis_db: str
) -> None:
    """Its recipes lack ',recorded' (a worker of that version may still add to its sums):
    this version's scripts refuse its rewards, writing nothing; the start-up upgrade
    gives it the suffix and an empty outcomes string (what a namesake deleted by that
    version left is gone), without walking its decisions; then rewards count."""
    service = await ExperimentService.open(app_settings)
    try:
        key = await _created(service)
        decision = await service.choose("fold", ChooseRequest(context=(1.0, 0.5)), key)
    finally:
        await service.close()
    client = redis.Redis.from_url(redis_db)
    try:
        for axis in ("model", "arm"):
            recipe_text: bytes = client.hget(keys.meta("fold"), f"{axis}_recipe")  # type: ignore[assignment]
            assert recipe_text.endswith(b",recorded")
            client.hset(keys.meta("fold"), f"{axis}_recipe",
                        recipe_text.removesuffix(b",recorded").decode())
        client.set(keys.outcomes("fold"), b"left:by a namesake")
        store = Store.from_url(redis_db, 5.0)
        try:
            with pytest.raises(redis.ResponseError, match="restart the service to upgrade"):
                await store.apply_rewards("fold", None, [(decision.decision_id, "1.0")])
        finally:
            await store.close()
        untouched = records.read(redis_db, "fold", decision.decision_id)
        assert untouched is not None and untouched["status"] == "pending"
        upgraded = await ExperimentService.open(app_settings)
        try:
            assert upgraded.upgraded == ["fold"]
            assert client.get(keys.outcomes("fold")) == b""
            (outcome,) = await upgraded.reward("fold", [(decision.decision_id, 1.0)], key)
            assert outcome.status == "applied"
            assert (await upgraded.get("fold")).rewards == 1
        finally:
            await upgraded.close()
    finally:
        client.close()


async def test_a_view_after_a_reward_solves_only_the_model_that_changed(
    service: ExperimentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model per arm: a reward changes one of them. The view that catches up with it
    starts from copies of the solutions its predecessor kept, so its first request
    solves one model, not every one; and they are a solve of every model, bit for bit.
    (LinReBoot with the paper's spread keeps its solutions; the pooled one solves with
    each request's contexts.)"""
    import policies.state

    spec = ExperimentSpec(id="kept", seed=5, hyperparameters={"spread": "paper"},
                          **SPECS["covariates"])  # type: ignore[arg-type]
    _, key = await service.create(spec)
    ridge = policies.state.ridge
    solved: list[int] = []

    def counted(xtx: np.ndarray, xty: np.ndarray, reg: float) -> np.ndarray:
        solved.append(int(np.prod(xtx.shape[:-2])))
        return ridge(xtx, xty, reg)

    monkeypatch.setattr(policies.state, "ridge", counted)
    rng = np.random.default_rng(3)
    for i in range(2 * FOLD_EVERY):  # folds, by this worker, among them
        solved.clear()
        context = tuple(float(v) for v in rng.normal(size=spec.dim))
        decision = await service.choose("kept", ChooseRequest(context=context), key)
        assert sum(solved) == (len(ARMS) if i == 0 else 1), (i, solved)
        view = service.views.held["kept"]
        assert view._last is not None and isinstance(view._last.state, policies.state.Sums)
        theta = view._last.state.kept["theta"]
        reg = view.definition.config.reg
        assert np.array_equal(theta, ridge(view.state["xtx"], view.state["xty"], reg)), i
        await service.reward("kept", [(decision.decision_id, float(rng.normal()))], key)


@pytest.mark.parametrize("setting", ["stochastic", "contextual", "covariates"])
@pytest.mark.parametrize("policy", ["linreboot", "lints-g", "lints-ig", "linphe", "lingiro",
                                    "linucb"])
def test_pack_gives_back_the_blobs_each_slot_was_assembled_from(
    policy: str, setting: str
) -> None:
    """A fold packs every slot (arm) it touched at once: each slot's blob must be the
    one it was read from, byte for byte, the slots in order."""
    config = paper_config(policy, setting, 3)  # type: ignore[arg-type]
    rng = np.random.default_rng(len(policy) + len(setting))

    def blobs(axis: Axis, count: int) -> list[bytes]:
        size = blob_size(config, axis) // 8
        return [rng.normal(size=size).astype("<f8").tobytes() for _ in range(count)]

    arms = blobs("arm", 5)
    models = blobs("model", 1 if config.shared else 5)
    state = assemble_state(config, models, arms)
    assert pack(config, "model", state) == models
    assert pack(config, "arm", state) == arms


@pytest.mark.parametrize(("policy", "setting", "options"), [
    ("linreboot", "stochastic", {"spread": "pooled"}),  # the service's default
    ("linreboot", "covariates", {}),  # a model per arm
    ("linreboot", "contextual", {"residuals": "observed"}),  # per-arm Gram matrices too
    ("linucb-const", "covariates", {"discount": 0.9}),  # forgetting: clocks and numbers
])
def test_a_fold_from_a_view_writes_the_blobs_a_fold_that_reads_them_writes(
    policy: str, setting: str, options: dict[str, Any]
) -> None:
    """Issue 26: a worker whose view holds the stored sums with the fold's first outcomes
    added folds from it without reading the stored blobs (held_blobs). Whatever number of
    the outcomes the view holds (none, some, all), its blobs are those of the fold that
    reads the stored blobs and adds every outcome, byte for byte; the view's sums stay as
    they were; an outcome of an arm the view does not hold makes it decline."""
    from policies.state import apply_observations, init_state
    from service.definition import reward_text

    config = paper_config(policy, setting, 3, **options)  # type: ignore[arg-type]
    rng = np.random.default_rng(26)
    n_arms, ids = 6, [f"arm:a{k}" for k in range(6)]
    stored_state = init_state(config, n_arms, 1)
    for number in range(1, 9):  # arms 0-3 observed before, 4 and 5 never
        apply_observations(config, stored_state, np.array([number % 4]), rng.normal(size=(1, 3)),
                           rng.normal(3.0, 1.0, size=1), np.array([float(number)]))
    model_ids = [keys.model_field(None)] if config.shared else [
        keys.model_field(i.removeprefix("arm:")) for i in ids]
    stored = {**dict(zip(model_ids, pack(config, "model", stored_state), strict=True)),
              **dict(zip(ids, pack(config, "arm", stored_state), strict=True))}
    outcomes = []
    for number in range(9, 29):  # arm 5 for the first time at the end
        arm = 5 if number == 28 else int(rng.integers(0, 5))
        model = keys.model_field(None if config.shared else ids[arm].removeprefix("arm:"))
        x = rng.normal(size=3)
        outcomes.append(f"{model}\n{ids[arm]}\n{number}\n{reward_text(rng.normal(3.0, 1.0))}\n"
                        .encode() + x.astype("<f8").tobytes())
    fields = fields_of(outcomes)
    read = folded_blobs(config, fields, [stored.get(f) for f in fields], outcomes)
    positions = {arm_id: k for k, arm_id in enumerate(ids)}
    for holds in range(len(outcomes) + 1):
        view = assemble_state(config, [stored[f] for f in model_ids], [stored[f] for f in ids])
        fold_into(config, view, positions, outcomes[:holds])
        before = {name: value.copy() for name, value in view.items()}
        assert held_blobs(config, view, positions, fields, outcomes[holds:]) == read, holds
        for name, value in view.items():
            assert np.array_equal(value, before[name]), (holds, name)
    del positions[ids[5]]  # an arm added since the view was read
    view = assemble_state(config, [stored[f] for f in model_ids], [stored[f] for f in ids])
    assert held_blobs(config, view, positions, fields, outcomes) is None


def _fold_ways(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The way each fold made its blobs, in turn: 'held_blobs' (from the worker's view) or
    'folded_blobs' (from the stored blobs read)."""
    import service.decisions as decisions_module

    ways: list[str] = []

    def counting(name: str) -> Any:
        original = getattr(decisions_module, name)

        def counted(*args: Any) -> Any:
            ways.append(name)
            return original(*args)
        return counted

    for name in ("folded_blobs", "held_blobs"):
        monkeypatch.setattr(decisions_module, name, counting(name))
    return ways


async def test_a_view_refreshed_while_its_experiment_is_created_again_is_the_new_ones(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    """A view refreshed from statistics read before its experiment was deleted and created
    again, and the definition read after (their versions differ: arms were added), is
    made from the new experiment's statistics, not the deleted one's under the new
    definition: a fold from it would write the deleted experiment's sums into the new one
    (found in review). The new experiment's sums are then its own outcomes', bit for bit."""
    old_key = await _created(service)
    await _waiting_outcomes(service, old_key, 5)
    await service.choose("fold", ChooseRequest(context=(1.0, 1.0)), old_key)
    view = service.views.get("fold")
    assert view is not None and view.folded + view.applied == 5
    await other_service.add_arms("fold", [ArmSpec("d")])  # a new version
    snapshot = await service._store.read_snapshot("fold")  # refresh's first read ...
    assert snapshot is not None
    await other_service.delete("fold")  # ... and meanwhile
    new_key = await _created(other_service)  # versions start at random
    view = await service.views.refresh("fold", view, snapshot)
    incarnation = (await other_service.views.definition("fold")).incarnation
    assert view.definition.incarnation == incarnation
    assert view.folded + view.applied == 0 and view.rewards == 0
    config = view.definition.config
    observations = []
    for i in range(FOLD_EVERY):
        x = np.array([1.0, 0.25 * i])
        decision = await other_service.choose("fold", ChooseRequest(context=tuple(x)), new_key)
        await service.reward("fold", [(decision.decision_id, float(i))], new_key)
        observations.append(Observation(ARMS.index(decision.arm_id), x, float(i)))
    await service.drain()
    stats, waiting = _raw(redis_db, "fold")
    assert waiting == [] and _counter(stats, keys.FOLDED) == FOLD_EVERY
    assert_stats_equal(config, ARMS, stats, expected_state(config, len(ARMS), observations))


@pytest.mark.parametrize("workers", [1, 2])
async def test_workers_fold_from_their_views_to_the_bits_of_the_outcomes_in_order(
    service: ExperimentService, other_service: ExperimentService, redis_db: str,
    monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """One worker that decides and rewards folds from its view every time (its decisions
    caught it up with every outcome but the last reward's), reading no stored sums. Two
    workers that decide and reward in turn at random hold each other's outcomes (caught
    up from what they read), and folds by one follow folds by the other, from views read
    before or after them: a fold that finds its worker's view holding the stored sums
    folds from it. Either way the sums written are the policies' update of the outcomes
    in the order they were applied, bit for bit."""
    ways = _fold_ways(monkeypatch)
    spec = ExperimentSpec(id="fold", seed=3, **SPECS["covariates"])  # type: ignore[arg-type]
    _, key = await service.create(spec)
    config = PolicyConfig(**(await service.get("fold")).config)  # type: ignore[arg-type]
    services = (service, other_service)[:workers]
    rng = np.random.default_rng(13)
    observations: list[Observation] = []
    for _ in range(4 * FOLD_EVERY):
        x = rng.normal(size=spec.dim)
        decider, rewarder = (services[int(i)] for i in rng.integers(0, workers, size=2))
        decision = await decider.choose("fold", ChooseRequest(context=tuple(x)), key)
        reward = float(rng.normal())
        await rewarder.reward("fold", [(decision.decision_id, reward)], key)
        observations.append(Observation(ARMS.index(decision.arm_id), x, reward,
                                        decision.decision_number))
        await service.drain()
        await other_service.drain()
    if workers == 1:
        assert ways == ["held_blobs"] * 4
    else:
        assert len(ways) == 4 and ways.count("held_blobs") >= 2, ways
    stats, waiting = _raw(redis_db, "fold")
    assert waiting == [] and _counter(stats, keys.FOLDED) == 4 * FOLD_EVERY
    assert_stats_equal(config, ARMS, stats,
                       expected_state(config, len(ARMS), _numbered(config, observations)))


async def test_a_stale_decision_refreshed_while_its_experiment_is_created_again(
    service: ExperimentService, other_service: ExperimentService, redis_db: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """decide.lua's stale reply brings the statistics (the view's version is behind: arms
    were added), and the experiment is deleted and created again before the definition
    is read: the view is made from the new experiment's statistics, not the deleted
    one's under the new definition (decide.lua's reply says whose statistics it brings),
    and the new experiment's folds write its own outcomes' sums, bit for bit (found in
    review)."""
    old_key = await _created(service)
    await _waiting_outcomes(service, old_key, 5)
    await service.choose("fold", ChooseRequest(context=(1.0, 1.0)), old_key)
    await other_service.add_arms("fold", [ArmSpec("d")])  # the view's version is behind
    original = service.views.definition
    made: list[str] = []

    async def created_again_first(experiment_id: str) -> Any:
        if not made:  # between decide.lua's stale reply and the definition's read
            await other_service.delete("fold")
            made.append(await _created(other_service))
        return await original(experiment_id)

    monkeypatch.setattr(service.views, "definition", created_again_first)
    with pytest.raises(Forbidden):  # decide.lua refuses the old key on the new experiment
        await service.choose("fold", ChooseRequest(context=(1.0, 1.0)), old_key)
    monkeypatch.setattr(service.views, "definition", original)
    view = service.views.get("fold")
    assert view is not None
    assert view.definition.incarnation == (await other_service.views.definition("fold")
                                           ).incarnation
    assert view.folded + view.applied == 0 and view.rewards == 0
    config = view.definition.config
    observations = []
    for i in range(FOLD_EVERY):
        x = np.array([1.0, 0.25 * i])
        decision = await other_service.choose("fold", ChooseRequest(context=tuple(x)), made[0])
        await service.reward("fold", [(decision.decision_id, float(i))], made[0])
        observations.append(Observation(ARMS.index(decision.arm_id), x, float(i)))
    await service.drain()
    stats, waiting = _raw(redis_db, "fold")
    assert waiting == [] and _counter(stats, keys.FOLDED) == FOLD_EVERY
    assert_stats_equal(config, ARMS, stats, expected_state(config, len(ARMS), observations))


async def test_a_views_statistics_cannot_be_written_into(service: ExperimentService) -> None:
    """A view's statistics never change (a change makes a new view), and a fold may write
    them back as they are: its arrays are read-only, as read and as caught up with its
    worker's rewards, so that a write into them fails instead of changing the sums."""
    key = await _created(service)
    for step in range(3):
        decision = await service.choose("fold", ChooseRequest(context=(1.0, 0.5)), key)
        view = service.views.get("fold")
        assert view is not None and view.applied == step  # read, then caught up
        assert view._last is not None
        for name, value in [*view.sums.items(), *view.state.items(),
                            *view._last.state.items()]:  # (the last: a request's arms)
            with pytest.raises(ValueError, match="read-only"):
                value[...] = 0.0
            assert not value.flags.writeable, name
        await service.reward("fold", [(decision.decision_id, 1.0)], key)
