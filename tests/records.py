"""Decision records as decide.lua, reward.lua and settle.lua write them (the format is in
service/lua/outcomes.lua), read independently of the scripts, for tests that look inside."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

import redis
from redis.cluster import RedisCluster

from service import keys, shards

_STATES = {b"p": "pending", b"l": "pending", b"r": "rewarded", b"d": "defaulted",
           b"D": "defaulted"}
_PENDING = ("incarnation", "number", "deadline", "model_field", "arm_field", "arm", "version",
            "rewards_seen", "created_at", "propensity")


def parse(raw: bytes) -> dict[str, bytes | str | bool]:
    """A record's fields by name: ``status`` (pending, rewarded or defaulted), ``late``
    (a late reward was counted), and the fields the record keeps in that status."""
    code = raw[:1]
    fields: dict[str, bytes | str | bool] = {"status": _STATES[code], "late": code in b"lD"}
    if code in b"pl":
        *texts, x = raw[1:].split(b"\n", len(_PENDING))
        return {**fields, **dict(zip(_PENDING, texts, strict=True)), "x": x}
    incarnation, number, reward = raw[1:].split(b"\n", 2)
    return {**fields, "incarnation": incarnation, "number": number, "reward": reward}


def shard_count(client: redis.Redis | RedisCluster, experiment_id: str) -> int:
    """The experiment's shard count, as its meta says (1 unsharded, or gone)."""
    return int(client.hget(keys.meta(experiment_id), "number_step") or 1)  # type: ignore[arg-type]


def member_of(client: redis.Redis | RedisCluster, experiment_id: str, decision_id: str) -> str:
    """The member the decision's id routes it to (service.shards; the experiment itself,
    unsharded)."""
    count = shard_count(client, experiment_id)
    return shards.member(experiment_id, shards.shard_of(decision_id, count))


def key(client: redis.Redis | RedisCluster, experiment_id: str, decision_id: str) -> str:
    """The key of the decision's record, on its member."""
    return keys.decision(member_of(client, experiment_id, decision_id), decision_id)


def read(url: str, experiment_id: str, decision_id: str) -> dict[str, bytes | str | bool] | None:
    """The decision's record, None when there is none: a ranking's slot's, its own once it
    has one, else as its ranking's record holds it (:func:`slot_of_ranking`)."""
    client = redis.Redis.from_url(url)
    try:
        raw: bytes | None = client.get(key(client, experiment_id, decision_id))  # type: ignore[assignment]
        ranking, _, slot = decision_id.partition(keys.SLOT_SEPARATOR)
        if raw is None and slot:
            whole: bytes | None = client.get(  # type: ignore[assignment]
                key(client, experiment_id, keys.slot_id(ranking, 0)))
            raw = None if whole is None else slot_of_ranking(whole, int(slot))
    finally:
        client.close()
    return None if raw is None else parse(raw)


def slot_of_ranking(raw: bytes, slot: int) -> bytes | None:
    """Slot ``slot``'s record (1 the first) as a ranking's record holds it, None when the
    slot's is its own (``s``). The format: ``service/lua/outcomes.lua``."""
    assert raw[:1] == b"R", raw[:20]
    incarnation, number, deadline, states, *rest = raw[1:].split(b"\n", 5)
    code = states[slot - 1:slot]
    if not 1 <= slot <= len(states) or code == b"s":
        return None
    if code in b"dD":
        return code + incarnation + b"\n" + number + b"\n"
    lengths, parts = rest
    sizes = [int(n) for n in lengths.split(b",")]
    start = sum(sizes[:slot - 1])
    return b"\n".join((code + incarnation, number, deadline, parts[start:start + sizes[slot - 1]]))


def make_legacy(
    client: redis.Redis | RedisCluster, experiment_id: str, decision_id: str, *,
    chunked: bool = True,
) -> None:
    """Turn a pending decision's record into the hash an earlier version wrote (same time
    to live): its context in 64-byte chunks ``x:1``, ``x:2``, ... (``chunked``), or whole
    in ``x`` (a version before that)."""
    record = key(client, experiment_id, decision_id)
    raw: bytes = client.get(record)  # type: ignore[assignment]
    fields = parse(raw)
    assert fields["status"] == "pending" and not fields["late"]
    x = fields.pop("x")
    assert isinstance(x, bytes)
    del fields["late"]
    if not fields["deadline"]:
        del fields["deadline"]
    if chunked:
        chunks = [x[i: i + 64] for i in range(0, len(x), 64)]
        fields.update({"x_chunks": str(len(chunks)),
                       **{f"x:{i}": c for i, c in enumerate(chunks, 1)}})
    else:
        fields["x"] = x
    left: int = client.pttl(record)  # type: ignore[assignment]
    client.delete(record)
    client.hset(record, mapping=fields)
    client.pexpire(record, left)


def member_ids(client: redis.Redis | RedisCluster, experiment_id: str) -> list[str]:
    """The experiment's members (itself alone, unsharded: service.shards)."""
    return shards.members(experiment_id, shard_count(client, experiment_id))


def list_length(client: redis.Redis | RedisCluster, experiment_id: str,
                key: Callable[[str], str]) -> int:
    """A per-member list's or stream's length (keys.pending, keys.settled, keys.log),
    over the members."""
    total = 0
    for member in member_ids(client, experiment_id):
        name = key(member)
        stream = client.type(name) == b"stream"
        total += int(client.xlen(name) if stream else client.llen(name))  # type: ignore[arg-type]
    return total


class FoldedTail(NamedTuple):
    """The folded tail as tail.lua keeps it: its end and count of outcomes, each fold's (slot,
    records, bytes) oldest first, and the folds' records one after the other."""

    ends: int
    outcomes: int
    folds: list[tuple[int, int, int]]
    records: bytes


def folded_tail(raw: Mapping[bytes, bytes] | Mapping[str, bytes]) -> FoldedTail:
    """The folded tail of a stats hash (HGETALL's), read from its index and slots."""
    stats = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
    ends, count, sizes = stats[keys.FOLDED_TAIL].decode().split(" ")
    folds = [(int(slot), int(n), int(size)) for slot, n, size in
             (re.fullmatch(r"(\d+):(\d+)/(\d+)", fold).groups()  # type: ignore[union-attr]
              for fold in sizes.split(","))]
    records = b"".join(stats[keys.folded_tail_field(slot)] for slot, _, _ in folds)
    return FoldedTail(int(ends), int(count), folds, records)
