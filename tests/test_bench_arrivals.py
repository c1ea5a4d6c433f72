"""benchmarks/bench_arrivals.py measures Redis's CPU a call on a real embedded Redis, at
each gap, with its core quiet and shared, and leaves no process behind."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from benchmarks.bench_arrivals import POLLUTER, measure, polluted

two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


def _gone(pid: int, within: float = 5.0) -> bool:
    """The process has exited within ``within`` s (reaped, or a zombie nobody reaps)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@two_cores
def test_redis_s_cpu_a_call_is_measured_at_each_gap_and_the_affinity_given_back() -> None:
    mine = os.sched_getaffinity(0)
    found = measure(calls=30, batch=3, gaps_ms=[0.0, 1.0])
    assert set(found) == {"quiet", "shared"}
    for figures in found.values():
        # Each gap's figure: Redis's main thread ran each script (a few µs at least).
        assert len(figures) == 2 and all(math.isfinite(f) and f > 1.0 for f in figures)
    assert os.sched_getaffinity(0) == mine  # this process no longer kept off Redis's core


@two_cores
def test_the_other_process_runs_on_redis_s_core_only_while_the_block_runs() -> None:
    core = sorted(os.sched_getaffinity(0))[0]
    with polluted(core) as process:
        assert process.poll() is None
        assert os.sched_getaffinity(process.pid) == {core}  # (after the block's 0.3 s)
    assert process.poll() is not None  # stopped and reaped


def test_the_other_process_stops_when_the_benchmark_is_killed_outright() -> None:
    # A parent that starts it and is then killed (SIGKILL: no finally runs).
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"p = subprocess.Popen([sys.executable, '-c', {POLLUTER!r}])\n"
                               "print(p.pid, flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    orphan = int(parent.stdout.readline())
    assert not _gone(orphan, within=0.3)  # it runs while its parent lives
    parent.kill()
    parent.wait()
    assert _gone(orphan)
