"""Domain errors. The app maps each to one HTTP status in one place."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error the service reports to a client.

    The message is written for the client: it says what is wrong without
    echoing the offending value back.
    """


class InvalidInput(DomainError):
    """The request is well-formed JSON but wrong for this experiment (422)."""


class NotFound(DomainError):
    """Unknown experiment, arm or decision, or an expired decision (404)."""


class Forbidden(DomainError):
    """The credentials do not belong to this experiment (403)."""


class Conflict(DomainError):
    """The request contradicts recorded state (409).

    For example a different reward for a decision already rewarded.
    """


class StoreUnavailable(DomainError):
    """Redis is unreachable or timed out (503 with Retry-After)."""


class StoreFull(StoreUnavailable):
    """Redis is out of memory and refuses writes (503 with Retry-After)."""


class StoreTimedOut(StoreUnavailable):
    """Redis did not answer within the call's deadline (503 with Retry-After): the next
    call would most likely wait out its deadline too."""


class StartupError(Exception):
    """The service cannot start. Not a client's error: for the operator.

    The message is one line naming the setting or resource at fault and what
    to do. ``exit_code`` is 2 for a wrong setting and 3 for something in the
    way (a data directory or port in use, a Redis that does not answer), as
    uvicorn exits 3 when it cannot start.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
