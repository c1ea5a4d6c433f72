"""The store's auto-pipelining and its optimistic decisions, against a real Redis.

- decisions and rewards made in the same event-loop turn travel in one
  pipeline, and each caller gets its own reply; the rewards of one experiment
  (with one key) go as one script call, each caller's answered as if alone;
- a Redis that lost its script cache (SCRIPT FLUSH) is refilled and the
  batch runs, once;
- a caller that is cancelled while its batch is in flight does not disturb
  the others;
- a worker whose view went stale (a reward through another worker) decides
  again from the current statistics before anything is recorded, unless the
  experiment allows its decisions to lag that many rewards behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import hiredis
import numpy as np
import pytest
import redis

from benchmarks.bench_contention import counting, run
from policies import PolicyConfig
from service import decisions, keys, views
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec, RewardOutcome
from service.errors import Forbidden, StoreUnavailable
from service.experiments import ExperimentService
from service.folding import FOLD_EVERY
from service.settings import Settings
from service.store import (
    _JOINED_MOST,
    Appended,
    Joining,
    RewardReply,
    Store,
    _Call,
    _joined_rewards,
    _results,
    _ScriptBatcher,
)
from tests import records
from tests.conftest import key_pattern

# Its experiments stay unsharded under LINREBOOT_TEST_SHARDS: the tests follow one
# member's views, script calls and keys (the sharded paths: tests/test_shards.py).
pytestmark = [pytest.mark.anyio, pytest.mark.unsharded]

FEATURES = ((1.0, 0.0), (0.0, 1.0), (0.6, 0.8))


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None] | None]:
    """The ``seen`` of every decide call (None: a second attempt, recorded whatever the
    statistics are now; an outcomes counter None: read first, recorded whatever outcomes
    came since); the real store still runs."""
    seen: list[tuple[int, int | None] | None] = []
    decide = Store.decide

    async def counted(self: Store, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["seen"])
        return await decide(self, *args, **kwargs)

    monkeypatch.setattr(Store, "decide", counted)
    return seen


async def _experiment(
    service: ExperimentService, experiment_id: str = "sto", max_stale_rewards: int = 0
) -> str:
    spec = ExperimentSpec(id=experiment_id, setting="stochastic", dim=2,
                          arms=tuple(ArmSpec(f"a{i}", f) for i, f in enumerate(FEATURES)),
                          max_stale_rewards=max_stale_rewards,
                          hyperparameters={"spread": "paper", "first_pass": True})  # a pass to see
    _, key = await service.create(spec)
    return key


async def test_one_turn_of_decisions_and_rewards_is_one_pipeline_with_a_reply_each(
    service: ExperimentService, pipelines: list[int]
) -> None:
    key = await _experiment(service)
    warm_up = await service.choose("sto", ChooseRequest(), key)  # reads the view
    unknown = await service.reward("sto", [("0" * 32, 0.0)], key)  # loads the script
    assert unknown[0].status == "not_found"
    pipelines.clear()

    decisions = await asyncio.gather(*(service.choose("sto", ChooseRequest(), key)
                                       for _ in range(20)))

    assert pipelines == [1]  # the decisions of one experiment: one decide.lua call
    numbers = sorted(d.decision_number for d in decisions)
    assert numbers == list(range(2, 22))  # each caller got its own reply
    assert len({d.decision_id for d in decisions}) == 20

    pipelines.clear()
    rewards = [0.25 * i for i in range(20)]
    outcomes = await asyncio.gather(*(service.reward("sto", [(d.decision_id, r)], key)
                                      for d, r in zip(decisions, rewards, strict=True)))
    assert pipelines == [1]  # the rewards of one experiment: one reward.lua call
    assert [o[0].status for o in outcomes] == ["applied"] * 20
    view = await service.get("sto")
    assert (view.decisions, view.rewards) == (21, 20)
    by_arm = {a.id: a for a in view.arms}
    assert by_arm[warm_up.arm_id].pulls == sum(d.arm_id == warm_up.arm_id for d in decisions)
    for arm_id in {d.arm_id for d in decisions}:
        mine = [r for d, r in zip(decisions, rewards, strict=True) if d.arm_id == arm_id]
        assert by_arm[arm_id].pulls == len(mine)
        assert by_arm[arm_id].mean_reward == pytest.approx(np.mean(mine), rel=1e-12)


def _statuses(outcomes: Sequence[Sequence[RewardOutcome]]) -> list[list[str]]:
    return [[o.status for o in outcome] for outcome in outcomes]


async def _load_reward_script(service: ExperimentService, experiment_id: str, key: str) -> None:
    """reward.lua in Redis's script cache, so that no call of the test is refused first
    (NOSCRIPT: sent again, a pipeline more)."""
    unknown = await service.reward(experiment_id, [("0" * 32, 0.0)], key)
    assert unknown[0].status == "not_found"


async def test_the_rewards_of_one_turn_are_answered_as_if_each_came_alone_in_turn(
    service: ExperimentService, redis_db: str, pipelines: list[int]
) -> None:
    """The requests' rewards of one experiment go as one reward.lua call; each request
    gets what it would have got alone, after those before it: the same decision again is
    a duplicate or a conflict, an unknown one not_found."""
    def requests(ids: Sequence[str]) -> list[list[tuple[str, float]]]:
        return [[(ids[0], 1.0)], [(ids[0], 1.0)], [(ids[1], 0.5), (ids[2], 0.0)],
                [(ids[1], 0.25)], [("0" * 32, 1.0)], [(ids[3], 2.0), (ids[3], 2.0)]]

    made = {}
    for experiment_id in ("joined", "alone"):
        key = await _experiment(service, experiment_id)
        made[experiment_id] = (key, [(await service.choose(experiment_id, ChooseRequest(),
                                                           key)).decision_id
                                     for _ in range(4)])
    key, ids = made["joined"]
    await _load_reward_script(service, "joined", key)
    pipelines.clear()
    together = await asyncio.gather(*(service.reward("joined", items, key)
                                      for items in requests(ids)))
    assert pipelines == [1]
    key, ids = made["alone"]
    in_turn = [await service.reward("alone", items, key) for items in requests(ids)]

    assert _statuses(together) == _statuses(in_turn) == [
        ["applied"], ["duplicate"], ["applied", "applied"], ["conflict"], ["not_found"],
        ["applied", "duplicate"]]
    for name in (keys.REWARDS, "duplicates"):
        assert _counter(redis_db, "joined", name) == _counter(redis_db, "alone", name) > 0


async def test_a_damaged_decision_fails_only_its_own_request_when_joined(
    service: ExperimentService, redis_db: str, pipelines: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The joined call is refused whole (nothing written); its requests are then sent
    again one by one, and only the one that names the damaged decision fails."""
    _, key = await service.create(ExperimentSpec(id="cov", setting="covariates", dim=2,
                                                 arms=(ArmSpec("a"), ArmSpec("b"))))
    other = await _experiment(service, "other")
    await service.choose("other", ChooseRequest(), other)  # its view read
    await _load_reward_script(service, "cov", key)
    made = [await service.choose("cov", ChooseRequest(context=(1.0, 2.0)), key)
            for _ in range(3)]
    client = redis.Redis.from_url(redis_db)
    try:
        record = keys.decision("cov", made[1].decision_id)
        client.set(record, _without_context(client.get(record)), keepttl=True)  # type: ignore[arg-type]
    finally:
        client.close()
    pipelines.clear()

    beside = asyncio.ensure_future(service.choose("other", ChooseRequest(), other))
    answered: list[bool] = []  # at each pipeline: whether the decision beside has its reply
    send = _ScriptBatcher._pipeline

    async def watched(self: _ScriptBatcher, calls: list[Any]) -> list[Any]:
        answered.append(beside.done())
        return await send(self, calls)

    monkeypatch.setattr(_ScriptBatcher, "_pipeline", watched)
    answers = await asyncio.gather(*(service.reward("cov", [(d.decision_id, 1.0)], key)
                                     for d in made), return_exceptions=True)

    assert pipelines == [2, 3]  # a decision beside the joined call; its requests alone, next
    assert answered == [False, True]  # its reply before the requests went again
    assert (await beside).decision_number == 2
    assert isinstance(answers[1], redis.ResponseError)
    assert str(answers[1]).startswith("DAMAGED a pending decision without its fields")
    assert [_statuses([a]) for a in (answers[0], answers[2])] == [[["applied"]]] * 2  # type: ignore[list-item]
    assert _counter(redis_db, "cov", keys.REWARDS) == 2


async def test_a_joined_call_refused_for_the_experiment_is_each_requests_error_at_once(
    service: ExperimentService, redis_db: str, pipelines: list[int]
) -> None:
    """An error reply other than a damaged decision's (here: an experiment stored by an
    earlier version) concerns every request of the call: no request is sent again."""
    key = await _experiment(service, "old")
    made = [await service.choose("old", ChooseRequest(), key) for _ in range(2)]
    await _load_reward_script(service, "old", key)
    client = redis.Redis.from_url(redis_db)
    try:
        client.hset(keys.meta("old"), "model_recipe", "outer_upper,r_x,r2,one,r")
    finally:
        client.close()
    pipelines.clear()
    answers = await asyncio.gather(*(service.reward("old", [(d.decision_id, 1.0)], key)
                                     for d in made), return_exceptions=True)
    assert pipelines == [1]
    assert all(isinstance(a, redis.ResponseError) and "earlier version" in str(a)
               for a in answers)


