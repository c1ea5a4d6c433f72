"""The client installs alone (issue 29): ``linreboot-client`` (clients/python) brings
httpx and pydantic and nothing of the service's, ships ``py.typed``, and runs the
README's client example against a service. It installs from the package index, as a
user's ``pip install`` does."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from loadtest.server import server_process
from tests.conftest import ADMIN_TOKEN
from tests.test_docs_examples import _ADDRESS, client_examples

ROOT = Path(__file__).resolve().parents[1]
SERVER_ONLY = ("numpy", "scipy", "fastapi", "redis", "uvicorn", "policies", "service", "app")


@pytest.mark.slow
def test_the_client_installs_alone_and_runs_the_readme_example(redis_db: str,
                                                               tmp_path: Path) -> None:
    venv.create(tmp_path / "v", with_pip=True)
    python = str(tmp_path / "v" / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "install", "-q",
                                str(ROOT / "clients" / "python")],
                               capture_output=True, text=True, timeout=600, check=False)
    assert installed.returncode == 0, installed.stderr[-2000:]
    probe = subprocess.run(
        [python, "-c", "import importlib.util, pathlib, linreboot.client as c; "
         f"print([m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)]); "
         "print((pathlib.Path(c.__file__).parent / 'py.typed').exists())"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path)
    assert probe.stdout.split("\n")[:2] == ["[]", "True"], probe.stdout
    env = {"LINREBOOT_REDIS_URL": redis_db, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    (code,) = client_examples((ROOT / "README.md").read_text())
    with server_process(env) as url:
        done = subprocess.run(
            [python, "-c", code.replace(_ADDRESS, url.removeprefix("http://"))],
            env={**os.environ, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN}, cwd=tmp_path,
            capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "chosen with probability" in done.stdout
    assert sys.executable != python  # it ran in the client's own environment
