"""The one narrow interface between the service and Redis.

Nothing above ``service/`` imports ``redis``: every Redis failure leaves this
module as :class:`service.errors.StoreUnavailable` (:class:`StoreFull` when
Redis is out of memory and refuses writes). Multi-key changes are Lua scripts
(``service/lua``); reads that must be consistent are one read-only script
(``read.lua``), which a Redis Cluster client sends as it sends any script.

One store speaks to one Redis or to a Redis Cluster (:meth:`Store.connect`
tells them apart). Every key of an experiment carries its hash tag, so each
script touches one slot; the two index sets live in slots of their own and
are written outside the scripts, in an order that needs no cross-slot
atomicity (see :meth:`Store.create`). A cluster in motion (a slot migrating,
a failover) answers MOVED, ASK, TRYAGAIN or CLUSTERDOWN: the client follows
the redirections it can, and what is left becomes :class:`StoreUnavailable`.

Each call has one deadline, retries and reconnections included: the store's
timeout. A call that misses it may still have happened in Redis; every write
is safe to repeat (a resent reward answers "duplicate", a resent decision
"recorded"), so the caller may retry.

Redis refuses a Lua script out of memory at its first write only (one that has
written runs to its end), so a refused script has changed nothing: each
script checks before it writes, and a refused creation is undone. On Redis 7
the scripts of every request are functions (:class:`_Library`), which Redis
refuses out of memory before they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import heapq
import itertools
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar

import hiredis
import redis
import redis.asyncio as aioredis
from redis._parsers import BaseParser
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterError,
    DataError,
    InvalidResponse,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
    WatchError,
)
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    TimeoutError as RedisTimeoutError,
)

from service import keys
from service.errors import StartupError, StoreFull, StoreTimedOut, StoreUnavailable
from service.folding import fields_of, split_records
from service.replicas import ReplicaAcks

logger = logging.getLogger("linreboot.store")

P = ParamSpec("P")
T = TypeVar("T")

# OSError covers TimeoutError, which asyncio.timeout raises at a deadline.
# ClusterError: a cluster that is down (CLUSTERDOWN, MASTERDOWN) or a request
# that ran out of redirections ("TTL exhausted") while slots moved.
_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError, OSError,
                ClusterError, SlotNotCoveredError)
_TIMEOUTS = (TimeoutError, RedisTimeoutError)  # the deadline passed (StoreTimedOut)
_UNAVAILABLE_MESSAGE = "the state store is unavailable; retry shortly"
_FULL_MESSAGE = "the state store is out of memory and refuses changes; retry later"


# Replies that say Redis cannot take the command *now*: a replica or a failover
# (READONLY, MASTERDOWN, NOREPLICAS), another client's long script (BUSY), a
# failed AOF or RDB write (MISCONF), a cluster in motion (TRYAGAIN,
# CLUSTERDOWN). Inside a script Redis wraps them in a script error, so they
# are looked for as words anywhere in the message.
_TRANSIENT = re.compile(
    r"\b(READONLY|BUSY|MISCONF|MASTERDOWN|NOREPLICAS|TRYAGAIN|CLUSTERDOWN)\b"
    r"|read only replica"
)


def _transient(exc: ResponseError) -> bool:
    # AskError (MovedError too) and TryAgainError: a slot on its way to another
    # node, when the cluster client could not follow it within its attempts.
    return (isinstance(exc, ReadOnlyError | AskError | TryAgainError)
            or bool(_TRANSIENT.search(str(exc))))


_REDIS_PACKAGE = os.path.dirname(redis.__file__)


def _connection_race(exc: AttributeError) -> bool:
    """redis-py's own fault, not ours: its asyncio cluster client can use a connection
    that another task is closing (``'NoneType' object has no attribute 'writelines'``,
    seen during a slot migration). Like a dropped connection, the command may or may
    not have run; the caller retries, and ids make the retry safe."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_REDIS_PACKAGE)


# uvloop's (and asyncio's) refusal to write on a transport that redis-py closed
# under the command, as it does to a failed-over master's connections:
# "unable to perform operation on <TCPTransport closed=True ...>; the handler
# is closed". A dropped connection: the command may or may not have run.
_CLOSED_TRANSPORT = re.compile(r"unable to perform operation on .*(closed|is closing)")


def _closed_transport(exc: RuntimeError) -> bool:
    return bool(_CLOSED_TRANSPORT.search(str(exc)))


def _out_of_memory(exc: ResponseError) -> bool:
    """Redis refused a write for lack of memory (maxmemory reached, noeviction).

    A command gets an ``-OOM`` reply (OutOfMemoryError); Redis 6.2 wraps the
    refusal of a write inside a script in a plain script error.
    """
    return isinstance(exc, OutOfMemoryError) or "OOM command not allowed" in str(exc)


class DroppedNodeNotices:
    """One warning a minute, instead of hundreds of errors, for redis-py's dropped nodes.

    When a cluster's topology changes (a failover, a slot migration) redis-py's
    cluster client replaces its ``ClusterNode`` objects without closing the old
    ones, and each, when collected, reports "Unclosed ClusterNode object" to the
    event loop's exception handler, which asyncio logs at error level: hundreds
    of lines in one failover, none of them an error of the service's. Installed
    on the running loop, this handler turns them into one warning line a minute
    (counting those it silenced) and passes every other report on unchanged.
    """

    MESSAGE = "Unclosed ClusterNode object"
    WINDOW_SECONDS = 60.0

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._previous = loop.get_exception_handler()
        self._quiet_until = -math.inf
        self._silenced = 0

    def install(self) -> None:
        self._loop.set_exception_handler(self._handle)

    def uninstall(self) -> None:
        if self._loop.get_exception_handler() == self._handle:
            self._loop.set_exception_handler(self._previous)

    def _handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now < self._quiet_until:
            self._silenced += 1
            return
        earlier = f" ({self._silenced} more in the minute before)" if self._silenced else ""
        logger.warning("the Redis Cluster's topology changed (a failover or a slot migration): "
                       "the client let go of connections to nodes it replaced%s; such notices "
                       "are silenced for a minute", earlier)
        self._quiet_until, self._silenced = now + self.WINDOW_SECONDS, 0


# A client of one Redis, or of a Redis Cluster (which routes each command by its keys).
Client = aioredis.Redis | RedisCluster

StoreMethod = Callable[Concatenate["Store", P], Awaitable[T]]


