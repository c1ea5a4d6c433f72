"""Replay the paper's environments against a running service over HTTP.

One experiment per repetition; every round each repetition asks ``/choose``
and reports the environment's reward to ``/reward``, through
:class:`linreboot.client.AsyncClient`. The environments and
seeds are those of the in-process simulator, and regret comes from the
environment's true means, so both drivers write the same results format.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from linreboot.client import AsyncClient, Decision, Ranking
from loadtest.environments import Environment, split_rngs
from loadtest.simulate import (
    Cell,
    Played,
    cell_seed,
    decision_seed,
    examination,
    examined,
    ranking_noise,
    regret_of,
    slot_weights,
)
from policies import HYPERPARAMETERS

Progress = Callable[[int], None]
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


class ReplayError(RuntimeError):
    """The service answered something a correct service would not."""


def require_loopback(url: str, allow_remote: bool) -> None:
    """Replays send many requests: only to this machine unless explicitly allowed."""
    host = urlsplit(url).hostname or ""
    if host not in _LOOPBACK and not host.startswith("127.") and not allow_remote:
        raise ValueError(f"refusing to replay against non-loopback host {host!r} "
                         "(pass --allow-remote if you mean it)")


@dataclass(frozen=True)
class Limits:
    """Bounds of one replay: requests in flight, total requests, wall time."""

    concurrency: int = 64
    max_requests: int = 2_000_000
    max_seconds: float = 3_600.0


@dataclass
class _Experiment:
    id: str
    api_key: str


def experiment_spec(cell: Cell, env: Environment, rep: int, seed: int) -> dict[str, Any]:
    """``create_experiment``'s keyword arguments for repetition ``rep`` of ``cell``."""
    n_arms = env.spec.n_arms
    features = env.arm_features if cell.setting == "stochastic" else None
    hyper: dict[str, Any] = dict(cell.overrides)
    if cell.sigma_omega is not None:
        hyper["sigma_omega"] = cell.sigma_omega
    config = cell.config()
    if "spread" in HYPERPARAMETERS[cell.policy]:
        # The service's default spread is not the simulator's: name the cell's.
        hyper.setdefault("spread", config.spread)
    hyper["first_pass"] = config.first_pass
    return {
        "setting": cell.setting,
        "dim": cell.dim,
        "policy": cell.policy,
        "arms": [
            {"id": f"a{k}", **({"features": features[rep, k].tolist()} if features is not None
                               else {})}
            for k in range(n_arms)
        ],
        "hyperparameters": hyper,
        "seed": decision_seed(seed, cell, rep),
        **({} if cell.position_weights is None
           else {"position_weights": list(cell.position_weights)}),
    }


def choose_args(cell: Cell, contexts: np.ndarray) -> dict[str, Any]:
    """``choose``'s keyword arguments for one repetition's contexts, shape (K, d)."""
    if cell.setting == "contextual":
        return {"arm_contexts": {f"a{k}": row.tolist() for k, row in enumerate(contexts)}}
    if cell.setting == "covariates":
        return {"context": contexts[0].tolist()}
    return {}


