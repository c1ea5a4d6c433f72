"""Everything the sync and async clients share: requests as data, answers parsed.

A :class:`Call` says what to send, how safe it is to repeat and how to read a
successful answer; :class:`Core` builds one per route and turns each answer
into a result, an exception, or a :class:`~linreboot.client._retry.Wait`. The
two clients only send calls and sleep (``_sync.py``, ``_async.py``).

To add a route:

1. a model of its answer in ``_models.py`` (a subclass of ``_Answer``, so that
   fields it does not know are ignored), exported from ``__init__.py``;
2. a builder on :class:`Core` returning a ``Call``: method, path (through
   ``_experiment_path`` for an id in it), the model's ``model_validate_json``,
   the credentials (``self._admin`` or ``self._key(api_key)``) and how safe
   it is to repeat: ``ALWAYS`` for reads and writes a repeat does not change,
   ``IF_NOT_APPLIED`` for writes it would, ``NEVER`` for probes; a change the
   service answers as made under an ``Idempotency-Key`` (a creation, a rotation)
   is built by ``_changing_call`` instead (``IF_KEY_HONOURED``);
3. a one-line method in ``Client`` (``_sync.py``, with the docstring) and in
   ``AsyncClient`` (``_async.py``); a paged listing also gets an ``iter_``
   method like ``iter_experiments``;
4. a call in ``tests/test_client.py::test_every_method`` (run with both clients).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from linreboot.client._errors import error_from_response
from linreboot.client._models import (
    CreatedExperiment,
    Decision,
    Experiment,
    ExperimentPage,
    NewKey,
    Ranking,
    Revoked,
    RewardResult,
    ServiceStatus,
)
from linreboot.client._retry import Attempts, Retry, Retryable, Wait

__all__ = ["DEFAULT_MAX_BATCH_REWARDS", "Call", "Core", "RewardItems", "Vector"]

T = TypeVar("T")
# The service's LINREBOOT_MAX_BATCH_REWARDS default; set the client's to match the server's.
DEFAULT_MAX_BATCH_REWARDS = 1000

Vector = Sequence[float]  # or anything with .tolist(), such as a NumPy array
ArmSpec = str | Mapping[str, Any]  # an arm id, or {"id": ..., "features": [...]}
RewardItems = Iterable[tuple[str, float]] | Mapping[str, float]


IDEMPOTENCY_KEY = "Idempotency-Key"


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request, how safe it is to repeat, and the parser of its 2xx body."""

    method: str
    path: str
    parse: Callable[[bytes], T]
    headers: Mapping[str, str]
    retryable: Retryable
    body: Any = None
    params: Mapping[str, str | int] | None = None
    # DELETE: a 404 after an attempt that may have deleted means that it did.
    gone_means_done: bool = False


class _RewardBatch(BaseModel):
    results: list[RewardResult]


def _no_content(_: bytes) -> None:
    return None


def _text(content: bytes) -> str:
    return content.decode("utf-8")


def _batch_results(content: bytes) -> list[RewardResult]:
    return _RewardBatch.model_validate_json(content).results


def _vector(values: Any) -> list[float]:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _arm(arm: ArmSpec) -> dict[str, Any]:
    if isinstance(arm, str):
        return {"id": arm}
    body = dict(arm)
    if body.get("features") is not None:
        body["features"] = _vector(body["features"])
    return body


def _experiment_path(experiment_id: str, *rest: str) -> str:
    return "/".join(("/experiments", quote(experiment_id, safe=""), *rest))


def _present(**fields: Any) -> dict[str, Any]:
    """The fields that were given: an omitted one takes the service's default."""
    return {k: v for k, v in fields.items() if v is not None}


