"""Redis's CPU a script call against how sparsely the calls come (BENCHMARKS.md §51).

Usage::

    python -m benchmarks.bench_arrivals [--calls 3000] [--batch 3] [--gaps 0 0.5 2 5]

An embedded Redis (as the service starts it; its main thread, which runs the commands,
on one core) and this process on another: ``--calls`` calls of a small script (a hash
read, four records set and logged, a counter: the kind of work decide.lua and reward.lua
do an item) in pipelines of ``--batch``, ``--gaps`` ms between pipelines; and again with
another process on Redis's core that walks 8 MB every half millisecond (as the workers,
wrk and the other masters share a core with it in ``bench_scale``'s runs). Prints
Redis's main-thread CPU a call (INFO cpu) at each gap, and its ratio to the first gap's
in the same run.

Why it matters: ``bench_scale`` reads a master's ceiling as 1e6 / its CPU a pair,
measured below the ceiling; where the same calls cost Redis more CPU when they come
sparsely (on this 2-core machine, 1.3-1.7 x at 2 ms between pipelines: §51), a row whose
master gets fewer pipelines a second overstates its cost at saturation. Which part is
waking from idle and which is caches lost to other processes, this does not tell.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from benchmarks.bench_service import server_cpu_us
from loadtest.server import free_port
from service.embedded import EmbeddedRedis

SCRIPT = """
local read = redis.call('HMGET', KEYS[1], 'a', 'b', 'c', 'd')
for i = 1, 4 do
  redis.call('SET', KEYS[2] .. i, ARGV[1], 'EX', 60)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 1000, '*', 'x', ARGV[1])
end
redis.call('HINCRBY', KEYS[1], 'a', 1)
return 1
"""

# Another process on Redis's core: it runs a moment every half millisecond and walks 8 MB,
# until its parent is gone (a benchmark killed outright leaves no process spinning).
POLLUTER = ("import os, time\nparent = os.getppid()\nb = bytearray(8 << 20)\n"
            "while os.getppid() == parent:\n    b[::64] = b[1::64]\n    time.sleep(0.0005)")


def cpu_a_call(server: redis.Redis, calls: int, batch: int, gap_s: float) -> float:
    """Redis's CPU (µs) a call, ``calls`` calls sent ``batch`` a pipeline, ``gap_s``
    between pipelines (a spin: sleeping would wake late by more than the gap)."""
    script = server.register_script(SCRIPT)
    before = server_cpu_us(server)
    for _ in range(max(1, calls // batch)):
        pipe = server.pipeline(transaction=False)
        for _ in range(batch):
            script(keys=["h", "record:", "log"], args=["x" * 300], client=pipe)
        pipe.execute()
        until = time.perf_counter() + gap_s
        while time.perf_counter() < until:
            pass
    return (server_cpu_us(server) - before) / (max(1, calls // batch) * batch)


@contextmanager
def polluted(core: int) -> Iterator[subprocess.Popen[bytes]]:
    """Another process on ``core`` while the block runs."""
    process = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", POLLUTER])
    try:
        time.sleep(0.3)
        yield process
    finally:
        process.kill()
        process.wait()


def measure(calls: int, batch: int, gaps_ms: list[float]) -> dict[str, list[float]]:
    """Redis's CPU a call at each gap: {"quiet": [...], "shared": [...]}."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("bench_arrivals needs two cores: Redis on one, this process on another")
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp) / "redis", port=free_port()).start()
        mine = os.sched_getaffinity(0)
        server = redis.Redis.from_url(embedded.url)
        try:
            about: dict[str, int] = server.info("server")  # type: ignore[assignment]
            os.sched_setaffinity(int(about["process_id"]), {cores[0]})
            os.sched_setaffinity(0, set(cores[1:]))
            cpu_a_call(server, calls, batch, 0.0)  # warm-up
            quiet: list[float] = []
            shared: list[float] = []
            for gap in gaps_ms:  # (each gap's two figures a moment apart: no drift between)
                quiet.append(cpu_a_call(server, calls, batch, gap / 1e3))
                with polluted(cores[0]):
                    shared.append(cpu_a_call(server, calls, batch, gap / 1e3))
        finally:
            server.close()
            os.sched_setaffinity(0, mine)
            embedded.stop()
    return {"quiet": quiet, "shared": shared}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=3, help="calls a pipeline")
    parser.add_argument("--gaps", type=float, nargs="+", default=[0, 0.5, 2, 5],
                        help="ms between pipelines (the first is the baseline)")
    args = parser.parse_args()
    if args.calls < args.batch or args.batch < 1 or min(args.gaps) < 0:
        parser.error("--batch must be at least 1, --calls at least --batch, the gaps >= 0")
    found = measure(args.calls, args.batch, args.gaps)
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; {args.calls} "
          f"calls, {args.batch} a pipeline; Redis's CPU a call, µs (x the first gap's)\n")
    print("| ms between pipelines | Redis alone on its core | its core shared |")
    print("|---:|---|---|")
    quiet, shared = found["quiet"], found["shared"]
    for gap, alone, beside in zip(args.gaps, quiet, shared, strict=True):
        print(f"| {gap:g} | {alone:.1f} ({alone / quiet[0]:.2f}) | "
              f"{beside:.1f} ({beside / shared[0]:.2f}) |")


if __name__ == "__main__":
    main()