class HttpDriver:
    """Replays cells against the service behind ``client`` (which holds the admin token).

    The client retries as it does for any application: rewards after a 503 or
    a lost reply (a retry whose first attempt got through answers
    ``duplicate``, which counts as applied), ``/choose`` only when it surely
    recorded nothing; the counter check after each cell shows that every
    decision and reward counted exactly once.
    """

    def __init__(self, client: AsyncClient, limits: Limits = Limits()):
        self._client = client
        self._limits = limits
        self._gate = asyncio.Semaphore(limits.concurrency)

    async def replay(
        self, cell: Cell, reps: int, horizon: int, seed: int, progress: Progress | None = None
    ) -> Played:
        """Play ``reps`` repetitions of ``cell`` for ``horizon`` rounds over HTTP (a
        ranking's cell: ``/rank`` and every slot's reward, in one batch in slot order)."""
        if cell.slots > 1:
            return await self._replay_rankings(cell, reps, horizon, seed, progress)
        requests = reps * (2 * horizon + 2)
        if requests > self._limits.max_requests:
            raise ValueError(f"this replay needs {requests} requests, above the limit "
                             f"{self._limits.max_requests}")
        env_rngs, _ = split_rngs(cell_seed(seed, cell), reps)
        spec = cell.env_spec(seed)
        env = Environment(spec, env_rngs)
        tag = uuid.uuid4().hex[:8]
        experiments = await asyncio.gather(*(
            self._create(f"replay-{tag}-{rep}", experiment_spec(cell, env, rep, seed))
            for rep in range(reps)
        ))
        rows = np.arange(reps)
        regret = np.empty((reps, horizon))
        chosen = np.empty((reps, horizon), dtype=np.int32)
        start = time.perf_counter()
        for t in range(horizon):
            if time.perf_counter() - start > self._limits.max_seconds:
                raise TimeoutError(f"replay exceeded {self._limits.max_seconds:.0f} s")
            contexts = env.contexts()
            decisions = await asyncio.gather(*(
                self._choose(cell, e, contexts[i]) for i, e in enumerate(experiments)
            ))
            arms = np.array([int(d.arm_id[1:]) for d in decisions])
            means = env.means(contexts)
            regret[:, t] = means.max(axis=1) - means[rows, arms]
            chosen[:, t] = arms
            rewards = env.rewards(contexts, arms)
            await asyncio.gather(*(
                self._reward(e, d.decision_id, float(r))
                for e, d, r in zip(experiments, decisions, rewards, strict=True)
            ))
            if progress is not None:
                progress(1)
        seconds = time.perf_counter() - start
        await self._check_counters(experiments, horizon)
        return Played(np.cumsum(regret, axis=1), chosen, seconds)

    async def _replay_rankings(
        self, cell: Cell, reps: int, horizon: int, seed: int, progress: Progress | None
    ) -> Played:
        """:meth:`replay` of rankings: the worlds' draws as the in-process simulator makes
        them (each slot's noise, the examined slots), so a seeded experiment ranks as
        :func:`loadtest.simulate.play` does with ``per_decision_rng``."""
        env = Environment(cell.env_spec(seed), split_rngs(cell_seed(seed, cell), reps)[0])
        looks = examination(seed, cell)
        experiments = await asyncio.gather(*(
            self._create(f"replay-{uuid.uuid4().hex[:8]}-{rep}",
                         experiment_spec(cell, env, rep, seed)) for rep in range(reps)))
        regret = np.empty((reps, horizon))
        placed = np.empty((reps, horizon, cell.slots), dtype=np.int64)
        start = time.perf_counter()
        for t in range(horizon):
            if time.perf_counter() - start > self._limits.max_seconds:
                raise TimeoutError(f"replay exceeded {self._limits.max_seconds:.0f} s")
            contexts = env.contexts()
            rankings = await asyncio.gather(*(
                self._rank(cell, e, contexts[i]) for i, e in enumerate(experiments)))
            placed[:, t] = [[int(arm[1:]) for arm in r.arm_ids] for r in rankings]
            means = env.means(contexts)
            regret[:, t] = regret_of(means, placed[:, t], slot_weights(cell))
            noise, looked = ranking_noise(env, cell.slots), examined(looks, cell, reps)
            rewards = np.stack([env.rewards(contexts, placed[:, t, j], noise[j])
                                for j in range(cell.slots)], axis=1)
            if looked is not None:
                rewards = np.where(looked.T, rewards, 0.0)
            await asyncio.gather(*(
                self._reward_slots(e, r, values)
                for e, r, values in zip(experiments, rankings, rewards, strict=True)))
            if progress is not None:
                progress(1)
        seconds = time.perf_counter() - start
        await self._check_counters(experiments, horizon * cell.slots)
        return Played(np.cumsum(regret, axis=1), placed[:, :, 0].astype(np.int32), seconds,
                      placed)

    async def _rank(self, cell: Cell, experiment: _Experiment, contexts: np.ndarray
                    ) -> Ranking:
        async with self._gate:
            return await self._client.rank(experiment.id, cell.slots,
                                           **choose_args(cell, contexts),
                                           api_key=experiment.api_key)

    async def _reward_slots(self, experiment: _Experiment, ranking: Ranking,
                            rewards: np.ndarray) -> None:
        """Every slot's reward, in slot order (one batch: applied in that order)."""
        async with self._gate:
            results = await self._client.reward_batch(
                experiment.id, [(slot.decision_id, float(r))
                                for slot, r in zip(ranking.slots, rewards, strict=True)],
                api_key=experiment.api_key)
        if not all(result.counted for result in results):
            raise ReplayError(f"a slot's reward not counted: {results}")

    async def _choose(self, cell: Cell, experiment: _Experiment, contexts: np.ndarray
                      ) -> Decision:
        async with self._gate:
            return await self._client.choose(experiment.id, **choose_args(cell, contexts),
                                             api_key=experiment.api_key)

    async def _create(self, experiment_id: str, spec: dict[str, Any]) -> _Experiment:
        async with self._gate:
            created = await self._client.create_experiment(experiment_id, **spec)
        return _Experiment(experiment_id, created.api_key)

    async def _reward(self, experiment: _Experiment, decision_id: str, reward: float) -> None:
        async with self._gate:
            result = await self._client.reward(experiment.id, decision_id, reward,
                                               api_key=experiment.api_key)
        if not result.counted:
            raise ReplayError(f"reward not counted: {result}")

    async def _check_counters(self, experiments: Sequence[_Experiment], horizon: int) -> None:
        """The service counted exactly what was sent: one decision and reward per round
        (a ranking's: per slot)."""
        for e in experiments:
            async with self._gate:
                view = await self._client.get_experiment(e.id)
            if (view.decisions, view.rewards) != (horizon, horizon):
                raise ReplayError(
                    f"experiment {e.id}: service counted {view.decisions} decisions and "
                    f"{view.rewards} rewards, the driver sent {horizon} of each"
                )

    async def delete(self, experiment_ids: Sequence[str]) -> None:
        for experiment_id in experiment_ids:
            async with self._gate:
                await self._client.delete_experiment(experiment_id)