def _call(fn: StoreMethod[P, T], *, bounded: bool) -> StoreMethod[P, T]:
    @functools.wraps(fn)
    async def wrapper(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            if not bounded:  # no deadline: not even asyncio.timeout(None), 3 µs a call
                return await fn(self, *args, **kwargs)
            async with asyncio.timeout(self.deadline_seconds):
                return await fn(self, *args, **kwargs)
        except _UNAVAILABLE as exc:
            unavailable = StoreTimedOut if isinstance(exc, _TIMEOUTS) else StoreUnavailable
            raise unavailable(_UNAVAILABLE_MESSAGE) from exc
        except AttributeError as exc:
            if _connection_race(exc):
                raise StoreUnavailable(_UNAVAILABLE_MESSAGE) from exc
            raise
        except RuntimeError as exc:
            if _closed_transport(exc):
                raise StoreUnavailable(_UNAVAILABLE_MESSAGE) from exc
            raise
        except ResponseError as exc:
            if _out_of_memory(exc):
                self.refused_at = time.monotonic()
                raise StoreFull(_FULL_MESSAGE) from exc
            if _transient(exc):
                raise StoreUnavailable(_UNAVAILABLE_MESSAGE) from exc
            raise

    return wrapper


def _translated(fn: StoreMethod[P, T]) -> StoreMethod[P, T]:
    """One deadline for the call, and Redis failures as :class:`StoreUnavailable`."""
    return _call(fn, bounded=True)


def _translated_unbounded(fn: StoreMethod[P, T]) -> StoreMethod[P, T]:
    """As :func:`_translated`, without the deadline (start-up work that may take long)."""
    return _call(fn, bounded=False)


def _translated_batched(fn: StoreMethod[P, T]) -> StoreMethod[P, T]:
    """As :func:`_translated`, for a call through the :class:`_ScriptBatcher`, which keeps
    each call's deadline (from when the call is queued, waiting for its turn included): a
    second timeout per call would bound nothing more, at a few per cent of a request."""
    return _call(fn, bounded=False)


def _script(name: str, uses: Sequence[str] = ()) -> str:
    """A script's text, after the shared chunks it ``uses`` (Redis has no ``require``);
    ``name`` "": the chunks alone."""
    lua = resources.files("service").joinpath("lua")
    return "".join(lua.joinpath(f"{part}.lua").read_text() for part in (*uses, name) if part)


@dataclass(frozen=True)
class _Library:
    """The scripts every request runs, as one Redis 7 function library (FUNCTION LOAD).

    A script's chunk runs whole on every EVALSHA, defining its helpers again
    (``outcomes.lua``'s cost a reward about 3 µs of Redis's time on 6.2, 2
    on 7); a library runs once, at load, so its shared chunks are defined
    once and each script's text becomes a function's body (``KEYS`` and
    ``ARGV`` its parameters). The name carries a digest of the text, so that
    workers of two versions sharing a Redis (a rolling upgrade) each call
    their own; a library of a version no longer running stays (tens of
    kilobytes) until ``FUNCTION DELETE``.
    """

    code: str
    functions: Mapping[str, str]  # a script's SHA-1 (as EVALSHA names it) -> its function

    @classmethod
    def of(cls, scripts: Mapping[str, tuple[str, Sequence[str]]]) -> _Library:
        """From ``name -> (its script's SHA-1, the chunks it uses)``."""
        chunks = list(dict.fromkeys(chunk for _, uses in scripts.values() for chunk in uses))
        shared = _script("", uses=chunks) if chunks else ""
        bodies = {name: _script(name) for name in scripts}
        digest = hashlib.sha1((shared + "".join(bodies.values())).encode()).hexdigest()[:16]
        parts = [f"#!lua name=linreboot_{digest}\n", shared]
        functions = {}
        for name, (sha, _) in scripts.items():
            function = f"linreboot_{name}_{digest}"
            # A function that writes nothing says so: Redis 7 then runs it out of memory
            # too (as EVALSHA runs such a script), where it refuses the others unrun.
            flags = ", flags={'no-writes'}" if name in _READ_ONLY else ""
            parts.append(f"redis.register_function{{function_name='{function}', "
                         f"callback=function(KEYS, ARGV)\n{bodies[name]}\nend{flags}}}\n")
            functions[sha] = function
        return cls("".join(parts), functions)


# The scripts of every request, and the shared chunks each is put after.
_BATCHED: dict[str, tuple[str, ...]] = {
    "decide": ("damaged", "tail", "recent"), "reward": ("damaged", "outcomes", "tail", "recent"),
    "settle": ("damaged", "outcomes", "recent"), "progress": ("tail",)}
_READ_ONLY = frozenset({"progress"})
_ONCE = ("once",)  # the changes of an experiment, answered the same when sent again


def script_names() -> dict[str, str]:
    """The SHA-1 EVALSHA calls each script of every request by -> its name (what a
    profile of Redis's commands shows)."""
    return {hashlib.sha1(_script(name, uses).encode()).hexdigest(): name
            for name, uses in _BATCHED.items()}


def library() -> _Library:
    """The scripts of every request (:data:`_BATCHED`) as a function library."""
    return _Library.of({name: (sha, _BATCHED[name]) for sha, name in script_names().items()})


def _function_refused(reply: object) -> bool:
    """An FCALL refused unrun: the function is not loaded (a restart without persistence,
    FUNCTION FLUSH), the server has no functions (a Redis before 7 in its place), or
    FCALL is not allowed (an ACL; a renamed command)."""
    if not isinstance(reply, ResponseError):
        return False
    text = str(reply)
    return ("Function not found" in text or "unknown command" in text
            or (isinstance(reply, NoPermissionError) and "'fcall'" in text.lower()))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _snapshot(
    meta: Mapping[str, str], raw_stats: Mapping[bytes, bytes], outcomes: bytes
) -> Snapshot:
    stats = {_text(k): v for k, v in raw_stats.items()}
    applied = int(stats.get(keys.REWARDS, 0)) + int(stats.get(keys.DEFAULTED, 0))
    return Snapshot(int(meta["version"]), applied, stats,
                    unfolded=tuple(split_records(outcomes)[0]),
                    incarnation=meta.get("incarnation"))


_LOG_FIRST_READ = 16  # entries of a log page's first read; the next are sized by them
_LOG_MOST_READ = 1000  # entries of one read of the latest entries, at most


def log_entry_json_bytes(fields: Mapping[str, bytes]) -> int:
    """About how many bytes an entry takes as JSON: packed float64 fields (contexts)
    3 times theirs (a float is written in up to 24 characters), text as it is, and a
    constant for names and punctuation; a ranking's, shown as an entry per slot, each
    with the fields the slots share. (The eligible arms are stored as index ranges
    and written as ids: the caller, who knows the ids, adds them.)"""
    slots = fields["arms"].count(b",") + 1 if "arms" in fields else 1
    total = 200 * slots
    for name, value in fields.items():
        if name in ("x", "arms", "propensities"):  # each slot shows its own share
            total += len(value) * (3 if name == "x" else 1) + slots * len(name)
        else:
            total += slots * (len(value) * (3 if name == "contexts" else 1) + len(name))
    return total


_UPGRADE_ATTEMPTS = 50
_DELETE_CHUNK = 1000  # decisions deleted per round trip


# How long a refused write keeps readiness at 503 while Redis is near its limit,
# and what near is: within 5 % of maxmemory, or 1 MiB (what a few hundred
# connections' buffers come and go by).
REFUSALS_REMEMBERED_SECONDS = 5.0
_NEAR_LIMIT_FRACTION = 0.05
_NEAR_LIMIT_BYTES = 2**20


def _refuses_writes(memory: Mapping[str, Any], refused_recently: bool) -> bool:
    """From INFO memory: whether Redis refuses writes for lack of memory.

    Redis compares the memory it uses, less its AOF and replication buffers,
    with maxmemory; under ``noeviction`` (the policy the service needs) it
    refuses every write while that is over. The figure counts the buffers of
    the command being run, so near the limit Redis refuses a decision or a
    reward (a kilobyte or more of arguments) while INFO, a few bytes, still
    reads under it: a write refused lately decides there. With no limit, or
    a limit raised well above the use, Redis is ready at once.
    """
    limit = int(memory.get("maxmemory", 0))
    if limit <= 0 or memory.get("maxmemory_policy") != "noeviction":
        return False
    used = int(memory.get("used_memory", 0)) - int(memory.get("mem_not_counted_for_evict", 0))
    near = max(_NEAR_LIMIT_FRACTION * limit, _NEAR_LIMIT_BYTES)
    return used > limit or (refused_recently and used > limit - near)


def _needs_upgrade(stored: Sequence[Any], meta_fields: Mapping[str, str]) -> bool:
    """From HMGET of incarnation and ``meta_fields``: exists, and differs from them."""
    incarnation, *values = stored
    return incarnation is not None and [
        None if v is None else _text(v) for v in values
    ] != list(meta_fields.values())


async def _cluster_enabled(client: aioredis.Redis) -> bool:
    """Whether the server is a node of a Redis Cluster (False if it refuses INFO)."""
    try:
        info = await client.info("cluster")
    except ResponseError:
        return False
    return bool(int(info.get("cluster_enabled", 0)))


class _HiredisPacking:
    """Packs commands in C (hiredis), as redis-py's sync client does.

    The asyncio client packs in Python, argument by argument; for a decision's
    two dozen arguments that was a visible share of ``/choose``.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = tuple(args[0].encode().split()) + args[1:]
        elif b" " in args[0]:
            args = tuple(args[0].split()) + args[1:]
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:
            raise DataError(str(exc)) from exc


_PACKING_IN_C: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _packing_in_c(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (TCP, TLS or a unix socket: the URL decides) packing in C."""
    if connection_class not in _PACKING_IN_C:
        _PACKING_IN_C[connection_class] = type(
            f"HiredisPacked{connection_class.__name__}", (_HiredisPacking, connection_class), {})
    return _PACKING_IN_C[connection_class]


class HeldConnection:
    """One connection of a pool's kind, held by its owner for pipelines, one at a time.

    What a non-transactional pipeline of redis-py does (pack the commands,
    send them, read each reply in order, error replies as exceptions in the
    list; retried whole by the connection's retry policy after a connection
    error), without the pool's checkout and release. redis-py drops the
    connection when a send or a read fails or is cancelled (a deadline), so a
    pipeline cut short leaves no reply behind for the next one: that one
    connects again.
    """

    def __init__(self, pool: aioredis.ConnectionPool, bounded: bool = False) -> None:
        self._pool = pool
        # ``bounded``: every pipeline runs under its caller's deadline, so its reads and
        # writes need no socket timeout of their own (an asyncio.timeout each, ~7 µs).
        self._bounded = bounded
        self._connection: Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def turn(self) -> asyncio.Lock:
        """Held while a caller prepares and runs its pipeline."""
        return self._lock

    async def pipeline(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self._closed:  # a batch still queued at shutdown connects no more
            raise RedisConnectionError("the store is closed")
        if self._connection is None:
            self._connection = self._pool.make_connection()
            if self._bounded:
                self._connection.socket_timeout = None
        connection = self._connection
        packed = connection.pack_commands(commands)

        async def round_trip() -> list[Any]:
            await connection.send_packed_command(packed)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await connection.read_response())
                except ResponseError as error:  # read whole: the stream stays in step
                    replies.append(error)
            return replies

        async def dropped(error: Exception) -> None:
            await connection.disconnect()
            if self._closed:  # closed meanwhile: no retry
                raise error

        return await connection.retry.call_with_retry(round_trip, dropped)

    async def close(self) -> None:
        self._closed = True
        if self._connection is not None:
            await self._connection.disconnect()


@dataclass(frozen=True)
class Joining(Generic[T]):
    """How a batch's calls of one script with equal ``key`` go to Redis as one call (a
    script that takes a batch: :meth:`Store.apply_rewards`): ``join`` makes the call's
    argv from theirs, ``part`` each call's result from its reply; ``size``, this call's
    items, bounds what one call holds (:data:`_JOINED_MOST`; a call of more goes alone).
    An error reply that ``apart`` accepts is one a call may have caused alone, before
    the script wrote anything: the calls then go again, each alone, with the next batch
    (each under its deadline from when it was first queued); any other error is each
    call's, as it would be of one call with all their items."""

    key: tuple[str, ...]
    size: int
    join: Callable[[Sequence[list[Any]]], list[Any]]
    part: Callable[[Any, Sequence[list[Any]]], Sequence[T]]
    apart: Callable[[Exception], bool]


# What one joined call holds at most: a script's run blocks Redis (about 20 µs an item).
_JOINED_MOST = 128


@dataclass(frozen=True)
class _Call:
    script: AsyncScript
    argv: list[Any]
    future: asyncio.Future[Any]  # the reply (or, joined, the part's result)
    joining: Joining[Any] | None = None
    tag: str | None = None
    alone: bool = False  # sent alone though it has a joining (its joined call was refused)
    first: bool = False  # sent ahead of those not sent first
    expires: float = math.inf  # the loop's time at its deadline


def _joined(calls: Sequence[_Call]) -> list[list[_Call]]:
    """The calls as they go to Redis, in order: alone, or with those of the same script
    and joining key (at the place of the first of them), up to :data:`_JOINED_MOST`
    items a call."""
    groups: list[list[_Call]] = []
    joinable: dict[tuple[str, ...], list[_Call]] = {}  # the group a call with this key joins
    sizes: dict[tuple[str, ...], int] = {}
    for call in calls:
        if call.joining is None or call.alone:
            groups.append([call])
            continue
        key, size = (call.script.sha, *call.joining.key), call.joining.size
        group = joinable.get(key)
        if group is not None and sizes[key] + size <= _JOINED_MOST:
            group.append(call)
            sizes[key] += size
        else:
            joinable[key], sizes[key] = [call], size
            groups.append(joinable[key])
    return groups


@dataclass
class _Queue:
    """The calls of the next batch, those sent first at its head."""

    calls: list[_Call] = field(default_factory=list)
    leading: int = 0  # how many at the head are sent first
    # Its calls by deadline (a heap), and the timer that refuses each at its deadline,
    # waiting for its turn or in flight (a reply that comes later is dropped).
    expiring: list[tuple[float, int, _Call]] = field(default_factory=list)
    watch: asyncio.TimerHandle | None = None

    def add(self, call: _Call) -> None:
        if call.first:
            self.calls.insert(self.leading, call)
            self.leading += 1
        else:
            self.calls.append(call)
        if call.expires != math.inf:
            heapq.heappush(self.expiring, (call.expires, next(_ORDER), call))
            if self.watch is None or call.expires < self.watch.when():
                self.unwatch()  # (a call queued again alone: an earlier deadline)
                self.watch = asyncio.get_running_loop().call_at(call.expires,
                                                                self.refuse_expired)

    def refuse_expired(self) -> None:
        # (a timer may fire a little early, uvloop's rounded to the millisecond: nothing
        # is due then, and it is set again)
        loop = asyncio.get_running_loop()
        now, expiring = loop.time(), self.expiring
        while expiring and (expiring[0][0] <= now or expiring[0][2].future.done()):
            future = heapq.heappop(expiring)[2].future
            if not future.done():
                future.set_exception(_expired())
        self.watch = (loop.call_at(expiring[0][0], self.refuse_expired) if expiring
                      else None)

    def unwatch(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None


_ORDER = itertools.count()  # (ties between deadlines: the heap never compares calls)


def _expired() -> TimeoutError:
    return TimeoutError("the store's deadline passed")


def _distribute(batch: Sequence[_Call], results: Sequence[Any]) -> None:
    """Each caller its result (an error reply as its exception)."""
    for call, result in zip(batch, results, strict=True):
        if call.future.done():  # the caller went away (cancelled)
            continue
        if isinstance(result, Exception):
            call.future.set_exception(result)
        else:
            call.future.set_result(result)


def _argv_of(group: list[_Call]) -> list[Any]:
    """The argv of the call that sends ``group``."""
    joining = group[0].joining
    if joining is None or len(group) == 1:
        return group[0].argv
    return joining.join([call.argv for call in group])


def _results(group: list[_Call], reply: Any) -> Sequence[Any]:
    """Each call's result of the one reply to ``group`` (joined, or a call alone): a reply
    its part cannot read is each call's error, not the batch's."""
    joining = group[0].joining
    if joining is None:
        return [reply]
    if isinstance(reply, Exception):
        return [reply] * len(group)
    try:
        results = joining.part(reply, [call.argv for call in group])
    except Exception as exc:  # (a damaged reply: an outcomes string cut short, say)
        return [exc] * len(group)
    if len(results) != len(group):
        return [ValueError(f"a joined reply parted in {len(results)}, not {len(group)}")
                ] * len(group)
    return results


def _apart(group: list[_Call], reply: Any) -> bool:
    """``group``, joined, was refused for what one of its calls may have caused alone."""
    joining = group[0].joining
    return (len(group) > 1 and joining is not None and isinstance(reply, Exception)
            and joining.apart(reply))


@dataclass
class _Lane:
    """The calls bound for one server, sent one batch at a time: the next batch's calls,
    and the batch in flight (the tags of its calls, and an Event set once it has given
    each of its callers its reply)."""

    turn: asyncio.Lock  # held while a batch is taken and sent
    queue: _Queue = field(default_factory=_Queue)
    sending: tuple[frozenset[str], asyncio.Event] | None = None


# Lanes of a cluster's masters kept before those with nothing queued or in flight go.
_LANES_KEPT = 64


def _unexpired(calls: Sequence[_Call], now: float) -> list[_Call]:
    """The calls whose deadline has not passed; the others' callers refused (a call
    whose caller went away, cancelled, is still sent, as it would be alone, until its
    deadline)."""
    live = []
    for call in calls:
        if call.expires > now:
            live.append(call)
        elif not call.future.done():
            call.future.set_exception(_expired())
    return live


def _last_expiry(calls: Sequence[_Call]) -> float | None:
    """The loop's time at the last of the calls' deadlines (None: none has one)."""
    last = max((call.expires for call in calls), default=math.inf)
    return None if last == math.inf else last


class _ScriptBatcher:
    """Sends the scripts called during one event-loop turn as one pipeline.

    Auto-pipelining, as ioredis and Lettuce offer it: under load many
    ``/choose`` and ``/reward`` calls reach the store in the same turn, and one
    pipeline pays the client's per-command cost (pool checkout, socket checks,
    retry and timeout wrappers) once for all of them. A batch that loses its
    connection is resent whole, as a single command would be. Each call has the
    store's deadline from when it is queued, the wait for its turn included: its
    caller is refused then, whether the call still waits or is in flight (its reply,
    if one comes, is dropped). A batch is abandoned at its last call's deadline (its
    connection dropped, so a stalled Redis holds none longer). A call is sent again
    only when it did not run (a script cache lost, a joined call refused whole) or its
    connection was lost, and only within its batch's time (until the batch's last
    deadline, which may be after its own).
    Resending cannot count anything twice: a recorded decision or an applied
    reward is marked, so its repeat answers "recorded" or "duplicate" (a
    reward whose first reply was lost is then reported as a duplicate, and
    counted once); a repeated stale decide only skips a decision number.

    One batch at a time to a server (a *lane*): the calls that arrive meanwhile make
    the next, so that under load a batch carries many calls of an experiment, sent as
    one script call (:class:`Joining`). On a cluster each master has its lane (by the
    slot of a call's first key, as the client last mapped it: a lane only paces its
    calls, the client routes them), so a stalled master holds back only its own.
    """

    def __init__(self, client: Client, deadline_seconds: float | None = None,
                 library: _Library | None = None, reads: frozenset[str] = frozenset()
                 ) -> None:
        self._client = client
        # A write is answered once a replica of its master holds it (when the master has
        # one online: service.replicas): ``reads``, the scripts that write nothing.
        self._reads = reads
        self._acks = ReplicaAcks(client, _replica_wait_ms(deadline_seconds))
        # Its scripts are called as functions (FCALL) where the server has them
        # (Redis 7): None until the first batch tries to load them. Not on a
        # cluster: redis-py finds FCALL's slot by asking a node for its keys
        # (COMMAND GETKEYS) on every call, a round trip more than a function saves;
        # EVALSHA's it reads from the arguments.
        self._library = library
        self._functions: bool | None = (
            None if library is not None and not isinstance(client, RedisCluster) else False)
        # A batch that outlives its callers' deadlines is abandoned: its
        # connection is dropped rather than held through Redis's stall.
        self._deadline = deadline_seconds
        self._flushes: set[asyncio.Task[None]] = set()  # held until done (no early GC)
        # On a single Redis the batches go over one connection of the pool's
        # kind, held by the batcher: a pooled pipeline's checkout, release and
        # bookkeeping cost a worker about as much CPU as the round trip itself.
        # One batch at a time: the calls that arrive meanwhile make the next.
        self._held: HeldConnection | None = (
            None if isinstance(client, RedisCluster)
            else HeldConnection(client.connection_pool, bounded=deadline_seconds is not None))
        # A single Redis's one lane (its turn the held connection's); a cluster's, by master.
        self._single = _Lane(self._held.turn()) if self._held is not None else None
        self._lanes: dict[str, _Lane] = {}

    async def run(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any],
                  first: bool = False, tag: str | None = None) -> Any:
        """The script's reply, sent with the others of this turn (``first``: ahead of
        those not sent first, in the order called; ``tag``: what
        :meth:`after_batch_in_flight` asks about)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._enqueue(_Call(script, [len(keys), *keys, *args], future, tag=tag, first=first,
                            expires=self._expiry(loop)))
        return await future

    async def run_joined(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any],
                         joining: Joining[T], first: bool = False, tag: str | None = None
                         ) -> T:
        """As :meth:`run`, sent as one call with the batch's others that ``joining``
        joins: this call's part of the reply."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._enqueue(_Call(script, [len(keys), *keys, *args], future, joining, tag,
                            first=first, expires=self._expiry(loop)))
        return await future

    def _expiry(self, loop: asyncio.AbstractEventLoop) -> float:
        return math.inf if self._deadline is None else loop.time() + self._deadline

    def _enqueue(self, call: _Call) -> None:
        lane = self._lane_of(call)
        queue = lane.queue
        queue.add(call)
        if len(queue.calls) == 1:  # the first of this turn: flush once the turn is over
            flush = asyncio.get_running_loop().create_task(self._flush(lane))
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)

    def _lane_of(self, call: _Call) -> _Lane:
        # (a script's first key names its slot: every script has keys)
        if self._single is not None:
            return self._single
        name = self._lane_name(call.argv[1])
        lane = self._lanes.get(name)
        if lane is None:
            if len(self._lanes) >= _LANES_KEPT:  # masters gone (failovers): their lanes go
                self._lanes = {n: kept for n, kept in self._lanes.items()
                               if kept.queue.calls or kept.sending is not None}
            lane = self._lanes[name] = _Lane(asyncio.Lock())
        return lane

    def _lane_name(self, key: str) -> str:
        """The name of the lane of a cluster's calls whose first key is ``key``."""
        assert isinstance(self._client, RedisCluster)
        try:
            node = self._client.get_node_from_key(key)
        except SlotNotCoveredError:  # (no slot map yet, or a hole in it: one lane)
            node = None
        return node.name if node is not None else ""

    @property
    def batch_in_flight(self) -> bool:
        """A batch is sent and not yet answered (to any server)."""
        lanes = [self._single] if self._single is not None else self._lanes.values()
        return any(lane.sending is not None for lane in lanes)

    async def after_batch_in_flight(self, tag: str, key: str, at_most: float) -> bool:
        """When the batch in flight on the lane of ``key`` carries a call tagged ``tag``:
        return once it has given its callers their replies and they have run on (True),
        or after ``at_most`` seconds (a stalled Redis: the batch's deadline bounds a
        call's wait, not twice that); else at once, False. A call made then goes with
        the lane's next batch, as it would have anyway, knowing what that batch's
        replies said."""
        lane = self._single or self._lanes.get(self._lane_name(key))
        sending = lane.sending if lane is not None else None
        if sending is None or tag not in sending[0]:
            return False
        # (an Event: each waiter is woken directly, before the next batch is taken)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await sending[1].wait()
        # One step of the loop: the batch's other callers, woken with the replies (a
        # caller of this batch that decides at once, before them, is here already),
        # run on and add their outcomes first.
        await asyncio.sleep(0)
        return True

    async def _flush(self, lane: _Lane) -> None:
        queue = lane.queue  # this flush's: the calls queued until it takes them
        pending = queue.calls  # those it still owes a reply
        sent: asyncio.Event | None = None
        try:
            # (the wait for the turn is bounded by the batch in flight's deadline; each
            # caller's, by its own: _Queue.refuse_expired)
            async with lane.turn:
                if lane.queue is queue:  # the calls queued from now on make the next batch
                    lane.queue = _Queue()
                now = asyncio.get_running_loop().time()
                batch = pending = _unexpired(queue.calls, now)
                sent = asyncio.Event()
                lane.sending = (frozenset(call.tag for call in batch if call.tag), sent)
                # Abandoned at its last call's deadline, when no caller waits for it any
                # more: its connection dropped, so a stalled Redis holds none longer.
                async with asyncio.timeout_at(_last_expiry(batch)):
                    await self._send(batch)
                    pending = []  # each call answered, or queued again alone (_send)
                    # The replies before the turn passes on: the callers, and those
                    # waiting for this batch (after_batch_in_flight), run (one step of the
                    # loop) before the next batch is taken, so that what they call goes
                    # with it.
                    sent.set()
                    await asyncio.sleep(0)
        except BaseException as exc:
            if lane.queue is queue:  # failed waiting for the turn: so do the calls queued
                lane.queue = _Queue()
            for call in pending:
                if not call.future.done():
                    call.future.set_exception(exc)
        finally:
            queue.unwatch()
            if sent is not None:
                sent.set()
                if lane.sending is not None and lane.sending[1] is sent:
                    lane.sending = None

    async def _send(self, batch: list[_Call]) -> None:
        """The batch's calls to Redis, and each caller its reply."""
        groups = _joined(batch)
        calls = [(group[0].script, _argv_of(group)) for group in groups]
        replies = await self._execute(calls) if calls else []
        for group, reply in zip(groups, replies, strict=True):
            if _apart(group, reply):  # each call alone, with the next batch
                for call in group:
                    self._enqueue(replace(call, alone=True))
            else:
                _distribute(group, _results(group, reply))

    async def close(self) -> None:
        if self._held is not None:
            await self._held.close()

    async def _execute(self, calls: list[tuple[AsyncScript, list[Any]]]) -> list[Any]:
        if self._functions is None:
            self._functions = await self._load_library()
        replies = await self._pipeline(calls)
        # A call refused before it ran anything is sent again once the server
        # has what it lacked: its functions (lost in a restart without
        # persistence or to FUNCTION FLUSH; or the server is now a Redis
        # without them, and the scripts serve), or its scripts (EVALSHA of a
        # script cache lost the same ways).
        missing = [i for i, r in enumerate(replies) if _function_refused(r)]
        if missing:
            if self._functions:
                self._functions = await self._load_library()
            await self._resend(calls, replies, missing)
            # Still refused with the library loaded: FCALL itself is (renamed, or
            # denied by an ACL that allows FUNCTION LOAD): the scripts serve.
            missing = [i for i, r in enumerate(replies) if _function_refused(r)]
            if missing:
                self._functions = False
                await self._resend(calls, replies, missing)
        # Out of memory, Redis 7 refuses a function that may write before it runs: it
        # has no EVAL's compatible mode, where a script runs and only a write is
        # refused. Sent again by EVALSHA, the call answers what needs no write (a
        # retried decision's answer), as on 6.2, and its writes are refused there.
        scripted = [i for i, r in enumerate(replies) if self._functions
                    and isinstance(r, ResponseError) and _out_of_memory(r)]
        await self._resend(calls, replies, scripted, by_script=True)
        unknown = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if unknown:
            for script in {calls[i][0] for i in unknown}:
                await self._client.script_load(script.script)
            await self._resend(calls, replies, [i for i in unknown if i not in scripted])
            await self._resend(calls, replies, [i for i in unknown if i in scripted],
                               by_script=True)
        return replies

    async def _resend(self, calls: list[tuple[AsyncScript, list[Any]]], replies: list[Any],
                      indexes: list[int], by_script: bool = False) -> None:
        """The calls at ``indexes`` sent again (``by_script``: by EVALSHA, whatever the
        server has), their replies in place of the first ones."""
        if not indexes:
            return
        again = await self._pipeline([calls[i] for i in indexes], by_script)
        for i, reply in zip(indexes, again, strict=True):
            replies[i] = reply

    async def _load_library(self) -> bool | None:
        """Load the library on the server: whether its functions serve; None when it
        cannot tell now (out of memory), to try again."""
        assert self._library is not None and self._held is not None
        command = ("FUNCTION", "LOAD", "REPLACE", self._library.code)
        try:
            reply = (await self._held.pipeline([command]))[0]
            if isinstance(reply, ResponseError):
                raise reply
        except ResponseError as exc:
            if _out_of_memory(exc) or _transient(exc):
                return None
            # A Redis before 7 ("unknown command"), or one that forbids FUNCTION
            # (an ACL, a managed service): the scripts serve as they are.
            logger.info("Redis functions not used (%s): scripts run by EVALSHA", exc)
            return False
        return True

    async def _pipeline(self, calls: list[tuple[AsyncScript, list[Any]]],
                        by_script: bool = False) -> list[Any]:
        functions = (self._library.functions
                     if self._functions and self._library and not by_script else {})
        commands = [("FCALL", functions[s.sha], *argv) if s.sha in functions
                    else ("EVALSHA", s.sha, *argv) for s, argv in calls]
        acks = self._acks
        if self._held is not None and acks.unasked:  # (once: whether it has replicas)
            acks.learn_server((await self._held.pipeline([("ROLE",)]))[0])
        plan = acks.plan((i, argv[1]) for i, (script, argv) in enumerate(calls)
                         if script.sha not in self._reads)
        extras = plan.commands(acks.timeout_ms)
        if self._held is not None:
            if not extras:  # (a Redis without a replica, as every batch but one a second)
                return await self._held.pipeline(commands)
            replies = await self._held.pipeline([*commands, *(extra for extra, _ in extras)])
        else:
            replies = await self._cluster_pipeline(commands, extras)
        replies, extra_replies = replies[:len(commands)], replies[len(commands):]
        for index, error in acks.unacknowledged(plan, replies, extra_replies).items():
            replies[index] = error
        return replies

    async def _cluster_pipeline(self, commands: list[tuple[Any, ...]],
                                extras: list[tuple[tuple[Any, ...], ClusterNode | None]]
                                ) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            for extra, node in extras:
                pipe.execute_command(*extra, target_nodes=node)
            try:
                return list(await pipe.execute(raise_on_error=False))
            except RedisClusterException as exc:
                if type(exc) is not RedisClusterException or not extras:
                    raise
                # redis-py retried the pipeline after a dropped connection (its targets
                # dropped with the first attempt): whatever that attempt wrote, no WAIT
                # on its connection can vouch for it now.
                raise RedisConnectionError("a connection dropped under a pipeline") from exc


