"""How fast /ui's pages render at scale, next to the JSON routes that read the same.

Usage::

    python -m benchmarks.bench_ui [--experiments 10000] [--decisions 100000] [--repeats 40]

In process (the app on an embedded Redis, httpx's ASGI transport: no sockets), with
``--experiments`` experiments and one of them holding ``--decisions`` logged decisions
(each rewarded) within the last hour: the experiments page (``/ui``: the first 100)
against ``GET /experiments?limit=100``, and an experiment's page (``/ui/experiments/
big``: its last hour, read up to 5,000 entries) against ``GET /experiments/big``.
Median and p95 ms over ``--repeats`` requests of each, timed in turn. Issue 30's bound:
300 ms at p95 for both pages. Then the evaluation form's answer (greedy evaluated on
``big``'s log: its last 15 minutes, and the whole log, each its latest 20,000 entries
at most), a few times each: it reads and evaluates the log in the request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import httpx
import numpy as np
from tqdm import tqdm

from app.main import create_app
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.settings import Settings

TOKEN = "bench-ui-token-0123456789"


async def _fill(service: object, experiments: int, decisions: int) -> None:
    arms = tuple(ArmSpec(f"a{i}") for i in range(5))
    create = service.create  # type: ignore[attr-defined]
    for i in tqdm(range(experiments - 1), desc="experiments", unit="exp"):
        await create(ExperimentSpec(id=f"exp-{i:05d}", setting="covariates", dim=3, arms=arms))
    await create(ExperimentSpec(id="big", setting="covariates", dim=3, arms=arms,
                                log_max_entries=2 * decisions))
    rng = np.random.default_rng(0)
    request = ChooseRequest(context=(0.1, 0.2, 0.3))
    for _ in tqdm(range(decisions), desc="decisions", unit="dec"):
        made = await service.choose("big", request)  # type: ignore[attr-defined]
        await service.reward("big", [(made.decision_id, float(rng.random()))])  # type: ignore[attr-defined]


async def _timed(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> float:
    start = time.perf_counter()
    reply = await http.get(path, headers=headers)
    assert reply.status_code == 200, (path, reply.status_code)
    return time.perf_counter() - start


async def main(experiments: int, decisions: int, repeats: int) -> None:
    os.environ["LINREBOOT_DATA_DIR"] = tempfile.mkdtemp(prefix="bench-ui-")
    app = create_app(Settings(admin_token=TOKEN))  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        await _fill(app.state.service, experiments, decisions)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            assert (await http.post("/ui/login", json={"token": TOKEN})).status_code == 200
            admin = {"Authorization": f"Bearer {TOKEN}"}
            pairs = [("/ui", "/experiments?limit=100"),
                     ("/ui/experiments/big", "/experiments/big")]
            times: dict[str, list[float]] = {p: [] for pair in pairs for p in pair}
            for _ in range(repeats):
                for page, json_route in pairs:
                    times[page].append(await _timed(http, page, {}))
                    times[json_route].append(await _timed(http, json_route, admin))
            for minutes in (15, 0):
                path = f"/ui/experiments/big/evaluate?policy=greedy&minutes={minutes}"
                times[path] = [await _timed(http, path, {}) for _ in range(max(3, repeats // 10))]
    print(f"{experiments} experiments; 'big' with {decisions} logged decisions, rewarded, "
          f"in the last hour; {repeats} requests each\n")
    print("| route | median ms | p95 ms |")
    print("|---|---:|---:|")
    for path, taken in times.items():
        ms = sorted(t * 1000 for t in taken)
        print(f"| `{path}` | {statistics.median(ms):.1f} | "
              f"{ms[int(0.95 * (len(ms) - 1))]:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    asyncio.run(main(args.experiments, args.decisions, args.repeats))
