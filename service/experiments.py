"""Experiments: the service's domain API, composed of four rooms.

* :mod:`service.views`: each worker's views of the statistics and their catch-up;
* :mod:`service.decisions`: choosing arms and applying rewards exactly once;
* :mod:`service.lifecycle`: creating, changing and deleting experiments;
* :mod:`service.decision_log`: reading the decision log.

:class:`ExperimentService` opens the store (or an embedded Redis), runs the
default-reward sweeper, and passes each call to its room. The math is
:mod:`policies` with a batch of one; the state is read from and added to Redis
through :class:`service.store.Store`, the one seam to Redis.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

from service.decision_log import DecisionLog
from service.decisions import Decisions
from service.definition import IdempotencyKey
from service.domain import (
    ArmSpec,
    ChooseRequest,
    Decision,
    ExperimentSpec,
    ExperimentView,
    LogEntry,
    RankedDecision,
    RewardOutcome,
)
from service.embedded import EmbeddedRedis
from service.errors import StartupError, StoreUnavailable
from service.lifecycle import LIVE_SETTINGS, Lifecycle
from service.settings import Settings
from service.store import Store
from service.sweeper import Sweeper
from service.views import Views

__all__ = ["LIVE_SETTINGS", "ExperimentService"]


async def _connect(url: str, settings: Settings) -> Store:
    """A store on ``url`` that has answered a PING; else one line naming REDIS_URL."""
    store: Store | None = None
    try:
        store = await Store.connect(url, settings.redis_timeout_seconds, settings.redis_cluster)
        await store.ping()
    except StoreUnavailable as exc:
        if store is not None:
            await store.close()
        cause = exc.__cause__ or exc
        # (a timeout's text is empty: its class names it)
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise StartupError(
            f"REDIS_URL: Redis at {_public_url(url)} does not answer ({reason}): start it, "
            "or fix REDIS_URL", exit_code=3,
        ) from None
    return store


def _public_url(url: str) -> str:
    """``url`` without its credentials, for messages."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"