def _replica_wait_ms(deadline_seconds: float | None) -> int:
    """How long a batch waits for a replica's acknowledgement: half the store's deadline,
    so that a replica that does not answer gets its callers a 503 of its own."""
    return max(1, round(1000 * (deadline_seconds or 2.0) / 2))


@dataclass(frozen=True)
class Snapshot:
    """An experiment's statistics as one script saw them."""

    version: int  # the meta version (changes when arms are added or retired)
    # Outcomes applied, rewards and default rewards (counters rewards + defaulted):
    # changes whenever the statistics do.
    rewards: int
    stats: dict[str, bytes]  # the stats hash: packed sums and counters
    # Outcomes applied but not yet in the sums (keys.outcomes), oldest first:
    # the statistics are the sums with these added (service.folding).
    unfolded: tuple[bytes, ...] = ()
    # The experiment's incarnation whose statistics these are (None: a new experiment's,
    # made here): a definition read apart must be of the same.
    incarnation: str | None = None


@dataclass(frozen=True)
class Progress:
    """An experiment's counters and the outcomes not yet in its sums (``progress.lua``)."""

    incarnation: str
    version: int
    rewards: int  # outcomes applied, rewards and default rewards (as Snapshot.rewards)
    decision_seq: int
    folded: int  # outcomes in the sums
    unfolded: tuple[bytes, ...]  # the records after them, oldest first, but the first `skipped`
    skipped: int = 0  # records after `folded` left out: the caller held them
    read_at: float = field(default_factory=time.monotonic)  # when (this process's clock)


