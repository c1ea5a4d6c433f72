"""A write on a Redis Cluster is answered once a replica holds it, not before.

Redis replicates asynchronously: a master answers a script before its replicas have
its effects. Were the master to die then, the replica promoted in its place would not
have them, and a reward the service had acknowledged would be lost (or a decision, whose
number the new master would then give to another). So the batcher's writes to a master
that has replicas are followed, in the same pipeline and on the same connection, by
``WAIT 1 <ms>`` (WAIT counts the replicas that acknowledged that connection's writes),
and their callers get their replies only once a replica has acknowledged; else a
``NOREPLICAS`` error (503, Retry-After). A retry is safe: a reward is applied at most
once (its repeat answers ``duplicate``), a decision with a request id answers its first
answer, and one without is made anew.

WAIT blocks for its whole timeout when the master has no replica online, so the
batcher needs to know which masters have one: ``ROLE`` (the replicas online) goes in
the same pipeline after each WAIT, and every second to masters written without one. A
replica that goes away (its master drops the link at once when the replica's process
dies, after ``repl-timeout`` when it hangs) costs one batch a WAIT timeout, then writes
go on without it, as they must, with nothing to wait for. A replica that is online and
acknowledges nothing within the timeout gets its master's writes answered 503 until it
does or goes away: the service prefers saying "retry" to acknowledging what a failover
could lose.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisError, ResponseError

# How long a master's count of online replicas serves before it is asked again.
REFRESH_SECONDS = 1.0

NOT_REPLICATED = ("NOREPLICAS no replica acknowledged the write within {ms} ms (the master "
                  "has {online} online); it may or may not be kept: retry")


@dataclass
class _Master:
    online: int  # replicas online, as the master last said (ROLE) or the topology lists
    asked_at: float  # time.monotonic() of the last ROLE (-inf: never)


@dataclass
class AckPlan:
    """What one pipeline's writes need: the master each went to, the WAITs and ROLEs."""

    # call index -> its key's slot and the slot's master when sent
    masters: dict[int, tuple[int, ClusterNode]] = field(default_factory=dict)
    waits: list[ClusterNode] = field(default_factory=list)
    roles: list[ClusterNode] = field(default_factory=list)

    def commands(self, timeout_ms: int) -> list[tuple[tuple[Any, ...], ClusterNode]]:
        """The commands to send after the calls, each with its node: a WAIT, then a
        ROLE, per master waited for; a ROLE per other master asked."""
        waited = [(("WAIT", 1, timeout_ms), node) for node in self.waits]
        return [*waited, *((("ROLE",), node) for node in self.roles)]


class ReplicaAcks:
    """Which masters have replicas online, and which writes they have acknowledged."""

    def __init__(self, client: RedisCluster, timeout_ms: int) -> None:
        self._client = client
        self.timeout_ms = timeout_ms
        self._masters: dict[str, _Master] = {}

    def plan(self, writes: Sequence[tuple[int, str]]) -> AckPlan:
        """The plan for calls that write (``writes``: each call's index and first key)."""
        plan, now = AckPlan(), time.monotonic()
        chosen: set[str] = set()
        for index, key in writes:
            slot = self._client.keyslot(key)
            master = self._master_of(slot)
            if master is None:  # a slot not covered: the call itself fails
                continue
            plan.masters[index] = (slot, master)
            if master.name in chosen:
                continue
            chosen.add(master.name)
            known = self._known(master, slot)
            if known.online > 0:
                plan.waits.append(master)
                plan.roles.append(master)
            elif now - known.asked_at >= REFRESH_SECONDS:
                plan.roles.append(master)
        return plan

    def unacknowledged(self, plan: AckPlan, replies: Sequence[Any], extra: Sequence[Any]
                       ) -> dict[int, Exception]:
        """The calls of ``plan`` whose write no replica is known to hold, each with the
        error its caller gets (``replies``: the calls'; ``extra``: the plan's commands',
        in order). A call that failed keeps its own error."""
        waited = dict(zip((node.name for node in plan.waits), extra, strict=False))
        roles = extra[len(plan.waits):]
        for node, role in zip(plan.roles, roles, strict=True):
            self._learn(node, role)
        refused: dict[int, Exception] = {}
        for index, (slot, master) in plan.masters.items():
            if isinstance(replies[index], Exception):
                continue
            now = self._master_of(slot)
            if master.name in waited:
                acked = waited[master.name]
                if not (isinstance(acked, int) and acked >= 1) and self._online(master) > 0:
                    refused[index] = ResponseError(NOT_REPLICATED.format(
                        ms=self.timeout_ms, online=self._online(master)))
                    continue
            if now is not None and now.name != master.name and (
                    self._online(master) > 0 or self._online(now) > 0):
                # Redirected (MOVED: a failover or a migration) and resent to another
                # master by the client, without a WAIT on that connection.
                refused[index] = ResponseError(
                    "NOREPLICAS the write was redirected to another master: retry")
        return refused

    def _master_of(self, slot: int) -> ClusterNode | None:
        """The slot's master as the client knows it (a MOVED reply updates it)."""
        try:
            return self._client.nodes_manager.get_node_from_slot(slot)
        except RedisError:
            return None

    def _known(self, master: ClusterNode, slot: int) -> _Master:
        known = self._masters.get(master.name)
        if known is None:  # never asked: as many as the topology lists
            listed = self._client.nodes_manager.slots_cache.get(slot, [])
            known = self._masters[master.name] = _Master(max(len(listed) - 1, 0), -float("inf"))
        return known

    def _online(self, node: ClusterNode) -> int:
        known = self._masters.get(node.name)
        return known.online if known is not None else 0

    def _learn(self, node: ClusterNode, role: Any) -> None:
        """What ROLE said: a master lists its online replicas; a replica (demoted) or an
        error tells nothing of the master that node was."""
        if isinstance(role, list) and len(role) >= 3 and role[0] in (b"master", "master"):
            self._masters[node.name] = _Master(len(role[2]), time.monotonic())
