"""Redis's CPU per /choose and per /reward at d = 5, 10, 20: this checkout against a revision.

Usage::

    python -m benchmarks.bench_redis_cpu --against REV [--blocks 8] [--calls 1000]
    python -m benchmarks.bench_redis_cpu --breakdown D [--blocks 8] [--calls 1000]

Starts an embedded Redis (AOF on, as the service's) and calls the scripts as
the service does, on experiments as created over HTTP (stochastic
LinReBoot, K = 100 arms, the decision log on, no default reward):

* ``/choose``: ``decide.lua`` recording a decision made from a current view
  (the path of every /choose whose worker's statistics are current);
* ``/reward``: ``reward.lua`` with one decision;
* ``batch of 100``: ``reward.lua`` with 100 decisions, per reward;
* ``joined call of 16``: ``reward.lua`` with 16 decisions, as the service
  joins single rewards of one batch under load (``service.store.Joining``:
  16 or 32 a call under ``bench_service``'s pairs load), per reward with its
  share of the folds;
* ``/choose, joined call of 16``: ``decide.lua`` with 16 decisions, as the service
  joins the decisions of one experiment in a batch, per decision (a revision that
  does not join: one call each);
* ``folds, per outcome``: where rewards are recorded as outcomes that the
  workers add to the sums (``service.folding``), what writing the sums back
  costs (``fold_read.lua``, an HMGET and ``fold.lua``, all Redis commands
  counted), done after every ``FOLD_EVERY`` single rewards as the service
  does, per outcome (a version that adds in ``reward.lua`` has none); the
  batch row includes its batch's fold;
* ``/reward + its share of the folds``: what one reward costs Redis in all.

Each figure is Redis's own ``usec_per_call`` of EVALSHA (INFO commandstats,
reset before each kind of call), so the client's cost is not in it; the two
versions run in alternate blocks so that both see the same machine load,
and the report gives the median over blocks (and the lowest block), and
their ratio as the median of the blocks' ratios. ``--breakdown D`` times
instead the scripts cut short before each step, to show where a call's
time goes. One
Redis runs one script at a time on one core, so 1e6 / µs is what one shard
applies per second at most: its ceiling.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import redis

from loadtest.faults import redis_process
from loadtest.server import free_port
from policies import paper_config
from policies.state import Axis
from service import keys, store
from service.codec import recipe, stored_recipe
from service.embedded import EmbeddedRedis
from service.folding import (
    FOLD_EVERY,
    FOLD_LIMIT,
    fields_of,
    folded_blobs,
    split_records,
)

DIMS = (5, 10, 20)
_HELD_REWARD = "ARGV[2]  how many outcomes the caller holds"
BATCH = 100
JOINED = 16  # rewards in a joined call (service.store.Joining) under bench_service's load
_LOG = {"log_max_entries": "100000", "log_max_age_seconds": "604800"}
KINDS = ("/choose", "/reward", f"batch of {BATCH}, per reward", "folds, per outcome",
         "/reward + its share of the folds",
         f"joined call of {JOINED}, per reward + its share of the folds",
         f"/choose, joined call of {JOINED}, per decision")


@dataclass
class Version:
    name: str
    decide: str  # script SHAs
    reward: str
    fold_read: str | None  # None: the version adds in reward.lua
    fold: str | None
    recorded: bool  # reward.lua takes the outcomes key (KEYS[4]): records outcomes
    held: bool = False  # decide.lua takes the outcomes the caller's view holds (ARGV[10])
    record: bool = False  # decide.lua takes the decision's record, one string (ARGV[11])
    request: bool = False  # decide.lua takes a caller's request id's fields (ARGV[12..14])
    command: str = "EVALSHA"  # or FCALL: decide and reward name functions (Redis 7)
    reward_held: bool = False  # reward.lua takes what the caller holds (ARGV[2])
    ranked: bool = False  # decide.lua takes k (ARGV[15]) and each slot's log field count
    one_entry: bool = False  # ... and, since a ranking is one log entry, no count
    reward_shards: bool = False  # reward.lua takes the caller's shard count (ARGV[3])
    parts: bool = False  # decide.lua takes decisions as parts (service.store.Joining)
    times: dict[tuple[int, str], list[float]] = field(default_factory=dict)


def _read(rev: str | None, name: str) -> str | None:
    """A script as of ``rev`` (None: this checkout); None where it has no such script."""
    if rev is None:
        path = resources.files("service").joinpath("lua", f"{name}.lua")
        return path.read_text() if path.is_file() else None
    shown = subprocess.run(["git", "show", f"{rev}:service/lua/{name}.lua"],
                           capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def _reward_script(rev: str | None) -> str:
    """reward.lua after its shared chunks (damaged.lua where the revision has it;
    outcomes.lua, sums.lua before it; tail.lua since it sends a worker the records it
    lacks)."""
    shared = _read(rev, "outcomes") or _read(rev, "sums")
    reward = _read(rev, "reward")
    assert shared and reward, f"no reward.lua at {rev}"
    tail = _read(rev, "tail") if _HELD_REWARD in reward else ""
    return ((_read(rev, "damaged") or "") + shared + (tail or "") + (_read(rev, "recent") or "")
            + reward)


def _decide_script(rev: str | None) -> str:
    """decide.lua after its shared chunks (damaged.lua, tail.lua, recent.lua, where the
    revision has them)."""
    decide = _read(rev, "decide")
    assert decide, f"no decide.lua at {rev}"
    return "".join(_read(rev, chunk) or "" for chunk in ("damaged", "tail", "recent")) + decide


def _version(client: redis.Redis, name: str, rev: str | None) -> Version:
    def load(script: str | None) -> str | None:
        return None if script is None else str(client.script_load(script))
    reward_text = _reward_script(rev)
    decide_text = _decide_script(rev)
    decide, reward = load(decide_text), load(reward_text)
    assert decide and reward
    fold = _read(rev, "fold")  # after tail.lua since a fold keeps a tail of its records
    fold = fold and ((_read(rev, "tail") or "") if "FOLDED_TAIL" in fold else "") + fold
    return Version(name, decide, reward, load(_read(rev, "fold_read")), load(fold),
                   "lrb:{exp}:outcomes" in reward_text, "ARGV[10] how many outcomes" in decide_text,
                   "ARGV[11] the pending record" in decide_text,
                   "ARGV[14] with KEYS[7]" in decide_text, reward_held=_HELD_REWARD in reward_text,
                   ranked="ARGV[15] k, the slots recorded" in decide_text,
                   one_entry=("ARGV[15 + k ..]  field, value" in decide_text
                              or "ARGV[16 ..]  field, value" in decide_text),
                   reward_shards="ARGV[3]  the shard count" in reward_text,
                   parts="ARGV ends: count 1, ..., count n, n" in decide_text)


def _functions(client: redis.Redis, scripts: Version) -> Version:
    """This checkout's decide and reward as the service calls them on Redis 7: functions."""
    library = store.library()
    client.execute_command("FUNCTION", "LOAD", "REPLACE", library.code)
    return replace(scripts, name="this, functions", decide=library.functions[scripts.decide],
                   reward=library.functions[scripts.reward], command="FCALL", times={})


