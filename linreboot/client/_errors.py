"""The client's exceptions, one class per meaning, built from the service's answers.

Every error the service sends has the same shape, ``{"error", "message",
"details"?}`` (docs/API.md), except a single ``/reward``'s 404 and 409, which
answer ``{"decision_id", "status", "message"}``; both become an
:class:`ApiError` subclass chosen by the HTTP status.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ApiError",
    "Conflict",
    "DecisionNotFound",
    "Forbidden",
    "InvalidInput",
    "LinrebootError",
    "NotFound",
    "RewardConflict",
    "StoreFull",
    "TooLarge",
    "TransportError",
    "Unavailable",
    "UnsupportedMediaType",
    "error_from_response",
]


class LinrebootError(Exception):
    """Anything this client raises about a call that did not succeed."""


class TransportError(LinrebootError):
    """No answer from the service: the connection failed or timed out (after any retries).

    ``__cause__`` is the ``httpx`` exception of the last attempt. ``sent`` is
    False only when no attempt reached the service (connection refused, or no
    connection within the timeout): then nothing happened. Otherwise the
    outcome is unknown, as for a 503.
    """

    def __init__(self, message: str, *, sent: bool, attempts: int) -> None:
        super().__init__(message)
        self.sent = sent
        self.attempts = attempts


class ApiError(LinrebootError):
    """The service answered with an error status.

    Attributes
    ----------
    status : int
        The HTTP status.
    error : str
        The service's machine-readable code (``invalid_input``, ``not_found``, ...).
    message : str
        What is wrong, in words.
    details : list of dict
        For a 422: where and why (``loc``, ``msg``, ``type``), else empty.
    retry_after : float or None
        The ``Retry-After`` header in seconds, if the answer had one.
    attempts : int
        Requests sent for this call, retries included.
    """

    def __init__(self, status: int, error: str, message: str,
                 details: list[dict[str, Any]] | None = None, retry_after: float | None = None,
                 attempts: int = 1) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message
        self.details = details or []
        self.retry_after = retry_after
        self.attempts = attempts


class InvalidInput(ApiError):
    """422: the request is invalid (``details`` says where); nothing was changed."""


class Forbidden(ApiError):
    """401 (no credentials) or 403 (wrong ones; on /choose and /reward also no such
    experiment, so that ids cannot be probed without a key)."""


class NotFound(ApiError):
    """404: no such experiment or arm (on the management routes), or route."""


class DecisionNotFound(NotFound):
    """404 to a single reward: unknown or expired decision, or another experiment's."""

    def __init__(self, decision_id: str, message: str, attempts: int = 1) -> None:
        super().__init__(404, "not_found", message, attempts=attempts)
        self.decision_id = decision_id


class Conflict(ApiError):
    """409: the id exists already."""


class RewardConflict(Conflict):
    """409 to a single reward: a different reward was already applied to this decision."""

    def __init__(self, decision_id: str, message: str, attempts: int = 1) -> None:
        super().__init__(409, "conflict", message, attempts=attempts)
        self.decision_id = decision_id


class TooLarge(ApiError):
    """413: the body is over the service's ``LINREBOOT_MAX_BODY_BYTES``."""


class UnsupportedMediaType(ApiError):
    """415: the body was not declared as JSON."""


class Unavailable(ApiError):
    """503 (``store_unavailable``): Redis did not answer in time; the outcome is unknown."""


class StoreFull(Unavailable):
    """503 ``store_full``: Redis is out of memory and refused the write; nothing changed."""


_BY_STATUS: dict[int, type[ApiError]] = {
    401: Forbidden, 403: Forbidden, 404: NotFound, 409: Conflict, 413: TooLarge,
    415: UnsupportedMediaType, 422: InvalidInput, 503: Unavailable,
}
_BY_CODE: dict[str, type[ApiError]] = {"store_full": StoreFull}


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date), None if absent or unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from_response(status: int, headers: Mapping[str, str], content: bytes,
                        attempts: int = 1) -> ApiError:
    """The exception for an error answer (any status >= 400)."""
    body = _json_object(content)
    if "error" not in body and isinstance(body.get("decision_id"), str):
        message = str(body.get("message", ""))
        if status == 404:
            return DecisionNotFound(body["decision_id"], message, attempts)
        if status == 409:
            return RewardConflict(body["decision_id"], message, attempts)
    error = str(body.get("error") or f"http_{status}")
    message = str(body.get("message") or content[:200].decode("utf-8", "replace"))
    details = body.get("details")
    cls = _BY_CODE.get(error) or _BY_STATUS.get(status, ApiError)
    return cls(status, error, message, details if isinstance(details, list) else None,
               retry_after_seconds(headers), attempts)


def _json_object(content: bytes) -> dict[str, Any]:
    """The body as a JSON object; empty when it is not one (a proxy's HTML page, say)."""
    try:
        body = json.loads(content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
