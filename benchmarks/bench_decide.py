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

The scripts' arguments are :mod:`benchmarks.bench_redis_cpu`'s (one
reading of each revision's interface, kept with the service's).

Then it prints the memory per decision (MEMORY USAGE after 10,000
decisions): of the pending list, of the decision log (a decision entry, and
with its reward's entry), and of a decision record.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis

from benchmarks.bench_redis_cpu import (
    Version,
    _create,
    _decide_args,
    _reward_args,
    _timed,
    _version,
)
from loadtest.server import free_port
from policies import paper_config
from service import keys
from service.codec import stored_recipe
from service.embedded import EmbeddedRedis

_DIM = 20
_FORGETTING = paper_config("linreboot", "stochastic", _DIM, discount=0.99)


@dataclass
class Variant:
    name: str
    experiment: str
    scripts: Version


def _setup(client: redis.Redis, v: Variant, meta: dict[str, str], unset: tuple[str, ...] = ()
           ) -> None:
    """The variant's experiment: as the service creates one, with ``meta`` changed."""
    _create(client, v.experiment, _DIM, recorded=v.scripts.recorded)
    if unset:
        client.hdel(keys.meta(v.experiment), *unset)
    if meta:
        client.hset(keys.meta(v.experiment), mapping=meta)


def _block(client: redis.Redis, v: Variant, calls: int) -> tuple[float, float]:
    ids = [secrets.token_hex(16) for _ in range(calls)]
    decide = _timed(client, v.scripts.decide,
                    [_decide_args(v.scripts, v.experiment, _DIM, i) for i in ids])
    reward = _timed(client, v.scripts.reward,
                    [_reward_args(v.scripts, v.experiment, [i]) for i in ids])
    return decide, reward


def _memory(client: redis.Redis, key: str) -> int:
    used: int = client.memory_usage(key, samples=0)  # type: ignore[assignment]
    return used


def _report_memory(client: redis.Redis, v: Variant) -> None:
    e, n = v.experiment, 10_000
    for key in (keys.pending(e), keys.log(e)):
        client.delete(key)
    ids = [secrets.token_hex(16) for _ in range(n)]
    _timed(client, v.scripts.decide, [_decide_args(v.scripts, e, _DIM, i) for i in ids])
    record = statistics.mean(_memory(client, keys.decision(e, i)) for i in ids[:200])
    print(f"  {v.name}: pending list {_memory(client, keys.pending(e)) / n:.1f} bytes per "
          f"decision; a decision record {record:.0f} bytes", end="")
    if client.exists(keys.log(e)):
        decided = _memory(client, keys.log(e))
        _timed(client, v.scripts.reward, [_reward_args(v.scripts, e, [i]) for i in ids])
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
            this = _version(client, "this", None)
            no_log = ("log_max_entries", "log_max_age_seconds")
            variants = [Variant("this, no log", "plain", this),
                        Variant("this, log", "logged", this),
                        Variant("this, log + default", "defaulted", this),
                        Variant("this, forgetting", "forgetting", this)]
            _setup(client, variants[0], {}, no_log)
            _setup(client, variants[1], {})
            _setup(client, variants[2], {"default_reward": "0.0"})
            _setup(client, variants[3], {
                "discount": repr(_FORGETTING.discount),
                "model_recipe": stored_recipe(_FORGETTING, "model"),
                "arm_recipe": stored_recipe(_FORGETTING, "arm")}, no_log)
            if args.against:
                variants.append(Variant(args.against, "before",
                                        _version(client, args.against, args.against)))
                _setup(client, variants[-1], {}, no_log)
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
            print(f"Memory, d = {_DIM}, K = 100 (MEMORY USAGE after 10,000 decisions):")
            for v in variants:
                _report_memory(client, v)
        finally:
            embedded.stop()


if __name__ == "__main__":
    main()
