"""A Python client of the linreboot service, blocking (:class:`Client`) and asyncio
(:class:`AsyncClient`), on httpx. It needs only httpx and pydantic.

::

    from linreboot.client import Client

    with Client("http://localhost:8000", api_key=KEY) as lrb:
        decision = lrb.choose("homepage", context=[0.2, -1.0, 0.5])
        ...
        lrb.reward("homepage", decision.decision_id, 1.0)

What to rely on:

- **Results** are typed models (:class:`Decision`, :class:`Experiment`, ...)
  that ignore fields they do not know, so a newer service does not break them.
- **Errors** raise an :class:`ApiError` subclass per meaning, with the
  service's ``error`` code, ``message``, HTTP ``status`` and ``details``:
  :class:`InvalidInput` 422, :class:`NotFound` 404, :class:`Forbidden`
  401/403, :class:`Conflict` 409, :class:`TooLarge` 413,
  :class:`UnsupportedMediaType` 415, :class:`Unavailable` 503 (and its
  :class:`StoreFull`). No answer at all raises :class:`TransportError`.
- **Retries** (:class:`Retry`): exponential backoff with jitter on 503 and
  connection failures, waiting at least ``Retry-After``, bounded by attempts
  and a total deadline; never on a 4xx. A call is retried after an ambiguous
  failure (the request may have taken effect: a 503 ``store_unavailable``, a
  timeout after sending) only if repeating it is harmless: reads, rewards,
  deletion, retiring arms, and ``choose``, which names its decision id (a new
  one, or ``decision_id=`` yours): a retry gets the decision the first attempt
  recorded. ``create_experiment``, ``add_arms`` and ``rotate_key`` are sent
  under an ``Idempotency-Key`` of their own, which the service answers as made
  when it comes again (the same API key back): they are retried after a 503
  that says the key back, and after a lost reply once the service has said
  one back (an older service, which ignores the header, would make them twice).
- **Rewards count once**: the decision id is an idempotency key, so a reward
  retried after a lost reply answers ``duplicate``. :class:`RewardResult`'s
  ``status`` is ``applied`` or ``duplicate``, and both mean counted
  (``result.counted``).
- **Batches** of rewards go in chunks of at most ``max_batch_rewards`` (the
  service's ``LINREBOOT_MAX_BATCH_REWARDS``, 1000 by default).
"""

from linreboot.client._async import AsyncClient
from linreboot.client._core import DEFAULT_MAX_BATCH_REWARDS
from linreboot.client._errors import (
    ApiError,
    Conflict,
    DecisionNotFound,
    Forbidden,
    InvalidInput,
    LinrebootError,
    NotFound,
    RewardConflict,
    StoreFull,
    TooLarge,
    TransportError,
    Unavailable,
    UnsupportedMediaType,
)
from linreboot.client._models import (
    Arm,
    CreatedExperiment,
    Decision,
    Experiment,
    ExperimentPage,
    Ranking,
    RewardResult,
    ServiceStatus,
    Slot,
)
from linreboot.client._retry import NO_RETRY, Retry
from linreboot.client._sync import Client

__all__ = [
    "DEFAULT_MAX_BATCH_REWARDS",
    "NO_RETRY",
    "ApiError",
    "Arm",
    "AsyncClient",
    "Client",
    "Conflict",
    "CreatedExperiment",
    "Decision",
    "DecisionNotFound",
    "Experiment",
    "ExperimentPage",
    "Forbidden",
    "InvalidInput",
    "LinrebootError",
    "NotFound",
    "Ranking",
    "Retry",
    "RewardConflict",
    "RewardResult",
    "ServiceStatus",
    "Slot",
    "StoreFull",
    "TooLarge",
    "TransportError",
    "Unavailable",
    "UnsupportedMediaType",
]
