"""``linreboot serve`` with two uvicorn workers: shared Redis state, summed metrics."""

from __future__ import annotations

import re

import httpx
import pytest

from loadtest.server import server_process
from tests.conftest import ADMIN, ADMIN_TOKEN, COVARIATES


def _counter(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.MULTILINE)
    assert match, name
    return float(match.group(1))


@pytest.mark.slow
def test_two_workers_share_state_and_metrics(redis_db: str) -> None:
    env = {"LINREBOOT_REDIS_URL": redis_db, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN}
    with server_process(env, workers=2) as url, httpx.Client(base_url=url, timeout=10) as http:
        created = http.post("/experiments", json=COVARIATES, headers=ADMIN)
        assert created.status_code == 201, created.text
        key = {"X-API-Key": created.json()["api_key"]}
        decisions = 20
        for _ in range(decisions):
            choice = http.post("/choose", json={"experiment_id": "cov", "context": [1, 0, 0]},
                               headers=key)
            assert choice.status_code == 200, choice.text
            reward = {"experiment_id": "cov", "decision_id": choice.json()["decision_id"],
                      "reward": 1.0}
            assert http.post("/reward", json=reward, headers=key).json()["status"] == "applied"
        view = http.get("/experiments/cov", headers=ADMIN).json()
        assert (view["decisions"], view["rewards"]) == (decisions, decisions)
        # Every scrape, whichever worker answers, sums both workers' counts.
        for _ in range(4):
            text = http.get("/metrics").text
            assert _counter(text, "linreboot_decisions_total") == decisions
            assert _counter(text, 'linreboot_rewards_total{outcome="applied"}') == decisions