@dataclass(frozen=True)
class Appended:
    """The outcomes one call recorded, and where: a view that holds ``first`` outcomes of
    this incarnation and version is at ``outcomes`` with ``records`` added (the call's
    own, or, when others came between what its caller held and them, all since)."""

    incarnation: str
    version: int
    outcomes: int  # the outcomes counter (rewards + defaulted) after them
    decision_seq: int  # the decision numbers taken by then
    records: tuple[bytes, ...]  # their payloads, in order (service.folding)
    first: int  # the outcomes before the first of them


@dataclass(frozen=True)
class RewardReply:
    """What one ``reward.lua`` call did."""

    # one per reward, or ["missing"] / ["forbidden"] / ["shards", S] for the whole call
    statuses: list[str]
    counter: int = 0  # the rewards counter after them (0 when none was applied)
    appended: Appended | None = None  # the outcomes it recorded (None when none was applied)

    @classmethod
    def of(cls, reply: list[Any], rewards: int) -> RewardReply:
        """From reward.lua's reply to a call of ``rewards`` rewards."""
        if len(reply) == 1:  # 'missing' or 'forbidden': the script's only reply
            return cls([_text(reply[0])])
        if _text(reply[0]) == "shards":
            return cls(["shards", _text(reply[1])])
        statuses, counter, appended = reply[:rewards], reply[rewards], reply[rewards + 1:]
        own = None
        if appended:  # some were applied: their records, and where they came
            incarnation, version, outcomes, decision_seq, records, first = appended
            own = Appended(_text(incarnation), int(version), int(outcomes), int(decision_seq),
                           tuple(split_records(records)[0]), int(first))
        return cls([_text(r) for r in statuses], int(counter), own)

    def parts(self, sizes: Sequence[int]) -> list[RewardReply]:
        """The replies of the calls whose rewards (``sizes`` of them, in turn) this call
        applied together: as each would have had, made alone in turn (the statuses are:
        reward.lua reads every decision before it writes, and a decision named twice is
        a repeat of itself). The records go to the calls that applied them; those of
        others' outcomes that came before (the reply brings them when the caller held
        fewer) to the first call that applied any."""
        if len(sizes) == 1:
            return [self]
        if self.statuses[0] in _WHOLE_CALL:  # the whole call's answer: each part's
            return [self] * len(sizes)
        applied = self.statuses.count("applied")
        counter = self.counter - applied  # before them
        appended = self.appended
        records = appended.records if appended is not None else ()
        usable = (appended is not None and len(records) >= applied
                  and appended.first + len(records) == appended.outcomes)
        at, taken = 0, len(records) - applied  # the first part's: others' outcomes too
        out, start = [], 0
        for size in sizes:
            statuses = self.statuses[start:start + size]
            start += size
            mine = statuses.count("applied")
            if not mine:
                out.append(RewardReply(statuses))
                continue
            counter, taken = counter + mine, taken + mine
            part = None
            if usable and appended is not None:  # (no dataclasses.replace: 3 µs a part)
                first = appended.first + at
                part = Appended(appended.incarnation, appended.version, first + taken,
                                appended.decision_seq, records[at:at + taken], first)
            out.append(RewardReply(statuses, counter, part))
            at, taken = at + taken, 0
        return out


# reward.lua's answers for the whole call (a status per reward is none of these)
_WHOLE_CALL = frozenset(("missing", "forbidden", "shards"))


_REWARD_HEAD = 4  # reward.lua's keys before the decisions' (_RewardArgs.head)


@dataclass(frozen=True)
class _RewardArgs:
    """A reward.lua call's argv (:meth:`_ScriptBatcher.run`'s: the number of keys, the
    keys, the args) by its parts."""

    head: list[Any]  # the experiment's keys: meta, stats, log, outcomes
    decisions: list[Any]  # a decision key per reward
    key_hash: Any
    held: Any  # '' for unknown
    shards: Any
    rewards: list[Any]

    @classmethod
    def of(cls, argv: list[Any]) -> _RewardArgs:
        ends = int(argv[0]) + 1
        return cls(argv[1:_REWARD_HEAD + 1], argv[_REWARD_HEAD + 1:ends], argv[ends],
                   argv[ends + 1], argv[ends + 2], argv[ends + 3:])

    def keys(self) -> list[Any]:
        return [*self.head, *self.decisions]

    def args(self) -> list[Any]:
        return [self.key_hash, self.held, self.shards, *self.rewards]

    def argv(self) -> list[Any]:
        return [len(self.head) + len(self.decisions), *self.keys(), *self.args()]


def _joined_rewards(argvs: Sequence[list[Any]]) -> list[Any]:
    """One reward.lua argv for the calls' (one experiment's, with the same key hash and
    shard count): their decisions and rewards in turn; the first outcomes count held."""
    calls = [_RewardArgs.of(argv) for argv in argvs]
    held = next((call.held for call in calls if call.held != ""), "")
    return replace(calls[0], decisions=[d for call in calls for d in call.decisions],
                   held=held, rewards=[r for call in calls for r in call.rewards]).argv()


