"""Redis's cost of recording a decision and applying its reward: the scripts' server time.

Usage::

    python -m benchmarks.bench_decide [--against REV] [--blocks 16] [--calls 3000]

Starts an embedded Redis and calls ``service/lua/decide.lua`` directly (the
'recorded' path: a fresh decision id per call, pipelines of 100) with the
fields of a d = 20 decision, then ``reward.lua`` once per decision, in
blocks; each block's figure is Redis's own ``usec_per_call`` of EVALSHA
(INFO commandstats, reset per block), so the client's cost is not in it.

Variants, run in alternate blocks so that all see the same machine load
(the report gives medians over blocks):

* ``this, no log``: this checkout's scripts, an experiment without a
  decision log or default reward;
* ``this, log``: with the decision log (the default for experiments created
  over HTTP);
* ``this, log + default``: with the log and a default reward (the decision
  is kept for the grace period and listed for the sweeper);
* ``this, forgetting``: no log, no default, ``discount`` 0.99 (each blob
  aged to the decision's number before the reward is added);
* ``REV`` (with ``--against REV``): the scripts as they were at that git
  revision, on an experiment without either.

Then it prints the memory per decision (MEMORY USAGE after 10,000
decisions): of the pending list, of the decision log (a decision entry, and
with its reward's entry), and of a decision record.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import redis

from loadtest.server import free_port
from policies import PolicyConfig, paper_config
from service import keys
from service.codec import stored_recipe
from service.embedded import EmbeddedRedis

_DIM = 20
_CONFIG = paper_config("linreboot", "stochastic", _DIM)
_FORGETTING = paper_config("linreboot", "stochastic", _DIM, discount=0.99)
_FIELDS: dict[str, str | bytes] = {  # as a version with decision hashes wrote them
    "arm": "a17", "model_field": "model", "arm_field": "arm:a17", "x_chunks": "3",
    "x:1": b"\x00\x00\x00\x00\x00\x00\xe0?" * 8, "x:2": b"\x00\x00\x00\x00\x00\x00\xf0?" * 8,
    "x:3": b"\x00\x00\x00\x00\x00\x00\xe0\xbf" * 4, "version": "1",
    "rewards_seen": "0", "status": "pending", "created_at": "1767225600.123456",
}
_X = b"".join(v for k, v in _FIELDS.items() if isinstance(v, bytes))
# decide.lua's ARGV[11] since a decision is one string (service.decisions._slots)
_RECORD = b"model\narm:a17\na17\n1\n0\n1767225600.123456\n0.0123456789\n" + _X


def _logged(decision_id: str) -> list[str | bytes]:
    """The decision's log entry, as service.decisions._slots writes it (K = 100)."""
    entry: dict[str, str | bytes] = {
        "type": "decision", "id": decision_id, "arm": "a17", "x": _X, "version": "1",
        "rewards_seen": "0", "eligible": "0-99", "propensity": "0.0123456789"}
    return [item for pair in entry.items() for item in pair]


@dataclass
class Variant:
    name: str
    experiment: str
    decide: str  # script SHA
    reward: str
    new_interface: bool  # decide.lua's ARGV[9] grace and ARGV[10] h; reward.lua's log key
    recorded: bool = False  # reward.lua takes the outcomes key (service.folding)
    held: bool = False  # decide.lua takes the outcomes the caller's view holds (ARGV[10])
    record: bool = False  # decide.lua takes the decision's record, one string (ARGV[11])
    reward_held: bool = False  # reward.lua takes what the caller holds (ARGV[2])


