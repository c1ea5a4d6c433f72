"""The asyncio client, on ``httpx.AsyncClient``: :class:`~linreboot.client.Client`'s
methods, awaited (see their docstrings there)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx

from linreboot.client._core import (
    DEFAULT_MAX_BATCH_REWARDS,
    ArmSpec,
    Call,
    Core,
    RewardItems,
    Vector,
)
from linreboot.client._models import (
    CreatedExperiment,
    Decision,
    Experiment,
    ExperimentPage,
    Ranking,
    RewardResult,
    ServiceStatus,
)
from linreboot.client._retry import Retry, Wait

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """A client of the linreboot service for asyncio; parameters as :class:`Client`'s,
    with ``http`` an ``httpx.AsyncClient``."""

    def __init__(self, base_url: str | None = None, *, admin_token: str | None = None,
                 api_key: str | None = None, timeout: float | httpx.Timeout = 10.0,
                 retry: Retry | None = None,
                 max_batch_rewards: int = DEFAULT_MAX_BATCH_REWARDS,
                 http: httpx.AsyncClient | None = None) -> None:
        if (base_url is None) == (http is None):
            raise ValueError("give either base_url or http (an httpx.AsyncClient with its "
                             "base_url)")
        self._core = Core(admin_token, api_key, retry or Retry(), max_batch_rewards)
        self._owns_http = http is None
        self.http = http if http is not None else httpx.AsyncClient(base_url=base_url or "",
                                                                     timeout=timeout)

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        attempts = self._core.attempts(call, self.http.timeout)
        while True:
            timeout = attempts.next_timeout() or httpx.USE_CLIENT_DEFAULT
            try:
                response = await self.http.request(call.method, call.path, json=call.body,
                                                   params=call.params, headers=call.headers,
                                                   timeout=timeout)
            except httpx.TransportError as exc:
                step = attempts.failed(exc)
            else:
                result = self._core.answered(call, attempts, response)
                if not isinstance(result, Wait):
                    return result
                step = result
            await asyncio.sleep(step.seconds)

    # -- experiments (admin token)

    async def create_experiment(
        self, experiment_id: str, *, setting: str, dim: int, arms: Sequence[ArmSpec],
        policy: str | None = None, hyperparameters: Mapping[str, bool | float | str] | None = None,
        seed: int | None = None, reward_window_seconds: int | None = None,
        max_stale_rewards: int | None = None, **fields: Any,
    ) -> CreatedExperiment:
        return await self._send(self._core.create_experiment(
            experiment_id, setting=setting, dim=dim, arms=arms, policy=policy,
            hyperparameters=hyperparameters, seed=seed,
            reward_window_seconds=reward_window_seconds, max_stale_rewards=max_stale_rewards,
            **fields))

    async def get_experiment(self, experiment_id: str) -> Experiment:
        return await self._send(self._core.get_experiment(experiment_id))

    async def list_experiments(self, limit: int = 100, after: str | None = None
                               ) -> ExperimentPage:
        return await self._send(self._core.list_experiments(limit, after))

    async def iter_experiments(self, page_size: int = 100) -> AsyncIterator[Experiment]:
        after: str | None = None
        while True:
            page = await self.list_experiments(page_size, after)
            for experiment in page.experiments:
                yield experiment
            if page.next_after is None:
                return
            after = page.next_after

    async def delete_experiment(self, experiment_id: str) -> None:
        await self._send(self._core.delete_experiment(experiment_id))

    async def add_arms(self, experiment_id: str, arms: Sequence[ArmSpec]) -> Experiment:
        return await self._send(self._core.add_arms(experiment_id, arms))

    async def retire_arms(self, experiment_id: str, arm_ids: Sequence[str]) -> Experiment:
        return await self._send(self._core.retire_arms(experiment_id, arm_ids))

    async def update_settings(self, experiment_id: str, **changes: Any) -> Experiment:
        return await self._send(self._core.update_settings(experiment_id, changes))

    async def rotate_key(self, experiment_id: str) -> str:
        return (await self._send(self._core.rotate_key(experiment_id))).api_key

    async def revoke_previous_key(self, experiment_id: str) -> bool:
        return (await self._send(self._core.revoke_previous_key(experiment_id))).revoked

    # -- decisions and rewards (the experiment's key)

    async def choose(self, experiment_id: str, *, context: Vector | None = None,
                     arm_contexts: Mapping[str, Vector] | None = None,
                     eligible: Sequence[str] | None = None,
                     excluded: Sequence[str] | None = None,
                     api_key: str | None = None, decision_id: str | None = None) -> Decision:
        return await self._send(self._core.choose(
            experiment_id, context=context, arm_contexts=arm_contexts, eligible=eligible,
            excluded=excluded, api_key=api_key, decision_id=decision_id))

    async def rank(self, experiment_id: str, k: int, *, context: Vector | None = None,
                   arm_contexts: Mapping[str, Vector] | None = None,
                   eligible: Sequence[str] | None = None,
                   excluded: Sequence[str] | None = None,
                   api_key: str | None = None, decision_id: str | None = None) -> Ranking:
        return await self._send(self._core.rank(
            experiment_id, k, context=context, arm_contexts=arm_contexts, eligible=eligible,
            excluded=excluded, api_key=api_key, decision_id=decision_id))

    async def reward(self, experiment_id: str, decision_id: str, reward: float, *,
                     api_key: str | None = None) -> RewardResult:
        return await self._send(self._core.reward(experiment_id, decision_id, reward, api_key))

    async def reward_batch(self, experiment_id: str, rewards: RewardItems, *,
                           api_key: str | None = None,
                           chunk_size: int | None = None) -> list[RewardResult]:
        results: list[RewardResult] = []
        for call in self._core.reward_batch(experiment_id, rewards, api_key, chunk_size):
            chunk: list[RewardResult] = await self._send(call)
            results.extend(chunk)
        return results

    # -- operations (no credentials)

    async def healthz(self) -> ServiceStatus:
        return await self._send(self._core.healthz())

    async def readyz(self) -> ServiceStatus:
        return await self._send(self._core.readyz())

    async def metrics(self) -> str:
        return await self._send(self._core.metrics())
