"""The admin tokens: LINREBOOT_ADMIN_TOKEN, or the lines of LINREBOOT_ADMIN_TOKEN_FILE.

The file is read again when it changes (its size, time or inode), at the first
admin request after the change, so that an operator rotates the admin token
without a restart: write the new token beside the old one, move the callers
to it, then remove the old line. A file that cannot serve any more (gone,
empty) keeps the tokens it last held, with a warning, rather than locking
every operator out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from pathlib import Path

from service.settings import Settings, read_admin_tokens

__all__ = ["SESSION_SECONDS", "AdminTokens"]

SESSION_SECONDS = 8 * 3600  # how long a /ui login lasts

logger = logging.getLogger("linreboot.app")


class AdminTokens:
    """Which bearer tokens the management routes take."""

    def __init__(self, settings: Settings) -> None:
        self._path: Path | None = settings.admin_token_file
        self._min_chars = settings.admin_token_minimum()  # a line added later too
        self._tokens: tuple[bytes, ...] = (settings.admin_token.get_secret_value().encode(),)
        self._stamp: tuple[int, int, int] | None = None
        if self._path is not None:
            self._reload()

    def valid(self, token: str) -> bool:
        if self._path is not None:
            self._reload()
        given = token.encode()
        # Every token compared, so the time taken does not tell which one came close.
        return sum(hmac.compare_digest(given, t) for t in self._tokens) > 0

    def session(self, token: str, now: float | None = None) -> str | None:
        """A /ui session for the holder of ``token`` (None if it is not an admin token):
        its expiry and an HMAC of it keyed by the token, so that any worker checks it
        with no state kept, and removing the token from the file ends its sessions."""
        if not self.valid(token):
            return None
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        return f"{expires}.{_signature(token.encode(), expires)}"

    def valid_session(self, cookie: str, now: float | None = None) -> bool:
        """``cookie`` is a session of a current admin token that has not expired."""
        if self._path is not None:
            self._reload()
        expires_text, _, signature = cookie.partition(".")
        if not expires_text.isdigit() or int(expires_text) < (now or time.time()):
            return False
        expires = int(expires_text)
        return sum(hmac.compare_digest(signature, _signature(t, expires))
                   for t in self._tokens) > 0

    def _reload(self) -> None:
        assert self._path is not None
        try:
            status = os.stat(self._path)
        except OSError as exc:
            self._warn(f"cannot read it ({exc.strerror})")
            return
        stamp = (status.st_mtime_ns, status.st_size, status.st_ino)
        if stamp == self._stamp:
            return
        try:
            tokens = read_admin_tokens(self._path, self._min_chars)
        except ValueError as exc:
            self._warn(str(exc))
            return
        self._tokens = tuple(t.encode() for t in tokens)
        self._stamp = stamp

    def _warn(self, reason: str) -> None:
        if self._stamp != (-1, -1, -1):  # once until the file serves again
            logger.warning("LINREBOOT_ADMIN_TOKEN_FILE: %s; the admin tokens it held last "
                           "still serve", reason)
            self._stamp = (-1, -1, -1)


def _signature(token: bytes, expires: int) -> str:
    return hmac.new(token, f"linreboot-ui:{expires}".encode(), hashlib.sha256).hexdigest()
