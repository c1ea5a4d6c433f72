"""When to try a call again, and how long to wait first.

Each failed attempt is one of three kinds:

- *not sent*: no connection was made (refused, or none within the connect or
  pool timeout): the service saw nothing, so any call may be retried;
- *not applied*: a 503 ``store_full``: Redis refused the write whole
  (RELIABILITY.md, "No half-done writes out of memory"), so nothing changed;
- *ambiguous*: a 503 ``store_unavailable``, or the connection failed or timed
  out after the request was sent: it may or may not have taken effect.

Ambiguous failures are retried only for calls that are safe to repeat
(:attr:`Retryable.ALWAYS`: reads, rewards, deletion, retiring arms). A 4xx is
never retried.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from linreboot.client._errors import ApiError, TransportError

__all__ = ["NO_RETRY", "Attempts", "Failure", "Retry", "Retryable", "Wait"]


class Retryable(enum.Enum):
    """How safe a call is to repeat."""

    ALWAYS = "always"  # repeating it changes nothing more: retry any retryable failure
    IF_NOT_APPLIED = "if_not_applied"  # retry only when it surely did not take effect
    # A change sent under an Idempotency-Key: as IF_NOT_APPLIED until the service has said
    # the key back (it answers the change sent again as made), then as ALWAYS.
    IF_KEY_HONOURED = "if_key_honoured"
    NEVER = "never"  # a probe: one attempt, its answer is the result


class Failure(enum.Enum):
    NOT_SENT = "not_sent"
    NOT_APPLIED = "not_applied"
    AMBIGUOUS = "ambiguous"


# Connection set-up failures: the request never left the client.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# A mistake of the caller (a malformed URL), not of the network: never retried.
_NOT_RETRIED = (httpx.UnsupportedProtocol, httpx.LocalProtocolError)


@dataclass(frozen=True)
class Retry:
    """Retries with exponential backoff and jitter, bounded by attempts and a deadline.

    Parameters
    ----------
    attempts : int
        Requests per call at most, the first included (1: no retries).
    deadline_seconds : float
        The whole call, waits and attempts included, ends within this time: no
        retry starts if its wait would pass it, and each attempt's timeouts
        are cut to what is left.
    backoff_seconds, max_backoff_seconds : float
        The n-th retry waits ``min(max, backoff * 2**(n-1))`` times a uniform
        factor in [0.5, 1] ("equal jitter": never zero, spread over half).
    retry_after_jitter : float
        After an answer with ``Retry-After``, the wait is at least that many
        seconds times a uniform factor in ``[1, 1 + retry_after_jitter]``, so
        that clients told the same time do not all come back at once.
    retry_choose : bool
        Kept for compatibility, no longer needed: ``/choose`` names its decision
        id (its own, or the caller's), so the service answers a retry with the
        decision the first attempt recorded, and it is retried like a reward.
    """

    attempts: int = 5
    deadline_seconds: float = 30.0
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 5.0
    retry_after_jitter: float = 0.1
    retry_choose: bool = False

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")
        if not (self.deadline_seconds > 0 and self.backoff_seconds >= 0
                and self.max_backoff_seconds >= 0 and self.retry_after_jitter >= 0):
            raise ValueError("deadline must be > 0, backoffs and jitter >= 0")

    def wait(self, retry: int, retry_after: float | None, u: float) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first), given U(0, 1) ``u``."""
        backoff = min(self.max_backoff_seconds, self.backoff_seconds * 2.0 ** (retry - 1))
        wait = backoff * (0.5 + 0.5 * u)
        if retry_after is not None:
            wait = max(wait, retry_after * (1.0 + self.retry_after_jitter * u))
        return wait


NO_RETRY = Retry(attempts=1)


@dataclass(frozen=True, slots=True)
class Wait:
    """Try again after ``seconds``."""

    seconds: float


@dataclass
class Attempts:
    """The retry state of one call: what has happened, and whether to go on."""

    retry: Retry
    retryable: Retryable
    timeout: httpx.Timeout
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    count: int = 0
    maybe_applied: bool = False  # an earlier attempt may have taken effect
    key_honoured: bool = False  # the service said the call's Idempotency-Key back

    def __post_init__(self) -> None:
        self._deadline = self.clock() + self.retry.deadline_seconds

    def next_timeout(self) -> httpx.Timeout | None:
        """Timeouts for the next attempt: the client's, cut to the time left (None: as is)."""
        self.count += 1
        left = self._deadline - self.clock()
        phases = (self.timeout.connect, self.timeout.read, self.timeout.write, self.timeout.pool)
        if all(p is not None and p <= left for p in phases):
            return None
        cut = [left if p is None else min(p, left) for p in phases]
        return httpx.Timeout(connect=cut[0], read=cut[1], write=cut[2], pool=cut[3])

    def refused(self, error: ApiError) -> Wait:
        """A 503: wait and retry, or raise ``error``."""
        error.attempts = self.count
        failure = Failure.NOT_APPLIED if error.error == "store_full" else Failure.AMBIGUOUS
        wait = self._wait(failure, error.retry_after)
        if wait is None:
            raise error
        return wait

    def failed(self, exc: httpx.TransportError) -> Wait:
        """No answer: wait and retry, or raise :class:`TransportError`."""
        if isinstance(exc, _NOT_RETRIED):
            failure, wait = Failure.NOT_SENT, None
        else:
            failure = Failure.NOT_SENT if isinstance(exc, _NOT_SENT) else Failure.AMBIGUOUS
            wait = self._wait(failure, None)
        if wait is None:
            sent = self.maybe_applied or failure is Failure.AMBIGUOUS
            what = "may have reached" if sent else "did not reach"
            raise TransportError(
                f"no answer after {self.count} attempt(s); the request {what} the service: "
                f"{type(exc).__name__}: {exc}", sent=sent, attempts=self.count,
            ) from exc
        return wait

    def _wait(self, failure: Failure, retry_after: float | None) -> Wait | None:
        keyed = self.retryable is Retryable.IF_KEY_HONOURED
        allowed = (self.retryable is Retryable.ALWAYS or (keyed and self.key_honoured) or (
            (keyed or self.retryable is Retryable.IF_NOT_APPLIED)
            and failure is not Failure.AMBIGUOUS))
        self.maybe_applied |= failure is Failure.AMBIGUOUS
        if not allowed or self.count >= self.retry.attempts:
            return None
        seconds = self.retry.wait(self.count, retry_after, self.rng.random())
        if self.clock() + seconds >= self._deadline:
            return None
        return Wait(seconds)
