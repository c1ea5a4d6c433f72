"""Redis's cost of recording a decision: decide.lua's server time, and the list of decisions.

Usage::

    python -m benchmarks.bench_decide [--against REV] [--blocks 16] [--calls 3000]

Starts an embedded Redis and calls ``service/lua/decide.lua`` directly (the
'recorded' path: a fresh decision id per call, pipelines of 100) with the
fields of a d = 20 decision, in blocks; each block's figure is Redis's own
``usec_per_call`` of EVALSHA (INFO commandstats, reset per block), so the
client's cost is not in it. With ``--against REV`` the script as it was at
that git revision runs in alternate blocks, so both see the same machine
load; the report gives medians over blocks. Then it prints the bytes per
decision of the experiment's pending list (MEMORY USAGE after 10,000
decisions).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import redis

from loadtest.server import free_port
from service import keys
from service.embedded import EmbeddedRedis

_EXPERIMENT = "bench"
_FIELDS: dict[str, str | bytes] = {  # as service.experiments._decision_fields writes them
    "arm": "a17", "model_field": "model", "arm_field": "arm:a17", "x_chunks": "3",
    "x:1": b"\x00" * 64, "x:2": b"\x01" * 64, "x:3": b"\x02" * 32, "version": "1",
    "rewards_seen": "0", "status": "pending", "created_at": "1767225600.123456",
}


def _record(client: redis.Redis, sha: str, calls: int) -> None:
    fields = [item for pair in _FIELDS.items() for item in pair]
    for _ in range(calls // 100):
        with client.pipeline(transaction=False) as pipe:
            for _ in range(100):
                decision = keys.decision(_EXPERIMENT, secrets.token_hex(16))
                pipe.evalsha(sha, 4, keys.meta(_EXPERIMENT), keys.stats(_EXPERIMENT), decision,
                             keys.pending(_EXPERIMENT), "h", "inc", "", "", "", "0", 3600, 0,
                             *fields)
            replies = pipe.execute()
        assert replies[-1][0] == b"recorded", replies[-1]


def _block(client: redis.Redis, sha: str, calls: int) -> float:
    client.config_resetstat()
    _record(client, sha, calls)
    stats: dict[str, dict[str, float]] = client.info("commandstats")  # type: ignore[assignment]
    return float(stats["cmdstat_evalsha"]["usec_per_call"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="also time decide.lua as of this git revision")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3000, help="decisions per block")
    args = parser.parse_args()
    scripts = {"this": resources.files("service").joinpath("lua", "decide.lua").read_text()}
    if args.against:
        scripts[args.against] = subprocess.run(
            ["git", "show", f"{args.against}:service/lua/decide.lua"],
            capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), port=free_port()).start()
        try:
            client = redis.Redis.from_url(embedded.url)
            client.hset(keys.meta(_EXPERIMENT),
                        mapping={"incarnation": "inc", "key_hash": "h", "version": "1"})
            shas: dict[str, str] = {
                name: client.script_load(text) for name, text in scripts.items()  # type: ignore[misc]
            }
            names = list(shas)
            times: dict[str, list[float]] = {name: [] for name in names}
            for block in range(args.blocks):
                for name in names if block % 2 == 0 else names[::-1]:
                    times[name].append(_block(client, shas[name], args.calls))
            for name in names:
                print(f"decide.lua ({name}): {statistics.median(times[name]):.1f} µs per "
                      f"recorded decision (median of {args.blocks} blocks; lowest "
                      f"{min(times[name]):.1f})")
            client.delete(keys.pending(_EXPERIMENT))
            _record(client, shas["this"], 10_000)
            listed: int = client.memory_usage(keys.pending(_EXPERIMENT), samples=0)  # type: ignore[assignment]
            print(f"pending list: {listed / 10_000:.1f} bytes per decision")
        finally:
            embedded.stop()


if __name__ == "__main__":
    main()
