"""uvicorn's HTTP protocol with a deadline on each request's head.

uvicorn closes a keep-alive connection that stays idle after a response
(``timeout_keep_alive``), but not one that connects and sends nothing, nor
one that sends a request's head a byte at a time: such connections are held
for as long as the client likes (slowloris). Here every request's head (the
request line and headers) must arrive within
``LINREBOOT_REQUEST_HEAD_TIMEOUT_SECONDS`` of the connection opening or of
the previous response (bytes that are not a head, such as blank lines, do not
count), else the connection is closed. A body is read by the app, whose
requests are small and bounded (``LINREBOOT_MAX_BODY_BYTES``). A connection
left idle after a response is closed by uvicorn after 5 s (its
``timeout_keep_alive``).
"""

from __future__ import annotations

import asyncio
import os
from asyncio import TimerHandle
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import Settings

# uvicorn builds this protocol without our settings: the deadline is read from
# the variable Settings reads (validated when the service starts).
HEAD_TIMEOUT_ENV = "LINREBOOT_REQUEST_HEAD_TIMEOUT_SECONDS"
DEFAULT_HEAD_TIMEOUT = float(Settings.model_fields["request_head_timeout_seconds"].default)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` that closes a connection whose request head is late.

    The deadline moves with every response, but its timer does not: a keep-alive
    connection would otherwise schedule and cancel one timer a request (about 1.5 µs
    of every request's few hundred). The timer stays where it was armed and, when it
    fires, closes the connection only if the head is still due and late; if the
    deadline moved meanwhile it is set again for the new one (at most once a
    deadline's length on a busy connection)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout = float(os.environ.get(HEAD_TIMEOUT_ENV, DEFAULT_HEAD_TIMEOUT))
        self._head_timer: TimerHandle | None = None
        self._head_due: float | None = None  # loop time by which a head must arrive

    def _arm_head_timer(self) -> None:
        self._head_due = self.loop.time() + self._head_timeout
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(self._head_due, self._head_check)

    def _disarm_head_timer(self) -> None:
        self._head_due = None  # the timer, if set, finds nothing due

    def _head_check(self) -> None:
        self._head_timer = None
        due = self._head_due
        if due is None or self.transport.is_closing():
            return
        # The deadline moved since the timer was set? (Within a millisecond is due: the
        # loop's timers keep milliseconds and may fire that much early.)
        if self.loop.time() + 0.001 < due:
            self._head_timer = self.loop.call_at(due, self._head_check)
            return
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_due = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next head is due from now, whatever arrives meanwhile: uvicorn's own
        # keep-alive timer stops at any byte (a blank line between requests, which
        # the parser skips, would hold the connection for ever). While a request is
        # handled no head is due (a pipelined one waits for its turn).
        if not self.transport.is_closing() and not self.pipeline:
            self._arm_head_timer()