def _damaged(error: Exception) -> bool:
    """reward.lua refused its call for a damaged decision (outcomes.lua's ``incomplete``),
    before it wrote anything."""
    return isinstance(error, ResponseError) and str(error).startswith("DAMAGED ")


def _reward_parts(reply: Any, argvs: Sequence[list[Any]]) -> list[RewardReply]:
    """Each call's :class:`RewardReply` of the one reward.lua reply to them."""
    sizes = [int(argv[0]) - _REWARD_HEAD for argv in argvs]  # (its keys: a decision's each)
    return RewardReply.of(reply, sum(sizes)).parts(sizes)


@dataclass(frozen=True)
class SettleReply:
    """What one ``settle.lua`` call did, and what is due next."""

    defaulted: int  # decisions that got the default reward now
    missed: int  # decisions that had expired before they could
    counter: int  # the defaulted counter after them (0 when none was defaulted now)
    due: list[str]  # pending-list entries whose window has ended, for the next call


@dataclass(frozen=True)
class DecideReply:
    """What ``decide.lua`` did: recorded the decision, or found the caller's view stale."""

    status: Literal["recorded", "stale", "missing", "forbidden", "repeat", "conflict", "spent"]
    number: int = 0
    answer: str | None = None  # with "repeat": the earlier answer (decide.lua's ARGV[13])
    # with "repeat": seconds each slot's reward may still come in (one for a /choose)
    windows_left: tuple[int, ...] = ()
    # With "stale", what to decide from instead: the statistics, or what the
    # caller's statistics lack (``held`` was given and they can catch up).
    snapshot: Snapshot | None = None
    progress: Progress | None = None
    reserved: int | None = None  # with "stale": a decision number set aside for the caller


def _joined_decisions(argvs: Sequence[list[Any]]) -> list[Any]:
    """One decide.lua argv for the calls' (each of one decision of the same experiment,
    with the same key hash): the first's keys and arguments, then each further one's
    three keys (its record, request and other route's record) and arguments, then
    every part's argument count and the number of parts."""
    # A call's argv: 8, its keys (KEYS[3], [7], [8] its own), the key's hash, its
    # arguments, their count, 1.
    first, *further = argvs
    keyset = [*first[1:9], *itertools.chain(*((a[3], a[7], a[8]) for a in further))]
    return [len(keyset), *keyset, first[9], *itertools.chain(*(a[10:-2] for a in argvs)),
            *(a[-2] for a in argvs), len(argvs)]


def _decide_parts(reply: Any, argvs: Sequence[list[Any]]) -> list[Any]:
    """Each call's reply of the one decide.lua reply to them: a part whose command failed,
    its error, of the class redis-py gives that error's reply (OutOfMemoryError, ...)."""
    return [BaseParser.parse_error(_text(part[1])) if _text(part[0]) == "error" else part
            for part in reply]


def _never(error: Exception) -> bool:
    """decide.lua answers each part, and errors that are not a part's are every part's."""
    return False


def _first_call(argvs: Sequence[list[Any]]) -> list[Any]:
    """Calls that are the same call (a read): the first's argv serves them all."""
    return argvs[0]


def _progress_of_every(reply: Any, argvs: Sequence[list[Any]]) -> list[Progress | None]:
    """progress.lua's reply to calls that are the same call: each one's, read once (its
    records split once, not once a caller)."""
    return [_progress_of(reply)] * len(argvs)


def _progress_of(reply: Any) -> Progress | None:
    """A :class:`Progress` of progress.lua's reply; None if the experiment does not exist."""
    if not reply:
        return None
    incarnation, version, rewards, seq, folded, outcomes, skipped = reply
    return Progress(_text(incarnation), int(version), int(rewards), int(seq), int(folded),
                    tuple(split_records(outcomes)[0]), int(skipped))


def _decide_reply(reply: Any, incarnation: str) -> DecideReply:
    """A :class:`DecideReply` of decide.lua's reply to one part (of ``incarnation``)."""
    status = _text(reply[0])
    if status == "recorded":
        return DecideReply("recorded", number=int(reply[1]))
    if status == "repeat":
        return DecideReply("repeat", number=int(reply[1]), answer=_text(reply[2]),
                           windows_left=tuple(int(w) for w in reply[3:]))
    if status in ("conflict", "spent", "missing", "forbidden"):
        return DecideReply(status)  # type: ignore[arg-type]
    if status == "stale":
        version, rewards, reserved_number, outcomes, kind, *rest = reply[1:]
        text = _text(reserved_number)
        set_aside = int(text) if text else None
        unfolded = tuple(split_records(outcomes)[0])
        if _text(kind) == "partial":
            folded, seq, skipped = rest
            progress = Progress(incarnation, int(version), int(rewards), int(seq), int(folded),
                                unfolded, int(skipped))
            return DecideReply("stale", progress=progress, reserved=set_aside)
        seen, *fields = rest
        stats = {_text(fields[i]): fields[i + 1] for i in range(0, len(fields), 2)}
        snapshot = Snapshot(int(version), int(rewards), stats, unfolded, _text(seen))
        return DecideReply("stale", snapshot=snapshot, reserved=set_aside)
    raise RuntimeError(f"unexpected decide.lua reply {status!r}")


