"""How long after its window a default reward lands, and what settled decisions cost.

Usage::

    python -m benchmarks.bench_defaults [--replicas 2] [--rate 200] [--seconds 20]
                                        [--window 2] [--reward-fraction 0.5]

Starts an embedded Redis and ``--replicas`` ``linreboot serve`` processes on
it (one worker each, each with its sweeper at the default
``LINREBOOT_SWEEP_INTERVAL_SECONDS``), creates an experiment with a default
reward (stochastic, K = 100, d = 20, ``--window`` s), and makes decisions at
``--rate`` a second for ``--seconds`` from this process (an in-process
service, which sweeps nothing), rewarding ``--reward-fraction`` of them at
once. When every window has ended and the sweepers had 10 s more, it reads
the decision log: each default's delay is the time of its log entry less the
end of its decision's window (decision entry time + window; both Redis's
clock, to the ms). It checks that every unrewarded decision got exactly one
default, prints the delay distribution, and the memory of a decision record
before and after it is settled (MEMORY USAGE).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import redis

from loadtest.server import server_process
from service import keys
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.embedded import EmbeddedRedis
from service.experiments import ExperimentService
from service.settings import Settings

_ID = "bench-defaults"


def _spec(window: int) -> ExperimentSpec:
    rng = np.random.default_rng(0)
    features = rng.random((100, 20))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    return ExperimentSpec(
        id=_ID, setting="stochastic", dim=20,
        arms=tuple(ArmSpec(f"a{k}", tuple(f)) for k, f in enumerate(features)),
        reward_window_seconds=window, default_reward=0.0, log_max_entries=10_000_000,
        max_stale_rewards=1_000_000,
        # The paper's spread, as BENCHMARKS.md measured it (the service's default is pooled).
        hyperparameters={"spread": "paper"})


async def _drive(service: ExperimentService, client: redis.Redis, rate: float, seconds: float,
                 reward_fraction: float) -> tuple[int, int, list[str], float]:
    """Decisions at ``rate`` a second for ``seconds``; (made, rewarded, a sample of
    unrewarded ids, their records' mean memory while pending)."""
    rng = random.Random(1)
    made = rewarded = 0
    sample: list[str] = []
    sizes: list[float] = []
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + 1 - made
        for _ in range(max(due, 0)):
            decision = await service.choose(_ID, ChooseRequest())
            made += 1
            if rng.random() < reward_fraction:
                await service.reward(_ID, [(decision.decision_id, 1.0)])
                rewarded += 1
            elif len(sample) < 200:
                sample.append(decision.decision_id)
                sizes.append(_memory(client, sample[-1:]))  # just made: pending
        await asyncio.sleep(0.005)
    return made, rewarded, sample, statistics.mean(sizes)


def _memory(client: redis.Redis, ids: list[str]) -> float:
    sizes: list[int | None] = [
        client.memory_usage(keys.decision(_ID, i), samples=0)  # type: ignore[misc]
        for i in ids]
    return statistics.mean(s for s in sizes if s)


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.array(values), q))


async def _run(url: str, args: argparse.Namespace) -> None:
    service = await ExperimentService.open(Settings(redis_url=url))
    client = redis.Redis.from_url(url)
    try:
        await service.create(_spec(args.window))
        made, rewarded, sample, pending = await _drive(service, client, args.rate, args.seconds,
                                                       args.reward_fraction)
        await asyncio.sleep(args.window + 10)
        settled = _memory(client, sample)
        log = []
        after = None
        while True:
            page, after = await service.read_log(_ID, after, limit=1000)
            log += page
            if after is None:
                break
        view = await service.get(_ID)
    finally:
        client.close()
        await service.close()
    made_at = {e.decision_id: e.time for e in log if e.type == "decision"}
    defaults = [e for e in log if e.type == "default"]
    delays = [e.time - (made_at[e.decision_id] + args.window) for e in defaults]
    once = len({e.decision_id for e in defaults}) == len(defaults) == made - rewarded
    print(f"{args.replicas} replica(s), sweep interval 1 s (0.5-1.5 s, jittered); {made} "
          f"decisions in {args.seconds:.0f} s ({made / args.seconds:.0f}/s), {rewarded} "
          f"rewarded, window {args.window} s")
    print(f"defaults: {len(defaults)} (view: defaulted {view.defaulted}, missed "
          f"{view.defaults_missed}); each unrewarded decision exactly once: {once}")
    print(f"delay after the window, s: min {min(delays):.3f}, p50 {_quantile(delays, 0.5):.3f}, "
          f"p90 {_quantile(delays, 0.9):.3f}, p99 {_quantile(delays, 0.99):.3f}, "
          f"max {max(delays):.3f}")
    print(f"decision record: {pending:.0f} bytes pending, {settled:.0f} bytes settled "
          f"(mean of {len(sample)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2, help="linreboot serve processes")
    parser.add_argument("--rate", type=float, default=200.0, help="decisions a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of decisions")
    parser.add_argument("--window", type=int, default=2, help="reward window, s")
    parser.add_argument("--reward-fraction", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp)).start()
        try:
            env = {"LINREBOOT_REDIS_URL": embedded.url, "LINREBOOT_LOG_LEVEL": "warning"}
            with contextlib.ExitStack() as stack:
                for _ in range(args.replicas):
                    stack.enter_context(server_process(env))
                asyncio.run(_run(embedded.url, args))
        finally:
            embedded.stop()


if __name__ == "__main__":
    main()
