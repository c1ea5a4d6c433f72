"""Issue 30 item 3: the alert rules, the Grafana dashboard and the compose profile that
runs them agree with the service: every metric they name is on a running app's
/metrics, the files parse, and the profile mounts what exists (no Docker engine here:
read, not run)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import DEFAULT_PORT
from tests.conftest import COVARIATES, Api

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
PROMETHEUS = ROOT / "deploy/prometheus/prometheus.yml"
DASHBOARD = ROOT / "deploy/grafana/dashboards/linreboot.json"
DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml"
PROVIDERS = ROOT / "deploy/grafana/provisioning/dashboards/linreboot.yml"
_NAME = re.compile(r"\blinreboot_[a-z_]+\b")
# The samples of a family by its TYPE line (prometheus_client's text format names a
# counter's family with its _total).
_SAMPLES = {"counter": ("",), "gauge": ("",),
            "histogram": ("_bucket", "_count", "_sum", "_created")}


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def _balanced(expr: str) -> bool:
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"[^"]*"', "", expr):
        if char in depth:
            depth[char] += 1
        elif char in closing:
            depth[closing[char]] -= 1
            if depth[closing[char]] < 0:
                return False
    return not any(depth.values())


@pytest.fixture
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


@pytest.mark.anyio
async def test_every_metric_the_rules_and_the_dashboard_name_is_on_metrics(api: Api) -> None:
    key = await api.create(COVARIATES)
    await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
    text = (await api.http.get("/metrics")).text
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    exposed = {name + suffix for name, kind in families.items()
               for suffix in _SAMPLES.get(kind, ("",))}
    named = {name for expr in [r["expr"] for r in _rules()] + _dashboard_exprs()
             for name in _NAME.findall(expr)}
    assert named, "the rules name no metric"
    assert named <= exposed, named - exposed


def test_the_alert_rules_cover_what_an_operator_is_paged_for() -> None:
    """5xx, 503s, readiness, Redis memory near maxmemory (and full), the default-reward
    share rising, p99 latency: each a rule with a duration, a severity and a summary."""
    rules = _rules()
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert len(exprs) == len(rules)  # names unique
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", str(rule["for"])), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "warn"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert _balanced(rule["expr"]), rule["alert"]
    joined = "\n".join(exprs.values())
    for needle in ('code=~"5..",code!="503"', 'code="503"', "linreboot_ready",
                   "linreboot_redis_maxmemory_bytes", "linreboot_store_full",
                   "linreboot_default_rewards_total", "histogram_quantile(0.99"):
        assert needle in joined, needle


def test_the_dashboard_reads_the_provisioned_prometheus() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert dashboard["uid"] and dashboard["title"] == "linreboot"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]) >= 6
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]
            assert _balanced(target["expr"]), target["expr"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"


def test_prometheus_scrapes_the_api_and_loads_the_rules(compose: dict[str, Any]) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    single, cluster = config["scrape_configs"]
    assert single["metrics_path"] == cluster["metrics_path"] == "/metrics"
    assert single["static_configs"][0]["targets"] == [f"api:{DEFAULT_PORT}"]
    # the cluster profile's replicas, by the name compose resolves to each of them
    assert "api-cluster" in compose["services"]
    assert cluster["dns_sd_configs"] == [{"names": ["api-cluster"], "type": "A",
                                         "port": DEFAULT_PORT}]
    mounts = _mounts(compose["services"]["prometheus"])
    assert mounts[str(ALERTS.relative_to(ROOT))] in config["rule_files"]
    assert f"--config.file={mounts[str(PROMETHEUS.relative_to(ROOT))]}" in \
        compose["services"]["prometheus"]["command"]


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Bind mounts of the repository's files: source (relative) -> target."""
    found = {}
    for volume in service["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            found[source[2:]] = target
    return found


def test_the_observability_profile_runs_prometheus_and_grafana_on_loopback(
    compose: dict[str, Any]
) -> None:
    for name, port in (("prometheus", 9090), ("grafana", 3000)):
        service = compose["services"][name]
        assert service["profiles"] == ["observability"]
        assert re.search(r":v?\d+\.\d+\.\d+$", service["image"]), service["image"]  # pinned
        assert service["ports"] == [f"127.0.0.1:{port}:{port}"]
        assert "cpus" in service and "mem_limit" in service
        for source in _mounts(service):
            assert (ROOT / source).exists(), source
    grafana = compose["services"]["grafana"]
    mounts = _mounts(grafana)
    provider = yaml.safe_load(PROVIDERS.read_text())["providers"][0]
    assert mounts["deploy/grafana/dashboards"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_a_profile_requires_no_variable_the_default_services_do_not() -> None:
    """Compose checks the required variables (``${VAR:?...}``) of every service before
    it applies profiles: one required only by a profile's service would stop a plain
    ``docker compose up``."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    required: dict[bool, set[str]] = {True: set(), False: set()}
    for service in compose["services"].values():
        text = json.dumps(service)
        required["profiles" in service].update(re.findall(r"\$\{(\w+):\?", text))
    assert required[True] <= required[False], required[True] - required[False]
