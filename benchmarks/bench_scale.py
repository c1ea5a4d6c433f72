"""Scale: decided-and-rewarded pairs over workers, experiments and Redis topologies.

Usage::

    python -m benchmarks.bench_scale [--workers 1 2 4] [--experiments 6] [--duration 8]
                                     [--connections 32] [--cluster] [--spread default]
                                     [--loads hot sharded many share apart]
                                     [--pin]
                                     [--max-stale-rewards 0] [--replica] [--by-script]
                                     [--runs R]

For each number of uvicorn workers N and each store (one embedded Redis; with
``--cluster`` also a local Redis Cluster of 3 masters, tests/cluster.py, without
replicas as the one Redis is; ``--replica`` gives the first master one, whose writes
then wait for it, service.replicas), wrk
drives choose+reward pairs (every decision rewarded, max_stale_rewards 0 or
``--max-stale-rewards``, stochastic LinReBoot, K = 100, d = 20) on each load:

- ``hot``: one experiment, driven by N wrk processes of ``--connections`` c each:
  each worker as loaded as one worker alone (at N x its concurrency N workers serve
  N x its pairs); on a cluster the one experiment is on the second master (one
  without a replica);
- ``sharded``: one experiment of ``--shards`` S shards (service.shards; on a cluster,
  its members on every master, with ``--replica`` one of them on the master with the
  replica, which the hot experiment is not), N wrk processes of min(S, masters) x c:
  each master as loaded as the hot experiment's (target 2 compares them);
- ``many``: ``--experiments`` experiments (a wrk thread each); on a cluster of S
  masters spread evenly over them, with S x c: each master as loaded as one Redis is
  with c (target 3);
- ``share`` (a cluster only): one master's share of ``many``, alone: 1 / S of its
  experiments on one master, with c, that master and each experiment as loaded as in
  ``many``; on each master in turn (the cheapest is the ceiling): target 3's control, the
  same processes alive and one master busy at a time;
- ``apart`` (N > 1): N services of one worker each, every one with an experiment of
  its own (on a cluster on the hot experiment's master) and a wrk of its own with c:
  target 1's control, the same processes on the same cores with the same load each,
  no experiment shared (what N workers pay for sharing one is the hot row's CPU per
  pair over this one's).

Each row gives pairs/s,
p50 and p99, the workers' CPU per pair (user + system, /proc) and the busiest
worker's share of it (about 1 / N when the connections are spread), the script calls
per pair (2 when no decision is made twice and no reward shares a call; a stale
decision is a third) and the scripts' time per pair (INFO commandstats), the whole
statistics reads per pair (HGETALL: a view that could not catch up by the outcomes it
lacked), each master's CPU
per pair (INFO cpu, its main thread: commands and clients' I/O, each counted once)
and busy share (that CPU over the run), and what
10,000 and 100,000 pairs/s would need by extrapolating the CPU per pair:
worker cores, and Redis masters kept below 80 % busy. An unsharded experiment
lives on one master: 1e6 / (its Redis µs per pair) pairs/s is its ceiling
whatever the workers; a sharded one spreads that work over its members.

On a machine with few cores wrk, the workers and Redis share them, so
pairs/s stops growing with N early; the CPU per pair and each master's busy
share are what decide scaling on a larger machine (BENCHMARKS.md §12): ``--pin``
gives the workers a core of their own (the rest share the others), and the summary
after the table reads targets 1 and 3 of issue 27 from them. With ``--pin`` the N
workers share that one core, which costs each process by itself (switches, caches):
the "apart" row pays the same, and target 1 is read against it too. ``--runs R`` repeats
the whole measurement R times back to back and ends with each target's figure as its
median over the runs, each run's beside it, and the verdict of the figure that decides
it (or the runs to repeat: errors, one worker doing the work, the hot Redis over 80 %
busy): the rules of BENCHMARKS.md §41 and §45 read three (a run's figures scatter by a
fifth on a 2-core machine, §51).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import redis

from benchmarks.bench_service import (
    HERE,
    World,
    _experiment,
    _start,
    pin_serving,
    run_wrks,
    server_cpu_us,
    tree_cpu_by_process,
)
from loadtest.server import free_port
from service import keys
from service.embedded import EmbeddedRedis
from service.shards import members
from service.store import script_names

TOKEN = "bench-token"
BUSY_LIMIT = 0.8  # the busy share a master is planned to stay under
TARGETS = (10_000, 100_000)  # pairs/s to extrapolate to


@dataclass(frozen=True)
class Row:
    store: str
    workers: int
    experiments: int
    shards: int  # of each experiment
    pairs_per_second: float
    p50_ms: float
    p99_ms: float
    errors: int
    worker_us_per_pair: float
    redis_us_per_pair: tuple[float, ...]  # per master
    busy: tuple[float, ...]  # per master: main-thread CPU / wall time
    scripts_per_pair: float = 2.0  # decide + reward; more: decisions made again (stale), folds
    # HGETALL calls (a whole statistics hash read: a view that could not catch up by the
    # outcomes it lacked, or a first read, with its meta), per pair: 0 when catching up
    # costs in proportion to the rewards missed (issue 27, target 1)
    whole_reads_per_pair: float = 0.0
    # the scripts' own time per pair (INFO commandstats, EVALSHA and FCALL usec, their
    # commands inside counted once; no client I/O): issue 26's target 2 under load
    script_us_per_pair: float = 0.0
    # the CPU of the busiest process of the serving tree, as a share of the tree's: about
    # 1 / N with N workers sharing the load; near 1 when the kernel gave one worker all
    # of wrk's connections (the row then shows one worker's figures)
    busiest_share: float = 1.0
    load: str = ""  # LOADS
    connections: int = 0  # wrk's, in all

    def needs(self, rate: float) -> str:
        """Worker cores and Redis masters for ``rate`` pairs/s, by this row's CPU per pair."""
        cores = rate * self.worker_us_per_pair / 1e6
        redis_cores = rate * sum(self.redis_us_per_pair) / 1e6
        wanted = max(1, math.ceil(redis_cores / BUSY_LIMIT))
        if self.experiments == 1 and self.shards == 1 and wanted > 1:
            return f"{cores:.0f} cores; {wanted} masters: shard it"
        return f"{cores:.0f} cores; {wanted} master{'s' if wanted > 1 else ''}"


