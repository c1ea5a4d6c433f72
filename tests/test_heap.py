"""A serving worker settles its garbage collector once started (app.heap); an app run
inside another program (the tests, an embedding) leaves the process's collector alone.

Each case runs in a fresh interpreter: the collector's state is the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from app.heap import YOUNG_THRESHOLD
from tests.conftest import ADMIN_TOKEN

# After the app's start-up (its lifespan, as uvicorn runs it): how many objects are
# frozen, the thresholds, and whether a cycle made afterwards is still collected.
_STARTED = textwrap.dedent("""
    import gc, json, sys
    from fastapi.testclient import TestClient
    from app.main import create_app
    from service.settings import Settings

    app = create_app() if sys.argv[1] == "factory" else create_app(Settings())
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        frozen, threshold = gc.get_freeze_count(), gc.get_threshold()
        gc.collect()
        cycle = []
        cycle.append(cycle)
        del cycle
        collected = gc.collect()
    print(json.dumps({"frozen": frozen, "threshold": threshold, "collected": collected}))
""")


def _started(how: str, redis_url: str) -> dict[str, object]:
    env = {**os.environ, "LINREBOOT_REDIS_URL": redis_url, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    done = subprocess.run([sys.executable, "-c", _STARTED, how], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _defaults() -> list[int]:
    """This interpreter's own thresholds, untouched."""
    done = subprocess.run([sys.executable, "-c", "import gc; print(list(gc.get_threshold()))"],
                          capture_output=True, text=True, timeout=60, check=True)
    thresholds: list[int] = json.loads(done.stdout)
    return thresholds


def test_a_served_app_freezes_what_start_up_made_and_still_collects_new_cycles(
        redis_db: str) -> None:
    started = _started("factory", redis_db)
    # Start-up's objects (FastAPI, pydantic, NumPy, the service): tens of thousands.
    assert isinstance(started["frozen"], int) and started["frozen"] > 10_000
    assert started["threshold"] == [YOUNG_THRESHOLD, *_defaults()[1:]]
    assert isinstance(started["collected"], int) and started["collected"] >= 1  # the cycle


def test_an_app_given_its_settings_leaves_the_collector_alone(redis_db: str) -> None:
    started = _started("settings", redis_db)
    assert started["frozen"] == 0
    assert started["threshold"] == _defaults()
    assert isinstance(started["collected"], int) and started["collected"] >= 1
