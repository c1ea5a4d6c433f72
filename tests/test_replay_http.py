"""Replays over HTTP against a real uvicorn server (subprocess) on the test Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loadtest.http_driver import Limits, require_loopback
from loadtest.replay import compare, replay_cells, write_comparison
from loadtest.results import read_curves, write_curves
from loadtest.server import server_process
from loadtest.simulate import Cell, play, to_curve

TOKEN = "replay-test-token"
HORIZON = 40
REPS = 2
CELLS = [
    Cell("stochastic", 3, "linreboot"),
    Cell("contextual", 3, "lints-g"),
    Cell("covariates", 3, "linucb"),
    Cell("stochastic", 3, "linreboot", overrides=(("spread", "pooled"),)),
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(redis_url: str) -> Iterator[str]:
    env = {"LINREBOOT_REDIS_URL": redis_url, "LINREBOOT_ADMIN_TOKEN": TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    with server_process(env, workers=1) as url:
        yield url


def test_replay_of_each_setting_computes_regret_and_counters_match(
    server: str, tmp_path: Path
) -> None:
    # HttpDriver.replay checks after each cell that the service counted one
    # decision and one reward per round and repetition (it raises otherwise).
    played = asyncio.run(replay_cells(server, TOKEN, CELLS, REPS, HORIZON, 0, Limits()))
    curves = []
    for cell, result in zip(CELLS, played, strict=True):
        assert result.cumulative.shape == (REPS, HORIZON)
        steps = np.diff(result.cumulative, axis=1, prepend=0.0)
        assert (steps >= -1e-12).all()  # regret per round is never negative
        assert result.arms.min() >= 0
        curves.append(to_curve("http", cell, result))
    path = tmp_path / "results.csv"
    write_curves(path, curves)
    back = {(c.setting, c.label): c for c in read_curves(path)}
    for c in curves:
        assert np.allclose(back[(c.setting, c.label)].mean, c.mean, rtol=1e-5)


def test_http_replay_makes_the_in_process_decisions(server: str, tmp_path: Path) -> None:
    """Same seeds, rewards applied in order, same policy code on the same sums."""
    rows = compare(server, TOKEN, CELLS, REPS, HORIZON, 1, Limits())
    for row in rows:
        assert row.same_decisions == 1.0, row.cell
        assert row.difference == pytest.approx(0.0, abs=1e-9)
    table = write_comparison(rows, tmp_path)
    assert "100.00%" in table
    assert (tmp_path / "regret.png").stat().st_size > 10_000


RANKING_CELLS = [
    Cell("stochastic", 3, "linreboot", overrides=(("spread", "pooled"),), slots=3),
    Cell("covariates", 3, "linreboot", slots=3, position_weights=(1.0, 0.5)),
    Cell("contextual", 3, "linucb", slots=2, position_weights=(1.0, 0.7)),
]


def test_http_replay_of_rankings_makes_the_in_process_rankings(server: str) -> None:
    """/rank over HTTP, every slot's reward in one batch in slot order (over its position
    weight, by the service): every slot of every round as in process, the same regret;
    the service counted one decision and one reward per slot (the driver checks)."""
    rows = compare(server, TOKEN, RANKING_CELLS, REPS, HORIZON, 2, Limits())
    for row in rows:
        assert row.same_decisions == 1.0, row.cell
        assert row.difference == pytest.approx(0.0, abs=1e-9)


def test_in_process_seeding_modes_differ_but_both_learn() -> None:
    """Per-decision seeding is a different random stream, not a different algorithm."""
    cell = Cell("stochastic", 3, "linreboot")
    fast = play(cell, 4, 300, 5)
    service_like = play(cell, 4, 300, 5, per_decision_rng=True)
    assert not np.array_equal(fast.arms, service_like.arms)
    # Both explore every one of the 100 arms first, then concentrate: the last
    # 100 rounds cost less regret than the 100 exploration rounds.
    for played in (fast, service_like):
        per_round = np.diff(played.cumulative, axis=1, prepend=0.0)
        assert per_round[:, -100:].sum() < per_round[:, :100].sum()


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com", "https://8.8.8.8"])
def test_replays_refuse_remote_hosts_unless_allowed(url: str) -> None:
    with pytest.raises(ValueError, match="non-loopback"):
        require_loopback(url, allow_remote=False)
    require_loopback(url, allow_remote=True)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:80"])
def test_loopback_hosts_are_allowed(url: str) -> None:
    require_loopback(url, allow_remote=False)
