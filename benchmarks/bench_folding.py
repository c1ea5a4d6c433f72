"""What adding the recorded outcomes costs a worker, and Redis, per choose + reward.

Usage::

    python -m benchmarks.bench_folding [--blocks 5] [--pairs 320] [--every 8 16 32]

Rewards are recorded as outcomes that the workers add to the sums
(``service.folding``): every view a worker reads adds the outcomes waiting,
and every ``FOLD_EVERY`` rewards one worker writes the sums back. This
starts an embedded Redis and one :class:`service.experiments.ExperimentService`
(a worker, without HTTP), creates LinReBoot experiments with K = 100 arms,
d = 20 (stochastic and covariates), and plays choose + reward pairs, each
decision rewarded before the next (every decision then reads new
statistics: the most folding a worker does). For each value of
``FOLD_EVERY`` (in alternate blocks) it reports, per pair:

* the worker's CPU time (``time.process_time``), and the part of it spent
  adding outcomes to views (``fold_into``) and writing sums back (the
  fold's Python work, ``folded_blobs``);
* Redis's time (INFO commandstats, every command, the folds' included).

Medians over blocks; one process, one machine load for all values.

With ``--stale``, instead: two workers, decisions by the first and their
rewards by the second, so that each of the first's decisions is found stale
by ``decide.lua``; in alternate blocks the stale reply carries what the
first worker's view lacks (the counters and the outcomes not yet in the
sums, as the service does) or the whole statistics (as it did: the worker's
``held`` withheld), FOLD_EVERY 16. Per pair: the process's CPU (both
workers) and Redis's time.
"""

from __future__ import annotations

import argparse
import asyncio
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis

import service.decisions as decisions
import service.definition as definition
import service.folding as folding
import service.views as views_module
from loadtest.environments import Environment, make_spec
from loadtest.server import free_port
from policies import Setting
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.embedded import EmbeddedRedis
from service.experiments import ExperimentService
from service.settings import Settings
from service.store import Store

ARMS, DIM = 100, 20
SETTINGS: tuple[Setting, ...] = ("stochastic", "covariates")


class _Clock:
    """CPU seconds spent inside wrapped functions."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - start
        return timed


def _world(setting: Setting) -> Environment:
    """The paper's world for ``setting`` (K = 100, d = 20)."""
    return Environment(make_spec(setting, DIM, n_arms=ARMS), [np.random.default_rng(1)])


async def _pairs(service: ExperimentService, experiment_id: str, key: str, world: Environment,
                 pairs: int) -> None:
    """Choose + reward pairs, rewards from the world, each decision rewarded before the next."""
    for _ in range(pairs):
        contexts = world.contexts()  # (1, K, d)
        context = None if world.spec.setting == "stochastic" else tuple(contexts[0, 0])
        decision = await service.choose(experiment_id, ChooseRequest(context=context), key)
        value = float(world.rewards(contexts, np.array([int(decision.arm_id[1:])]))[0])
        await service.reward(experiment_id, [(decision.decision_id, value)], key)


def _redis_usec(client: redis.Redis) -> dict[str, float]:
    stats: dict[str, dict[str, float]] = client.info("commandstats")  # type: ignore[assignment]
    return {name: float(s["usec"]) for name, s in stats.items()}


async def _stale_pairs(first: ExperimentService, second: ExperimentService, experiment_id: str,
                       key: str, world: Environment, pairs: int) -> None:
    """Decisions by ``first``, rewarded by ``second``: each next decision is found stale."""
    for _ in range(pairs):
        contexts = world.contexts()
        context = None if world.spec.setting == "stochastic" else tuple(contexts[0, 0])
        decision = await first.choose(experiment_id, ChooseRequest(context=context), key)
        value = float(world.rewards(contexts, np.array([int(decision.arm_id[1:])]))[0])
        await second.reward(experiment_id, [(decision.decision_id, value)], key)


