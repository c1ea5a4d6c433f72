"""``linreboot serve``: embedded Redis when no REDIS_URL is set, then uvicorn."""

from __future__ import annotations

import os
from pathlib import Path

from service.embedded import EmbeddedRedis
from service.settings import Settings


def serve(
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    data_dir: Path | None = None,
) -> int:
    """Run uvicorn in the foreground until interrupted."""
    import uvicorn

    overrides: dict[str, object] = {
        k: v for k, v in {"host": host, "port": port, "workers": workers,
                          "data_dir": data_dir}.items() if v is not None
    }
    settings = Settings(**overrides)  # type: ignore[arg-type]
    embedded = None
    if settings.redis_url is None:
        # One embedded server for all workers: each worker connects to it.
        embedded = EmbeddedRedis(settings.data_dir).start()
        os.environ["LINREBOOT_REDIS_URL"] = embedded.url
    for key, value in overrides.items():
        os.environ[f"LINREBOOT_{key.upper()}"] = str(value)
    try:
        uvicorn.run(
            "app.main:create_app",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level,
            access_log=False,
        )
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