class ExperimentService:
    """The service's domain API; the app's routes call exactly these methods."""

    def __init__(self, store: Store, settings: Settings, embedded: EmbeddedRedis | None = None):
        self._store = store
        self._settings = settings
        self._embedded = embedded
        self.views = Views(store, settings)
        self.decisions = Decisions(store, settings, self.views)
        self.lifecycle = Lifecycle(store, settings, self.views)
        self.log = DecisionLog(store, settings, self.views)
        self.persistence_warnings: list[str] = []
        self.upgraded: list[str] = []  # experiments brought up to date at start-up
        self.upgrade_failures: list[str] = []  # "id: reason" for those that could not be
        # Told how many default rewards each sweep applied (the app's metrics).
        self.defaults_observer: Callable[[int], None] | None = None
        self._sweeper = Sweeper(store, settings.sweep_interval_seconds,
                                self._defaults_applied, settings.default_reward_grace_seconds)

    @classmethod
    async def open(cls, settings: Settings) -> ExperimentService:
        """Connect to ``settings.redis_url``, or start an embedded Redis without one.

        Raises
        ------
        StartupError
            One line, when the embedded Redis cannot start or Redis does not answer.
        """
        embedded = None
        url = settings.redis_url
        if url is None:
            embedded = EmbeddedRedis(settings.data_dir).start()  # this process owns it
            url = embedded.url
        try:
            store = await _connect(url, settings)
        except BaseException:
            if embedded is not None:
                embedded.stop()
            raise
        service = cls(store, settings, embedded)
        store.quiet_dropped_nodes()  # a cluster's failovers: a warning, not error storms
        try:
            service.persistence_warnings = await service._store.persistence_warnings()
            service.upgraded, service.upgrade_failures = \
                await service.lifecycle.upgrade_stored()
        except StoreUnavailable as exc:  # e.g. out of memory while upgrading
            await service.close()
            raise StartupError(f"REDIS_URL: Redis at {_public_url(url)} failed during start-up "
                               f"({exc}): fix Redis, then start again", exit_code=3) from None
        except BaseException:
            await service.close()
            raise
        return service

    @staticmethod
    async def check_store(settings: Settings) -> None:
        """Start-up check of ``settings.redis_url``: :class:`StartupError` unless Redis answers."""
        assert settings.redis_url is not None
        await (await _connect(settings.redis_url, settings)).close()

    def start_sweeper(self) -> None:
        """Apply default rewards in the background, until :meth:`close` (see service.sweeper)."""
        self._sweeper.start()

    async def sweep(self) -> int:
        """Apply the default rewards that are due now, once (what the background sweeper
        does every tick); how many were applied."""
        return (await self._sweeper.sweep()).defaulted

    async def close(self) -> None:
        """Stop the sweeper, close the connections; stop the embedded Redis if this
        service started it."""
        try:
            await self._sweeper.stop()
            await self.decisions.drain()
            await self._store.close()
        finally:
            if self._embedded is not None:
                self._embedded.stop()

    @property
    def store_is_cluster(self) -> bool:
        """Whether the statistics live in a Redis Cluster (else one Redis)."""
        return self._store.cluster

    async def ping(self) -> None:
        await self._store.ping()

    async def ready(self) -> None:
        """Redis answers and accepts writes; StoreFull while it is out of memory."""
        await self._store.ready()

    async def memory(self) -> builtins.list[tuple[str, int, int]]:
        """Each Redis primary's (name, used, max) memory in bytes (max 0: no limit)."""
        return await self._store.memory()

    async def _defaults_applied(self, experiment_id: str, counter: int, defaulted: int) -> None:
        await self.decisions.defaults_applied(experiment_id, counter, defaulted)
        if self.defaults_observer is not None:
            self.defaults_observer(defaulted)

    # -- the rooms' API, as the app's routes call it ---------------------------

    async def create(self, spec: ExperimentSpec, idempotency: IdempotencyKey | None = None
                     ) -> tuple[ExperimentView, str]:
        return await self.lifecycle.create(spec, idempotency)

    async def get(self, experiment_id: str) -> ExperimentView:
        return await self.lifecycle.get(experiment_id)

    async def list(
        self, limit: int = 100, after: str | None = None
    ) -> tuple[builtins.list[ExperimentView], str | None]:
        return await self.lifecycle.list(limit, after)

    async def delete(self, experiment_id: str) -> None:
        await self.lifecycle.delete(experiment_id)

    async def add_arms(self, experiment_id: str, arms: Sequence[ArmSpec],
                       idempotency: IdempotencyKey | None = None) -> ExperimentView:
        return await self.lifecycle.add_arms(experiment_id, arms, idempotency)

    async def update_settings(
        self, experiment_id: str, changes: Mapping[str, object]
    ) -> ExperimentView:
        return await self.lifecycle.update_settings(experiment_id, changes)

    async def rotate_key(self, experiment_id: str,
                         idempotency: IdempotencyKey | None = None) -> str:
        return await self.lifecycle.rotate_key(experiment_id, idempotency)

    async def revoke_previous_key(self, experiment_id: str) -> bool:
        return await self.lifecycle.revoke_previous_key(experiment_id)

    async def retire_arms(self, experiment_id: str, arm_ids: Sequence[str]) -> ExperimentView:
        return await self.lifecycle.retire_arms(experiment_id, arm_ids)

    async def choose(
        self, experiment_id: str, request: ChooseRequest, api_key: str | None = None
    ) -> Decision:
        return await self.decisions.choose(experiment_id, request, api_key)

    async def rank(
        self, experiment_id: str, request: ChooseRequest, api_key: str | None = None
    ) -> RankedDecision:
        return await self.decisions.rank(experiment_id, request, api_key)

    async def reward(
        self, experiment_id: str, items: Sequence[tuple[str, float]], api_key: str | None = None
    ) -> builtins.list[RewardOutcome]:
        return await self.decisions.reward(experiment_id, items, api_key)

    async def fold_if_due(self, experiment_id: str, counter: int, recorded: int) -> None:
        await self.decisions.fold_if_due(experiment_id, counter, recorded)

    async def drain(self) -> None:
        """Wait for the background folds started so far (tests that read the stored sums
        after a reward do)."""
        await self.decisions.drain()

    async def read_log(
        self, experiment_id: str, after: str | None = None, limit: int = 100
    ) -> tuple[builtins.list[LogEntry], str | None]:
        return await self.log.read(experiment_id, after, limit)

    async def read_latest_log(
        self, experiment_id: str, since: float, limit: int, max_bytes: int
    ) -> tuple[builtins.list[LogEntry], bool]:
        return await self.log.latest(experiment_id, since, limit, max_bytes)
