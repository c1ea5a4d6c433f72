"""A write is answered once a replica holds it, not before.

Redis replicates asynchronously: a master answers a script before its replicas have
its effects. Were the master to die then, the replica promoted in its place (by a Redis
Cluster, Sentinel or a managed service's failover) would not have them, and a reward
the service had acknowledged would be lost (or a decision, whose number the new master
would then give to another). So the batcher's writes to a master that has replicas are
followed, in the same pipeline and on the same connection, by ``WAIT 1 <ms>`` (WAIT
counts the replicas that acknowledged that connection's writes), and their callers get
their replies only once a replica has acknowledged; else a ``NOREPLICAS`` error (503,
Retry-After). A retry is safe: a reward is applied at most once (its repeat answers
``duplicate``), a decision with a request id answers its first answer, and one without
is made anew.

WAIT blocks for its whole timeout when the master has no replica online, so the
batcher needs to know which masters have one: ``ROLE`` (the replicas online) goes in
the same pipeline after each WAIT, and every second to masters written without one. A
replica that goes away (its master drops the link at once when the replica's process
dies, after ``repl-timeout`` when it hangs) costs one batch a WAIT timeout, then writes
go on without it, as they must, with nothing to wait for. A replica that is online and
acknowledges nothing within the timeout gets its master's writes answered 503 until it
does or goes away: the service prefers saying "retry" to acknowledging what a failover
could lose. A server that refuses ROLE or WAIT (a managed service's renamed commands,
an ACL) is written to without waiting, as before, and a warning says so once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoPermissionError, RedisError, ResponseError

logger = logging.getLogger("linreboot.store")

# How long a master's count of online replicas serves before it is asked again.
REFRESH_SECONDS = 1.0

NOT_REPLICATED = ("NOREPLICAS no replica acknowledged the write within {ms} ms (the master "
                  "has {online} online); it may or may not be kept: retry")
REDIRECTED = "NOREPLICAS the write was redirected to another master: retry"

# The master of a single Redis (no cluster): the one server the client speaks to.
SERVER = "the server"


@dataclass
class _Master:
    online: int  # replicas online, as the master last said (ROLE) or the topology lists
    asked_at: float  # time.monotonic() of the last ROLE (-inf: never)


@dataclass
class AckPlan:
    """What one pipeline's writes need: the master each went to, the WAITs and ROLEs
    (each master by name, with its cluster node; None: the single Redis)."""

    # call index -> its key's slot and the name of the slot's master when sent
    masters: dict[int, tuple[int, str]] = field(default_factory=dict)
    nodes: dict[str, ClusterNode | None] = field(default_factory=dict)
    waits: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)

    def commands(self, timeout_ms: int) -> list[tuple[tuple[Any, ...], ClusterNode | None]]:
        """The commands to send after the calls, each with its node: a WAIT per master
        waited for, then a ROLE per master asked (each waited for among them).

        (A retry that finds its work done writes nothing, its first attempt's write on
        another connection: WAIT still waits for it, on Redis 6.2 and 7 alike, as
        tests/test_replicas.py shows.)"""
        waited = [(("WAIT", 1, timeout_ms), self.nodes[name]) for name in self.waits]
        return [*waited, *((("ROLE",), self.nodes[name]) for name in self.roles)]


class ReplicaAcks:
    """Which masters have replicas online, and which writes they have acknowledged."""

    def __init__(self, client: Any, timeout_ms: int) -> None:
        self._cluster: RedisCluster | None = client if isinstance(client, RedisCluster) else None
        self.timeout_ms = timeout_ms
        self._masters: dict[str, _Master] = {}
        self._refused = False  # the server refuses ROLE or WAIT: no waiting

    @property
    def unasked(self) -> bool:
        """A single Redis not yet asked whether it has replicas (a cluster's first guess
        comes from its topology)."""
        return self._cluster is None and not self._refused and SERVER not in self._masters

    def learn_server(self, role: Any) -> None:
        """What the single Redis said to ROLE (an error: it has none we can know of)."""
        self._masters[SERVER] = _Master(0, time.monotonic())
        self._learn(SERVER, role)

    def plan(self, writes: Iterable[tuple[int, str]]) -> AckPlan:
        """The plan for calls that write (``writes``: each call's index and first key)."""
        plan, now = AckPlan(), time.monotonic()
        if self._refused:
            return plan
        if self._cluster is None:
            return self._server_plan(writes, now)
        for index, key in writes:
            slot = self._cluster.keyslot(key)
            node = self._master_of(slot)
            if node is None:  # a slot not covered: the call itself fails
                continue
            name = node.name
            plan.masters[index] = (slot, name)
            if name in plan.nodes:
                continue
            plan.nodes[name] = node
            known = self._known(name, slot)
            if known.online > 0:
                plan.waits.append(name)
                plan.roles.append(name)
            elif now - known.asked_at >= REFRESH_SECONDS:
                plan.roles.append(name)
        return plan

    def _server_plan(self, writes: Iterable[tuple[int, str]], now: float) -> AckPlan:
        """:meth:`plan` on a single Redis: every call's master is the server, and
        without a replica online (the embedded Redis) no call needs a look."""
        plan, known = AckPlan(), self._masters.get(SERVER)
        if known is None:  # not asked (the batcher asks first)
            return plan
        if known.online > 0:
            plan.masters = {index: (0, SERVER) for index, _ in writes}
            if plan.masters:
                plan.nodes[SERVER] = None
                plan.waits.append(SERVER)
                plan.roles.append(SERVER)
        elif now - known.asked_at >= REFRESH_SECONDS and any(True for _ in writes):
            plan.nodes[SERVER] = None
            plan.roles.append(SERVER)
        return plan

    def unacknowledged(self, plan: AckPlan, replies: Sequence[Any], extra: Sequence[Any]
                       ) -> dict[int, Exception]:
        """The calls of ``plan`` whose write no replica is known to hold, each with the
        error its caller gets (``replies``: the calls'; ``extra``: the plan's commands',
        in order). A call that failed keeps its own error."""
        waited = dict(zip(plan.waits, extra[:len(plan.waits)], strict=True))
        for name, role in zip(plan.roles, extra[len(plan.waits):], strict=True):
            self._learn(name, role)
        for acked in waited.values():
            self._check_refusal(acked)
        if self._refused:  # (WAIT refused: written to without waiting, as documented)
            return {}
        refused: dict[int, Exception] = {}
        for index, (slot, name) in plan.masters.items():
            if isinstance(replies[index], Exception):
                continue
            acked = waited.get(name, 1)
            if not (isinstance(acked, int) and acked >= 1) and self._online(name) > 0:
                refused[index] = ResponseError(NOT_REPLICATED.format(
                    ms=self.timeout_ms, online=self._online(name)))
                continue
            now = self._master_of(slot) if self._cluster is not None else None
            if now is not None and now.name != name and (
                    self._online(name) > 0 or self._known(now.name, slot).online > 0):
                # Redirected (MOVED: a failover or a migration) and resent to another
                # master by the client, without a WAIT on that connection.
                refused[index] = ResponseError(REDIRECTED)
        return refused

    def _master_of(self, slot: int) -> ClusterNode | None:
        """The slot's master as the cluster client knows it (a MOVED reply updates it);
        None when no master serves the slot."""
        assert self._cluster is not None
        try:
            return self._cluster.nodes_manager.get_node_from_slot(slot)
        except RedisError:
            return None

    def _known(self, name: str, slot: int) -> _Master:
        known = self._masters.get(name)
        if known is None:  # never asked: as many as the cluster's topology lists
            listed = (self._cluster.nodes_manager.slots_cache.get(slot, [])
                      if self._cluster is not None else [])
            known = self._masters[name] = _Master(max(len(listed) - 1, 0), -float("inf"))
        return known

    def _online(self, name: str) -> int:
        known = self._masters.get(name)
        return known.online if known is not None else 0

    def _learn(self, name: str, role: Any) -> None:
        """What ROLE said: a master lists its online replicas; a replica (demoted) or an
        error tells nothing of the master that node was."""
        if isinstance(role, list) and len(role) >= 3 and role[0] in (b"master", "master"):
            self._masters[name] = _Master(len(role[2]), time.monotonic())
        else:
            self._check_refusal(role)

    def _check_refusal(self, reply: Any) -> None:
        """A server that forbids ROLE or WAIT (an ACL; a managed service that renamed
        them) cannot say what its replicas hold: its writes are answered unwaited."""
        if isinstance(reply, NoPermissionError) or (
                isinstance(reply, ResponseError) and "unknown command" in str(reply)):
            if not self._refused:
                logger.warning("Redis refuses ROLE or WAIT (%s): writes are acknowledged "
                               "without waiting for a replica; a failover can lose the "
                               "last ones", reply)
            self._refused = True
