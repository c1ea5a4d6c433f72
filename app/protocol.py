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
    """:class:`HttpToolsProtocol` that closes a connection whose request head is late."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout = float(os.environ.get(HEAD_TIMEOUT_ENV, DEFAULT_HEAD_TIMEOUT))
        self._head_timer: TimerHandle | None = None

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self._head_timeout, self._head_too_late)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
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
