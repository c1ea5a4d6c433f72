"""The README's and docs/API.md's curl examples, run as written against a real server.

Every ```bash block that holds ``curl`` is split into its commands, which run
in order with bash, as a reader pastes them, after doing what the docs tell
the reader to do: ``TOKEN`` is the admin token, ``KEY`` the ``api_key`` that
creating the experiment returned, ``<from /choose>`` the ``decision_id``
that the last ``/choose`` returned, and ``<slot 2 from /rank>`` the second slot's
of the last ``/rank``. Only the address differs (the server
listens on a free port, not 8000).

The README's Python example of ``linreboot.client`` runs the same way, with
``LINREBOOT_ADMIN_TOKEN`` set, and prints what its comments say.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.server import server_process
from tests.conftest import ADMIN_TOKEN

_REPO = Path(__file__).resolve().parents[1]
_DOCS = ["README.md", "docs/API.md"]
_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_ADDRESS = "localhost:8000"

needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl on PATH")


def curl_commands(text: str) -> list[str]:
    """The curl commands of the text's bash blocks, each with its continuation lines."""
    commands: list[list[str]] = []
    for block in _BLOCK.findall(text):
        if "curl " not in block:
            continue
        for line in block.splitlines():
            if line.startswith("curl "):
                commands.append([line])
            elif line.startswith(" ") and commands:  # a continuation, indented
                commands[-1].append(line)
            elif line.strip() and not line.startswith("#"):
                raise AssertionError(f"a line this test cannot run as the docs mean: {line!r}")
    return ["\n".join(lines) for lines in commands]


def test_curl_commands_are_split_as_a_reader_pastes_them() -> None:
    text = "```bash\n# a comment\ncurl -s a \\\n  -d '{\"x\":\n    1}'\ncurl b\n```\n"
    assert curl_commands(text) == ["curl -s a \\\n  -d '{\"x\":\n    1}'", "curl b"]
    assert curl_commands("```bash\n./dev test\n```\n") == []


@pytest.fixture(scope="module")
def base_url(redis_url: str) -> Iterator[str]:
    env = {"REDIS_URL": redis_url, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    with server_process(env) as url:
        yield url


@needs_curl
@pytest.mark.parametrize("doc", _DOCS)
def test_the_docs_curl_examples_work_as_written(redis_db: str, base_url: str, doc: str) -> None:
    commands = curl_commands((_REPO / doc).read_text())
    assert any("/choose" in c for c in commands) and any("/reward" in c for c in commands)
    env = {**os.environ, "TOKEN": ADMIN_TOKEN, "KEY": ""}
    decision_id = slot_id = None
    for command in commands:
        assert _ADDRESS in command, command
        if "<from /choose>" in command:
            assert decision_id is not None, f"{doc}: a reward before any /choose"
            command = command.replace("<from /choose>", decision_id)
        if "<slot 2 from /rank>" in command:
            assert slot_id is not None, f"{doc}: a slot's reward before any /rank"
            command = command.replace("<slot 2 from /rank>", slot_id)
        command = command.replace(_ADDRESS, base_url.removeprefix("http://"))
        body = _run(command, env, doc)
        path = command.split(base_url.removeprefix("http://"), 1)[1].split()[0]
        if path == "/experiments" or path.endswith("/keys"):  # created, or a key rotated
            env["KEY"] = body["api_key"]
        elif path == "/choose":
            decision_id = body["decision_id"]
        elif path == "/rank":
            slot_id = body["slots"][1]["decision_id"]
        elif path == "/reward":
            assert body["status"] == "applied", (doc, body)


def _run(command: str, env: dict[str, str], doc: str) -> Any:
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, (doc, command, done.stderr)
    body = json.loads(done.stdout)
    assert isinstance(body, dict) and "error" not in body, (doc, command, body)
    return body


def client_examples(text: str) -> list[str]:
    """The text's Python blocks that use ``linreboot.client``."""
    return [block for block in _PYTHON.findall(text) if "linreboot.client" in block]


def test_the_readme_client_example_works_as_written(redis_db: str, base_url: str) -> None:
    examples = client_examples((_REPO / "README.md").read_text())
    assert examples
    env = {**os.environ, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN}
    for code in examples:
        assert _ADDRESS in code
        done = subprocess.run(
            [sys.executable, "-c", code.replace(_ADDRESS, base_url.removeprefix("http://"))],
            env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        # Each print says what it prints in its comment, when it can know it.
        prints = [line for line in code.splitlines() if line.lstrip().startswith("print(")]
        printed = done.stdout.splitlines()
        assert len(printed) == len(prints), done.stdout
        for line, out in zip(prints, printed, strict=True):
            if "  # " in line:
                assert out == line.split("  # ", 1)[1], (line, out)