class Core:
    """Credentials and settings of a client; builds calls and reads answers."""

    def __init__(self, admin_token: str | None, api_key: str | None, retry: Retry,
                 max_batch_rewards: int) -> None:
        if max_batch_rewards < 1:
            raise ValueError("max_batch_rewards must be >= 1")
        self.retry = retry
        self.max_batch_rewards = max_batch_rewards
        self._admin = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._api_key = api_key
        self._rng = random.Random()
        # The service said a change's Idempotency-Key back (an older one ignores it).
        self._keys_honoured = False

    # -- answers

    def attempts(self, call: Call[Any], timeout: httpx.Timeout) -> Attempts:
        return Attempts(self.retry, call.retryable, timeout, rng=self._rng,
                        key_honoured=self._keys_honoured)

    def answered(self, call: Call[T], attempts: Attempts, response: httpx.Response) -> T | Wait:
        """The result of a 2xx; a :class:`Wait` to retry a 503; else raises the error."""
        key = call.headers.get(IDEMPOTENCY_KEY)
        if key is not None and response.headers.get(IDEMPOTENCY_KEY) == key:
            # This service answers a change sent again under its key as made: this call's
            # retries, and later calls' after a lost reply, are safe.
            self._keys_honoured = attempts.key_honoured = True
        status = response.status_code
        if 200 <= status < 300:
            return call.parse(response.content)
        if status == 404 and call.gone_means_done and attempts.maybe_applied:
            return call.parse(b"")
        error = error_from_response(status, response.headers, response.content, attempts.count)
        if status == 503:
            return attempts.refused(error)
        raise error

    # -- credentials

    def _key(self, api_key: str | None) -> dict[str, str]:
        key = api_key or self._api_key
        return {"X-API-Key": key} if key else {}

    def _admin_call(self, method: str, path: str, parse: Callable[[bytes], T],
                    retryable: Retryable, body: Any = None, **kw: Any) -> Call[T]:
        return Call(method, path, parse, self._admin, retryable, body, **kw)

    def _changing_call(self, method: str, path: str, parse: Callable[[bytes], T],
                       body: Any = None) -> Call[T]:
        """A change the service answers as made when it is sent again under the same
        ``Idempotency-Key`` (a new one a call, kept by its attempts): retried after an
        ambiguous failure once the service has said such a key back (a service older
        than the header would make the change twice)."""
        headers = {**self._admin, IDEMPOTENCY_KEY: uuid.uuid4().hex}
        return Call(method, path, parse, headers, Retryable.IF_KEY_HONOURED, body)

    # -- experiments (admin token)

    def create_experiment(
        self, experiment_id: str, *, setting: str, dim: int, arms: Sequence[ArmSpec],
        policy: str | None = None, hyperparameters: Mapping[str, bool | float | str] | None = None,
        seed: int | None = None, reward_window_seconds: int | None = None,
        max_stale_rewards: int | None = None, **fields: Any,
    ) -> Call[CreatedExperiment]:
        # Sent under an Idempotency-Key of its own: an attempt after one that may have
        # created it gets the same key back (the service makes it again), not a 409.
        body = {"id": experiment_id, "setting": setting, "dim": dim,
                "arms": [_arm(a) for a in arms],
                **_present(policy=policy, seed=seed, reward_window_seconds=reward_window_seconds,
                           max_stale_rewards=max_stale_rewards),
                **({"hyperparameters": dict(hyperparameters)} if hyperparameters else {}),
                **fields}
        return self._changing_call("POST", "/experiments", CreatedExperiment.model_validate_json,
                                   body)

    def get_experiment(self, experiment_id: str) -> Call[Experiment]:
        return self._admin_call("GET", _experiment_path(experiment_id),
                                Experiment.model_validate_json, Retryable.ALWAYS)

    def list_experiments(self, limit: int, after: str | None) -> Call[ExperimentPage]:
        params: dict[str, str | int] = {"limit": limit, **_present(after=after)}
        return self._admin_call("GET", "/experiments", ExperimentPage.model_validate_json,
                                Retryable.ALWAYS, params=params)

    def delete_experiment(self, experiment_id: str) -> Call[None]:
        return self._admin_call("DELETE", _experiment_path(experiment_id), _no_content,
                                Retryable.ALWAYS, gone_means_done=True)

    def add_arms(self, experiment_id: str, arms: Sequence[ArmSpec]) -> Call[Experiment]:
        # Under an Idempotency-Key: arms there already as asked are answered as added.
        return self._changing_call("POST", _experiment_path(experiment_id, "arms"),
                                   Experiment.model_validate_json,
                                   {"arms": [_arm(a) for a in arms]})

    def retire_arms(self, experiment_id: str, arm_ids: Sequence[str]) -> Call[Experiment]:
        return self._admin_call("POST", _experiment_path(experiment_id, "arms", "retire"),
                                Experiment.model_validate_json, Retryable.ALWAYS,
                                {"arm_ids": list(arm_ids)})

    def update_settings(self, experiment_id: str, changes: Mapping[str, Any]) -> Call[Experiment]:
        # The same values again change nothing more (the log records the change twice).
        return self._admin_call("PATCH", _experiment_path(experiment_id),
                                Experiment.model_validate_json, Retryable.ALWAYS, dict(changes))

    def rotate_key(self, experiment_id: str) -> Call[NewKey]:
        # Under an Idempotency-Key: an attempt after one that may have rotated gets that
        # key back, rather than rotating again (which would revoke the key kept valid).
        return self._changing_call("POST", _experiment_path(experiment_id, "keys"),
                                   NewKey.model_validate_json)

    def revoke_previous_key(self, experiment_id: str) -> Call[Revoked]:
        return self._admin_call("DELETE", _experiment_path(experiment_id, "keys", "previous"),
                                Revoked.model_validate_json, Retryable.ALWAYS)

    # -- decisions and rewards (the experiment's key)

    def choose(
        self, experiment_id: str, *, context: Vector | None = None,
        arm_contexts: Mapping[str, Vector] | None = None,
        eligible: Sequence[str] | None = None, excluded: Sequence[str] | None = None,
        api_key: str | None = None, decision_id: str | None = None,
    ) -> Call[Decision]:
        # A decision id of ours makes the request idempotent: a retry after a lost reply
        # gets the decision the first attempt recorded, not a second one.
        body: dict[str, Any] = {"experiment_id": experiment_id,
                                "decision_id": decision_id or uuid.uuid4().hex}
        if context is not None:
            body["context"] = _vector(context)
        if arm_contexts is not None:
            body["arm_contexts"] = {arm: _vector(v) for arm, v in arm_contexts.items()}
        if eligible is not None:
            body["eligible"] = list(eligible)
        if excluded:
            body["excluded"] = list(excluded)
        return Call("POST", "/choose", Decision.model_validate_json, self._key(api_key),
                    Retryable.ALWAYS, body)

    def rank(
        self, experiment_id: str, k: int, *, context: Vector | None = None,
        arm_contexts: Mapping[str, Vector] | None = None,
        eligible: Sequence[str] | None = None, excluded: Sequence[str] | None = None,
        api_key: str | None = None, decision_id: str | None = None,
    ) -> Call[Ranking]:
        chosen = self.choose(experiment_id, context=context, arm_contexts=arm_contexts,
                             eligible=eligible, excluded=excluded, api_key=api_key,
                             decision_id=decision_id)
        return Call("POST", "/rank", Ranking.model_validate_json, chosen.headers,
                    Retryable.ALWAYS, {**chosen.body, "k": k})

    def reward(self, experiment_id: str, decision_id: str, reward: float,
               api_key: str | None = None) -> Call[RewardResult]:
        body = {"experiment_id": experiment_id, "decision_id": decision_id,
                "reward": float(reward)}
        return Call("POST", "/reward", RewardResult.model_validate_json, self._key(api_key),
                    Retryable.ALWAYS, body)

    def reward_batch(self, experiment_id: str, rewards: RewardItems,
                     api_key: str | None = None, chunk_size: int | None = None,
                     ) -> list[Call[list[RewardResult]]]:
        """One call per chunk of at most ``chunk_size`` (default ``max_batch_rewards``) items."""
        size = chunk_size or self.max_batch_rewards
        if size < 1:
            raise ValueError("chunk_size must be >= 1")
        pairs = rewards.items() if isinstance(rewards, Mapping) else rewards
        items = [{"decision_id": d, "reward": float(r)} for d, r in pairs]
        headers = self._key(api_key)
        return [Call("POST", "/reward", _batch_results, headers, Retryable.ALWAYS,
                     {"experiment_id": experiment_id, "rewards": items[i:i + size]})
                for i in range(0, len(items), size)]

    # -- operations (no credentials)

    def healthz(self) -> Call[ServiceStatus]:
        return Call("GET", "/healthz", ServiceStatus.model_validate_json, {}, Retryable.NEVER)

    def readyz(self) -> Call[ServiceStatus]:
        return Call("GET", "/readyz", ServiceStatus.model_validate_json, {}, Retryable.NEVER)

    def metrics(self) -> Call[str]:
        return Call("GET", "/metrics", _text, {}, Retryable.ALWAYS)
