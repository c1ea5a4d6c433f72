"""Structured logs: one JSON object per line on stderr.

Records carry their structured part in ``extra={"fields": {...}}``; the
formatter merges it into the line, with the id of the HTTP request being
served, if any (:data:`request_id`, set by the access-log middleware).
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

__all__ = ["JsonFormatter", "configure_logging", "request_id"]

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()  # the request this line is written for, if any
        if rid is not None:
            line["request_id"] = rid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _JsonHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is now (test runners swap it).

    Its class also marks the handler this module installed, so configuring
    twice adds no second one.
    """

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def configure_logging(level: str) -> None:
    """Send the root logger's records to stderr as JSON lines at ``level``.

    Raises
    ------
    ValueError
        For an unknown level name (settings are validated at start-up).
    """
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError("log_level must be one of debug, info, warning, error, critical")
    root = logging.getLogger()
    root.setLevel(numeric)
    if not any(isinstance(h, _JsonHandler) for h in root.handlers):
        handler = _JsonHandler()
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
