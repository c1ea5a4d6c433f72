"""The statistics a decision log's outcomes give, member by member.

A sharded experiment (service.shards) keeps one set of sums per member, each the
outcomes of the decisions routed to it, in that member's order; its log is the
members' logs merged. So each member's sums are replayed from its own decisions'
entries, and a decision's statistics are the merge of every member's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TypeVar

import numpy as np
import redis

from policies import PolicyConfig, State
from policies.state import merge_sums
from service import shards
from service.domain import LogEntry
from tests import records
from tests.test_service_durability import (
    Observation,
    assert_stats_equal,
    expected_state,
    stored_stats,
)

T = TypeVar("T")


def replayed(log: Sequence[LogEntry], arm_ids: Sequence[str]) -> list[Observation]:
    """The log's applied outcomes (rewards and defaults), in its order, as observations."""
    decisions = {e.decision_id: e for e in log if e.type == "decision"}
    observations = []
    for entry in log:
        if entry.type in ("reward", "default"):
            decision = decisions[entry.decision_id]
            assert decision.arm_id is not None and decision.context is not None
            assert entry.reward is not None
            observations.append(Observation(arm_ids.index(decision.arm_id),
                                            np.array(decision.context), entry.reward,
                                            decision.number))
    return observations


def member_logs(log: Sequence[LogEntry], count: int) -> list[list[LogEntry]]:
    """Each member's entries (those of the decisions routed to it), in the log's order."""
    logs: list[list[LogEntry]] = [[] for _ in range(count)]
    for entry in log:
        logs[shards.shard_of(entry.decision_id, count)].append(entry)
    return logs


def member_count(redis_url: str, experiment_id: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return records.shard_count(client, experiment_id)
    finally:
        client.close()


def assert_members_stats(redis_url: str, experiment_id: str, config: PolicyConfig,
                         arm_ids: Sequence[str], log: Sequence[LogEntry]) -> None:
    """Each member's stored sums are exactly its own decisions' outcomes, in log order
    (the experiment's own, unsharded)."""
    count = member_count(redis_url, experiment_id)
    for member_id, mine in zip(shards.members(experiment_id, count), member_logs(log, count),
                               strict=True):
        assert_stats_equal(config, arm_ids, stored_stats(redis_url, member_id),
                           expected_state(config, len(arm_ids), replayed(mine, arm_ids)))


def state_after(config: PolicyConfig, arm_ids: Sequence[str], log: Sequence[LogEntry],
                count: int, applied: Collection[str]) -> State:
    """The statistics of the outcomes of the decisions in ``applied``: each member's
    replayed in its order, then merged in the members' order, as a worker merges its
    views of them (one member's as they are)."""
    parts = []
    for mine in member_logs(log, count):
        kept = [e for e in mine if e.type == "decision" or e.decision_id in applied]
        parts.append(expected_state(config, len(arm_ids), replayed(kept, arm_ids)))
    return parts[0] if count == 1 else merge_sums(config, parts)


def assert_each_members_order(logged: Sequence[T], expected: Sequence[T], count: int) -> None:
    """``logged`` (decision ids, or tuples whose last item is one) holds what ``expected``
    does, each member's in the same order: the merged log orders the members' entries by
    their ids: the server clock's milliseconds, which tie, and may step back."""
    assert sorted(map(repr, logged)) == sorted(map(repr, expected))

    def shard(item: T) -> int:
        decision_id = item[-1] if isinstance(item, tuple) else item
        assert isinstance(decision_id, str)
        return shards.shard_of(decision_id, count)

    for member in range(count):
        assert [i for i in logged if shard(i) == member] == [
            i for i in expected if shard(i) == member]
