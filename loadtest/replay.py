"""HTTP replays of grid cells, and their comparison with the in-process simulator."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from linreboot.client import AsyncClient
from loadtest.http_driver import HttpDriver, Limits
from loadtest.results import Curve
from loadtest.server import server_process
from loadtest.simulate import Cell, Played, play, to_curve


@dataclass(frozen=True)
class Comparison:
    """One cell replayed both ways with the same seeds."""

    cell: Cell
    in_process: Curve
    http: Curve
    same_decisions: float  # fraction of (repetition, round) with the same arm (every slot's)

    @property
    def difference(self) -> float:
        return self.http.final_mean - self.in_process.final_mean

    @property
    def difference_se(self) -> float:
        return float(np.hypot(self.http.final_se, self.in_process.final_se))


@contextlib.contextmanager
def service(url: str | None, admin_token: str | None, workers: int) -> Iterator[tuple[str, str]]:
    """Use the service at ``url``, or start one (embedded Redis in a temporary directory)."""
    if url is not None:
        if not admin_token:
            raise SystemExit("--url needs --admin-token (the service's LINREBOOT_ADMIN_TOKEN)")
        yield url, admin_token
        return
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="linreboot-") as data_dir:
        env = {"LINREBOOT_ADMIN_TOKEN": token, "LINREBOOT_DATA_DIR": data_dir,
               "LINREBOOT_LOG_LEVEL": "warning"}
        env["LINREBOOT_REDIS_URL"] = ""
        with server_process(env, workers=workers) as base_url:
            yield base_url, token


async def replay_cells(
    base_url: str, admin_token: str, cells: Sequence[Cell], reps: int, horizon: int,
    seed: int, limits: Limits,
) -> list[Played]:
    """Replay every cell over HTTP, one after another, with a progress bar over rounds."""
    timeout = httpx.Timeout(30.0)
    pool = httpx.Limits(max_connections=limits.concurrency,
                        max_keepalive_connections=limits.concurrency)
    played = []
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=pool) as http:
        driver = HttpDriver(AsyncClient(http=http, admin_token=admin_token), limits)
        with tqdm(total=len(cells) * horizon, desc="replay over HTTP", unit="round") as bar:
            for cell in cells:
                bar.set_postfix_str(f"{cell.setting} d={cell.dim} {cell.label}")
                played.append(await driver.replay(cell, reps, horizon, seed, bar.update))
    return played


def http_curves(
    base_url: str, admin_token: str, cells: Sequence[Cell], reps: int, horizon: int,
    seed: int, limits: Limits,
) -> list[Curve]:
    played = asyncio.run(replay_cells(base_url, admin_token, cells, reps, horizon, seed, limits))
    return [to_curve("http", c, p) for c, p in zip(cells, played, strict=True)]


def compare(
    base_url: str, admin_token: str, cells: Sequence[Cell], reps: int, horizon: int,
    seed: int, limits: Limits,
) -> list[Comparison]:
    """Run each cell in-process (service-style seeding) and over HTTP; compare."""
    remote = asyncio.run(replay_cells(base_url, admin_token, cells, reps, horizon, seed, limits))
    results = []
    for cell, http in zip(tqdm(cells, desc="in-process", unit="cell"), remote, strict=True):
        local = play(cell, reps, horizon, seed, per_decision_rng=True)
        results.append(Comparison(
            cell=cell,
            in_process=to_curve("in-process", cell, local),
            http=to_curve("http", cell, http),
            same_decisions=float((local.arms == http.arms).mean() if local.placed is None
                                 else (local.placed == http.placed).all(axis=2).mean()),
        ))
    return results


def comparison_table(rows: Sequence[Comparison]) -> str:
    lines = [
        "| setting | d | policy | in-process | HTTP | difference | diff / s.e. "
        "| same decisions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        z = r.difference / r.difference_se if r.difference_se > 0 else 0.0
        lines.append(
            f"| {r.cell.setting} | {r.cell.dim} | {r.cell.label} "
            f"| {r.in_process.final_mean:.2f} ± {r.in_process.final_se:.2f} "
            f"| {r.http.final_mean:.2f} ± {r.http.final_se:.2f} "
            f"| {r.difference:+.3g} | {z:+.2f} | {100 * r.same_decisions:.2f}% |"
        )
    return "\n".join(lines)


def write_comparison(rows: Sequence[Comparison], out: Path) -> str:
    from loadtest.plots import regret_grid
    from loadtest.results import write_curves

    curves = [c for r in rows for c in (r.in_process, r.http)]
    write_curves(out / "results.csv", curves)
    regret_grid(curves, out / "regret.png", "In-process (solid) vs HTTP (dashed)")
    table = comparison_table(rows)
    (out / "comparison.md").write_text(table + "\n")
    return table