class Store:
    """Async access to experiments, statistics and decisions in Redis."""

    def __init__(self, client: Client, deadline_seconds: float | None = None) -> None:
        self._client = client
        self._notices: DroppedNodeNotices | None = None
        self.deadline_seconds = deadline_seconds  # per call, retries included; None: none
        self.refused_at: float | None = None  # time.monotonic() of the last write refused
        self._reward = client.register_script(_script("reward", _BATCHED["reward"]))
        self._settle = client.register_script(_script("settle", _BATCHED["settle"]))
        self._fold_read = client.register_script(_script("fold_read"))
        self._fold = client.register_script(_script("fold", uses=["tail"]))
        self._progress = client.register_script(_script("progress", _BATCHED["progress"]))
        self._create = client.register_script(_script("create"))
        self._add_arms = client.register_script(_script("add_arms", _ONCE))
        self._retire_arms = client.register_script(_script("retire_arms", _ONCE))
        self._decide = client.register_script(_script("decide", _BATCHED["decide"]))
        self._upgrade_decision = client.register_script(_script("upgrade_decision"))
        self._delete = client.register_script(_script("delete", _ONCE))
        self._read = client.register_script(_script("read"))
        self._keys = client.register_script(_script("keys", _ONCE))
        self._settings = client.register_script(_script("settings", _ONCE))
        self._sync_member = client.register_script(_script("sync_member"))
        self._release = client.register_script(_script("release"))
        self._batcher = _ScriptBatcher(client, deadline_seconds, library(),
                                       reads=frozenset({self._progress.sha}))

    @property
    def cluster(self) -> bool:
        """Whether the store speaks to a Redis Cluster."""
        return isinstance(self._client, RedisCluster)

    @classmethod
    async def connect(cls, url: str, timeout_seconds: float, cluster: bool | None) -> Store:
        """:meth:`from_url`, with ``cluster`` None asking the server whether it is
        a cluster node (``INFO cluster``; a server that refuses INFO is taken for
        a single Redis). Any node will do, a replica included: the cluster
        client learns the others from it."""
        probe = aioredis.Redis.from_url(url, socket_timeout=timeout_seconds,
                                        socket_connect_timeout=timeout_seconds)
        try:
            async with asyncio.timeout(timeout_seconds):
                if cluster is None:
                    cluster = await _cluster_enabled(probe)
                else:
                    await probe.ping()
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(_UNAVAILABLE_MESSAGE) from exc
        except InvalidResponse:  # e.g. an HTTP server's "<": another service on the port
            raise StartupError(
                "REDIS_URL: the server there does not speak Redis's protocol (another "
                "service on that port?): point REDIS_URL at a Redis server", exit_code=3,
            ) from None
        finally:
            await probe.aclose()
        store = cls.from_url(url, timeout_seconds, cluster=cluster)
        if isinstance(store._client, RedisCluster):
            try:
                async with asyncio.timeout(timeout_seconds):
                    await store._client.initialize()  # learns the slots and the nodes
            except RedisClusterException as exc:
                await store.close()
                if "not enabled" not in str(exc):
                    raise StoreUnavailable(_UNAVAILABLE_MESSAGE) from exc
                raise StartupError(
                    "LINREBOOT_REDIS_CLUSTER: the server at REDIS_URL is not a Redis Cluster "
                    "node: unset LINREBOOT_REDIS_CLUSTER, or point REDIS_URL at a cluster"
                ) from None
            except _UNAVAILABLE as exc:
                await store.close()
                raise StoreUnavailable(_UNAVAILABLE_MESSAGE) from exc
        return store

    @classmethod
    def from_url(cls, url: str, timeout_seconds: float, *, cluster: bool = False) -> Store:
        """A store whose every call gets ``timeout_seconds``, retries included.

        redis-py retries a failed command on a new connection (after a Redis
        restart the pooled connections are dead); the deadline bounds the
        whole, where the socket timeouts alone bound each attempt and each
        reconnection, which the retries multiply. Retries are safe: every
        write is idempotent (the decision marker makes a repeated reward a
        no-op; a change of an experiment sent again gets its first answer,
        ``once.lua``), so a timed-out script may be resent.

        ``cluster``: ``url`` is a node of a Redis Cluster (any node, a replica
        included). The cluster client keeps up to 256 connections per node and
        follows MOVED and ASK redirections itself; it packs commands in Python
        (it refuses another connection class).
        """
        options: dict[str, Any] = {
            "socket_timeout": timeout_seconds,
            "socket_connect_timeout": timeout_seconds,
            "retry": Retry(ExponentialBackoff(cap=0.25, base=0.02), retries=2),
            "retry_on_error": [RedisConnectionError, RedisTimeoutError],
            "health_check_interval": 30,
            "max_connections": 256,
        }
        if cluster:
            return cls(RedisCluster.from_url(url, **options), timeout_seconds)
        client = aioredis.Redis.from_url(url, **options)
        pool = client.connection_pool
        pool.connection_class = _packing_in_c(pool.connection_class)
        return cls(client, timeout_seconds)

    async def _write(self, script: AsyncScript, keyset: Sequence[str], args: Sequence[Any] = ()
                     ) -> Any:
        """A script whose writes a caller is told of: through the batcher, which answers
        once a replica holds them (:mod:`service.replicas`), and asks the server about
        its replicas before the first and then every second (a worker that serves only
        changes of experiments learns of a replica attached later too)."""
        return await self._batcher.run(script, keyset, args)

    async def _change(self, script: AsyncScript, experiment_id: str, keyset: Sequence[str],
                      args: Sequence[Any] = (), token: str | None = None) -> Any:
        """:meth:`_write` of a change of the experiment whose script keeps its answer for
        the call sent again (``once.lua``): the experiment's calls hash after ``keyset``,
        the call's ``token`` (a fresh one by default) after ``args``."""
        return await self._write(script, [*keyset, keys.calls(experiment_id)],
                                 [*args, token or secrets.token_hex(8)])

    async def _primaries(self) -> list[ClusterNode | None]:
        """The nodes to ask about the whole store: every primary of a cluster,
        or [None] (the one server) for a single Redis."""
        if isinstance(self._client, RedisCluster):
            await self._client.initialize()  # learns the nodes on first use only
            return list(self._client.get_primaries())
        return [None]

    async def _on(self, node: ClusterNode | None, *args: Any) -> Any:
        """A command sent to ``node`` (None: wherever the client sends it)."""
        if node is None or not isinstance(self._client, RedisCluster):
            return await self._client.execute_command(*args)
        return await self._client.execute_command(*args, target_nodes=node)

    def quiet_dropped_nodes(self) -> None:
        """With a cluster, :class:`DroppedNodeNotices` on the running loop until :meth:`close`."""
        if isinstance(self._client, RedisCluster) and self._notices is None:
            self._notices = DroppedNodeNotices(asyncio.get_running_loop())
            self._notices.install()

    @property
    def batch_in_flight(self) -> bool:
        """A batch of script calls is sent and not yet answered."""
        return self._batcher.batch_in_flight

    async def after_rewards_in_flight(self, experiment_id: str, at_most: float) -> bool:
        """When the batch of script calls in flight carries rewards of ``experiment_id``:
        return once it has been answered and its callers have run on, or after
        ``at_most`` seconds, True; else at once, False
        (:meth:`_ScriptBatcher.after_batch_in_flight`)."""
        return await self._batcher.after_batch_in_flight(
            experiment_id, keys.meta(experiment_id), at_most)

    async def close(self) -> None:
        if self._notices is not None:
            self._notices.uninstall()
            self._notices = None
        await self._batcher.close()
        await self._client.aclose()

    @_translated
    async def ping(self) -> None:
        await self._client.ping()

    @_translated
    async def ready(self) -> None:
        """Redis answers and accepts writes.

        Raises
        ------
        StoreFull
            While Redis is out of memory (maxmemory reached, noeviction) and
            refuses writes: over its limit now, or at it and a write was
            refused in the last ``REFUSALS_REMEMBERED_SECONDS``.
        StoreUnavailable
            If Redis does not answer, is a replica (read-only), or failed to
            write its append-only file (it then refuses writes: MISCONF).

        On a cluster, every primary is asked, and each must see the cluster
        as ``ok`` (every slot served): an experiment may live on any of them.
        """
        for node in await self._primaries():
            await self._node_ready(node)

    async def _node_ready(self, node: ClusterNode | None) -> None:
        try:
            info = await self._on(node, "INFO")  # the default sections, in one reply
        except ResponseError:
            await self._on(node, "PING")  # INFO refused (ACL, renamed): answering must do
            return
        if node is not None:
            state = await self._on(node, "CLUSTER INFO")
            if state.get("cluster_state") != "ok":
                raise StoreUnavailable("the state store's cluster is down; retry shortly")
        if info.get("role", "master") != "master":
            raise StoreUnavailable("the state store is a read-only replica; retry shortly")
        if info.get("aof_last_write_status", "ok") != "ok":
            raise StoreUnavailable("the state store cannot write its append-only file")
        refused_recently = (self.refused_at is not None and
                            time.monotonic() - self.refused_at < REFUSALS_REMEMBERED_SECONDS)
        if _refuses_writes(info, refused_recently):
            raise StoreFull(_FULL_MESSAGE)

    @_translated
    async def memory(self) -> list[tuple[str, int, int]]:
        """Each primary's (name, used_memory, maxmemory) in bytes (the one server is
        "redis"; maxmemory 0: no limit); a node that refuses INFO is left out."""
        found = []
        for node in await self._primaries():
            try:
                info = await self._on(node, "INFO", "memory")
            except ResponseError:
                continue
            found.append(("redis" if node is None else node.name,
                          int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))))
        return found

    @_translated
    async def persistence_warnings(self) -> list[str]:
        """What in the server's configuration could lose acknowledged state
        (on a cluster, in any primary's: each warning names the node)."""
        warnings = []
        for node in await self._primaries():
            warnings += await self._node_persistence_warnings(node)
        return warnings

    async def _node_persistence_warnings(self, node: ClusterNode | None) -> list[str]:
        server = "Redis" if node is None else f"Redis {node.name}"
        try:
            config = await self._on(node, "CONFIG GET", "appendonly")
            config.update(await self._on(node, "CONFIG GET", "maxmemory-policy"))
        except ResponseError:  # CONFIG may be disabled on managed Redis
            return [f"cannot read {server} CONFIG; make sure appendonly is yes and "
                    "maxmemory-policy is noeviction"]
        appendonly = _text(config.get("appendonly", "no"))
        policy = _text(config.get("maxmemory-policy", "unknown"))
        warnings = []
        if appendonly != "yes":
            warnings.append(f"{server} appendonly is {appendonly!r}: a restart can lose statistics")
        if policy != "noeviction":
            warnings.append(f"{server} maxmemory-policy is {policy!r}: Redis may evict statistics")
        return warnings

    # -- experiments ------------------------------------------------------

    @_translated
    async def create(
        self, experiment_id: str, meta: Mapping[str, str], arms: Mapping[str, str],
        *, default_reward: bool = False, listed: bool = True,
    ) -> bool:
        """Create the experiment unless the id is taken (False then).

        ``default_reward``: list it for the sweeper (:meth:`default_reward_ids`);
        ``listed`` False: not among the experiments (a shard's member, service.shards).
        """
        args: list[str] = [str(len(meta))]
        for pair in meta.items():
            args.extend(pair)
        for pair in arms.items():
            args.extend(pair)
        keyset = [keys.meta(experiment_id), keys.arms(experiment_id), keys.stats(experiment_id),
                  keys.outcomes(experiment_id)]
        # The indexes live in slots of their own, so they are written outside
        # the script: before it, so that a connection lost after it leaves no
        # experiment unlisted (an entry without its experiment is skipped where
        # read), and again after it, in case a listing dropped the entry as
        # stale in between.
        await self._index(experiment_id, default_reward, listed)
        try:
            created = await self._write(self._create, keyset, args)
        except ResponseError as exc:
            # Refused (out of memory, say): take back the entries written for it,
            # unless the experiment exists (a resent creation that had landed).
            if not await self._client.exists(keys.meta(experiment_id)):
                await self._client.srem(keys.EXPERIMENT_INDEX, experiment_id)
                await self._client.srem(keys.DEFAULT_REWARD_INDEX, experiment_id)
            raise exc
        if created:
            try:
                await self._index(experiment_id, default_reward, listed)
            except ResponseError as exc:
                # The script's writes took the last memory: undo them (DEL is
                # allowed out of memory), as nobody has the key to use them.
                if _out_of_memory(exc):
                    await self._client.delete(*keyset)
                    await self._client.srem(keys.EXPERIMENT_INDEX, experiment_id)
                    await self._client.srem(keys.DEFAULT_REWARD_INDEX, experiment_id)
                raise
        return bool(created)

    @_translated
    async def existing(self, experiment_ids: Sequence[str]) -> list[str]:
        """Those of ``experiment_ids`` (members, service.shards) that exist."""
        found = [await self._client.exists(keys.meta(i)) for i in experiment_ids]
        return [i for i, there in zip(experiment_ids, found, strict=True) if there]

    @_translated
    async def claim(self, experiment_id: str) -> str | None:
        """Claim the id while a sharded experiment is created or deleted (15 s at most: a
        claim left by an attempt that failed does not hold its retries up long): the
        claim's token, None if another holds it."""
        token = secrets.token_hex(8)
        claimed = await self._client.set(keys.creating(experiment_id), token, nx=True, ex=15)
        return token if claimed else None

    @_translated
    async def release(self, experiment_id: str, token: str) -> None:
        """Release the claim if it is still this token's (``release.lua``)."""
        await self._release(keys=[keys.creating(experiment_id)], args=[token])

    async def _index(self, experiment_id: str, default_reward: bool, listed: bool = True
                     ) -> None:
        if listed:
            await self._client.sadd(keys.EXPERIMENT_INDEX, experiment_id)
        if default_reward:
            await self._client.sadd(keys.DEFAULT_REWARD_INDEX, experiment_id)

    @_translated
    async def read_definition(
        self, experiment_id: str
    ) -> tuple[dict[str, str], dict[str, str]] | None:
        """Meta and arms of an experiment, read together; None if it does not exist."""
        meta, arms = await self._hashes(keys.meta(experiment_id), keys.arms(experiment_id))
        if not meta:
            return None
        as_text = {_text(k): _text(v) for k, v in meta.items()}
        return as_text, {_text(k): _text(v) for k, v in arms.items()}

    async def _hashes(self, *names: str) -> list[dict[bytes, bytes]]:
        """The hashes ``names`` (of one experiment), as one script saw them together."""
        reply = await self._read(keys=list(names))
        return [{flat[i]: flat[i + 1] for i in range(0, len(flat), 2)} for flat in reply]

    async def _with_outcomes(
        self, experiment_id: str, *names: str
    ) -> tuple[list[dict[bytes, bytes]], bytes]:
        """As :meth:`_hashes`, and the experiment's outcomes string, all read together."""
        reply = await self._read(keys=[*names, keys.outcomes(experiment_id)], args=[len(names)])
        hashes = [{flat[i]: flat[i + 1] for i in range(0, len(flat), 2)} for flat in reply[:-1]]
        return hashes, reply[-1]

    @_translated
    async def rotate_key(self, experiment_id: str, new_hash: str, replaced_hash: str,
                         nonce: str) -> int:
        """The new key becomes the experiment's, the current one (``replaced_hash``) its
        previous (still valid until revoked): 1; 0 if the experiment does not exist; -1 if
        its current key is another by now (``keys.lua``)."""
        return int(await self._change(
            self._keys, experiment_id, [keys.meta(experiment_id)],
            ["rotate", new_hash, replaced_hash, nonce, repr(time.time())]))

    @_translated
    async def revoke_previous_key(self, experiment_id: str) -> int:
        """0: no such experiment; 1: the previous key revoked; 2: there was none."""
        return int(await self._change(self._keys, experiment_id, [keys.meta(experiment_id)],
                                      ["revoke"]))

    @_translated
    async def key_hashes(self, experiment_id: str) -> tuple[str, ...] | None:
        """The hashes of the keys the experiment accepts (the current one first); None if
        it does not exist."""
        current, previous = await self._client.hmget(keys.meta(experiment_id),
                                                      ["key_hash", "key_hash_old"])
        if current is None:
            return None
        return tuple(_text(h) for h in (current, previous) if h is not None)

    @_translated
    async def key_hash(self, experiment_id: str) -> str | None:
        """The stored hash of an experiment's API key; None if it does not exist."""
        value = await self._client.hget(keys.meta(experiment_id), "key_hash")
        return None if value is None else _text(value)

    @_translated_unbounded  # once at start-up; it walks every pending decision
    async def upgrade(
        self,
        experiment_id: str,
        meta_fields: Mapping[str, str],
        stats_of: Callable[[dict[str, bytes], dict[str, str | None]], dict[str, bytes]],
        decision_fields_of: Callable[[str], dict[str, str]],
        decisions_behind: Callable[[dict[str, str | None]], bool] = lambda stored: True,
    ) -> bool:
        """Bring an experiment written by an earlier version up to date, once.

        Nothing to do (False) when its meta already holds ``meta_fields`` or it
        no longer exists. Otherwise its pending decisions get
        ``decision_fields_of(arm)`` where they lack them (when
        ``decisions_behind(stored)`` says they may), and then, in one
        transaction (retried while other clients change the experiment), its
        stats blobs are replaced by ``stats_of(stats, stored)`` (``stored``: the
        values of ``meta_fields`` as they were, None where absent) and ``meta_fields`` are
        set. Several workers may run this at once: one of them upgrades.

        Raises
        ------
        RuntimeError
            If the experiment kept changing through every attempt.
        """
        meta_key, stats_key = keys.meta(experiment_id), keys.stats(experiment_id)
        wanted = ["incarnation", *meta_fields]
        first = await self._client.hmget(meta_key, wanted)
        if not _needs_upgrade(first, meta_fields):
            return False
        stored_first = {name: None if value is None else _text(value)
                        for name, value in zip(meta_fields, first[1:], strict=True)}
        if decisions_behind(stored_first):
            await self._upgrade_decisions(experiment_id, decision_fields_of)
        for _ in range(_UPGRADE_ATTEMPTS):
            async with self._client.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(meta_key, stats_key)
                    found = await pipe.hmget(meta_key, wanted)
                    if not _needs_upgrade(found, meta_fields):
                        return False
                    stored = {name: None if value is None else _text(value)
                              for name, value in zip(meta_fields, found[1:], strict=True)}
                    stats = {_text(k): v for k, v in (await pipe.hgetall(stats_key)).items()}
                    blobs = stats_of(stats, stored)
                    pipe.multi()
                    if blobs:  # none before the first reward
                        pipe.hset(stats_key, mapping=blobs)
                    pipe.hset(meta_key, mapping=dict(meta_fields))
                    # Created with the experiment since outcomes are recorded
                    # (keys.outcomes): so that all its keys exist in a migration.
                    # Empty: until now every outcome went into the sums (this
                    # version's scripts refuse an experiment not upgraded), so
                    # what is there was left by a namesake an earlier version deleted.
                    pipe.set(keys.outcomes(experiment_id), "")
                    pipe.hdel(stats_key, keys.FOLDED, keys.FOLDED_TAIL, *map(
                        keys.folded_tail_field, range(keys.TAIL_FOLDS)))
                    await pipe.execute()
                    return True
                except WatchError:
                    continue  # changed meanwhile: read it again
        raise RuntimeError(f"experiment {experiment_id} kept changing during its upgrade")

    async def _upgrade_decisions(
        self, experiment_id: str, decision_fields_of: Callable[[str], dict[str, str]]
    ) -> None:
        """Give an experiment's pending decisions ``decision_fields_of(arm)`` where they lack
        them. SCAN walks the whole keyspace: once per experiment, and only for versions
        whose decisions lack what this one's need."""
        async for key in self._client.scan_iter(match=keys.decision(experiment_id, "*")):
            if _text(await self._client.type(key)) != "hash":
                continue  # a record of this version (a string) lacks nothing
            arm = await self._client.hget(key, "arm")
            if arm is not None:
                fields = decision_fields_of(_text(arm))
                args = [item for pair in fields.items() for item in pair]
                await self._upgrade_decision(keys=[key], args=args)

    @_translated
    async def list_ids(self) -> list[str]:
        return sorted(_text(v) for v in await self._client.smembers(keys.EXPERIMENT_INDEX))

    @_translated
    async def delete(self, experiment_id: str) -> bool:
        """Delete an experiment, its log and its decisions (pending, rewarded or
        settled, contexts included).

        ``delete.lua`` removes the experiment and sets its lists of decisions
        aside in one step; the decisions are then deleted a chunk at a time,
        so that a large experiment does not hold Redis up. False if there
        was no such experiment (the script sent again after its reply was lost
        answers as it first did: ``once.lua``).
        """
        aside = [keys.deleted_pending(experiment_id, secrets.token_hex(8)) for _ in range(2)]
        keyset = [keys.meta(experiment_id), keys.arms(experiment_id),
                  keys.stats(experiment_id), keys.log(experiment_id),
                  keys.pending(experiment_id), keys.settled(experiment_id), *aside,
                  keys.outcomes(experiment_id)]
        token = secrets.token_hex(8)
        removed = await self._change(self._delete, experiment_id, keyset, token=token)
        await self._client.srem(keys.EXPERIMENT_INDEX, experiment_id)
        await self._client.srem(keys.DEFAULT_REWARD_INDEX, experiment_id)
        for listed in aside:
            await self._delete_listed(experiment_id, listed)
        with contextlib.suppress(redis.RedisError):  # (else gone in a minute)
            # Its own answer only: the id may be an experiment's again already.
            await self._client.hdel(keys.calls(experiment_id), token)
        return bool(removed)

    async def _delete_listed(self, experiment_id: str, listed: str) -> None:
        """Delete the decisions on a list set aside by ``delete.lua``, then the list."""
        while entries := await self._client.lrange(listed, 0, _DELETE_CHUNK - 1):
            ids = {_text(e).split(" ", 1)[1] for e in entries}
            # a ranking's slots: their records, and the ranking's (slot 0)
            ids |= {keys.slot_id(keys.ranking_of(i), 0) for i in ids if keys.ranking_of(i) != i}
            decision_keys = [keys.decision(experiment_id, i) for i in sorted(ids)]
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(*decision_keys)
                pipe.ltrim(listed, len(entries), -1)  # all keys share the hash tag
                await pipe.execute()
            if len(entries) < _DELETE_CHUNK:
                break

    @_translated
    async def forget_id(self, experiment_id: str) -> None:
        await self._client.srem(keys.EXPERIMENT_INDEX, experiment_id)
        await self._client.srem(keys.DEFAULT_REWARD_INDEX, experiment_id)

    @_translated
    async def default_reward_ids(self) -> list[str]:
        """The experiments with a default reward (some perhaps deleted meanwhile)."""
        return [_text(v) for v in await self._client.smembers(keys.DEFAULT_REWARD_INDEX)]

    @_translated
    async def add_arms(self, experiment_id: str, arms: Mapping[str, str], max_arms: int) -> int:
        """Returns the new version, 0 if the experiment is gone, -1 if an arm exists,
        -2 if it would have more than ``max_arms``."""
        args = [str(max_arms), *(item for pair in arms.items() for item in pair)]
        keyset = [keys.meta(experiment_id), keys.arms(experiment_id)]
        return int(await self._change(self._add_arms, experiment_id, keyset, args))

    @_translated
    async def update_settings(
        self, experiment_id: str, version: int, spec: str, config: str,
        default_reward: str | None, log_max_entries: int, log_max_age_seconds: int,
        change: str,
    ) -> int:
        """Write the live settings (``settings.lua``): the new version, 0 if the experiment
        is gone, -1 if its definition changed since ``version`` was read."""
        args = [str(version), spec, config, default_reward or "", str(log_max_entries),
                str(log_max_age_seconds), change]
        return int(await self._change(
            self._settings, experiment_id, [keys.meta(experiment_id), keys.log(experiment_id)],
            args))

    @_translated
    async def sync_member(
        self, member_id: str, incarnation: str, meta: Mapping[str, str],
        absent: Sequence[str], arms: Mapping[str, str],
    ) -> int:
        """Give a shard's member its home's definition (``sync_member.lua``): 1 done, 0 no
        such member, -1 a member of another incarnation."""
        args = [incarnation, str(len(meta)), *(item for pair in meta.items() for item in pair),
                str(len(absent)), *absent, *(item for pair in arms.items() for item in pair)]
        return int(await self._write(
            self._sync_member, [keys.meta(member_id), keys.arms(member_id)], args))

    @_translated
    async def retire_arms(self, experiment_id: str, arm_ids: Sequence[str]) -> int:
        """Returns the new version, 0 if the experiment is gone, -1 if an arm is unknown,
        -2 if no active arm would be left."""
        keyset = [keys.meta(experiment_id), keys.arms(experiment_id)]
        return int(await self._change(self._retire_arms, experiment_id, keyset, list(arm_ids)))

    # -- statistics and decisions ----------------------------------------

    @_translated
    async def read_experiment(
        self, experiment_id: str
    ) -> tuple[dict[str, str], dict[str, str], Snapshot] | None:
        """Meta, arms and statistics, read together; None if the experiment does not exist."""
        (meta, arms, raw_stats), outcomes = await self._with_outcomes(
            experiment_id,
            keys.meta(experiment_id), keys.arms(experiment_id), keys.stats(experiment_id))
        if not meta:
            return None
        as_text = {_text(k): _text(v) for k, v in meta.items()}
        return (as_text, {_text(k): _text(v) for k, v in arms.items()},
                _snapshot(as_text, raw_stats, outcomes))

    @_translated
    async def read_snapshot(self, experiment_id: str) -> Snapshot | None:
        """The statistics and the meta version, read together; None if the experiment
        does not exist."""
        (meta, raw_stats), outcomes = await self._with_outcomes(
            experiment_id, keys.meta(experiment_id), keys.stats(experiment_id))
        if not meta:
            return None
        return _snapshot({_text(k): _text(v) for k, v in meta.items()}, raw_stats, outcomes)

    @_translated
    async def read_progress(self, experiment_id: str, held: int | None = None
                            ) -> Progress | None:
        """Counters and outcomes not yet in the sums, read together, without the sums
        (those after the first ``held`` outcomes only, when given: what a caller who
        holds them lacks); None if the experiment does not exist."""
        keyset = [keys.meta(experiment_id), keys.stats(experiment_id),
                  keys.outcomes(experiment_id)]
        reply = await self._progress(keys=keyset, args=[] if held is None else [held])
        return _progress_of(reply)

    @_translated_batched
    async def probe_progress(self, experiment_id: str, held: int) -> Progress | None:
        """:meth:`read_progress` with ``held``, sent with this worker's next batch: one call
        for every probe of the experiment from the same ``held`` in it, each made before
        the batch was sent (what the decisions of requests that arrived before then need
        to reflect every outcome applied before them)."""
        keyset = [keys.meta(experiment_id), keys.stats(experiment_id),
                  keys.outcomes(experiment_id)]
        joining = Joining((experiment_id, str(held)), 1, _first_call, _progress_of_every,
                          _never)
        progress: Progress | None = await self._batcher.run_joined(self._progress, keyset,
                                                                   [held], joining)
        return progress

    @_translated_batched
    async def decide(
        self,
        experiment_id: str,
        decision_id: str,
        *,
        key_hash: str | None,
        incarnation: str,
        seen: tuple[int, int | None] | None,
        number: int | None,
        reserved: bool,
        ttl_seconds: int,
        max_lag: int,
        grace_seconds: int,
        record: bytes,
        logged: Mapping[str, str | bytes] | None = None,
        held: int | None = None,
        request: tuple[str, str, int] | None = None,
        ranked: bool = False,
        later_records: Sequence[bytes] = (),
    ) -> DecideReply:
        """Record a pending decision if the statistics it was made from are current.

        ``seen`` is the (version, outcomes counter) the decision was made at; None
        records it whatever they are now, and an outcomes counter None whatever outcomes
        were applied since; ``max_lag`` outcomes applied since ``seen`` are
        tolerated. ``number`` is the decision number its random
        draw used (None: the script assigns one); ``reserved`` says an earlier
        stale reply set it aside. ``key_hash`` None skips the key check (trusted
        in-process callers). ``record`` is the end of the decision's record
        (``decide.lua``'s ARGV[11]), ``logged`` its entry in the decision log
        (the script adds its number). ``held``: how many outcomes the caller's
        statistics hold (folded and added); a stale reply then carries only what
        they lack when they can catch up (``DecideReply.progress``). ``request``: the
        caller chose ``decision_id``; the request's digest, the answer (but its
        number) and how long (seconds) to keep them, so that a retry gets the same
        answer ("repeat") and another request under the same id is refused
        ("conflict"), as is any request under it once its answer is no longer kept
        while its decision lives ("spent"). ``ranked``: the decision is a ranking,
        ``record`` its first slot's end, ``later_records`` its further slots' (slot j is
        the decision :func:`service.keys.slot_id` names), all kept in one record (slot
        0's key), ``logged`` the ranking's one log entry. See ``decide.lua``.
        """
        slots = 1 + len(later_records)
        if ranked:  # one record: the slots' ends' lengths, then the ends (decide.lua)
            ends = (record, *later_records)
            record = b"%b\n%b" % (b",".join(b"%d" % len(end) for end in ends), b"".join(ends))
        part: list[str | bytes | int] = [
            incarnation,
            "" if seen is None else str(seen[0]),
            "" if seen is None or seen[1] is None else str(seen[1]),
            "" if number is None else str(number),
            "1" if reserved else "0",
            ttl_seconds,
            max_lag,
            grace_seconds,
            "" if held is None else str(held),
            record,
            *(request or ("", "", "")),
            slots,
        ]
        for pair in (logged or {}).items():
            part.extend(pair)
        ranking = keys.decision(experiment_id, keys.slot_id(decision_id, 0))
        decision = keys.decision(experiment_id, decision_id)
        keyset = [
            keys.meta(experiment_id),
            keys.stats(experiment_id),
            ranking if ranked else decision,
            keys.pending(experiment_id),
            keys.log(experiment_id),
            keys.outcomes(experiment_id),
            keys.request(experiment_id, decision_id),
            # The caller's id on the other route (decide.lua refuses it while that lives).
            decision if ranked else ranking,
        ]
        # The decisions of one experiment in a turn go to Redis as one call (BENCHMARKS.md
        # §26), first in its batch: the rewards sent with them then do not make them stale.
        joining = Joining((experiment_id, key_hash or ""), slots, _joined_decisions,
                          _decide_parts, _never)
        raw = await self._batcher.run_joined(
            self._decide, keyset, ["" if key_hash is None else key_hash, *part, len(part), 1],
            joining, first=True)
        return _decide_reply(raw, incarnation)

    @_translated_batched
    async def apply_rewards(
        self, experiment_id: str, key_hash: str | None, items: Sequence[tuple[str, str]],
        held: int | None = None, shards: int = 1,
    ) -> RewardReply:
        """Run the exactly-once reward script on (decision id, reward text) pairs.

        ``key_hash`` must be the experiment's; None skips the check (trusted
        in-process callers). ``held``: how many outcomes the caller holds the records
        of; when others' came between those and these, the reply brings them too.
        Returns one status per item, the rewards counter after them (0 when none
        was applied) and the outcomes recorded (:class:`Appended`), or the
        statuses ``["missing"]`` / ``["forbidden"]`` for the whole call (then
        nothing was written), or ``["shards", S]`` when the experiment has S shards, not
        ``shards`` (by which the caller routed the rewards to ``experiment_id``: nothing
        was written, service.shards).
        """
        call = _RewardArgs(
            [keys.meta(experiment_id), keys.stats(experiment_id), keys.log(experiment_id),
             keys.outcomes(experiment_id)],
            [keys.decision(experiment_id, decision_id) for decision_id, _ in items],
            "" if key_hash is None else key_hash, "" if held is None else held, shards,
            [reward for _, reward in items])
        # The rewards of the requests of one turn go to Redis as one call (a reward in a
        # call of 16 costs Redis about half a single one's: BENCHMARKS.md §25).
        joining = Joining((experiment_id, key_hash or "", str(shards)), len(items),
                          _joined_rewards, _reward_parts, _damaged)
        return await self._batcher.run_joined(self._reward, call.keys(), call.args(), joining,
                                              tag=experiment_id)

    @_translated_batched
    async def settle(
        self, experiment_id: str, entries: Sequence[str], limit: int, grace_seconds: int
    ) -> SettleReply | None:
        """Run ``settle.lua``: apply the default reward to ``entries`` (pending-list
        entries an earlier call returned) that are still due and unrewarded.

        Returns what it did and up to ``limit`` entries due next; None if the
        experiment does not exist or has no default reward.
        """
        keyset = [keys.meta(experiment_id), keys.stats(experiment_id), keys.log(experiment_id),
                  keys.pending(experiment_id), keys.settled(experiment_id),
                  keys.outcomes(experiment_id)]
        keyset += [keys.decision(experiment_id, e.split(" ", 1)[1]) for e in entries]
        reply = await self._batcher.run(self._settle, keyset, [limit, grace_seconds, *entries])
        if reply and _text(reply[0]) == "missing":
            return None
        defaulted, missed, counter, *due = reply
        return SettleReply(int(defaulted), int(missed), int(counter), [_text(e) for e in due])

    @_translated
    async def fold(
        self,
        experiment_id: str,
        incarnation: str,
        limit: int,
        folded: Callable[[Sequence[str], Sequence[bytes | None], Sequence[bytes]],
                         dict[str, bytes]],
        held: Callable[[int, Sequence[str], Sequence[bytes]], dict[str, bytes] | None]
        | None = None,
    ) -> int | None:
        """Add up to ``limit`` of the oldest outcomes not yet in the sums to the sums.

        ``folded(fields, blobs, records)`` gives the blobs of ``fields`` with
        ``records`` added (:func:`service.folding.folded_blobs`);
        ``held(sums_hold, fields, records)``, if given, gives them first from what
        the caller holds of the sums when they hold ``sums_hold`` outcomes, or None
        (then the stored blobs are read). Returns how many outcomes the sums now hold
        that they did not (0 when there were none, or another fold came first:
        ``fold.lua`` writes only if none did); None when the experiment is gone or is
        not ``incarnation``.
        """
        keyset = [keys.meta(experiment_id), keys.stats(experiment_id),
                  keys.outcomes(experiment_id)]
        reply = await self._fold_read(keys=keyset)
        if not reply or _text(reply[0]) != incarnation:
            return None
        _, seen, outcomes = reply
        records, length = split_records(outcomes, limit)
        if not records:
            return 0
        # Only a fold changes the sums, and fold.lua writes only if none came
        # after fold_read.lua: these blobs (or those ``held`` holds) are the ones
        # the records add to.
        fields = fields_of(records)
        written = None if held is None else held(int(seen), fields, records)
        if written is None:
            blobs = await self._client.hmget(keys.stats(experiment_id), fields)
            written = folded(fields, [b or None for b in blobs], records)
        args: list[str | bytes | int] = [incarnation, _text(seen), len(records), length]
        for pair in written.items():
            args.extend(pair)
        return len(records) if await self._fold(keys=keyset, args=args) else 0

    @_translated
    async def read_latest_log(
        self, experiment_id: str, since: str | None, limit: int, max_bytes: int,
        size: Callable[[Mapping[str, bytes]], int], before: str | None = None,
    ) -> tuple[list[tuple[str, dict[str, bytes]]], bool]:
        """The latest entries of the decision log from the entry id ``since`` on (all
        of it if None) and before the entry id ``before`` (if given), up to ``limit``
        and about ``max_bytes`` of JSON (by ``size``; at least one entry), oldest
        first; and whether earlier ones were left out. Read newest first, a few at a
        time as :meth:`read_log` reads."""
        found: list[tuple[str, dict[str, bytes]]] = []
        # One more than the limit is read, so that "left out" is known, not guessed; and
        # at most _LOG_MOST_READ a command, so that Redis serves others in between.
        spent, count = 0, min(limit + 1, _LOG_FIRST_READ)
        end = "+" if before is None else f"({before}"
        while True:
            chunk = await self._client.xrevrange(keys.log(experiment_id), end,
                                                 since or "-", count=count)
            for entry_id, fields in chunk:
                entry = (_text(entry_id), {_text(k): v for k, v in fields.items()})
                cost = size(entry[1])
                if len(found) == limit or (found and spent + cost > max_bytes):
                    return found[::-1], True
                found.append(entry)
                spent += cost
            if len(chunk) < count:
                return found[::-1], False
            end = f"({found[-1][0]}"
            each = max(1, spent // len(found))
            count = max(1, min(limit + 1 - len(found), (max_bytes - spent) // each + 1,
                               _LOG_MOST_READ))

    async def read_log(
        self, experiment_id: str, after: str | None, limit: int, max_bytes: int | None = None,
        size: Callable[[Mapping[str, bytes]], int] | None = None,
    ) -> tuple[list[tuple[str, dict[str, bytes]]], bool]:
        """Up to ``limit`` entries of the decision log after the entry id ``after``
        (from the start if None), oldest first: (entry id, fields); and whether the
        log may go on after them.

        With ``max_bytes``, entries stop once their JSON would pass about that many
        bytes (at least one entry): they are read a few at a time, each read sized
        by the entries before it, so that a log of entries with every arm's context
        (megabytes each) is never read a thousand at a time. ``size`` estimates an
        entry's JSON (default :func:`log_entry_json_bytes`).
        """
        size = size or log_entry_json_bytes
        found: list[tuple[str, dict[str, bytes]]] = []
        spent, count = 0, limit if max_bytes is None else min(limit, _LOG_FIRST_READ)
        while True:
            start = "-" if after is None else f"({after}"
            chunk = await self._client.xrange(keys.log(experiment_id), start, "+", count=count)
            for entry_id, fields in chunk:
                entry = (_text(entry_id), {_text(k): v for k, v in fields.items()})
                cost = size(entry[1])
                if found and max_bytes is not None and spent + cost > max_bytes:
                    return found, True
                found.append(entry)
                spent += cost
            if len(chunk) < count:
                return found, False
            if len(found) == limit:
                return found, True
            after = found[-1][0]
            assert max_bytes is not None  # else the first read took `limit` entries
            each = max(1, spent // len(found))
            count = max(1, min(limit - len(found), (max_bytes - spent) // each + 1))