@dataclass
class Store:
    url: str
    servers: list[redis.Redis]
    # The 'many' load's experiment ids, new for each suffix: one per master in turn (a
    # single Redis: any), or (share: the master's index) 1 / S of them, all on that master
    place: Callable[[str, int | None], list[str]]
    sharded: Callable[[str], str]  # a sharded experiment's id (a cluster: members on every
    # master), by a suffix
    hot: Callable[[str], str]  # the hot experiment's id (a cluster: on the same master,
    # one without a replica, for every suffix)


def _single(stack: ExitStack, tmp: Path, count: int, shards: int) -> Store:
    embedded = EmbeddedRedis(tmp / "redis", port=free_port()).start()
    stack.callback(embedded.stop)
    server = redis.Redis.from_url(embedded.url)
    stack.callback(server.close)
    return Store(embedded.url, [server],
                 lambda suffix, share: [f"many{i}-{suffix}" for i in range(count)],
                 lambda suffix: f"sharded-{suffix}", lambda suffix: f"hot-{suffix}")


def _cluster(stack: ExitStack, tmp: Path, count: int, shards: int, *,
             replica: bool) -> Store:
    from tests.cluster import id_on, local_cluster  # test infrastructure: a real cluster

    cluster = stack.enter_context(local_cluster(tmp / "cluster", with_replica=replica))
    servers = [cluster.node(port) for port in cluster.masters]
    for server in servers:
        stack.callback(server.close)

    masters = cluster.masters
    if count % len(masters):
        raise SystemExit(f"--experiments must be a multiple of the {len(masters)} masters")

    def place(suffix: str, share: int | None) -> list[str]:
        ids: list[str] = []
        for i in range(count if share is None else count // len(masters)):
            master = masters[i % len(masters) if share is None else share]
            ids.append(id_on(cluster, master, f"many{suffix}-", ids))
        return ids

    wanted = min(shards, len(cluster.masters))

    def sharded(suffix: str) -> str:
        return next(f"sharded{n}-{suffix}" for n in range(10_000) if len(
            {cluster.owner(keys.meta(m)) for m in members(f"sharded{n}-{suffix}", shards)}
        ) == wanted)

    # (tests/cluster.py gives the first master the replica, if any)
    return Store(cluster.url, servers, place, sharded,
                 lambda suffix: id_on(cluster, masters[1], f"hot{suffix}-"))


@dataclass(frozen=True)
class Served:
    """A serving process tree (uvicorn's ``pid`` at ``url``) and the experiments (id, key)
    wrk drives on it, a thread each."""

    url: str
    pid: int
    pairs: list[tuple[str, str]]

    def args(self) -> list[str]:
        return [item for experiment, key in self.pairs for item in (experiment, key, "")]


def _measure(store: Store, name: str, workers: int, served: list[Served], connections: int,
             *, duration: int, shards: int = 1, load: str = "", by_script: bool = False
             ) -> Row:
    """wrk's pairs on every one of ``served`` at once, a wrk each with ``connections``
    (``by_script``: and Redis's time by script and command, printed)."""
    script = HERE / "wrk_pairs.lua"
    runs = [(f"{s.url}/choose", s.args(), len(s.pairs)) for s in served]
    run_wrks("warm-up", runs, 2, connections, script)
    for server in store.servers:
        server.config_resetstat()
        if by_script:
            _slowlog(server, every=True)
    redis_before = [server_cpu_us(server) for server in store.servers]
    before = _cpu_by_process(served)
    result = run_wrks(name, runs, duration, connections, script)
    if by_script:
        entries = [e for server in store.servers for e in _slowlog(server, every=False)]
        for label, spent_us, calls in time_by_command(entries, script_names(),
                                                      max(result.requests / 2, 1.0))[:8]:
            print(f"    {label:10s} {spent_us:6.1f} µs a pair, {calls:.3f} calls a pair",
                  flush=True)
    spent_by = {p: cpu - before.get(p, 0.0) for p, cpu in _cpu_by_process(served).items()}
    spent = sum(spent_by.values())
    usec = [server_cpu_us(server) - b
            for server, b in zip(store.servers, redis_before, strict=True)]
    scripts = sum(script_calls(server) for server in store.servers)
    script_usec = sum(command_usec(server, ("evalsha", "fcall")) for server in store.servers)
    whole_reads = sum(command_calls(server, ("hgetall",)) for server in store.servers)
    count = max(result.requests / 2, 1.0)  # a /choose and a /reward each
    return Row(name, workers, len({e for s in served for e, _ in s.pairs}), shards,
               result.requests_per_second / 2, result.p50_ms,
               result.p99_ms, result.errors, 1e6 * spent / count,
               tuple(u / count for u in usec), tuple(u / (1e6 * duration) for u in usec),
               scripts_per_pair=scripts / count, whole_reads_per_pair=whole_reads / count,
               script_us_per_pair=script_usec / count,
               busiest_share=max(spent_by.values()) / max(spent, 1e-9), load=load,
               connections=connections * len(served))


_SLOWLOG_MOST = 2_000_000  # entries kept: a run's every command (about 20 a pair)


def _slowlog(server: redis.Redis, *, every: bool) -> list[dict[str, Any]]:
    """``every``: from now on Redis logs every command (SLOWLOG at 0 µs, its log emptied);
    else what it logged, and the log back to its default threshold. Logging costs Redis
    about half again its time: read the shares, not the totals."""
    if every:
        server.config_set("slowlog-max-len", _SLOWLOG_MOST)
        server.config_set("slowlog-log-slower-than", 0)
        server.slowlog_reset()
        return []
    entries: list[dict[str, Any]] = server.slowlog_get(_SLOWLOG_MOST)  # type: ignore[assignment]
    server.config_set("slowlog-log-slower-than", 10_000)
    server.slowlog_reset()
    return entries


def time_by_command(entries: list[dict[str, Any]], scripts: dict[str, str], pairs: float
                    ) -> list[tuple[str, float, float]]:
    """(command, µs a pair, calls a pair) from SLOWLOG entries, the dearest first: a script
    called by EVALSHA as its name in ``scripts`` (SHA-1 -> name), else its SHA-1's first 8
    digits. A script's time includes the commands it called, which are listed too."""
    usec: dict[str, float] = {}
    calls: dict[str, int] = {}
    for entry in entries:
        words = entry["command"].split(b" ")
        label = words[0].decode().upper()
        if label in ("EVALSHA", "FCALL") and len(words) > 1:
            sha = words[1].decode()
            label = scripts.get(sha, sha[:8])
        usec[label] = usec.get(label, 0.0) + entry["duration"]
        calls[label] = calls.get(label, 0) + 1
    return sorted(((label, us / pairs, calls[label] / pairs) for label, us in usec.items()),
                  key=lambda row: -row[1])


def _cpu_by_process(served: list[Served]) -> dict[int, float]:
    return {p: cpu for s in served for p, cpu in tree_cpu_by_process(s.pid).items()}


def script_calls(server: redis.Redis) -> int:
    """Script calls (EVALSHA, FCALL) since the server's stats were last reset."""
    return command_calls(server, ("evalsha", "fcall"))


def command_calls(server: redis.Redis, names: tuple[str, ...]) -> int:
    """Calls of these commands since the server's stats were last reset (a script's own
    calls included)."""
    return _commandstat(server, names, "calls")


def command_usec(server: redis.Redis, names: tuple[str, ...]) -> int:
    """Time (µs) in these commands since the server's stats were last reset."""
    return _commandstat(server, names, "usec")


def _commandstat(server: redis.Redis, names: tuple[str, ...], field: str) -> int:
    stats: dict[str, dict[str, int]] = server.info("commandstats")  # type: ignore[assignment]
    return sum(stats.get(f"cmdstat_{name}", {}).get(field, 0) for name in names)


LOADS = ("hot", "sharded", "many", "share", "apart")

# The workers' core is taken once a process (``--runs``: the first run keeps this process
# off it, so a second pin_serving would find one core left and refuse).
pinned_serving = functools.cache(pin_serving)


def measure(workers: list[int], experiments: int, duration: int, connections: int,
            cluster: bool, spread: str, shards: int = 3,
            loads: tuple[str, ...] = LOADS, pin: bool = False,
            max_stale_rewards: int = 0, replica: bool = False, by_script: bool = False
            ) -> list[Row]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    serve = [sys.executable, "-m", "linreboot", "serve"]
    if pin:  # the workers on the last core; Redis, wrk and this process on the others
        serve = [*pinned_serving(), *serve]
    rows = []
    clustered = functools.partial(_cluster, replica=replica)
    topology = "3-master cluster" + (" + replica" if replica else "")
    stores = [("one Redis", _single)] + ([(topology, clustered)] if cluster else [])
    for label, make in stores:
        with ExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            store = make(stack, tmp, experiments, shards)
            env = {"LINREBOOT_REDIS_URL": store.url, "LINREBOOT_ADMIN_TOKEN": TOKEN,
                   "LINREBOOT_LOG_LEVEL": "warning"}
            run = functools.partial(_measure, store, label, duration=duration,
                                    by_script=by_script)
            for n in workers:
                with ExitStack() as serving:
                    url, pid = _serve(serving, serve, env, n)
                    for load in (each for each in loads if each != "apart"):
                        made = functools.partial(_load, store, load, url, n, spread, shards,
                                                 max_stale_rewards)
                        if load == "share":  # a master's share on each master in turn
                            for m in range(len(store.servers) if len(store.servers) > 1 else 0):
                                rows.append(run(n, [Served(url, pid, made(m))], connections,
                                                load=load))
                                print(_line(rows[-1]), flush=True)
                            continue
                        # Each worker as loaded as one worker alone (a wrk each); each
                        # master or member of a spread load as one Redis or the hot
                        # experiment is with ``connections``.
                        wrks, each = _connections(load, n, len(store.servers), shards,
                                                  connections)
                        rows.append(run(n, [Served(url, pid, made(None))] * wrks, each,
                                        shards=shards if load == "sharded" else 1, load=load))
                        print(_line(rows[-1]), flush=True)
                if "apart" in loads and n > 1:
                    rows.append(_apart(run, store, n, serve, env, spread, max_stale_rewards,
                                       connections))
                    print(_line(rows[-1]), flush=True)
    return rows


def _connections(load: str, workers: int, masters: int, shards: int,
                 connections: int) -> tuple[int, int]:
    """How many wrk processes drive ``load``, and the connections of each: N workers on
    one experiment as N wrk processes of ``connections`` (each worker as loaded as one
    alone, and as many wrk processes as the apart control has); an experiment of S
    shards the same with min(S, masters) x the connections (each master as loaded as
    the hot experiment's: on one Redis the one process, on a cluster each master of a
    member); experiments spread over S masters with S x the connections (each master as
    loaded as one Redis; the many and share rows of target 3 compare the same N, so
    they are not scaled by it)."""
    if load == "hot":
        return workers, connections
    if load == "sharded":
        return workers, connections * min(shards, masters)
    if load == "many":
        return 1, connections * masters
    return 1, connections


def _serve(stack: ExitStack, serve: list[str], env: dict[str, str],
           workers: int) -> tuple[str, int]:
    port = free_port()
    return _start(stack, [*serve, "--port", str(port), "--workers", str(workers)], env, port,
                  "/readyz")


def _apart(run: Callable[..., Row], store: Store, n: int, serve: list[str], env: dict[str, str],
           spread: str, lag: int, connections: int) -> Row:
    """What ``n`` workers on one hot experiment are compared with (target 1): ``n``
    services of one worker, each on an experiment of its own and driven by a wrk of its
    own with ``connections``, as each worker of the hot row is: the same processes on
    the same cores with the same load each, and no experiment shared."""
    with ExitStack() as serving:
        served = []
        for i in range(n):
            url, pid = _serve(serving, serve, env, 1)
            served.append(Served(url, pid, [_experiment(
                url, TOKEN, store.hot(f"apart{i}x{n}"), spread=spread, world=World(),
                max_stale_rewards=lag)]))
        return run(n, served, connections, load="apart")


def _load(store: Store, load: str, url: str, n: int, spread: str, shards: int, lag: int,
          share: int | None) -> list[tuple[str, str]]:
    """The experiments (id, key) of ``load``, created for the run of ``n`` workers, each
    with ``lag`` as its max_stale_rewards (``share``: the master of a share)."""
    if load == "hot":
        return [_experiment(url, TOKEN, store.hot(str(n)), spread=spread, world=World(),
                            max_stale_rewards=lag)]
    if load == "sharded":
        return [_experiment(url, TOKEN, store.sharded(str(n)), spread=spread, world=World(),
                            shards=shards, max_stale_rewards=lag)]
    return [_experiment(url, TOKEN, i, spread=spread, world=World(), max_stale_rewards=lag)
            for i in store.place(f"{n}{'' if share is None else f's{share}'}", share)]


class Reading(NamedTuple):
    """Which figure of issue 27's targets 1 and 3: its target, store, workers and what it
    is read against ("one worker", "apart", "one Redis", "cheapest share")."""

    target: int
    store: str
    workers: int
    against: str


class Figure(NamedTuple):
    """A figure of a run, the least it may be, and why the run may not count: errors in
    a row it is read from (an error reply is a cheap pair), one worker doing the work of
    several (the kernel's spread of wrk's connections), or the hot experiment's Redis
    above 80 % busy at the rate read (the rules of BENCHMARKS.md §41 then repeat the run)."""

    value: float
    at_least: float
    doubts: tuple[str, ...] = ()


# The figure each target is decided by (§41, §45); the others are reported beside it.
DECIDING = frozenset({"apart", "cheapest share"})


def ratios(rows: list[Row]) -> dict[Reading, Figure]:
    """Issue 27's targets 1 and 3 by CPU per pair, for a machine with a core per process.

    Target 1: N workers on one hot experiment serve N x 1e6 / (worker µs per pair at N)
    pairs/s with a core each; against N x the one-worker figure that is (µs at 1) / (µs at
    N), to be >= 0.8, with the experiment's Redis below 80 % busy at that rate; and against
    the apart control, (its µs) / (µs at N). Target 3: with many experiments, the busiest
    master saturates first, at 1e6 / (its µs per pair of the aggregate) pairs/s; against
    one master's ceiling (1e6 / its µs per pair serving one Redis's load, or the cheapest
    master serving a master's share alone, or the masters' mean) that is to be >= 0.8 x
    the masters.
    """
    found: dict[Reading, Figure] = {}
    for store in dict.fromkeys(row.store for row in rows):
        hot = {r.workers: r for r in rows if r.store == store and r.load == "hot"}
        apart = {r.workers: r for r in rows if r.store == store and r.load == "apart"}
        for n, row in sorted(hot.items()) if 1 in hot else ():
            doubts = tuple(_doubts(row) + (_doubts(hot[1]) if n > 1 else []))
            found[Reading(1, store, n, "one worker")] = Figure(
                hot[1].worker_us_per_pair / row.worker_us_per_pair, 0.8, doubts)
            if n in apart:
                found[Reading(1, store, n, "apart")] = Figure(
                    apart[n].worker_us_per_pair / row.worker_us_per_pair, 0.8,
                    tuple(_doubts(row) + _doubts(apart[n])))
    single = {r.workers: r for r in rows if r.store == "one Redis" and r.load == "many"}
    for row in rows:
        masters = len(row.redis_us_per_pair)
        if row.load != "many" or masters < 2:
            continue
        # (0.8 * 3 computes as 2.4000000000000004, which an exact 2.40 would miss)
        busiest, at_least = max(row.redis_us_per_pair), masters * 4 / 5
        if row.workers in single:
            found[Reading(3, row.store, row.workers, "one Redis")] = Figure(
                sum(single[row.workers].redis_us_per_pair) / busiest, at_least,
                tuple(_doubts(row) + _doubts(single[row.workers])))
        # The same processes, one master busy at a time: each master's own µs a pair.
        shares = [r for r in rows if r.load == "share" and r.store == row.store
                  and r.workers == row.workers]
        if shares:
            alone = [max(r.redis_us_per_pair) for r in shares]
            doubts = tuple(_doubts(row) + [d for r in shares for d in _doubts(r)])
            found[Reading(3, row.store, row.workers, "cheapest share")] = Figure(
                min(alone) / busiest, at_least, doubts)
            # The masters are alike: their mean is a ceiling too, which the scatter of
            # each share's joining does not pull down as it does the least (§51).
            found[Reading(3, row.store, row.workers, "mean share")] = Figure(
                statistics.fmean(alone) / busiest, at_least, doubts)
    return found


def _doubts(row: Row) -> list[str]:
    """Why a run whose figure is read from ``row`` may not count."""
    doubts = [f"{row.errors} errors"] if row.errors else []
    if row.load == "hot" and row.workers > 1 and row.busiest_share > 1.5 / row.workers:
        doubts.append(f"one worker did {row.busiest_share:.0%} of the work")
    if row.load == "hot":
        rate = row.workers * 1e6 / row.worker_us_per_pair
        if rate * max(row.redis_us_per_pair) / 1e6 > BUSY_LIMIT:
            doubts.append("its Redis over 80 % busy")
    return doubts


def scaling(rows: list[Row]) -> list[str]:
    """Issue 27's targets 1 and 3 by CPU per pair (:func:`ratios`), a line each, with the
    rates, the busy shares and the flags they are read with."""
    found = ratios(rows)
    lines = []
    for reading, figure in found.items():
        if reading.target != 1 or reading.against != "one worker":
            continue
        store, n = reading.store, reading.workers
        row = next(r for r in rows if r.store == store and r.load == "hot" and r.workers == n)
        one = next(r for r in rows if r.store == store and r.load == "hot" and r.workers == 1)
        rate = n * 1e6 / row.worker_us_per_pair
        busy = rate * max(row.redis_us_per_pair) / 1e6  # its master's
        unspread = n > 1 and row.busiest_share > 1.5 / n
        apart = found.get(Reading(1, store, n, "apart"))
        control = "" if apart is None else (
            f"; against {n} one-worker services apart on the same cores {apart.value:.2f}"
            + _flags(next(r for r in rows if r.store == store and r.load == "apart"
                          and r.workers == n)))
        lines.append(f"- target 1, {store}, {n} worker{'s' if n > 1 else ''}: "
                     f"{rate:,.0f} pairs/s with a core each, {figure.value:.2f} x N x "
                     f"one worker's (>= 0.8){control}, its Redis {busy:.0%} busy "
                     "(< 80%)" + _flags(row) + (_flags(one) if n > 1 else "")
                     + (f"; NOT SPREAD: one worker did {row.busiest_share:.0%} of the "
                        "work, run it again" if unspread else ""))
    for row in rows:
        masters = len(row.redis_us_per_pair)
        if row.load != "many" or masters < 2:
            continue
        single = found.get(Reading(3, row.store, row.workers, "one Redis"))
        ceilings = [f"{single.value:.2f} x one master's ceiling (one Redis)"] if single else []
        cheapest = found.get(Reading(3, row.store, row.workers, "cheapest share"))
        mean = found.get(Reading(3, row.store, row.workers, "mean share"))
        if cheapest and mean:
            alone = [max(r.redis_us_per_pair) for r in rows if r.load == "share"
                     and r.store == row.store and r.workers == row.workers]
            ceilings.append(f"{cheapest.value:.2f} x its cheapest master's serving a "
                            f"master's share alone ({' / '.join(f'{u:.1f}' for u in alone)} "
                            f"µs a pair; {mean.value:.2f} x their mean)")
        if ceilings:
            lines.append(f"- target 3, {row.store}, {row.workers} worker"
                         f"{'s' if row.workers > 1 else ''}, {row.experiments} experiments: "
                         f"the busiest master saturates at {'; at '.join(ceilings)} "
                         f"(>= 0.8 x {masters} = {0.8 * masters:.1f})" + _flags(row))
    return lines


_AGAINST = {"one worker": "N x one worker's", "apart": "the apart control",
            "one Redis": "one master's ceiling (one Redis)",
            "cheapest share": "its cheapest master's serving a master's share alone",
            "mean share": "its masters' mean serving a master's share alone"}


def medians(runs: list[list[Row]]) -> list[str]:
    """Each figure of :func:`ratios` over the runs, as the rules of BENCHMARKS.md §41 and
    §45 read three: its median (of the figures as printed, to two decimals), each run's
    beside it ("n/a" where a run lacks it), and for the figure a target is decided by
    (:data:`DECIDING`) whether the median is at least what the target asks; unless a run
    may not count (:class:`Figure`), which the rules then repeat: named instead."""
    per_run = [ratios(rows) for rows in runs]
    lines = []
    for reading in dict.fromkeys(r for found in per_run for r in found):
        if reading.target == 1 and reading.workers == 1:
            continue  # one worker against itself: 1 by definition
        figures = [found.get(reading) for found in per_run]
        present = [f for f in figures if f is not None]
        median = statistics.median(round(f.value, 2) for f in present)
        each = " / ".join("n/a" if f is None else f"{f.value:.2f}" for f in figures)
        doubtful = [f"run {i + 1}: {', '.join(f.doubts)}" for i, f in enumerate(figures)
                    if f is not None and f.doubts]
        if doubtful:
            verdict = "REPEAT (" + "; ".join(doubtful) + ")"
        elif reading.against not in DECIDING:
            verdict = "reported beside the deciding figure"
        else:
            verdict = "holds" if median >= present[0].at_least else "NOT held"
        lines.append(
            f"- target {reading.target}, {reading.store}, {reading.workers} worker"
            f"{'s' if reading.workers > 1 else ''}, against {_AGAINST[reading.against]}: "
            f"median {median:.2f} over {len(present)} run{'s' if len(present) > 1 else ''} "
            f"({each}; >= {present[0].at_least:.1f}): {verdict}")
    return lines


def _flags(row: Row) -> str:
    return f" (ERRORS: {row.errors} replies were not 2xx)" if row.errors else ""


def _line(row: Row) -> str:
    redis_us = " / ".join(f"{u:.1f}" for u in row.redis_us_per_pair)
    busy = " / ".join(f"{b:.0%}" for b in row.busy)
    load = f"{row.experiments}" + (f" ({row.shards} shards)" if row.shards > 1 else "") + (
        {"apart": " (a service each)",
         "share": " (a master's share, alone on master "
                  f"{row.redis_us_per_pair.index(max(row.redis_us_per_pair))})"}.get(row.load, ""))
    control = row.load in ("apart", "share")  # what they would need means nothing
    needs = ["" if control else row.needs(rate) for rate in TARGETS]
    return (f"| {row.store} | {row.workers} | {load} | {row.connections} | "
            f"{row.pairs_per_second:,.0f} | "
            f"{row.p50_ms:.1f} | {row.p99_ms:.1f} | {row.worker_us_per_pair:.0f} | "
            f"{row.busiest_share:.0%} | "
            f"{row.scripts_per_pair:.2f} | {row.script_us_per_pair:.1f} | "
            f"{row.whole_reads_per_pair:.3f} | {redis_us} | "
            f"{busy} | {needs[0]} | {needs[1]} | {row.errors} |")


HEADER = ("| store | workers | experiments | connections | pairs/s | p50 ms | p99 ms "
          "| worker CPU µs/pair | busiest worker's share "
          "| scripts/pair | script µs/pair | whole reads/pair | Redis µs/pair, by master "
          "| busy, by master | for 10k pairs/s | for 100k pairs/s | errors |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--experiments", type=int, default=6,
                        help="experiments of the 'many' load (a wrk thread each)")
    parser.add_argument("--duration", type=int, default=8, help="seconds per run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--cluster", action="store_true",
                        help="also on a local 3-master Redis Cluster")
    parser.add_argument("--spread", choices=("paper", "default"), default="default")
    parser.add_argument("--shards", type=int, default=3, help="of the sharded hot experiment")
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    parser.add_argument("--pin", action="store_true",
                        help="the workers on one core of their own, the rest on the others: "
                             "their CPU per pair without wrk's and Redis's contention")
    parser.add_argument("--max-stale-rewards", type=int, default=0, metavar="L",
                        help="every experiment's: how many rewards its decisions may miss")
    parser.add_argument("--replica", action="store_true",
                        help="the cluster's first master with a replica (its writes wait "
                             "for it): the cost of that durability")
    parser.add_argument("--by-script", action="store_true",
                        help="also Redis's time by script and command (SLOWLOG at 0 µs: it "
                             "costs Redis about half again, so read the shares)")
    parser.add_argument("--runs", type=int, default=1,
                        help="the whole measurement this many times, back to back; then each "
                             "target's figure as a median over them (BENCHMARKS.md §41, §45)")
    args = parser.parse_args()
    if args.cluster and args.experiments % 3:
        parser.error("--experiments must be a multiple of the cluster's 3 masters")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if len(set(args.workers)) < len(args.workers) or min(args.workers) < 1:
        parser.error("--workers: each count once, each at least 1 (a run's figures are "
                     "read by it)")
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at the start; "
          f"stochastic LinReBoot ({args.spread} spread), K = 100, d = 20, every decision "
          f"rewarded, max_stale_rewards {args.max_stale_rewards}; {args.duration} s a run, "
          f"{args.connections} connections a worker or a master (the table: each row's in "
          "all)\n")
    runs = []
    for run in range(args.runs):
        if args.runs > 1:
            print(f"Run {run + 1} of {args.runs} (load average {os.getloadavg()[0]:.2f}):\n")
        print(HEADER, flush=True)
        runs.append(measure(args.workers, args.experiments, args.duration, args.connections,
                            args.cluster, args.spread, args.shards, tuple(args.loads),
                            args.pin, args.max_stale_rewards, args.replica, args.by_script))
        print("\nBy CPU per pair (a core for each process; BENCHMARKS.md §12):")
        print("\n".join(scaling(runs[-1])) + "\n", flush=True)
    if args.runs > 1:
        print(f"Over the {args.runs} runs, each figure's median (each run's beside it):")
        print("\n".join(medians(runs)))


if __name__ == "__main__":
    main()
