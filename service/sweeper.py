"""The sweeper: applies default rewards to decisions whose window has ended.

Every worker runs one (several replicas of the service may share a Redis);
they need no coordination, because ``settle.lua`` claims each decision
(pending -> defaulted) in the script that adds its default, so a default
counts once however many sweepers reach it. Each tick visits every
experiment with a default reward (shuffled, so that workers tend to start on
different ones), settles up to ``batch`` decisions per script call and up to
``budget`` in all, and the ticks are jittered, so that the workers' ticks do
not fall into step. A tick that fails (Redis down, out of memory) is logged
and the next one tries again: nothing is lost meanwhile, as the decisions
wait in their experiment's pending list for the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from service.errors import StoreUnavailable
from service.store import Store

logger = logging.getLogger("linreboot.sweeper")

BATCH = 256  # decisions per settle.lua call: about a reward batch's Redis time each
BUDGET = 4096  # decisions per tick and worker, so that one tick's work stays bounded
_CONCURRENT = 64  # experiments settled at once (their calls share pipelines)


@dataclass
class Swept:
    """What one tick did."""

    experiments: int = 0
    defaulted: int = 0
    missed: int = 0  # decisions that had expired before the default (the grace period passed)
    settled: int = 0  # decisions looked at: rewarded, defaulted now, or missed

    @property
    def exhausted(self) -> bool:
        return self.settled >= BUDGET


class Sweeper:
    """Runs :meth:`sweep` every ``interval`` seconds (0.5 to 1.5 times that, at random)."""

    def __init__(
        self, store: Store, interval: float,
        applied: Callable[[str, int, int], Awaitable[None]] | None = None,
        grace_seconds: int = 3600,
    ) -> None:
        self._store = store
        self._grace_seconds = grace_seconds  # LINREBOOT_DEFAULT_REWARD_GRACE_SECONDS
        # Called after each call that applied defaults: (experiment, defaulted
        # counter, defaults applied): the caller's views are behind by as many, and
        # its sums may be due to be written back (service.folding).
        self._applied = applied
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._random = random.Random()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def sweep(self) -> Swept:
        """One tick: settle the due decisions of every experiment with a default reward."""
        ids = await self._store.default_reward_ids()
        self._random.shuffle(ids)
        swept = Swept(experiments=len(ids))
        for start in range(0, len(ids), _CONCURRENT):
            if swept.exhausted:
                break
            group = ids[start: start + _CONCURRENT]
            results = await asyncio.gather(*(self._settle(i, swept) for i in group),
                                           return_exceptions=True)
            for experiment_id, result in zip(group, results, strict=True):
                if isinstance(result, StoreUnavailable):
                    raise result
                if isinstance(result, Exception):  # a bug: the other experiments go on
                    logger.error("default rewards of experiment %s failed", experiment_id,
                                 exc_info=result)
        return swept

    async def _settle(self, experiment_id: str, swept: Swept) -> None:
        """Settle one experiment's due decisions, a batch per call, within the tick's budget."""
        entries: list[str] = []
        while True:
            wanted = max(0, min(BATCH, BUDGET - swept.settled - len(entries)))
            reply = await self._store.settle(experiment_id, entries, wanted,
                                             self._grace_seconds)
            swept.settled += len(entries)
            if reply is None:  # deleted meanwhile
                return
            swept.defaulted += reply.defaulted
            swept.missed += reply.missed
            if reply.defaulted and self._applied is not None:
                await self._applied(experiment_id, reply.counter, reply.defaulted)
            entries = reply.due
            if not entries:
                return

    async def _run(self) -> None:
        failing = False  # logged once when the ticks start failing, once when they recover
        me = asyncio.current_task()
        while True:
            if me is not None and me.cancelling():
                # stop() asked, but the cancellation did not reach us as CancelledError
                # (a Redis client may turn it into a connection error): stop anyway,
                # or stop() and the event loop's shutdown would wait for ever.
                return
            await asyncio.sleep(self._interval * self._random.uniform(0.5, 1.5))
            try:
                swept = await self.sweep()
            except StoreUnavailable as exc:  # the next tick tries again
                if not failing:
                    logger.warning("default rewards wait: %s", exc)
                failing = True
                continue
            except Exception:  # a bug: keep sweeping the experiments that work
                logger.exception("default rewards: the sweep failed")
                continue
            if failing:
                logger.warning("default rewards are applied again")
                failing = False
            if swept.missed:
                logger.warning(
                    "%d decision(s) could not get their default reward (expired: the service "
                    "was stopped for longer than the grace period; or a damaged record)",
                    swept.missed,
                    extra={"fields": {"defaults_missed": swept.missed}},
                )