async def _stale_run(blocks: int, pairs: int) -> None:
    decide = Store.decide

    async def whole(self: Store, *args: Any, **kwargs: Any) -> Any:
        return await decide(self, *args, **{**kwargs, "held": None})

    variants = {"what the view lacks": decide, "the whole statistics": whole}
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), port=free_port()).start()
        client = redis.Redis.from_url(embedded.url)
        first = await ExperimentService.open(Settings(redis_url=embedded.url))
        second = await ExperimentService.open(Settings(redis_url=embedded.url))
        rows: dict[tuple[Setting, str], list[tuple[float, float]]] = {}
        try:
            keys, worlds = await _experiments(first)
            for block in range(blocks):
                names = list(variants) if block % 2 == 0 else list(variants)[::-1]
                for name in names:
                    Store.decide = variants[name]  # type: ignore[method-assign]
                    for setting in SETTINGS:
                        client.config_resetstat()
                        start = time.process_time()
                        await _stale_pairs(first, second, setting, keys[setting],
                                           worlds[setting], pairs)
                        cpu = time.process_time() - start
                        usec = _redis_usec(client)
                        redis_all = sum(v for k, v in usec.items() if k != "cmdstat_config")
                        rows.setdefault((setting, name), []).append(
                            (1e6 * cpu / pairs, redis_all / pairs))
        finally:
            Store.decide = decide  # type: ignore[method-assign]
            await first.close()
            await second.close()
            client.close()
            embedded.stop()
    print(f"Per choose + reward pair, K = {ARMS}, d = {DIM}, decisions by one worker and "
          f"rewards by another (medians of {blocks} blocks of {pairs} pairs)\n")
    print("| setting | the stale reply carries | CPU µs (both workers) | Redis µs |")
    print("|---|---|---:|---:|")
    for (setting, name), values in rows.items():
        cpu, redis_all = (statistics.median(column) for column in zip(*values, strict=True))
        print(f"| {setting} | {name} | {cpu:.0f} | {redis_all:.0f} |")


async def _experiments(
    service: ExperimentService,
) -> tuple[dict[str, str], dict[Setting, Environment]]:
    """One LinReBoot experiment per setting (its id the setting's name), warmed up."""
    keys: dict[str, str] = {}
    worlds = {setting: _world(setting) for setting in SETTINGS}
    for setting, world in worlds.items():
        features = world.contexts()[0] if setting == "stochastic" else None
        arms = tuple(ArmSpec(f"a{k}", None if features is None else tuple(features[k]))
                     for k in range(ARMS))
        _, keys[setting] = await service.create(ExperimentSpec(
            id=setting, setting=setting, dim=DIM, arms=arms))
        await _pairs(service, setting, keys[setting], world, 200)  # warm-up
    return keys, worlds


async def _run(blocks: int, pairs: int, everies: list[int]) -> None:
    in_views, in_folds = _Clock(), _Clock()
    views_module.fold_into = definition.fold_into = in_views.wrap(folding.fold_into)
    decisions.folded_blobs = in_folds.wrap(folding.folded_blobs)
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), port=free_port()).start()
        client = redis.Redis.from_url(embedded.url)
        service = await ExperimentService.open(Settings(redis_url=embedded.url))
        try:
            keys, worlds = await _experiments(service)
            rows: dict[tuple[Setting, int], list[tuple[float, float, float, float]]] = {}
            for block in range(blocks):
                for every in everies if block % 2 == 0 else everies[::-1]:
                    decisions.FOLD_EVERY = every
                    for setting in SETTINGS:
                        client.config_resetstat()
                        in_views.seconds = in_folds.seconds = 0.0
                        start = time.process_time()
                        await _pairs(service, setting, keys[setting], worlds[setting], pairs)
                        cpu = time.process_time() - start
                        usec = _redis_usec(client)
                        redis_all = sum(v for k, v in usec.items() if k != "cmdstat_config")
                        rows.setdefault((setting, every), []).append((
                            1e6 * cpu / pairs, 1e6 * in_views.seconds / pairs,
                            1e6 * in_folds.seconds / pairs, redis_all / pairs))
        finally:
            await service.close()
            client.close()
            embedded.stop()
    print(f"Per choose + reward pair, K = {ARMS}, d = {DIM}, one worker in-process "
          f"(medians of {blocks} blocks of {pairs} pairs)\n")
    print("| setting | FOLD_EVERY | worker CPU µs | adding to views µs | writing back µs "
          "| Redis µs (all commands) |")
    print("|---|---:|---:|---:|---:|---:|")
    for (setting, every), values in rows.items():
        cpu, views, folds, redis_all = (statistics.median(column)
                                        for column in zip(*values, strict=True))
        print(f"| {setting} | {every} | {cpu:.0f} | {views:.0f} ({views / cpu:.0%}) "
              f"| {folds:.0f} ({folds / cpu:.0%}) | {redis_all:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=320, help="choose + reward pairs per block")
    parser.add_argument("--every", type=int, nargs="+", default=[8, 16, 32],
                        help="values of FOLD_EVERY to compare")
    parser.add_argument("--stale", action="store_true",
                        help="instead, two workers: what a stale reply carries")
    args = parser.parse_args()
    if args.stale:
        asyncio.run(_stale_run(args.blocks, args.pairs))
    else:
        asyncio.run(_run(args.blocks, args.pairs, args.every))


if __name__ == "__main__":
    main()