def _experiment(version: Version, dim: int) -> str:
    return f"{version.name}-d{dim}"


def _create(client: redis.Redis, experiment: str, dim: int, recorded: bool = True) -> None:
    """The experiment's meta as service.experiments writes it (``recorded``: as this
    version does; else as a version that added outcomes in reward.lua did)."""
    config = paper_config("linreboot", "stochastic", dim)
    axes: tuple[Axis, ...] = ("model", "arm")
    recipes = {axis: stored_recipe(config, axis) if recorded else recipe(config, axis)
               for axis in axes}
    client.hset(keys.meta(experiment), mapping={
        "incarnation": "inc", "key_hash": "h", "version": "1",
        "model_recipe": recipes["model"], "arm_recipe": recipes["arm"], **_LOG})
    if recorded:
        client.set(keys.outcomes(experiment), "")
        client.hset(keys.meta(experiment), "context_bytes", str(8 * dim))


def _context(dim: int) -> bytes:
    return np.random.default_rng(dim).normal(size=dim).astype("<f8").tobytes()


def _decision_record(dim: int) -> bytes:
    """As service.decisions._slots writes it."""
    return b"model\narm:a17\na17\n1\n0\n1767225600.123456\n0.0123\n" + _context(dim)


def _decision_fields(dim: int) -> dict[str, str | bytes]:
    """As a version with decision hashes wrote them (the context in 64-byte chunks)."""
    x = _context(dim)
    chunks = [x[i:i + 64] for i in range(0, len(x), 64)]
    return {"arm": "a17", "model_field": "model", "arm_field": "arm:a17",
            "x_chunks": str(len(chunks)), **{f"x:{i}": c for i, c in enumerate(chunks, 1)},
            "version": "1", "rewards_seen": "0", "status": "pending",
            "created_at": "1767225600.123456"}