async def test_a_cancelled_request_leaves_its_joined_call_alone(
    service: ExperimentService, redis_db: str, pipelines: list[int]
) -> None:
    """Cancelled before its call is sent, a request's reward still goes (as a call of its
    own would); the others get their replies."""
    key = await _experiment(service, "gone")
    made = [await service.choose("gone", ChooseRequest(), key) for _ in range(3)]
    await _load_reward_script(service, "gone", key)
    pipelines.clear()
    tasks = [asyncio.ensure_future(service.reward("gone", [(d.decision_id, 1.0)], key))
             for d in made]
    await asyncio.sleep(0)  # each queued its call
    tasks[1].cancel()
    answers = await asyncio.gather(*tasks, return_exceptions=True)
    assert pipelines == [1]
    assert isinstance(answers[1], asyncio.CancelledError)
    assert _statuses([answers[0], answers[2]]) == [["applied"], ["applied"]]  # type: ignore[list-item]
    assert _counter(redis_db, "gone", keys.REWARDS) == 3


async def test_a_joined_call_across_a_multiple_of_the_fold_interval_folds_once(
    service: ExperimentService, redis_db: str, monkeypatch: pytest.MonkeyPatch,
    pipelines: list[int],
) -> None:
    """Each request's part says the rewards counter after its own rewards, so exactly
    one request starts the fold a multiple of FOLD_EVERY calls for."""
    key = await _experiment(service, "fold")
    made = [await service.choose("fold", ChooseRequest(), key) for _ in range(FOLD_EVERY + 8)]
    folds: list[str] = []
    fold = Store.fold

    async def counted(self: Store, experiment_id: str, *args: Any) -> Any:
        folds.append(experiment_id)
        return await fold(self, experiment_id, *args)

    monkeypatch.setattr(Store, "fold", counted)
    await _load_reward_script(service, "fold", key)
    pipelines.clear()
    await asyncio.gather(*(service.reward("fold", [(d.decision_id, 0.5)], key) for d in made))
    assert pipelines == [1]  # one call
    await service.drain()
    assert folds == ["fold"]
    assert _counter(redis_db, "fold", "folded") == FOLD_EVERY + 8


def test_a_joined_reply_its_part_cannot_read_or_parts_wrongly_fails_its_own_requests_only(
) -> None:
    def unreadable(reply: Any, argvs: Sequence[list[Any]]) -> list[Any]:
        raise ValueError("the outcomes string ends inside a record")

    joining = Joining(("e",), 1, _joined_rewards, unreadable, lambda error: False)
    group = [_Call(None, [], None, joining), _Call(None, [], None, joining)]  # type: ignore[arg-type]
    results = _results(group, ["applied", "applied", 2])
    assert [type(r) for r in results] == [ValueError, ValueError]
    assert _results([_Call(None, [], None)], "OK") == ["OK"]  # type: ignore[arg-type]
    short = Joining(("e",), 1, _joined_rewards, lambda reply, argvs: [reply], lambda e: False)
    calls = [_Call(None, [], None, short), _Call(None, [], None, short)]  # type: ignore[arg-type]
    assert [type(r) for r in _results(calls, "OK")] == [ValueError, ValueError]


async def test_rewards_of_another_experiment_or_key_go_in_calls_of_their_own(
    service: ExperimentService, pipelines: list[int]
) -> None:
    keys_by_id = {e: await _experiment(service, e) for e in ("one", "two")}
    made = {e: [await service.choose(e, ChooseRequest(), keys_by_id[e]) for _ in range(2)]
            for e in keys_by_id}
    await _load_reward_script(service, "one", keys_by_id["one"])
    pipelines.clear()

    answers = await asyncio.gather(
        service.reward("one", [(made["one"][0].decision_id, 1.0)], keys_by_id["one"]),
        service.reward("one", [(made["one"][1].decision_id, 1.0)], "not-the-key"),
        service.reward("two", [(made["two"][0].decision_id, 1.0)], keys_by_id["two"]),
        return_exceptions=True)

    assert pipelines == [3]
    assert isinstance(answers[1], Forbidden)
    assert _statuses([answers[0], answers[2]]) == [["applied"], ["applied"]]  # type: ignore[list-item]
    again = await service.reward("one", [(made["one"][1].decision_id, 1.0)], keys_by_id["one"])
    assert _statuses([again]) == [["applied"]]  # the refused one wrote nothing


async def test_a_joined_call_holds_at_most_128_rewards(
    service: ExperimentService, pipelines: list[int]
) -> None:
    key = await _experiment(service, "many")
    made = [await service.choose("many", ChooseRequest(), key) for _ in range(_JOINED_MOST + 3)]
    await _load_reward_script(service, "many", key)
    pipelines.clear()
    answers = await asyncio.gather(*(service.reward("many", [(d.decision_id, 1.0)], key)
                                     for d in made))
    assert pipelines == [2]  # one pipeline of two calls: 128 rewards, then 3
    assert _statuses(answers) == [["applied"]] * (_JOINED_MOST + 3)


def test_a_joined_reply_is_parted_as_the_calls_would_have_had_it_alone() -> None:
    """Statuses by request; each request's rewards counter after its own; the records
    to the requests that applied them, those of others' outcomes before them (sent
    because the worker held fewer) to the first that applied any."""
    records = tuple(f"r{i}".encode() for i in range(6))  # two others', then four
    joined = RewardReply(["applied", "duplicate", "not_found", "applied", "applied",
                          "applied"], 20, Appended("inc", 3, 30, 41, records, 24))
    # (the rewards counter 20 of the 30 outcomes: the others ten default rewards)
    assert joined.parts([2, 1, 1, 2]) == [
        RewardReply(["applied", "duplicate"], 17, Appended("inc", 3, 27, 41, records[:3], 24)),
        RewardReply(["not_found"]),
        RewardReply(["applied"], 18, Appended("inc", 3, 28, 41, records[3:4], 27)),
        RewardReply(["applied", "applied"], 20, Appended("inc", 3, 30, 41, records[4:], 28)),
    ]
    assert joined.parts([6]) == [joined]
    for whole in (["forbidden"], ["missing"], ["shards", "3"]):
        assert RewardReply(whole).parts([1, 1]) == [RewardReply(whole)] * 2
    # Records that do not add up to the counter: no part gets any (each view reads).
    broken = RewardReply(["applied", "applied"], 2, Appended("inc", 3, 9, 0, records[:2], 0))
    assert [p.appended for p in broken.parts([1, 1])] == [None, None]
    assert [p.counter for p in broken.parts([1, 1])] == [1, 2]


def test_joined_reward_arguments_are_those_of_one_call_with_every_reward() -> None:
    def argv(ids: Sequence[str], held: object, rewards: Sequence[str]) -> list[object]:
        head = [keys.meta("e"), keys.stats("e"), keys.log("e"), keys.outcomes("e")]
        decision_keys = [keys.decision("e", i) for i in ids]
        return [len(head) + len(ids), *head, *decision_keys, "hash", held, 1, *rewards]

    parts = [argv(["a"], "", ["1"]), argv(["b", "c"], 7, ["0.5", "0"]), argv(["d"], "", ["2"])]
    assert _joined_rewards(parts) == argv(["a", "b", "c", "d"], 7, ["1", "0.5", "0", "2"])


async def test_a_lost_script_cache_is_refilled_and_each_call_runs_once(
    service: ExperimentService, redis_db: str, pipelines: list[int]
) -> None:
    key = await _experiment(service)
    first = await service.choose("sto", ChooseRequest(), key)
    client = redis.Redis.from_url(redis_db)
    try:
        client.script_flush()
        version: str = client.info("server")["redis_version"]  # type: ignore[index]
        functions = int(version.split(".")[0]) >= 7  # there decide and reward are functions
        if functions:
            client.function_flush()
    finally:
        client.close()
    pipelines.clear()

    decisions = await asyncio.gather(*(service.choose("sto", ChooseRequest(), key)
                                       for _ in range(3)))
    outcome = await service.reward("sto", [(first.decision_id, 1.0)], key)

    # Each call is refused (NOSCRIPT, or no such function) once and runs after loading:
    # 3 decisions (one joined call), 1 reward. Redis 6.2 loads each script when it is
    # refused; Redis 7 loads the library, reward's function with decide's.
    assert pipelines == ([1, 1, 1] if functions else [1, 1, 1, 1])
    assert sorted(d.decision_number for d in decisions) == [2, 3, 4]
    assert outcome[0].status == "applied"
    assert (await service.get("sto")).decisions == 4


async def test_a_cancelled_caller_leaves_the_rest_of_its_batch_alone(
    service: ExperimentService,
) -> None:
    key = await _experiment(service)
    await service.choose("sto", ChooseRequest(), key)
    tasks = [asyncio.create_task(service.choose("sto", ChooseRequest(), key)) for _ in range(5)]
    await asyncio.sleep(0)  # all five are queued in the batch now
    tasks[2].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)

    assert isinstance(results[2], asyncio.CancelledError)
    others = [r for i, r in enumerate(results) if i != 2]
    assert all(not isinstance(r, BaseException) for r in others)
    # The cancelled caller's script was already sent: it is recorded, not lost or doubled.
    assert (await service.get("sto")).decisions == 6


