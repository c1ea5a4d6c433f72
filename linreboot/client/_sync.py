"""The blocking client, on ``httpx.Client``."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
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

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """A client of the linreboot service.

    Parameters
    ----------
    base_url : str
        The service, e.g. ``"http://localhost:8000"``. Give this or ``http``.
    admin_token : str, optional
        ``LINREBOOT_ADMIN_TOKEN``, for the ``/experiments`` calls.
    api_key : str, optional
        The experiment key for ``choose`` and ``reward`` (each call may give its own).
    timeout : float or httpx.Timeout
        Seconds for each phase of a request (connect, write, read, pool wait).
    retry : Retry, optional
        When and how often to retry (default ``Retry()``; ``NO_RETRY`` for none).
    max_batch_rewards : int
        ``reward_batch`` sends chunks of at most this many items: the service's
        ``LINREBOOT_MAX_BATCH_REWARDS`` (default 1000).
    http : httpx.Client, optional
        A client of your own (its base URL, timeouts and pool); it is not closed
        by :meth:`close`.
    """

    def __init__(self, base_url: str | None = None, *, admin_token: str | None = None,
                 api_key: str | None = None, timeout: float | httpx.Timeout = 10.0,
                 retry: Retry | None = None,
                 max_batch_rewards: int = DEFAULT_MAX_BATCH_REWARDS,
                 http: httpx.Client | None = None) -> None:
        if (base_url is None) == (http is None):
            raise ValueError("give either base_url or http (an httpx.Client with its base_url)")
        self._core = Core(admin_token, api_key, retry or Retry(), max_batch_rewards)
        self._owns_http = http is None
        self.http = http if http is not None else httpx.Client(base_url=base_url or "",
                                                                timeout=timeout)

    def close(self) -> None:
        if self._owns_http:
            self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        attempts = self._core.attempts(call, self.http.timeout)
        while True:
            timeout = attempts.next_timeout() or httpx.USE_CLIENT_DEFAULT
            try:
                response = self.http.request(call.method, call.path, json=call.body,
                                             params=call.params, headers=call.headers,
                                             timeout=timeout)
            except httpx.TransportError as exc:
                step = attempts.failed(exc)
            else:
                result = self._core.answered(call, attempts, response)
                if not isinstance(result, Wait):
                    return result
                step = result
            time.sleep(step.seconds)

    # -- experiments (admin token)

    def create_experiment(
        self, experiment_id: str, *, setting: str, dim: int, arms: Sequence[ArmSpec],
        policy: str | None = None, hyperparameters: Mapping[str, bool | float | str] | None = None,
        seed: int | None = None, reward_window_seconds: int | None = None,
        max_stale_rewards: int | None = None, **fields: Any,
    ) -> CreatedExperiment:
        """Create an experiment; the answer holds its API key, shown only this once.

        ``arms`` are ids, or ``{"id": ..., "features": [...]}`` (stochastic setting).
        Options left at None take the service's defaults; ``fields`` are sent as
        they are (for options this client does not know yet). Sent under an
        ``Idempotency-Key``: retried once the service has said such a key back (an
        attempt after one that created it gets the same key back).
        """
        return self._send(self._core.create_experiment(
            experiment_id, setting=setting, dim=dim, arms=arms, policy=policy,
            hyperparameters=hyperparameters, seed=seed,
            reward_window_seconds=reward_window_seconds, max_stale_rewards=max_stale_rewards,
            **fields))

    def get_experiment(self, experiment_id: str) -> Experiment:
        """An experiment, its counters and estimates."""
        return self._send(self._core.get_experiment(experiment_id))

    def list_experiments(self, limit: int = 100, after: str | None = None) -> ExperimentPage:
        """One page of experiments in id order, after the id ``after``."""
        return self._send(self._core.list_experiments(limit, after))

    def iter_experiments(self, page_size: int = 100) -> Iterator[Experiment]:
        """Every experiment in id order, a page of ``page_size`` at a time."""
        after: str | None = None
        while True:
            page = self.list_experiments(page_size, after)
            yield from page.experiments
            if page.next_after is None:
                return
            after = page.next_after

    def delete_experiment(self, experiment_id: str) -> None:
        """Delete an experiment and all its state. Safe to retry: when an attempt whose
        reply was lost did delete it, the retry's 404 is taken as done."""
        self._send(self._core.delete_experiment(experiment_id))

    def add_arms(self, experiment_id: str, arms: Sequence[ArmSpec]) -> Experiment:
        """Add arms (ids, or ``{"id", "features"}``); under an ``Idempotency-Key``: an
        attempt after one that added them answers them added."""
        return self._send(self._core.add_arms(experiment_id, arms))

    def retire_arms(self, experiment_id: str, arm_ids: Sequence[str]) -> Experiment:
        """Retire arms: never chosen again, they keep their history."""
        return self._send(self._core.retire_arms(experiment_id, arm_ids))

    def update_settings(self, experiment_id: str, **changes: Any) -> Experiment:
        """Change live settings (``epsilon``, ``reward_window_seconds``,
        ``default_reward``, ``max_stale_rewards``, ``log_max_entries``,
        ``log_max_age_seconds``); the experiment as it is then."""
        return self._send(self._core.update_settings(experiment_id, changes))

    def rotate_key(self, experiment_id: str) -> str:
        """A new API key for the experiment, shown once; the current one stays valid until
        :meth:`revoke_previous_key`. Move every caller to the new key, then revoke.
        Under an ``Idempotency-Key``: an attempt after one that rotated answers that key
        (it does not rotate twice)."""
        return self._send(self._core.rotate_key(experiment_id)).api_key

    def revoke_previous_key(self, experiment_id: str) -> bool:
        """Revoke the key the last rotation kept valid (at once); False if there was none."""
        return self._send(self._core.revoke_previous_key(experiment_id)).revoked

    # -- decisions and rewards (the experiment's key)

    def choose(self, experiment_id: str, *, context: Vector | None = None,
               arm_contexts: Mapping[str, Vector] | None = None,
               eligible: Sequence[str] | None = None, excluded: Sequence[str] | None = None,
               api_key: str | None = None, decision_id: str | None = None) -> Decision:
        """Choose an arm: ``context`` (covariates), ``arm_contexts`` (contextual) or neither.

        The request names its decision id (``decision_id``, or a new random one), so
        it is retried like a reward: after a lost reply or a 503 the service
        answers the retry with the decision the first attempt recorded, if it did.
        """
        return self._send(self._core.choose(experiment_id, context=context,
                                            arm_contexts=arm_contexts, eligible=eligible,
                                            excluded=excluded, api_key=api_key,
                                            decision_id=decision_id))

    def rank(self, experiment_id: str, k: int, *, context: Vector | None = None,
             arm_contexts: Mapping[str, Vector] | None = None,
             eligible: Sequence[str] | None = None, excluded: Sequence[str] | None = None,
             api_key: str | None = None, decision_id: str | None = None) -> Ranking:
        """Rank ``k`` distinct arms, best first; the context as for :meth:`choose`.

        Reward each slot on its own, with its ``decision_id`` (``ranking.slots[j]``);
        a slot without one gets the experiment's default reward. Retried as
        :meth:`choose` is (the request names its id).
        """
        return self._send(self._core.rank(experiment_id, k, context=context,
                                          arm_contexts=arm_contexts, eligible=eligible,
                                          excluded=excluded, api_key=api_key,
                                          decision_id=decision_id))

    def reward(self, experiment_id: str, decision_id: str, reward: float, *,
               api_key: str | None = None) -> RewardResult:
        """Report a decision's reward; it counts exactly once.

        Retried on 503 and lost replies: the decision id makes it idempotent, so
        a retry whose first attempt got through answers ``duplicate``. Both
        ``applied`` and ``duplicate`` mean counted (``result.counted``). Raises
        :class:`RewardConflict` (a different reward was applied) or
        :class:`DecisionNotFound` (unknown or expired decision).
        """
        return self._send(self._core.reward(experiment_id, decision_id, reward, api_key))

    def reward_batch(self, experiment_id: str, rewards: RewardItems, *,
                     api_key: str | None = None,
                     chunk_size: int | None = None) -> list[RewardResult]:
        """Report many rewards (``(decision_id, reward)`` pairs or a dict), in order.

        Sent in chunks of at most ``chunk_size`` (default ``max_batch_rewards``),
        each retried as a whole. Each result has its own status: ``conflict`` and
        ``not_found`` items do not raise. If a chunk fails for good, the chunks
        before it were applied: resending the whole batch is safe (they answer
        ``duplicate``).
        """
        results: list[RewardResult] = []
        for call in self._core.reward_batch(experiment_id, rewards, api_key, chunk_size):
            chunk: list[RewardResult] = self._send(call)
            results.extend(chunk)
        return results

    # -- operations (no credentials)

    def healthz(self) -> ServiceStatus:
        """The process is up (one attempt, no retries)."""
        return self._send(self._core.healthz())

    def readyz(self) -> ServiceStatus:
        """Redis answers and accepts writes; raises :class:`Unavailable` (or
        :class:`StoreFull`) when not. One attempt: its answer is the result."""
        return self._send(self._core.readyz())

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._send(self._core.metrics())