def _logged(decision_id: str, dim: int) -> list[str | bytes]:
    """The decision's log entry, as service.experiments writes it (K = 100)."""
    entry: dict[str, str | bytes] = {
        "type": "decision", "id": decision_id, "arm": "a17", "x": _context(dim),
        "version": "1", "rewards_seen": "0", "eligible": "0-99", "propensity": "0.0123"}
    return [item for pair in entry.items() for item in pair]


def _decide_args(version: Version, experiment: str, dim: int, decision_id: str) -> list[Any]:
    e = experiment
    if version.parts:  # a call of one part: its arguments' count and 1 at the end
        part = ["inc", "", "", "", "0", 3600, 0, 3600, "", _decision_record(dim), "", "", "",
                1, *_logged(decision_id, dim)]
        return [8, keys.meta(e), keys.stats(e), keys.decision(e, decision_id), keys.pending(e),
                keys.log(e), keys.outcomes(e), keys.request(e, decision_id),
                keys.decision(e, keys.slot_id(decision_id, 0)), "h", *part, len(part), 1]
    # (a version before outcomes were recorded ignores the last key)
    keyset = [keys.meta(e), keys.stats(e), keys.decision(e, decision_id), keys.pending(e),
              keys.log(e), keys.outcomes(e)]
    fields = _decision_fields(dim)
    held = [""] if version.held else []  # the outcomes the caller's view holds: unknown
    fixed = [len(keyset), *keyset, "h", "inc", "", "", "", "0", 3600, 0, 3600, *held]
    no_request = ["", "", ""] if version.request else []  # the service's id, not the caller's
    if version.ranked:  # one slot (and, before one_entry, its log field count)
        logged = _logged(decision_id, dim)
        fixed[0] = len(keyset) + 1
        fixed.insert(len(keyset) + 1, keys.request(e, decision_id))
        count = [] if version.one_entry else [len(logged)]
        return [*fixed, _decision_record(dim), *no_request, 1, *count, *logged]
    if version.record:
        return [*fixed, _decision_record(dim), *no_request, *_logged(decision_id, dim)]
    return [*fixed, len(fields), *(item for pair in fields.items() for item in pair),
            *_logged(decision_id, dim)]


def _reward_args(version: Version, experiment: str, decision_ids: list[str]) -> list[Any]:
    e = experiment
    recorded = [keys.outcomes(e)] if version.recorded else []
    keyset = [keys.meta(e), keys.stats(e), keys.log(e), *recorded,
              *(keys.decision(e, i) for i in decision_ids)]
    held = [""] if version.reward_held else []  # what the caller holds: unknown
    routed = ["1"] if version.reward_shards else []  # (unsharded)
    return [len(keyset), *keyset, "h", *held, *routed, *("0.5" for _ in decision_ids)]


def _timed(client: redis.Redis, sha: str, calls: list[list[Any]], command: str = "EVALSHA"
           ) -> float:
    """Redis's µs per EVALSHA (or FCALL of a function) over ``calls`` (pipelines of 100)."""
    client.config_resetstat()
    for start in range(0, len(calls), 100):
        with client.pipeline(transaction=False) as pipe:
            for args in calls[start: start + 100]:
                pipe.execute_command(command, sha, *args)
            replies = pipe.execute(raise_on_error=False)
        assert all(not isinstance(r, Exception) for r in replies), replies[0]
    stats: dict[str, dict[str, float]] = client.info("commandstats")  # type: ignore[assignment]
    return float(stats[f"cmdstat_{command.lower()}"]["usec_per_call"])