async def test_a_killed_connection_is_replaced_and_its_batch_runs_once(
    service: ExperimentService, redis_db: str
) -> None:
    """The batches travel over one held connection: Redis dropping it (a restart, a
    CLIENT KILL) costs a reconnection, not the calls, and nothing runs twice."""
    key = await _experiment(service)
    first = await service.choose("sto", ChooseRequest(), key)
    client = redis.Redis.from_url(redis_db)
    try:
        killed = client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    finally:
        client.close()
    assert killed >= 1

    second = await service.choose("sto", ChooseRequest(), key)
    outcome = await service.reward("sto", [(first.decision_id, 1.0)], key)

    assert second.decision_number == 2
    assert outcome[0].status == "applied"
    assert (await service.get("sto")).decisions == 2


async def test_a_closed_store_sends_no_more_batches(app_settings: Settings) -> None:
    """A call that reaches the batcher after the store closed (a request still in flight at
    shutdown) is refused as the store being unavailable, without connecting again."""
    opened = await ExperimentService.open(app_settings)
    key = await _experiment(opened)
    decision = await opened.choose("sto", ChooseRequest(), key)
    store = opened._store
    held = store._batcher._held
    assert held is not None and held._connection is not None
    await opened.close()

    with pytest.raises(StoreUnavailable):
        await store.apply_rewards("sto", None, [(decision.decision_id, "1.0")])
    assert not held._connection.is_connected


@contextlib.asynccontextmanager
async def _pausable(app_settings: Settings, redis_db: str, deadline: float
                    ) -> AsyncIterator[tuple[ExperimentService, redis.Redis]]:
    """A service whose store calls have ``deadline`` seconds, and a client to pause its
    Redis with (unpaused after, whatever happens)."""
    opened = await ExperimentService.open(
        app_settings.model_copy(update={"redis_timeout_seconds": deadline}))
    client = redis.Redis.from_url(redis_db)
    try:
        yield opened, client
    finally:
        try:
            client.execute_command("CLIENT", "UNPAUSE")
        finally:
            client.close()
            await opened.close()


async def test_a_batch_cut_short_by_its_deadline_leaves_no_reply_for_the_next(
    app_settings: Settings, redis_db: str
) -> None:
    """A batch abandoned at the deadline (Redis paused) drops its connection: the
    replies Redis sends after the pause are never read as the next batch's."""
    async with _pausable(app_settings, redis_db, 0.3) as (opened, client):
        key = await _experiment(opened)
        first = await opened.choose("sto", ChooseRequest(), key)
        client.execute_command("CLIENT", "PAUSE", "1000", "ALL")
        with pytest.raises(StoreUnavailable):
            await opened.choose("sto", ChooseRequest(), key)
        await asyncio.sleep(1.0)  # the pause is over

        unknown = await opened.reward("sto", [("0" * 32, 0.0)], key)
        applied = await opened.reward("sto", [(first.decision_id, 1.0)], key)
        third = await opened.choose("sto", ChooseRequest(), key)

        assert [unknown[0].status, applied[0].status] == ["not_found", "applied"]
        # Whether Redis ran the abandoned decision or dropped it with its connection,
        # the numbers and the count agree: no reply was taken for another call's.
        assert third.decision_number == (await opened.get("sto")).decisions


async def test_each_call_of_a_batch_has_its_own_deadline(
    app_settings: Settings, redis_db: str
) -> None:
    """Redis paused for 1 s, a deadline of 0.8 s: a reward made at once is refused at its
    deadline, and so is one queued 0.05 s later, behind it; one queued 0.5 s later, in
    the same batch as the second (one script call), is answered once the pause is over
    (at 1 s, its deadline at 1.3 s), not refused with its batch at the second's."""
    deadline = 0.8
    unknown = [("0" * 32, 0.0)]
    async with _pausable(app_settings, redis_db, deadline) as (opened, client):
        key = await _experiment(opened)
        assert (await opened.reward("sto", unknown, key))[0].status == "not_found"  # loaded
        client.execute_command("CLIENT", "PAUSE", "1000", "ALL")
        paused = time.monotonic()
        first = asyncio.ensure_future(opened.reward("sto", unknown, key))
        await _until_sent(opened)
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(opened.reward("sto", unknown, key))
        await asyncio.sleep(0.45)
        third = asyncio.ensure_future(opened.reward("sto", unknown, key))

        for refused in (first, second):
            with pytest.raises(StoreUnavailable):
                await refused
        assert time.monotonic() - paused < 1.0  # (refused while Redis is still paused)
        assert (await third)[0].status == "not_found"
        assert time.monotonic() - paused < 0.5 + deadline


async def test_a_stalled_batch_is_abandoned_once_and_each_call_refused_at_its_deadline(
    app_settings: Settings, redis_db: str
) -> None:
    """Redis paused for 1.2 s, a deadline of 0.8 s, a reward made every 10 ms for 0.7 s:
    those whose deadline passes within the pause are refused, those whose deadline
    comes after it answered, and the batches go over two connections at most (the
    first batch's, dropped at its deadline, and the next's): no connection and resend
    for each call's deadline."""
    deadline, pause = 0.8, 1.2
    unknown = [("0" * 32, 0.0)]
    async with _pausable(app_settings, redis_db, deadline) as (opened, client):

        async def reward(at: float) -> tuple[float, bool]:
            try:
                await opened.reward("sto", unknown, key)
            except StoreUnavailable:
                return at, False
            return at, True

        key = await _experiment(opened)
        assert (await opened.reward("sto", unknown, key))[0].status == "not_found"  # loaded
        connections = _connections_received(client)
        client.execute_command("CLIENT", "PAUSE", str(round(1000 * pause)), "ALL")
        paused = time.monotonic()
        made = []
        while (at := time.monotonic() - paused) < 0.7:
            made.append(asyncio.ensure_future(reward(at)))
            await asyncio.sleep(0.01)
        outcomes = await asyncio.gather(*made)
        await asyncio.sleep(max(0.0, paused + pause - time.monotonic()))
        assert _connections_received(client) - connections <= 2
    refused = [at for at, answered in outcomes if not answered]
    answered = [at for at, answered in outcomes if answered]
    # Redis ends a pause at its next tick (hz 10: up to 0.1 s late), and a loaded
    # machine's loop turns late: the boundary is not sharper than that.
    assert refused and max(refused) < pause - deadline + 0.2
    assert answered and min(answered) > pause - deadline - 0.1