def _read(rev: str | None, name: str) -> str:
    if rev is None:
        path = resources.files("service").joinpath("lua", f"{name}.lua")
        return path.read_text() if path.is_file() else ""
    shown = subprocess.run(["git", "show", f"{rev}:service/lua/{name}.lua"],
                           capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else ""


def _scripts(client: redis.Redis, rev: str | None
             ) -> tuple[str, str, bool, bool, bool, bool, bool]:
    decide = _read(rev, "tail") + _read(rev, "decide")  # its shared chunk, if it has one
    record = "ARGV[11] the pending record" in decide
    new = "ARGV[10] h" in decide or record
    # The shared chunk: outcomes.lua (sums.lua before outcomes were recorded).
    reward = _read(rev, "reward")
    held = "ARGV[2]  how many outcomes the caller holds" in reward  # and takes tail.lua
    shared = (_read(rev, "outcomes") or _read(rev, "sums")) if new else ""
    reward = shared + (_read(rev, "tail") if held else "") + reward
    shas = [client.script_load(text) for text in (decide, reward)]
    return (str(shas[0]), str(shas[1]), new, ":outcomes" in reward,
            "ARGV[10] how many outcomes" in decide, record, held)


def _create(client: redis.Redis, experiment: str, extra: dict[str, str],
            config: PolicyConfig = _CONFIG) -> None:
    client.hset(keys.meta(experiment), mapping={
        "incarnation": "inc", "key_hash": "h", "version": "1",
        "model_recipe": stored_recipe(config, "model"),
        "arm_recipe": stored_recipe(config, "arm"), **extra})


def _decide_args(v: Variant, decision_id: str) -> list[Any]:
    e = v.experiment
    keyset = [keys.meta(e), keys.stats(e), keys.decision(e, decision_id), keys.pending(e)]
    fixed: list[Any] = ["h", "inc", "", "", "", "0", 3600, 0]
    fields = [item for pair in _FIELDS.items() for item in pair]
    if not v.new_interface:
        return [4, *keyset, *fixed, *fields]
    held = [""] if v.held else []
    if v.record:
        return [5, *keyset, keys.log(e), *fixed, 3600, *held, _RECORD, *_logged(decision_id)]
    return [5, *keyset, keys.log(e), *fixed, 3600, *held, len(_FIELDS), *fields,
            *_logged(decision_id)]


def _reward_args(v: Variant, decision_id: str) -> list[Any]:
    e = v.experiment
    logged = [keys.log(e)] if v.new_interface else []
    # reward.lua takes the outcomes key since outcomes are recorded (service.folding).
    recorded = [keys.outcomes(e)] if v.recorded else []
    keyset = [keys.meta(e), keys.stats(e), *logged, *recorded, keys.decision(e, decision_id)]
    return [len(keyset), *keyset, "", *([""] if v.reward_held else []), "0.5"]


def _pipelined(client: redis.Redis, sha: str, calls: list[list[Any]]) -> list[Any]:
    replies: list[Any] = []
    for start in range(0, len(calls), 100):
        with client.pipeline(transaction=False) as pipe:
            for args in calls[start: start + 100]:
                pipe.evalsha(sha, *args)
            replies += pipe.execute()
    return replies


def _usec_per_call(client: redis.Redis) -> float:
    stats: dict[str, dict[str, float]] = client.info("commandstats")  # type: ignore[assignment]
    return float(stats["cmdstat_evalsha"]["usec_per_call"])


def _block(client: redis.Redis, v: Variant, calls: int) -> tuple[float, float]:
    ids = [secrets.token_hex(16) for _ in range(calls)]
    client.config_resetstat()
    replies = _pipelined(client, v.decide, [_decide_args(v, i) for i in ids])
    assert replies[-1][0] == b"recorded", replies[-1]
    decide = _usec_per_call(client)
    client.config_resetstat()
    replies = _pipelined(client, v.reward, [_reward_args(v, i) for i in ids])
    assert replies[-1][0] == b"applied", replies[-1]  # (then the rewards counter)
    return decide, _usec_per_call(client)


def _memory(client: redis.Redis, key: str) -> int:
    used: int = client.memory_usage(key, samples=0)  # type: ignore[assignment]
    return used


def _report_memory(client: redis.Redis, v: Variant) -> None:
    e, n = v.experiment, 10_000
    for key in (keys.pending(e), keys.log(e)):
        client.delete(key)
    ids = [secrets.token_hex(16) for _ in range(n)]
    _pipelined(client, v.decide, [_decide_args(v, i) for i in ids])
    record = statistics.mean(_memory(client, keys.decision(e, i)) for i in ids[:200])
    print(f"  {v.name}: pending list {_memory(client, keys.pending(e)) / n:.1f} bytes per "
          f"decision; a decision record {record:.0f} bytes", end="")
    if v.new_interface and client.exists(keys.log(e)):
        decided = _memory(client, keys.log(e))
        _pipelined(client, v.reward, [_reward_args(v, i) for i in ids])
        print(f"; the log {decided / n:.1f} bytes per decision, "
              f"{_memory(client, keys.log(e)) / n:.1f} with its reward", end="")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="also time the scripts as of this git revision")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3000, help="decisions per block")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), port=free_port()).start()
        try:
            client = redis.Redis.from_url(embedded.url)
            log = {"log_max_entries": "100000", "log_max_age_seconds": "604800"}
            this = _scripts(client, None)
            variants = [
                Variant("this, no log", "plain", *this),
                Variant("this, log", "logged", *this),
                Variant("this, log + default", "defaulted", *this),
                Variant("this, forgetting", "forgetting", *this),
            ]
            _create(client, "plain", {})
            _create(client, "forgetting", {"discount": repr(_FORGETTING.discount)}, _FORGETTING)
            _create(client, "logged", log)
            _create(client, "defaulted", {**log, "default_reward": "0.0"})
            if args.against:
                variants.append(Variant(args.against, "before", *_scripts(client, args.against)))
                _create(client, "before", {})
            times: dict[str, list[tuple[float, float]]] = {v.name: [] for v in variants}
            for block in range(args.blocks):
                for v in variants if block % 2 == 0 else variants[::-1]:
                    times[v.name].append(_block(client, v, args.calls))
            print(f"Redis µs per call, median of {args.blocks} blocks of {args.calls} "
                  "(lowest block in brackets):")
            for v in variants:
                decides, rewards = zip(*times[v.name], strict=True)
                print(f"  {v.name}: decide.lua {statistics.median(decides):.1f} "
                      f"({min(decides):.1f}), reward.lua {statistics.median(rewards):.1f} "
                      f"({min(rewards):.1f})")
            print("Memory, d = 20, K = 100 (MEMORY USAGE after 10,000 decisions):")
            for v in variants:
                _report_memory(client, v)
        finally:
            embedded.stop()


if __name__ == "__main__":
    main()
