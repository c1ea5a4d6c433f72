"""benchmarks/bench_arrivals.py measures Redis's CPU a call on a real embedded Redis, at
each gap, with its core quiet and shared, and leaves the machine as it found it."""

from __future__ import annotations

import math
import os

import pytest

from benchmarks.bench_arrivals import measure


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_redis_s_cpu_a_call_is_measured_at_each_gap_and_the_affinity_given_back() -> None:
    mine = os.sched_getaffinity(0)
    found = measure(calls=30, batch=3, gaps_ms=[0.0, 1.0])
    assert set(found) == {"quiet", "shared"}
    for figures in found.values():
        # Each gap's figure: Redis's main thread ran each script (a few µs at least).
        assert len(figures) == 2 and all(math.isfinite(f) and f > 1.0 for f in figures)
    assert os.sched_getaffinity(0) == mine  # this process no longer kept off Redis's core