def _connections_received(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("stats")  # type: ignore[assignment]
    return int(stats["total_connections_received"])


async def test_a_stale_view_decides_again_from_the_current_statistics(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    one, two = service, other_service
    key = await _experiment(one)
    seen = await one.choose("sto", ChooseRequest(), key)  # one's view: pulls all 0
    assert seen.exploring

    # Through the other worker: each arm pulled and rewarded once (an
    # unexplored arm goes first), so no arm is left to explore.
    for _ in FEATURES:
        decision = await two.choose("sto", ChooseRequest(), key)
        assert decision.exploring
        await two.reward("sto", [(decision.decision_id, 1.0)], key)

    after = await one.choose("sto", ChooseRequest(), key)
    assert not after.exploring  # decided from the rewarded state, not its stale view
    record = records.read(redis_db, "sto", after.decision_id)
    assert record is not None and record["rewards_seen"] == b"3"


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The store's reads of statistics, by name, as they happen."""
    reads: list[str] = []
    for name in ("read_progress", "read_snapshot", "read_experiment"):
        original = getattr(Store, name)

        async def counted(self: Store, *args: Any, _name: str = name, _original: Any = original,
                          **kwargs: Any) -> Any:
            reads.append(_name)
            return await _original(self, *args, **kwargs)

        monkeypatch.setattr(Store, name, counted)
    return reads


async def test_a_worker_adds_its_own_rewards_to_its_view_without_reading(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """reward.lua returns the outcomes it recorded: the worker that sent them keeps
    them, and adds them to its view when it must (with max_stale_rewards 0, before
    its next decision); it then has the statistics a worker reading them has, to the
    bit."""
    key = await _experiment(service, "own")
    await service.choose("own", ChooseRequest(), key)  # the first read
    reads = _count_reads(monkeypatch)
    rewards = np.random.default_rng(5).normal(size=FOLD_EVERY + 4)  # a fold in between
    for value in rewards:
        decision = await service.choose("own", ChooseRequest(), key)
        outcome = await service.reward("own", [(decision.decision_id, float(value))], key)
        assert outcome[0].status == "applied"
    await service.drain()
    await service.choose("own", ChooseRequest(), key)  # adds the last reward
    assert reads == []  # neither the outcomes nor the sums were read
    mine = service.views.held["own"]
    assert service.views.nbytes == sum(v.nbytes + v.own_bytes for v in service.views.held.values())
    theirs = await other_service.views.view_for("own", None)  # read from Redis
    assert mine.rewards == theirs.rewards == FOLD_EVERY + 4 and mine.behind == 0
    assert mine.folded + mine.applied == theirs.folded + theirs.applied == FOLD_EVERY + 4
    assert theirs.folded >= FOLD_EVERY  # (a fold takes the records waiting when it runs)
    assert mine.state.keys() == theirs.state.keys()
    for name, value in theirs.state.items():
        np.testing.assert_array_equal(mine.state[name], value, err_msg=name)


@pytest.mark.parametrize(("batch", "read"), [(256, []), (257, ["read_progress"])])
async def test_a_view_keeps_the_records_of_at_most_256_of_its_own_outcomes(
    service: ExperimentService, monkeypatch: pytest.MonkeyPatch, batch: int, read: list[str],
) -> None:
    key = await _experiment(service, "own")
    decisions = [await service.choose("own", ChooseRequest(), key) for _ in range(batch)]
    outcomes = await service.reward("own", [(d.decision_id, 1.0) for d in decisions], key)
    assert {o.status for o in outcomes} == {"applied"}
    reads = _count_reads(monkeypatch)

    await service.choose("own", ChooseRequest(), key)

    assert reads == read
    assert service.views.held["own"].rewards == batch


async def test_a_seeded_worker_learns_the_numbers_other_workers_took_from_its_rewards(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seeded decision predicts its number: a worker that catches up from its own
    rewards' records learns the numbers other workers' decisions took meanwhile (reward.lua
    returns decision_seq), so its next decision is recorded at once, not after a stale
    reply and a second draw."""
    spec = ExperimentSpec(id="seeded", setting="stochastic", dim=2, seed=9,
                          arms=tuple(ArmSpec(f"a{i}", f) for i, f in enumerate(FEATURES)))
    _, key = await service.create(spec)
    stale: list[int] = []  # the numbers this worker predicted and found taken
    decide = Store.decide

    async def counted(self: Store, *args: Any, **kwargs: Any) -> Any:
        reply = await decide(self, *args, **kwargs)
        if reply.status == "stale" and self is service._store:
            stale.append(kwargs["number"])
        return reply

    monkeypatch.setattr(Store, "decide", counted)
    for _ in range(4):
        mine = await service.choose("seeded", ChooseRequest(), key)
        await other_service.choose("seeded", ChooseRequest(), key)  # takes the next number
        await service.reward("seeded", [(mine.decision_id, 1.0)], key)
    reads = _count_reads(monkeypatch)
    after = await service.choose("seeded", ChooseRequest(), key)
    assert reads == [] and stale == []
    assert after.decision_number == 9  # 8 taken before it, in turn by the two workers


async def test_an_outcome_through_another_worker_between_comes_with_the_rewards_reply(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch, redis_db: str,
) -> None:
    """After another worker's reward in between, a worker's reward reply brings that
    outcome's record too (reward.lua sends every record after those the worker holds):
    its next decision reads nothing, sees both, and its view is the one a read gives."""
    key = await _experiment(service, "own")
    mine = await service.choose("own", ChooseRequest(), key)
    theirs = await other_service.choose("own", ChooseRequest(), key)
    assert (await other_service.reward("own", [(theirs.decision_id, 1.0)], key))[0].status \
        == "applied"
    assert (await service.reward("own", [(mine.decision_id, 0.0)], key))[0].status == "applied"
    assert service.views.held["own"].own is not None and service.views.held["own"].behind == 2
    reads = _count_reads(monkeypatch)

    after = await service.choose("own", ChooseRequest(), key)

    assert reads == []
    record = records.read(redis_db, "own", after.decision_id)
    assert record is not None and record["rewards_seen"] == b"2"
    mine_now = service.views.held["own"]
    read = await other_service.views.read_view("own")
    for name, value in read.state.items():
        np.testing.assert_array_equal(mine_now.state[name], value, err_msg=name)


@pytest.mark.parametrize("folds", [1, 3])
async def test_a_reward_reply_brings_what_a_fold_took_from_the_folded_tail(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch, redis_db: str, folds: int,
) -> None:
    """When folds took outcomes the worker never added (one fold, or several: the tail
    keeps the last folds' records, up to 32 KB), the reply brings them from the folded
    tail with its own: its next decision reads nothing, and its view is a full read's."""
    key = await _experiment(service, "own")
    mine = await service.choose("own", ChooseRequest(), key)
    for _ in range(folds):
        batch = [await other_service.choose("own", ChooseRequest(), key)
                 for _ in range(FOLD_EVERY)]
        await other_service.reward("own", [(d.decision_id, 1.0) for d in batch], key)
        await other_service.drain()  # the fold: the sums hold outcomes this worker lacks
    others = folds * FOLD_EVERY
    assert _counter(redis_db, "own", keys.FOLDED) == others
    assert (await service.reward("own", [(mine.decision_id, 0.0)], key))[0].status == "applied"
    assert len(service.views.held["own"].own or ()) == others + 1
    reads = _count_reads(monkeypatch)

    after = await service.choose("own", ChooseRequest(), key)

    assert reads == []
    record = records.read(redis_db, "own", after.decision_id)
    assert record is not None and record["rewards_seen"] == str(others + 1).encode()
    read = await other_service.views.read_view("own")
    for name, value in read.state.items():
        np.testing.assert_array_equal(service.views.held["own"].state[name], value,
                                      err_msg=name)


@pytest.mark.parametrize("lacking", ["beyond the tail", "no tail", "another fold's tail",
                                     "a fold's records of another size", "a damaged tail"])
async def test_a_reward_reply_that_cannot_bring_what_a_worker_lacks_makes_it_read(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch, redis_db: str, lacking: str,
) -> None:
    """When a fold took outcomes the worker never added that the folded tail does not
    have (more folds took them than the tail keeps; a fold of a version before it, which
    wrote none, or which folded after the tail's end; a fold's records not of the size
    its index says; a damaged index), the reply brings
    its own record
    only: the view drops its kept records and its next decision reads what it lacks."""
    key = await _experiment(service, "own")
    mine = await service.choose("own", ChooseRequest(), key)
    others = 0
    while True:  # each: FOLD_EVERY rewards, and the fold they start
        batch = [await other_service.choose("own", ChooseRequest(), key)
                 for _ in range(FOLD_EVERY)]
        await other_service.reward("own", [(d.decision_id, 1.0) for d in batch], key)
        await other_service.drain()  # the fold: the sums hold outcomes this worker lacks
        others += FOLD_EVERY
        if lacking != "beyond the tail" or _tail_start(redis_db, "own") > 0:
            break  # (beyond: until the tail, whole folds up to 32 KB, lacks the first)
    assert _counter(redis_db, "own", keys.FOLDED) == others
    client = redis.Redis.from_url(redis_db)
    try:
        if lacking == "no tail":
            assert client.hdel(keys.stats("own"), keys.FOLDED_TAIL) == 1
        index: bytes = client.hget(keys.stats("own"), keys.FOLDED_TAIL)  # type: ignore[assignment]
        if lacking == "another fold's tail":  # ending one outcome before the sums' folded
            ends, count, sizes = index.decode().split(" ")
            index = f"{int(ends) - 1} {count} {sizes}".encode()
        if lacking == "a fold's records of another size":
            last = index.decode().split(" ")[2].split(",")[-1].partition(":")[0]
            client.hset(keys.stats("own"), keys.folded_tail_field(int(last)), b"1:x")  # type: ignore[arg-type]
        if lacking == "a damaged tail":
            index = b"damaged"
        if index is not None:
            client.hset(keys.stats("own"), keys.FOLDED_TAIL, index)  # type: ignore[arg-type]
    finally:
        client.close()
    assert (await service.reward("own", [(mine.decision_id, 0.0)], key))[0].status == "applied"
    assert service.views.held["own"].own is None
    reads = _count_reads(monkeypatch)

    after = await service.choose("own", ChooseRequest(), key)

    assert reads[0] == "read_progress" and "read_snapshot" in reads
    record = records.read(redis_db, "own", after.decision_id)
    assert record is not None and record["rewards_seen"] == str(others + 1).encode()


@pytest.mark.parametrize("max_stale_rewards", [0, 1])
async def test_a_worker_that_applied_a_reward_decides_from_it(
    service: ExperimentService, attempts: list[tuple[int, int | None] | None], redis_db: str,
    max_stale_rewards: int,
) -> None:
    key = await _experiment(service, "own", max_stale_rewards=max_stale_rewards)
    for rewarded in range(1, 6):
        decision = await service.choose("own", ChooseRequest(), key)
        assert (await service.reward("own", [(decision.decision_id, 1.0)], key))[0].status \
            == "applied"
        after = await service.choose("own", ChooseRequest(), key)
        # Within the allowed lag the view is kept; beyond it the statistics are
        # brought up to date first (the worker's own outcomes added, or read), so the
        # decision is made once, from the current statistics.
        lag = rewarded % (max_stale_rewards + 1)
        record = records.read(redis_db, "own", after.decision_id)
        assert record is not None and record["rewards_seen"] == str(rewarded - lag).encode()
    assert all(seen is not None for seen in attempts)  # never a stale reply, never a retry
    assert len(attempts) == 10


async def test_a_decision_is_made_once_beside_its_workers_rewards(
    service: ExperimentService, other_service: ExperimentService,
    attempts: list[tuple[int, int | None] | None], redis_db: str,
) -> None:
    """A decision sent in the same batch as rewards goes first (so they do not make its
    view stale); one made while this worker's rewards are in flight waits for their
    replies and decides from their outcomes. Either way it is made once. Another
    worker's reward, acknowledged before, still makes it stale: it is made again."""
    key = await _experiment(service, "fly")
    made = [await service.choose("fly", ChooseRequest(), key) for _ in range(5)]
    unknown = await service.reward("fly", [("0" * 32, 0.0)], key)  # loads the script
    assert unknown[0].status == "not_found"

    # A reward and a decision in one turn: one batch, the decision first.
    attempts.clear()
    outcome, during = await asyncio.gather(
        service.reward("fly", [(made[0].decision_id, 1.0)], key),
        service.choose("fly", ChooseRequest(), key))
    assert outcome[0].status == "applied"
    assert len(attempts) == 1 and attempts[0] is not None  # recorded at its first attempt
    assert _seen(redis_db, "fly", during.decision_id) == 0  # before that reward

    # A decision while the reward's batch is in flight, another reward queued behind
    # it: the decision waits for the first reply, decides from it, and goes ahead of the
    # reward queued.
    attempts.clear()
    rewarding = asyncio.ensure_future(service.reward("fly", [(made[1].decision_id, 1.0)], key))
    await _until_sent(service)
    queued = asyncio.ensure_future(service.reward("fly", [(made[4].decision_id, 1.0)], key))
    await asyncio.sleep(0)  # queued, its batch waiting for the first's turn
    after = await service.choose("fly", ChooseRequest(), key)
    assert [(await r)[0].status for r in (rewarding, queued)] == ["applied", "applied"]
    assert len(attempts) == 1  # made once
    assert _seen(redis_db, "fly", after.decision_id) == 2  # from both rewards sent before

    # Another worker's reward, acknowledged before the decision's request: stale, and
    # made again from it.
    assert (await other_service.reward("fly", [(made[2].decision_id, 0.5)], key))[0].status \
        == "applied"
    attempts.clear()
    outcome, during = await asyncio.gather(
        service.reward("fly", [(made[3].decision_id, 1.0)], key),
        service.choose("fly", ChooseRequest(), key))
    assert outcome[0].status == "applied"
    assert len(attempts) == 2 and attempts[1] is None  # stale, then made again
    assert _seen(redis_db, "fly", during.decision_id) >= 4


async def test_after_a_stale_decision_decisions_read_first_and_are_made_once(
    service: ExperimentService, other_service: ExperimentService,
    attempts: list[tuple[int, int | None] | None], pipelines: list[int], redis_db: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once another worker's rewards made a decision stale, this worker's decisions of
    the experiment read what their view lacks first (one read for a turn's decisions),
    and are recorded at their first attempt, whatever is applied after that read: each
    reflects every reward acknowledged before its request. Without contention, no
    reads."""
    monkeypatch.setattr(decisions, "_CONTENDED_SECONDS", 30.0)  # a slow host's pauses
    key = await _experiment(service, "probe")
    made = [await service.choose("probe", ChooseRequest(), key) for _ in range(6)]
    assert (await other_service.reward("probe", [(made[0].decision_id, 1.0)], key))[0].status \
        == "applied"
    attempts.clear()
    stale = await service.choose("probe", ChooseRequest(), key)
    assert len(attempts) == 2 and attempts[1] is None  # stale, then made again: contended
    assert _seen(redis_db, "probe", stale.decision_id) == 1

    # Another reward through the other worker, then three decisions in one turn: one
    # read for the three, then one decide call, each recorded at its first attempt.
    assert (await other_service.reward("probe", [(made[1].decision_id, 1.0)], key))[0].status \
        == "applied"
    await service._store.read_progress("probe")  # its script loaded (else sent twice)
    attempts.clear()
    pipelines.clear()
    three = await asyncio.gather(*(service.choose("probe", ChooseRequest(), key)
                                   for _ in range(3)))
    assert pipelines == [1, 1]  # the joined read, then the joined decisions
    assert len(attempts) == 3 and all(seen is not None and seen[1] is None for seen in attempts)
    assert [_seen(redis_db, "probe", d.decision_id) for d in three] == [2, 2, 2]

    # A reward applied after the read, before the decision is recorded: it need not
    # count, and the decision is recorded at once (it counted, it was made again).
    probe = Store.probe_progress

    async def then_a_reward(self: Store, *args: Any, **kwargs: Any) -> Any:
        progress = await probe(self, *args, **kwargs)
        statuses = await other_service.reward("probe", [(made[2].decision_id, 1.0)], key)
        assert statuses[0].status == "applied"
        return progress

    monkeypatch.setattr(Store, "probe_progress", then_a_reward)
    attempts.clear()
    during = await service.choose("probe", ChooseRequest(), key)
    assert len(attempts) == 1 and attempts[0] is not None and attempts[0][1] is None
    assert _seen(redis_db, "probe", during.decision_id) == 2
    monkeypatch.setattr(Store, "probe_progress", probe)

    # The contention over: no read first, and the decision is made from what the view
    # holds, checked as before.
    assert (await service.choose("probe", ChooseRequest(), key)).decision_id  # catches up
    service.decisions._contended.clear()
    attempts.clear()
    pipelines.clear()
    quiet = await service.choose("probe", ChooseRequest(), key)
    assert pipelines == [1] and len(attempts) == 1
    assert attempts[0] is not None and attempts[0][1] == 3
    assert _seen(redis_db, "probe", quiet.decision_id) == 3


async def test_a_read_first_that_finds_nothing_new_keeps_the_view(
    service: ExperimentService, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A contended experiment's decisions read first; a read that brings nothing the view
    lacks keeps the view itself, with the policy prepared from it and the propensities
    computed on it. (A copy of the view computed them again after every read: after a
    ranking's rewards, a placement table per turn of rankings, BENCHMARKS.md §32.)"""
    monkeypatch.setattr(decisions, "_CONTENDED_SECONDS", 30.0)  # a slow host's pauses
    key = await _experiment(service, "still")
    for _ in range(4):  # past the first pass, so that decisions keep their propensities
        await service.choose("still", ChooseRequest(), key)
    probe = Store.probe_progress
    reads: list[int] = []

    async def counted(self: Store, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return await probe(self, *args, **kwargs)

    monkeypatch.setattr(Store, "probe_progress", counted)
    held = dict(service.views.held)
    for member_id in held:
        service.decisions._contend(member_id)
    for _ in range(3):
        await service.choose("still", ChooseRequest(), key)
    assert len(reads) == 3  # each read first
    assert all(service.views.held[m] is view for m, view in held.items())


async def test_a_read_from_an_older_view_adds_only_what_the_held_view_lacks(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests in flight together read first from the same view; when one of them has
    caught the held view up meanwhile, another's read (made from the older view, so it
    brings the outcomes since that) is added to the held view: only the outcomes it
    lacks are added, not again those it added (at max_stale_rewards 100 two workers
    added 2.68 outcomes a decision where 2 were new, BENCHMARKS.md §42). The same bits
    as reading the statistics."""
    key = await _experiment(service, "twice")
    await service.choose("twice", ChooseRequest(), key)
    older = service.views.held["twice"]

    async def other_worker_rewards(count: int) -> None:
        for _ in range(count):
            made = await other_service.choose("twice", ChooseRequest(), key)
            assert (await other_service.reward("twice", [(made.decision_id, 0.5)], key))[0] \
                .status == "applied"

    await other_worker_rewards(2)
    read = await service._store.read_progress("twice", held=older.folded + older.applied)
    assert read is not None
    held = await service.views.caught_up("twice", older, None, read)
    assert held.rewards == 2 and service.views.held["twice"] is held

    await other_worker_rewards(3)
    read = await service._store.read_progress("twice", held=older.folded + older.applied)
    assert read is not None and len(read.unfolded) == 5  # from the older view's place
    added: list[int] = []
    fold_into = views.fold_into

    def counted(config: Any, sums: Any, positions: Any, records: Sequence[bytes]) -> None:
        added.append(len(records))
        fold_into(config, sums, positions, records)

    monkeypatch.setattr(views, "fold_into", counted)
    older.last_number = 99  # (as a decision from it recorded since would have set it)
    caught = await service.views.caught_up("twice", older, None, read)
    assert added == [3]  # the held view's two not added again
    assert caught.rewards == 5 and caught.folded + caught.applied == 5
    assert caught.last_number == 99  # what the older view had learnt is kept
    fresh = await service.views.read_view("twice")
    assert fresh.rewards == 5
    for name, value in fresh.sums.items():
        assert np.array_equal(caught.sums[name], value), name


async def test_workers_on_one_hot_experiment_seldom_make_a_decision_twice(
    redis_db: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``benchmarks.bench_contention``'s load, small: two workers' loops each choose on one
    and reward on the other, at max_stale_rewards 0. Each worker's decisions made before
    it first met the other's rewards may be made again, at most a turn of them (the loops
    in flight); after that every decision is made once, with a read first for a batch of
    them. (Without the reads first, half to all of them were made twice.)"""
    monkeypatch.setattr(decisions, "_CONTENDED_SECONDS", 30.0)  # a slow host's pauses
    loops, pairs = 16, 300
    with counting() as counts:
        row = await run(redis_db, 2, loops, pairs, 0, counts)
    assert counts.decides - counts.again >= pairs
    assert counts.again <= loops
    assert 0 < row["reads first"] < 0.5  # joined: a read for several decisions


async def test_a_worker_s_own_rewards_within_the_lag_do_not_keep_it_reading_first(
    service: ExperimentService, other_service: ExperimentService,
    attempts: list[tuple[int, int | None] | None], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With max_stale_rewards 4, other workers' rewards beyond the lag make a decision
    stale and start reads first; afterwards the worker's own rewards, within the lag,
    would not have made its decisions stale, and do not renew them: once the contention
    is over, its decisions read nothing first."""
    monkeypatch.setattr(decisions, "_CONTENDED_SECONDS", 0.3)
    key = await _experiment(service, "own", max_stale_rewards=4)
    made = [await other_service.choose("own", ChooseRequest(), key) for _ in range(5)]
    await service.choose("own", ChooseRequest(), key)  # its view: 0 outcomes
    await other_service.reward("own", [(d.decision_id, 1.0) for d in made], key)
    attempts.clear()
    await service.choose("own", ChooseRequest(), key)
    assert len(attempts) == 2 and attempts[1] is None  # 5 > 4 behind: stale, contended
    started, probed_late = time.monotonic(), []
    while time.monotonic() - started < 0.8:
        attempts.clear()
        decision = await service.choose("own", ChooseRequest(), key)
        if time.monotonic() - started > 0.5:  # past the contention
            probed_late.append(attempts[0] is not None and attempts[0][1] is None)
        assert (await service.reward("own", [(decision.decision_id, 1.0)], key))[0].status \
            == "applied"
        await asyncio.sleep(0.02)
    assert probed_late and not any(probed_late)


async def test_a_seeded_decision_s_number_taken_does_not_start_reads_first(
    service: ExperimentService, attempts: list[tuple[int, int | None] | None],
) -> None:
    """Seeded decisions of one worker made together predict the same number: all but one
    are stale, and made again with a number set aside. A read first could not have
    helped (no one's rewards came): the next decision reads nothing first."""
    spec = ExperimentSpec(id="seeded", setting="stochastic", dim=2, seed=7,
                          arms=tuple(ArmSpec(f"a{i}", f) for i, f in enumerate(FEATURES)),
                          hyperparameters={"spread": "paper", "first_pass": True})
    _, key = await service.create(spec)
    await service.choose("seeded", ChooseRequest(), key)
    attempts.clear()
    await asyncio.gather(*(service.choose("seeded", ChooseRequest(), key) for _ in range(3)))
    assert sum(seen is None for seen in attempts) >= 1  # a number taken: made again
    attempts.clear()
    await service.choose("seeded", ChooseRequest(), key)
    assert len(attempts) == 1 and attempts[0] is not None and attempts[0][1] is not None


async def test_a_read_first_of_an_experiment_deleted_meanwhile_is_refused(
    service: ExperimentService, other_service: ExperimentService,
    attempts: list[tuple[int, int | None] | None], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decision that reads first finds the experiment gone: refused as a decision of
    a missing experiment is (a wrong key's 403), with nothing recorded."""
    monkeypatch.setattr(decisions, "_CONTENDED_SECONDS", 30.0)  # a slow host's pauses
    key = await _experiment(service, "gone")
    made = [await service.choose("gone", ChooseRequest(), key) for _ in range(2)]
    assert (await other_service.reward("gone", [(made[0].decision_id, 1.0)], key))[0].status \
        == "applied"
    await service.choose("gone", ChooseRequest(), key)  # stale: contended
    await other_service.delete("gone")
    attempts.clear()
    with pytest.raises(Forbidden):
        await service.choose("gone", ChooseRequest(), key)
    assert attempts == []  # refused by the read, before any decision was made


async def test_a_decision_right_after_its_rewards_reply_reflects_its_batch(
    service: ExperimentService, attempts: list[tuple[int, int | None] | None], redis_db: str,
) -> None:
    """A caller that decides as soon as its reward is answered runs before the same
    batch's other callers have added their outcomes to the view: it lets them run first,
    and its decision is made once, from all of them (it was made twice, the first time
    from a view without the others', in every in-process loop of choose and reward)."""
    key = await _experiment(service, "turn")
    made = [await service.choose("turn", ChooseRequest(), key) for _ in range(4)]
    attempts.clear()

    async def reward_then_choose() -> str:
        await service.reward("turn", [(made[0].decision_id, 1.0)], key)
        return (await service.choose("turn", ChooseRequest(), key)).decision_id

    async def reward(decision_id: str) -> None:
        await service.reward("turn", [(decision_id, 0.5)], key)

    chooser = asyncio.ensure_future(reward_then_choose())  # its reward first in the batch
    await asyncio.gather(chooser, *(reward(d.decision_id) for d in made[1:]))
    assert len(attempts) == 1 and attempts[0] is not None  # made once
    assert _seen(redis_db, "turn", chooser.result()) == 4  # from the batch's four rewards


async def test_a_decision_waits_for_its_workers_rewards_only_a_moment(
    app_settings: Settings, redis_db: str
) -> None:
    """With Redis paused a reward's batch takes the whole deadline: a decision made
    meanwhile waits for it only a moment, so it is refused about a deadline after it
    arrived, not after the reward's deadline and then its own."""
    deadline = 0.4
    async with _pausable(app_settings, redis_db, deadline) as (opened, client):
        key = await _experiment(opened, "slow")
        made = await opened.choose("slow", ChooseRequest(), key)
        unknown = await opened.reward("slow", [("0" * 32, 0.0)], key)  # loads the script
        assert unknown[0].status == "not_found"
        client.execute_command("CLIENT", "PAUSE", "1000", "ALL")
        paused = time.monotonic()
        rewarding = asyncio.ensure_future(opened.reward("slow", [(made.decision_id, 1.0)], key))
        await _until_sent(opened)

        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await opened.choose("slow", ChooseRequest(), key)
        refused_after = time.monotonic() - started

        with pytest.raises(StoreUnavailable):
            await rewarding
        assert refused_after < 1.5 * deadline  # unbounded: about 2 x the deadline
        await asyncio.sleep(max(0.0, paused + 1.0 - time.monotonic()))  # the pause is over


async def test_a_decision_that_may_lag_does_not_wait_for_its_workers_rewards(
    service: ExperimentService, attempts: list[tuple[int, int | None] | None],
    redis_db: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decisions that may lag two rewards: one made while a reward of this worker is in
    flight (Redis paused) is made at once, from the view without it, and recorded at its
    first attempt, behind the reward; it does not wait for the reward's reply, as a
    decision that may not lag does."""
    monkeypatch.setattr(decisions, "_REWARDS_WAIT_SECONDS", 5.0)  # waiting would show
    key = await _experiment(service, "lagging", max_stale_rewards=2)
    made = await service.choose("lagging", ChooseRequest(), key)
    unknown = await service.reward("lagging", [("0" * 32, 0.0)], key)  # loads the script
    assert unknown[0].status == "not_found"
    attempts.clear()
    client = redis.Redis.from_url(redis_db)
    try:
        client.execute_command("CLIENT", "PAUSE", "500", "ALL")
        paused = time.monotonic()
        rewarding = asyncio.ensure_future(
            service.reward("lagging", [(made.decision_id, 1.0)], key))
        await _until_sent(service)
        deciding = asyncio.ensure_future(service.choose("lagging", ChooseRequest(), key))
        while not attempts and time.monotonic() - paused < 0.25:
            await asyncio.sleep(0.005)
        assert attempts and not rewarding.done()  # made while the reward was in flight
        assert (await rewarding)[0].status == "applied"
        decision = await deciding
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
        client.close()
    assert len(attempts) == 1 and attempts[0] is not None  # recorded at its first attempt
    assert _seen(redis_db, "lagging", decision.decision_id) == 0  # without that reward


async def _until_sent(service: ExperimentService) -> None:
    """Until the batch just queued is on its way to Redis."""
    for _ in range(100):
        await asyncio.sleep(0)
        if service._store.batch_in_flight:
            return
    pytest.fail("the batch was not sent")


def _seen(url: str, experiment_id: str, decision_id: str) -> int:
    record = records.read(url, experiment_id, decision_id)
    assert record is not None
    return int(record["rewards_seen"])


async def test_a_view_may_lag_as_many_rewards_as_the_experiment_allows(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    one, two = service, other_service
    key = await _experiment(one, "lag", max_stale_rewards=2)
    first = await one.choose("lag", ChooseRequest(), key)
    assert _seen(redis_db, "lag", first.decision_id) == 0

    async def reward_through_two() -> None:
        decision = await two.choose("lag", ChooseRequest(), key)
        assert (await two.reward("lag", [(decision.decision_id, 1.0)], key))[0].status \
            == "applied"

    for _ in range(2):
        await reward_through_two()
    lagging = await one.choose("lag", ChooseRequest(), key)
    assert _seen(redis_db, "lag", lagging.decision_id) == 0  # two behind: allowed

    await reward_through_two()
    fresh = await one.choose("lag", ChooseRequest(), key)
    assert _seen(redis_db, "lag", fresh.decision_id) == 3  # three behind: read again
    assert (await one.get("lag")).spec.max_stale_rewards == 2  # stored with the spec


@pytest.mark.parametrize(("budget", "reads"), [(256 * 2**20, 2), (1, 3)])
async def test_views_beyond_the_memory_budget_are_dropped_least_recently_used_first(
    app_settings: Settings, monkeypatch: pytest.MonkeyPatch, budget: int, reads: int
) -> None:
    calls: list[str] = []
    read = Store.read_experiment

    async def counted(self: Store, experiment_id: str) -> Any:
        calls.append(experiment_id)
        return await read(self, experiment_id)

    monkeypatch.setattr(Store, "read_experiment", counted)
    service = await ExperimentService.open(app_settings.model_copy(
        update={"view_cache_bytes": budget}))
    try:
        keys_by_id = {e: await _experiment(service, e) for e in ("first", "second")}
        calls.clear()  # creating reads each experiment back once
        for experiment_id in ("first", "second", "first"):
            decision = await service.choose(experiment_id, ChooseRequest(),
                                            keys_by_id[experiment_id])
            assert decision.decision_number >= 1
    finally:
        await service.close()
    # A budget of one byte keeps only the view just made: "first" is read twice.
    assert len(calls) == reads


def _without_context(raw: bytes) -> bytes:
    return raw[: raw.rindex(b"\n")]  # (d = 2: no newline byte in this context)


def _short_context(raw: bytes) -> bytes:
    return raw[: raw.rindex(b"\n") + 1] + b"\0" * 8


def _line(index: int, value: bytes) -> Callable[[bytes], bytes]:
    def damage(raw: bytes) -> bytes:
        lines = raw.split(b"\n", 10)
        lines[index] = value
        return b"\n".join(lines)
    return damage


@pytest.mark.parametrize(("damage", "message"), [
    (_without_context, "without its fields or context"),
    (_short_context, "not of the experiment's size"),
    (_line(1, b"seven"), "number or deadline is not a number"),
    (_line(2, b"soon"), "number or deadline is not a number"),
])
async def test_a_batch_meeting_a_damaged_decision_writes_nothing(
    service: ExperimentService, redis_db: str, damage: Callable[[bytes], bytes], message: str
) -> None:
    """A pending decision whose context is gone, or of another size than the
    experiment's: the whole batch is refused before any write (Redis does not undo a
    failed script's writes)."""
    spec = ExperimentSpec(id="cov", setting="covariates", dim=2,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    _, key = await service.create(spec)
    first = await service.choose("cov", ChooseRequest(context=(1.0, 2.0), eligible=("a",)), key)
    second = await service.choose("cov", ChooseRequest(context=(1.0, 2.0), eligible=("b",)), key)
    client = redis.Redis.from_url(redis_db)
    try:
        record = keys.decision("cov", second.decision_id)
        raw: bytes = client.get(record)  # type: ignore[assignment]
        assert b"\n" not in raw[-16:]  # the context, (1.0, 2.0): no newline byte in it
        client.set(record, damage(raw), keepttl=True)
        with pytest.raises(redis.ResponseError, match=message):
            await service.reward("cov", [(first.decision_id, 1.0), (second.decision_id, 1.0)],
                                 key)
        untouched = records.read(redis_db, "cov", first.decision_id)
        assert untouched is not None and untouched["status"] == "pending"
        assert client.get(keys.outcomes("cov")) == b""
        assert client.hget(keys.stats("cov"), keys.REWARDS) == b"0"
    finally:
        client.close()


@pytest.mark.parametrize(("key_of", "kind"), [
    (keys.stats, "hash"), (keys.log, "stream"), (keys.outcomes, "string")])
async def test_a_reward_meeting_an_experiment_key_of_another_type_writes_nothing(
    service: ExperimentService, redis_db: str, key_of: Callable[[str], str], kind: str
) -> None:
    """A key of the experiment that holds another type (left there by hand): the rewards
    are refused before any write, saying which key; once it is mended, the same rewards
    are applied, not ``duplicate``: no outcome was lost. (A write to it failed the script
    after the decision was marked rewarded.)"""
    spec = ExperimentSpec(id="typed", setting="covariates", dim=2, log_max_entries=100,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    _, key = await service.create(spec)
    made = await service.choose("typed", ChooseRequest(context=(1.0, 2.0)), key)
    earlier = await service.choose("typed", ChooseRequest(context=(2.0, 1.0)), key)
    assert (await service.reward("typed", [(earlier.decision_id, 0.5)], key))[0].status \
        == "applied"  # the log and the outcomes exist
    client = redis.Redis.from_url(redis_db)
    name = key_of("typed")
    try:
        assert client.type(name) == kind.encode()
        kept: bytes = client.dump(name)  # type: ignore[assignment]
        assert kept is not None
        client.delete(name)
        client.sadd(name, "x")
        with pytest.raises(redis.ResponseError, match=f"holds a set, not a {kind}"):
            await service.reward("typed", [(made.decision_id, 1.0)], key)
        pending = records.read(redis_db, "typed", made.decision_id)
        assert pending is not None and pending["status"] == "pending"
        client.delete(name)
        client.restore(name, 0, kept)
    finally:
        client.close()
    outcome = await service.reward("typed", [(made.decision_id, 1.0)], key)
    assert outcome[0].status == "applied"
    assert (await service.get("typed")).rewards == 2


@pytest.mark.parametrize("default_reward", [None, 0.0])
@pytest.mark.parametrize(("key_of", "kind"), [(keys.pending, "list"), (keys.log, "stream")])
async def test_decisions_meeting_an_experiment_key_of_another_type_record_nothing(
    service: ExperimentService, redis_db: str, pipelines: list[int],
    key_of: Callable[[str], str], kind: str, default_reward: float | None
) -> None:
    """The pending list or the log left holding another type (by hand): a turn of
    decisions, one joined call, is refused whole, saying which key, before any write (the
    list's push or a log entry failed the call after the decisions were recorded and
    counted, while their callers got the error); once it is mended they are made and
    recorded."""
    spec = ExperimentSpec(id="typed", setting="covariates", dim=2, log_max_entries=100,
                          default_reward=default_reward, arms=(ArmSpec("a"), ArmSpec("b")))
    _, key = await service.create(spec)
    await service.choose("typed", ChooseRequest(context=(1.0, 2.0)), key)  # both keys exist
    client = redis.Redis.from_url(redis_db)
    name = key_of("typed")
    try:
        assert client.type(name) == kind.encode()
        kept: bytes = client.dump(name)  # type: ignore[assignment]
        client.delete(name)
        client.sadd(name, "x")
        before = {k: client.dump(k) for k in client.scan_iter(match=key_pattern("typed"))}
        turn = [service.choose("typed", ChooseRequest(context=(1.0, float(i))), key)
                for i in range(3)]
        pipelines.clear()
        answers = await asyncio.gather(*turn, return_exceptions=True)
        assert pipelines == [1]  # one decide.lua call for the three
        for answer in answers:
            assert isinstance(answer, redis.ResponseError), answer
            assert str(answer) == f"DAMAGED {name} holds a set, not a {kind}"
        assert {k: client.dump(k) for k in client.scan_iter(match=key_pattern("typed"))} \
            == before  # nothing written: no record, count, number or list entry
        client.delete(name)
        client.restore(name, 0, kept)
    finally:
        client.close()
    made = await asyncio.gather(*(service.choose("typed", ChooseRequest(context=(1.0, 0.0)),
                                                 key) for _ in range(3)))
    view = await service.get("typed")
    assert view.decisions == 4
    assert sorted(d.decision_number for d in made) == [2, 3, 4]


async def test_a_stale_decision_meeting_an_outcomes_key_of_another_type_sets_no_number_aside(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    """A seeded decision made stale by another worker's reward reads the outcomes it
    lacks before it sets its number aside: an outcomes key of another type (left there by
    hand) fails it with nothing written (its number is not spent)."""
    spec = ExperimentSpec(id="typed", setting="covariates", dim=2, seed=7,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    _, key = await service.create(spec)
    made = await service.choose("typed", ChooseRequest(context=(1.0, 2.0)), key)
    await other_service.reward("typed", [(made.decision_id, 1.0)], key)  # service is stale
    client = redis.Redis.from_url(redis_db)
    name = keys.outcomes("typed")
    try:
        kept: bytes = client.dump(name)  # type: ignore[assignment]
        client.delete(name)
        client.sadd(name, "x")
        counters = client.hmget(keys.stats("typed"), ["decision_seq", "decisions"])
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await service.choose("typed", ChooseRequest(context=(1.0, 0.0)), key)
        assert client.hmget(keys.stats("typed"), ["decision_seq", "decisions"]) == counters
        client.delete(name)
        client.restore(name, 0, kept)
    finally:
        client.close()
    assert (await service.choose("typed", ChooseRequest(context=(1.0, 0.0)), key)
            ).decision_number == 2


async def test_an_arm_added_through_another_worker_can_be_named_at_once(
    service: ExperimentService, other_service: ExperimentService
) -> None:
    one, two = service, other_service
    _, key = await one.create(ExperimentSpec(id="grow", setting="covariates", dim=2,
                                             arms=(ArmSpec("a"), ArmSpec("b"))))
    await one.choose("grow", ChooseRequest(context=(1.0, 0.5)), key)  # one's view: a, b
    await two.add_arms("grow", [ArmSpec("c")])

    decision = await one.choose("grow", ChooseRequest(context=(1.0, 0.5),
                                                      eligible=("c",)), key)
    assert decision.arm_id == "c"


async def test_patching_a_decision_that_expired_does_not_create_it_again(redis_db: str) -> None:
    """upgrade_decision.lua: a key without TTL would never expire."""
    store = Store.from_url(redis_db, 2.0)
    client = redis.Redis.from_url(redis_db)
    try:
        gone, live = keys.decision("up", "gone"), keys.decision("up", "live")
        client.hset(live, mapping={"arm": "a", "model_field": "kept"})
        client.expire(live, 600)
        fields = ["model_field", "model", "arm_field", "arm:a"]
        assert await store._upgrade_decision(keys=[gone], args=fields) == 0
        assert await store._upgrade_decision(keys=[live], args=fields) == 1
        assert not client.exists(gone)
        assert client.hgetall(live) == {b"arm": b"a", b"model_field": b"kept",
                                        b"arm_field": b"arm:a"}  # only what was missing
        ttl: int = client.ttl(live)  # type: ignore[assignment]
        assert 0 < ttl <= 600
    finally:
        client.close()
        await store.close()


async def test_a_pending_decision_is_one_record_with_its_context_whole(
    service: ExperimentService, redis_db: str
) -> None:
    """One string (one GET for a reward): what reward.lua needs and the state the
    decision was made from; rewarded, it keeps only what a repeat is checked against."""
    features = tuple(tuple(float(i + j) for j in range(20)) for i in range(3))
    _, key = await service.create(ExperimentSpec(
        id="wide", setting="stochastic", dim=20,
        arms=tuple(ArmSpec(f"a{i}", f) for i, f in enumerate(features))))
    decision = await service.choose("wide", ChooseRequest(), key)
    record = records.read(redis_db, "wide", decision.decision_id)
    assert record is not None
    picked = int(decision.arm_id[1:])
    assert record["x"] == np.array(features[picked], dtype="<f8").tobytes()  # 160 bytes
    assert (record["status"], record["arm"], record["model_field"], record["arm_field"]) == (
        "pending", decision.arm_id.encode(), keys.model_field(None).encode(),
        keys.arm_field(decision.arm_id).encode())
    assert record["number"] == str(decision.decision_number).encode()
    assert record["deadline"] == b""  # no default reward
    assert float(record["propensity"]) == pytest.approx(decision.propensity)
    # the reward reads the context back whole: the arm's features
    assert (await service.reward("wide", [(decision.decision_id, 2.0)], key))[0].status \
        == "applied"
    view = await service.get("wide")
    assert view.theta_hat["shared"] != [0.0] * 20
    rewarded = records.read(redis_db, "wide", decision.decision_id)
    assert rewarded == {"status": "rewarded", "late": False, "incarnation": record["incarnation"],
                        "number": record["number"], "reward": b"2.0"}


async def test_a_long_context_is_read_back_whole(
    app_settings: Settings, redis_db: str
) -> None:
    """d = 72: a context of 576 bytes, in the record and in the outcome's."""
    from tests.test_service_durability import (
        Observation,
        assert_stats_equal,
        expected_state,
        stored_stats,
    )

    service = await ExperimentService.open(app_settings.model_copy(update={"max_dim": 256}))
    try:
        _, key = await service.create(ExperimentSpec(id="big", setting="covariates", dim=72,
                                                     arms=(ArmSpec("a"), ArmSpec("b"))))
        rng = np.random.default_rng(5)
        observations = []
        for _ in range(4):
            context = tuple(float(v) for v in rng.normal(size=72))
            decision = await service.choose("big", ChooseRequest(context=context), key)
            reward = float(rng.normal())
            await service.reward("big", [(decision.decision_id, reward)], key)
            observations.append(Observation(["a", "b"].index(decision.arm_id),
                                            np.array(context), reward))
        config = PolicyConfig(**(await service.get("big")).config)  # type: ignore[arg-type]
    finally:
        await service.close()
    assert_stats_equal(config, ["a", "b"], stored_stats(redis_db, "big"),
                       expected_state(config, 2, observations))


@pytest.mark.parametrize("legacy", [False, True], ids=["record", "hash of an earlier version"])
async def test_a_resent_decision_is_answered_with_its_number_and_recorded_once(
    service: ExperimentService, redis_db: str, legacy: bool
) -> None:
    """decide.lua run again after its reply was lost (the Redis client's own retry)."""
    spec = ExperimentSpec(id="again", setting="covariates", dim=2,
                          arms=(ArmSpec("a"), ArmSpec("b")))
    _, key = await service.create(spec)
    made = await service.choose("again", ChooseRequest(context=(1.0, 2.0)), key)
    client = redis.Redis.from_url(redis_db)
    store = Store.from_url(redis_db, 5.0)
    try:
        if legacy:
            records.make_legacy(client, "again", made.decision_id)
        incarnation = client.hget(keys.meta("again"), "incarnation").decode()  # type: ignore[union-attr]
        before = client.hgetall(keys.stats("again"))
        record = client.dump(keys.decision("again", made.decision_id))
        reply = await store.decide(
            "again", made.decision_id, key_hash=None, incarnation=incarnation, seen=None,
            number=None, reserved=False, ttl_seconds=60, max_lag=0, grace_seconds=60,
            record=b"model:a\narm:a\na\n1\n0\n0.0\n0.5\n" + b"\0" * 16)
        assert (reply.status, reply.number) == ("recorded", made.decision_number)
        assert client.hgetall(keys.stats("again")) == before  # no decision counted twice
        assert client.dump(keys.decision("again", made.decision_id)) == record  # untouched
        assert client.llen(keys.pending("again")) == 1
    finally:
        client.close()
        await store.close()
    outcome = await service.reward("again", [(made.decision_id, 1.0)], key)
    assert outcome[0].status == "applied"


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "unix:///run/redis.sock?db=0",
                                 "rediss://127.0.0.1:6380/0"])
def test_every_kind_of_connection_packs_commands_in_c(url: str) -> None:
    """The URL picks the connection's kind (TCP, a unix socket, TLS); each packs with
    hiredis (the embedded Redis is a unix socket: it packed in Python before)."""
    client = Store.from_url(url, 1.0)._client
    assert isinstance(client, redis.asyncio.Redis)
    connection = client.connection_pool.make_connection()
    command: tuple[Any, ...] = ("EVALSHA", "0" * 40, 2, "k1", "k2", b"\x00\xff", 1.5, 7)
    assert connection.pack_command(*command) == [hiredis.pack_command(command)]
    assert type(connection).__module__ == "service.store"


async def test_catching_up_brings_only_the_outcomes_a_worker_lacks(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stale reply (decide.lua) and a progress read carry the outcomes after those the
    worker's view holds, not every outcome not yet folded: catching up costs in
    proportion to what it missed. The view it makes is the one a full read gives."""
    monkeypatch.setattr(decisions, "_CONTENDED_SECONDS", 0.0)  # stale replies, no reads first
    key = await _experiment(service, "tail")
    await other_service.choose("tail", ChooseRequest(), key)  # the other worker's view: 0 held
    first = [await service.choose("tail", ChooseRequest(), key) for _ in range(5)]
    await service.reward("tail", [(d.decision_id, 0.5) for d in first], key)
    replies: list[Any] = []
    decide = Store.decide

    async def recorded(self: Store, *args: Any, **kwargs: Any) -> Any:
        reply = await decide(self, *args, **kwargs)
        if self is other_service._store:
            replies.append(reply)
        return reply

    monkeypatch.setattr(Store, "decide", recorded)
    mine = await other_service.choose("tail", ChooseRequest(), key)  # stale: lacks all 5
    assert [r.status for r in replies] == ["stale", "recorded"]
    progress = replies[0].progress
    assert (progress.folded, progress.skipped, len(progress.unfolded)) == (0, 0, 5)

    second = await service.choose("tail", ChooseRequest(), key)
    await service.reward("tail", [(second.decision_id, 1.5), (mine.decision_id, 2.5)], key)
    replies.clear()
    await other_service.choose("tail", ChooseRequest(), key)  # stale: lacks 2 of 7
    progress = replies[0].progress
    assert (progress.folded, progress.skipped, len(progress.unfolded)) == (0, 5, 2)
    assert progress.rewards == 7

    third = await service.choose("tail", ChooseRequest(), key)
    await service.reward("tail", [(third.decision_id, 3.5)], key)
    lacking = await other_service._store.read_progress("tail", held=7)
    assert lacking is not None and (lacking.skipped, len(lacking.unfolded)) == (7, 1)
    whole = await other_service._store.read_progress("tail")
    assert whole is not None and (whole.skipped, len(whole.unfolded)) == (0, 8)
    assert whole.unfolded[7:] == lacking.unfolded

    caught = await other_service.views.caught_up(
        "tail", other_service.views.held["tail"], None)
    read = await service.views.read_view("tail")
    assert caught.rewards == read.rewards == 8
    for name, value in read.state.items():
        np.testing.assert_array_equal(caught.state[name], value, err_msg=name)


async def test_rewards_sent_together_keep_the_view_current_with_each_record_once(
    service: ExperimentService, other_service: ExperimentService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rewards a worker sends together (one pipeline) after another worker's reward: the
    first reply brings the other's outcome with its own (only the first says what the
    worker holds), the next bring their own, and the view keeps each record once; its
    next decision reads nothing, and its view is the one a read gives."""
    key = await _experiment(service, "together")
    theirs = await other_service.choose("together", ChooseRequest(), key)
    mine = [await service.choose("together", ChooseRequest(), key) for _ in range(5)]
    await other_service.reward("together", [(theirs.decision_id, 1.0)], key)
    sent: list[int | None] = []
    apply_rewards = Store.apply_rewards

    async def watched(self: Store, *args: Any) -> Any:
        sent.append(args[3] if len(args) > 3 else None)
        return await apply_rewards(self, *args)

    monkeypatch.setattr(Store, "apply_rewards", watched)
    outcomes = await asyncio.gather(*(service.reward("together", [(d.decision_id, 0.5 * i)], key)
                                      for i, d in enumerate(mine)))
    assert [o[0].status for o in outcomes] == ["applied"] * 5
    assert sent == [0, None, None, None, None]  # the view held no outcome yet
    view = service.views.held["together"]
    assert view.own is not None and len(view.own) == view.behind == 6
    reads = _count_reads(monkeypatch)

    await service.choose("together", ChooseRequest(), key)

    assert reads == []
    caught = service.views.held["together"]
    read = await other_service.views.read_view("together")
    assert caught.rewards == read.rewards == 6
    for name, value in read.state.items():
        np.testing.assert_array_equal(caught.state[name], value, err_msg=name)


def _counter(url: str, experiment_id: str, name: str) -> int:
    """A counter of the experiment's stats hash."""
    client = redis.Redis.from_url(url)
    try:
        return int(client.hget(keys.stats(experiment_id), name) or 0)  # type: ignore[arg-type]
    finally:
        client.close()


def _tail_start(url: str, experiment_id: str) -> int:
    """The first outcome the folded tail holds (its end less its count)."""
    client = redis.Redis.from_url(url)
    try:
        index: bytes = client.hget(keys.stats(experiment_id), keys.FOLDED_TAIL)  # type: ignore[assignment]
    finally:
        client.close()
    ends, count = index.split()[:2]
    return int(ends) - int(count)