def _block(client: redis.Redis, version: Version, dim: int, calls: int) -> None:
    experiment = _experiment(version, dim)
    joined_count = JOINED * max(1, calls // (2 * JOINED))
    ids = [secrets.token_hex(16)
           for _ in range(calls + BATCH * (calls // BATCH) + joined_count)]
    single, batched = ids[:calls], ids[calls:len(ids) - joined_count]
    joined_ids = ids[len(ids) - joined_count:]
    choose = _timed(client, version.decide,
                    [_decide_args(version, experiment, dim, i) for i in ids[:calls]],
                    version.command)
    # The others' decisions, joined JOINED a call where the version joins them.
    others = [_decide_args(version, experiment, dim, i) for i in ids[calls:]]
    together = ([store._joined_decisions(others[at: at + JOINED])
                 for at in range(0, len(others), JOINED)] if version.parts else others)
    decided = _timed(client, version.decide, together, version.command) * len(together) / len(
        others)
    # As the service calls them: a fold after every FOLD_EVERY single rewards,
    # and after each batch (it crosses a multiple of FOLD_EVERY).
    rewards, folds, folded = 0.0, 0.0, 0
    for start in range(0, len(single), FOLD_EVERY):
        group = single[start: start + FOLD_EVERY]
        rewards += _timed(client, version.reward,
                          [_reward_args(version, experiment, [i]) for i in group],
                          version.command) * len(group)
        spent, count = _timed_folds(client, version, experiment, dim)
        folds, folded = folds + spent, folded + count
    batch = 0.0
    for start in range(0, len(batched), BATCH):
        calls_ = [_reward_args(version, experiment, batched[start: start + BATCH])]
        batch += _timed(client, version.reward, calls_, version.command) + _timed_folds(
            client, version, experiment, dim)[0]
    joined = 0.0
    for start in range(0, len(joined_ids), FOLD_EVERY):  # a fold after FOLD_EVERY outcomes
        group = joined_ids[start: start + FOLD_EVERY]
        calls_ = [_reward_args(version, experiment, group[at: at + JOINED])
                  for at in range(0, len(group), JOINED)]
        joined += (_timed(client, version.reward, calls_, version.command) * len(calls_)
                   + _timed_folds(client, version, experiment, dim)[0])
    reward, fold = rewards / len(single), folds / max(folded, 1)
    figures = (choose, reward, batch / len(batched), fold, reward + fold,
               joined / len(joined_ids), decided)
    for kind, value in zip(KINDS, figures, strict=True):
        version.times.setdefault((dim, kind), []).append(value)
    with client.pipeline(transaction=False) as pipe:  # keep the memory flat over blocks
        for i in ids:
            pipe.unlink(keys.decision(experiment, i))
        pipe.unlink(keys.pending(experiment), keys.log(experiment))
        pipe.execute()


def _timed_folds(
    client: redis.Redis, version: Version, experiment: str, dim: int
) -> tuple[float, int]:
    """Redis's µs for folding every outcome waiting, as ``Store.fold`` does (fold_read.lua,
    HMGET, fold.lua), and how many it folded; (0, 0) for a version without folds."""
    if version.fold_read is None or version.fold is None:
        return 0.0, 0
    config = paper_config("linreboot", "stochastic", dim)
    keyset = [keys.meta(experiment), keys.stats(experiment), keys.outcomes(experiment)]
    client.config_resetstat()
    reply: list[Any] = client.evalsha(version.fold_read, len(keyset), *keyset)  # type: ignore[assignment]
    incarnation, seen, outcomes = reply
    records, length = split_records(outcomes, FOLD_LIMIT)
    # (none: the rewards were refused, their arguments behind reward.lua's)
    assert records, "no outcome recorded by the rewards timed"
    if records:
        fields = fields_of(records)
        blobs: list[bytes | None] = client.hmget(keys.stats(experiment), fields)  # type: ignore[assignment]
        written = folded_blobs(config, fields, [b or None for b in blobs], records)
        pairs = [item for pair in written.items() for item in pair]
        assert client.evalsha(version.fold, len(keyset), *keyset, incarnation, seen,
                              len(records), length, *pairs) == 1
    stats: dict[str, dict[str, float]] = client.info("commandstats")  # type: ignore[assignment]
    spent = sum(float(s["usec"]) for name, s in stats.items() if name != "cmdstat_config")
    return spent, len(records)


def _report(versions: list[Version], blocks: int) -> None:
    print(f"Redis µs per call (median of {blocks} blocks; lowest block in brackets; "
          "this / other: median of the blocks' ratios)\n")
    print("| d | request | " + " | ".join(v.name for v in versions)
          + " | this / other | shard ceiling, this (per s) |")
    print("|---|---|" + "---:|" * len(versions) + "---:|---:|")
    for dim in DIMS:
        for kind in KINDS:
            cells, medians = [], []
            for v in versions:
                times = v.times[(dim, kind)]
                medians.append(statistics.median(times))
                cells.append(f"{medians[-1]:.1f} ({min(times):.1f})")
            # Block i of each version ran back to back: the median of their
            # ratios follows the machine's load better than a ratio of medians.
            pairs = list(zip(versions[0].times[(dim, kind)], versions[-1].times[(dim, kind)],
                             strict=True))
            ratio = (f"{statistics.median(a / b for a, b in pairs):.2f}"
                     if all(b > 0 for _, b in pairs) else "")
            ceiling = f"{1e6 / medians[0]:,.0f}" if medians[0] > 0 else ""
            print(f"| {dim} | {kind} | " + " | ".join(cells) + f" | {ratio} | {ceiling} |")
    print()
    this = versions[0]
    for dim in DIMS:
        single = statistics.median(this.times[(dim, KINDS[4])])
        batch = (statistics.median(this.times[(dim, KINDS[2])])
                 + statistics.median(this.times[(dim, KINDS[3])]))
        choose = statistics.median(this.times[(dim, KINDS[0])])
        joined = statistics.median(this.times[(dim, KINDS[5])])
        decided = statistics.median(this.times[(dim, KINDS[6])])
        print(f"d = {dim}: a reward in a batch of {BATCH} costs {batch / single:.0%} of a "
              f"single one (each with its share of the folds); one shard applies "
              f"{1e6 / (choose + single):,.0f} choose+reward pairs/s; a pair "
              f"{choose + single:.1f} µs, {choose + joined:.1f} with its reward in a joined "
              f"call of {JOINED}, {decided + joined:.1f} with its decision in one too")


# Where a call's time goes: the script cut short (``do return ... end``)
# before each of these lines, one cut per row, each row timed in the same
# blocks as the whole script; a row's figure is what the script has done up
# to its cut.
_CUT = "do return {'cut'} end\n"
_REWARD_CUTS = (
    ("outcomes.lua's definitions", "-- Apply a batch of rewards"),
    ("+ the meta read", "local incarnation = meta[1]"),
    ("+ the decision read", "local now = nil"),
    ("+ the record made, the decision marked, its log entry", "finish(KEYS[4])"),
    ("+ the counters", "  mark_minute(KEYS[2], clock(), counters[4], counters[5], rewards"),
    ("+ the minute's mark (recent.lua: once a minute)", "if duplicates > 0 then"),
)
_DECIDE_CUTS = (
    ("+ the meta read, the parts' arguments", "-- What the parts share:"),
    ("+ the counters read", "local function write_counters()"),
    ("+ the part: existence, number, clock, record, minute's mark, log entry",
     "write_counters()"),
    ("+ the counters written", "if #entries == 0 then"),
    ("+ the pending list and its TTL", "-- The log expires log_max_age_seconds"),
)


def _cut(script: str, line: str) -> str:
    at = script.index("\n" + line) + 1  # ValueError when a script no longer has the line
    return script[:at] + _CUT + script[at:]


def _breakdown(client: redis.Redis, dim: int, blocks: int, calls: int) -> None:
    """Print Redis µs per call of each cut of decide.lua and of reward.lua (one decision)."""
    decide, reward = _decide_script(None), _reward_script(None)
    rows = [("decide.lua", "empty script", "return {'cut'}"),
            *(("decide.lua", label, _cut(decide, line)) for label, line in _DECIDE_CUTS),
            ("decide.lua", "the whole script", decide),
            ("reward.lua", "empty script", "return {'cut'}"),
            *(("reward.lua", label, _cut(reward, line)) for label, line in _REWARD_CUTS),
            ("reward.lua", "the whole script", reward)]
    full_decide = str(client.script_load(decide))
    shas = [str(client.script_load(script)) for _, _, script in rows]
    this = _version(client, "this", None)
    times: list[list[float]] = [[] for _ in rows]
    for block in range(blocks):
        order = range(len(rows)) if block % 2 == 0 else reversed(range(len(rows)))
        for i in order:
            experiment = f"cut{i}-d{dim}"
            if not client.exists(keys.meta(experiment)):
                _create(client, experiment, dim)
                # a reward applied in full first: the cuts unpack real sums, not none
                client.evalsha(full_decide, *_decide_args(this, experiment, dim, "first"))
                client.evalsha(shas[-1], *_reward_args(this, experiment, ["first"]))
            ids = [secrets.token_hex(16) for _ in range(calls)]
            if rows[i][0] == "decide.lua":
                times[i].append(_timed(client, shas[i],
                                       [_decide_args(this, experiment, dim, d) for d in ids]))
            else:
                _timed(client, full_decide, [_decide_args(this, experiment, dim, d) for d in ids])
                times[i].append(_timed(client, shas[i],
                                       [_reward_args(this, experiment, [d]) for d in ids]))
            with client.pipeline(transaction=False) as pipe:
                for d in ids:
                    pipe.unlink(keys.decision(experiment, d))
                pipe.unlink(keys.pending(experiment), keys.log(experiment))
                pipe.execute()
    print(f"Where the time goes at d = {dim}: Redis µs per call of the script cut short "
          f"(median of {blocks} blocks; lowest block in brackets)\n")
    # The steps from the lowest blocks: on a shared machine the least disturbed
    # block is the best guess at a step's own cost (medians carry the load).
    print("| script | done before the cut | µs per call | step (lowest blocks) |")
    print("|---|---|---:|---:|")
    previous = 0.0
    for (script, label, _), row in zip(rows, times, strict=True):
        step = "" if label == "empty script" else f"{min(row) - previous:+.1f}"
        print(f"| {script} | {label} | {statistics.median(row):.1f} ({min(row):.1f}) | {step} |")
        previous = min(row)
    per_mark, grown = _recent_alone(client, blocks)
    print(f"\nrecent.lua's mark of a new minute alone: {per_mark:.2f} µs (20,000 marks in one "
          "script, median of the blocks: no call's overhead), made once a minute by an "
          f"experiment's first call that counts; its fields add {grown} bytes to a stats hash "
          "(MEMORY USAGE)")


def _recent_alone(client: redis.Redis, blocks: int) -> tuple[float, int]:
    """Redis µs of one ``mark_minute`` of a new minute (recent.lua) on a stats hash of 50
    fields, timed in a loop inside one script (the cut steps above are too noisy to show
    a µs); and the bytes its fields add to the hash."""
    loop = (_read(None, "recent") or "") + (
        "local t = tonumber(redis.call('TIME')[1])\n"
        "for i = 1, tonumber(ARGV[1]) do mark_minute(KEYS[1], t + 60 * i, nil, i, i, i) end\n"
        "return 0")
    client.hset("bench:recent", mapping={f"model:{i}": "x" * 100 for i in range(50)})
    before = int(client.memory_usage("bench:recent", samples=0) or 0)  # type: ignore[arg-type]
    times = []
    for _ in range(blocks):
        client.config_resetstat()
        client.eval(loop, 1, "bench:recent", 20_000)
        stats: dict[str, dict[str, float]] = client.info("commandstats")  # type: ignore[assignment]
        times.append(float(stats["cmdstat_eval"]["usec"]) / 20_000)
    grown = int(client.memory_usage("bench:recent", samples=0) or 0) - before  # type: ignore[arg-type]
    client.delete("bench:recent")
    return statistics.median(times), grown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="also time the scripts as of this git revision")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=1000, help="single rewards per block")
    parser.add_argument("--breakdown", type=int, metavar="D",
                        help="instead, where a call's time goes at dimension D (script cuts)")
    parser.add_argument("--redis-server", metavar="PATH",
                        help="a redis-server 7 (e.g. Debian's /usr/bin/redis-server) instead of "
                             "the embedded 6.2: this checkout as functions and as scripts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, _server(Path(tmp), args.redis_server) as url:
        client = redis.Redis.from_url(url)
        server: dict[str, Any] = client.info("server")  # type: ignore[assignment]
        print(f"Redis {server['redis_version']}\n")
        if args.breakdown:
            _breakdown(client, args.breakdown, args.blocks, args.calls)
            return
        versions = [_version(client, "this", None)]
        if args.redis_server:
            versions.insert(0, _functions(client, versions[0]))
        if args.against:
            versions.append(_version(client, args.against, args.against))
        for v in versions:
            for dim in DIMS:
                _create(client, _experiment(v, dim), dim, v.recorded)
        for block in range(args.blocks):
            for v in versions if block % 2 == 0 else versions[::-1]:
                for dim in DIMS:
                    _block(client, v, dim, args.calls)
        _report(versions, args.blocks)


@contextlib.contextmanager
def _server(directory: Path, binary: str | None) -> Iterator[str]:
    """The embedded Redis (AOF on, as the service's), or ``binary`` with the same settings."""
    if binary is None:
        embedded = EmbeddedRedis(directory, port=free_port()).start()
        try:
            yield embedded.url
        finally:
            embedded.stop()
        return
    with redis_process(directory, free_port(), binary) as server:
        yield server.url


if __name__ == "__main__":
    main()
