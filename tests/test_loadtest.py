"""The load replay: its pure pieces, then a short run against a real server."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from linreboot.cli import main
from loadtest.load import (
    CHOOSE,
    REWARD,
    FeedbackModel,
    LoadConfig,
    RouteStats,
    Tally,
    expected_counters,
    latency_summary,
    percentile,
    poisson_arrivals,
    run_load,
)
from loadtest.server import server_process
from tests.conftest import ADMIN_TOKEN

SIGMAS = 4.0  # tolerance of the statistical checks; fixed seeds make them deterministic


def _binomial_ok(hits: int, n: int, p: float) -> bool:
    return abs(hits / n - p) <= SIGMAS * math.sqrt(p * (1 - p) / n)


# --------------------------------------------------------------------------- percentiles


def test_percentile_is_nearest_rank() -> None:
    values = sorted(np.random.default_rng(0).permutation(np.arange(1.0, 101.0)))
    assert [percentile(values, q) for q in (0, 1, 50, 95, 99, 99.5, 100)] == [
        1, 1, 50, 95, 99, 100, 100]
    assert percentile([7.0], 50) == percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0], 50) == 1.0  # an element, never an interpolation


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


def test_latency_summary_in_milliseconds() -> None:
    summary = latency_summary([k / 1000 for k in range(1000, 0, -1)])  # 1..1000 ms, unsorted
    assert summary["p50_ms"] == pytest.approx(500)
    assert summary["p95_ms"] == pytest.approx(950)
    assert summary["p99_ms"] == pytest.approx(990)
    assert summary["max_ms"] == pytest.approx(1000)
    assert summary["mean_ms"] == pytest.approx(500.5)
    assert set(latency_summary([]).values()) == {None}


# --------------------------------------------------------------------------- arrivals


def test_arrivals_are_poisson() -> None:
    rate, duration = 200.0, 50.0
    times = poisson_arrivals(rate, duration, np.random.default_rng(1), limit=10**6)
    n, expected = times.size, rate * duration
    # The count is Poisson(rate * duration): variance equals the mean.
    assert abs(n - expected) <= SIGMAS * math.sqrt(expected)
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < duration
    gaps = np.diff(np.concatenate([[0.0], times]))
    # Exponential gaps: mean 1/rate with standard error (1/rate)/sqrt(n) ...
    assert abs(gaps.mean() - 1 / rate) <= SIGMAS / (rate * math.sqrt(n))
    # ... and P(gap > mean) = 1/e, which a regular or uniform schedule would miss.
    assert _binomial_ok(int((gaps > 1 / rate).sum()), n, math.exp(-1))


def test_arrivals_respect_the_limit_and_the_duration() -> None:
    rng = np.random.default_rng(2)
    assert poisson_arrivals(1000.0, 10.0, rng, limit=25).size == 25
    few = poisson_arrivals(0.5, 0.001, rng, limit=100)
    assert few.size <= 1 and np.all(few < 0.001)


# --------------------------------------------------------------------------- feedback


def test_feedback_fractions_and_delays() -> None:
    model = FeedbackModel(delay_mean=0.2, drop_fraction=0.1, duplicate_fraction=0.05,
                          duplicate_delay_mean=0.03)
    rng = np.random.default_rng(3)
    n = 20_000
    plans = [model.draw(rng) for _ in range(n)]
    dropped = [p for p in plans if p.delay is None]
    twice = [p for p in plans if p.duplicate_delay is not None]
    assert _binomial_ok(len(dropped), n, 0.1)
    assert _binomial_ok(len(twice), n, 0.05)
    assert all(p.duplicate_delay is None for p in dropped)
    delays = np.array([p.delay for p in plans if p.delay is not None])
    # Exponential: the sd equals the mean, so the sample mean's s.e. is mean / sqrt(n).
    assert abs(delays.mean() - 0.2) <= SIGMAS * 0.2 / math.sqrt(delays.size)
    again = np.array([p.duplicate_delay for p in twice])
    assert abs(again.mean() - 0.03) <= SIGMAS * 0.03 / math.sqrt(again.size)


@pytest.mark.parametrize("kwargs", [
    {"drop_fraction": -0.1}, {"duplicate_fraction": 0.6, "drop_fraction": 0.5},
    {"delay_mean": -1.0}, {"duplicate_delay_mean": -1.0},
])
def test_feedback_model_refuses(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FeedbackModel(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {}, {"rate": 10.0, "concurrency": 4}, {"rate": 0.0}, {"rate": math.nan},
    {"concurrency": 0}, {"rate": 1.0, "duration": 0.0}, {"rate": 1.0, "experiments": 0},
    {"rate": 1.0, "drain_seconds": -1.0}, {"rate": 1.0, "n_arms": 0},
    {"rate": 1.0, "clients": 0},
])
def test_load_config_refuses(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LoadConfig(**kwargs)


# --------------------------------------------------------------------------- counter check


def _view(decisions: int, rewards: int, duplicates: int) -> dict[str, int]:
    return {"decisions": decisions, "rewards": rewards, "duplicates": duplicates}


def test_counter_check_is_exact_without_unknowns() -> None:
    tally = Tally(choose_ok=5)
    for decision, status in [("a", "applied"), ("b", "applied"), ("a", "duplicate"),
                             ("c", "duplicate")]:  # c: the first send's answer came later
        tally.acknowledge(decision, status)
    tally.acknowledge("c", "applied")
    check = expected_counters("e", tally, _view(5, 3, 2))
    assert check.passed
    assert check.rewards_expected == (3, 3) and check.duplicates_expected == (2, 2)
    for wrong in (_view(6, 3, 2), _view(5, 4, 2), _view(5, 3, 1)):
        assert not expected_counters("e", tally, wrong).passed


def test_counter_check_bounds_unanswered_requests() -> None:
    tally = Tally(choose_ok=3, choose_unknown=1, reward_unknown={"x"})
    tally.acknowledge("a", "applied")
    assert expected_counters("e", tally, _view(4, 2, 1)).passed
    assert expected_counters("e", tally, _view(3, 1, 0)).passed
    assert not expected_counters("e", tally, _view(5, 1, 0)).passed


@pytest.mark.parametrize("acks", [[("a", "applied"), ("a", "applied")], [("a", "conflict")]])
def test_counter_check_fails_on_double_count_or_unexpected_ack(
    acks: list[tuple[str, str]],
) -> None:
    tally = Tally(choose_ok=1)
    for decision, status in acks:
        tally.acknowledge(decision, status)
    counted = len(tally.counted)
    assert not expected_counters("e", tally, _view(1, counted, 0)).passed


def test_route_errors_are_4xx_5xx_and_transport() -> None:
    stats = RouteStats()
    for outcome in ("200", "200", "404", "503", "ReadTimeout"):
        stats.record(outcome, 0.0, 0.001, timed=outcome.isdigit())
    assert stats.errors == {"404": 1, "503": 1, "ReadTimeout": 1}
    assert stats.requests == 5 and len(stats.latencies) == 4


def test_cli_refuses_a_remote_service() -> None:
    with pytest.raises(SystemExit, match="non-loopback"):
        main(["loadtest", "--url", "http://10.1.2.3:8000", "--admin-token", "x"])


# --------------------------------------------------------------------------- against a server


def _no_5xx(statuses: dict[str, int] | Counter[str]) -> bool:
    return not any(code.startswith("5") for code in statuses)


@pytest.mark.slow
def test_load_replay_against_a_server(redis_db: str, tmp_path: Path) -> None:
    env = {"LINREBOOT_REDIS_URL": redis_db, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    with server_process(env) as url:
        # Open loop through the CLI: exit code, JSON report.
        out = tmp_path / "report.json"
        code = main(["loadtest", "--url", url, "--admin-token", ADMIN_TOKEN, "--rate", "40",
                     "--duration", "2.5", "--experiments", "4", "--dim", "5",
                     "--drop-fraction", "0.2", "--duplicate-fraction", "0.25",
                     "--reward-delay-mean", "0.1", "--no-progress", "--out", str(out)])
        assert code == 0
        report = json.loads(out.read_text())
        check = report["counter_check"]
        assert check["passed"] and check["exact"]
        for route in (CHOOSE, REWARD):
            stats = report["routes"][route]
            assert stats["requests"] > 0 and _no_5xx(stats["statuses"])
            assert None not in stats["latency"].values()
        service, low, high = check["totals"]["duplicates"]
        assert service == low == high == report["reward_acks"]["duplicate"] > 0
        assert report["feedback"]["planned"]["dropped"] > 0
        # Closed loop in-process: a different setting, the report object itself.
        config = LoadConfig(experiments=3, setting="contextual", dim=3, n_arms=5,
                            concurrency=4, duration=1.5, max_requests=300,
                            feedback=FeedbackModel(0.05, 0.1, 0.3, 0.01))
        closed = asyncio.run(run_load(url, ADMIN_TOKEN, config, progress=False))
    assert closed.check.passed and closed.check.exact, closed.check.line()
    assert sum(e.duplicates for e in closed.check.experiments) == closed.acks()["duplicate"]
    assert closed.routes[CHOOSE].requests <= 300
    assert all(_no_5xx(r.statuses) and not r.errors for r in closed.routes.values())
    assert "| /reward |" in closed.markdown() and "PASS" in closed.markdown()
