"""Where one worker's time goes under choose + reward pairs: a sampling profile.

Usage::

    python -m benchmarks.profile_worker [--seconds 12] [--rate 500] [--spread default] [--top N]
                                        [--inclusive N]
                                        [--load pairs|choose|rank|reward] [--workers N]

Needs wrk (``apt-get install wrk``) and py-spy (``pip install py-spy``; not a
dependency of the service). Starts ``linreboot serve`` with one worker and its
embedded Redis, creates the stochastic K = 100, d = 20 LinReBoot experiment of
``benchmarks.bench_service``, drives it with ``wrk_pairs.lua`` (every decision
rewarded) and samples the worker with py-spy meanwhile. Prints the share of
samples by where the innermost frame of a known package is (the policy math,
the service, redis-py, the HTTP stack, the event loop), one table, for
BENCHMARKS.md; ``--top N`` adds the N functions most often innermost (self
time). Redis's own time is ``bench_service``'s "Redis µs/request". With ``--workers N``
the N workers share one experiment and are sampled together (py-spy's
``--subprocesses``): what more workers on one hot experiment cost shows as the shares
that grow against one worker's.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.bench_service import World, _experiment
from loadtest.server import free_port

HERE = Path(__file__).resolve().parent

# (a path fragment of a frame's file, its category), the first that matches wins.
CATEGORIES = (
    ("policies/propensity", "policy math: propensity"),
    ("policies/", "policy math: prepare, draw, update"),
    ("service/folding", "service: folding"),
    ("service/store", "service: store (script calls, batching)"),
    ("service/", "service: experiments, codec"),
    ("redis/", "redis-py client"),
    ("pydantic", "pydantic"),
    ("app/", "app: routes and middleware"),
    ("fastapi/", "fastapi"),
    ("starlette/", "starlette"),
    ("uvicorn/", "uvicorn (HTTP parsing, sending)"),
    ("asyncio/", "asyncio (event loop, socket writes)"),
)


def samples(stacks: Path) -> list[tuple[list[str], int]]:
    """Each sampled stack's frames (outermost first) and its count. A line without a
    count (a frame's name that held a line break) is skipped."""
    parsed = []
    for line in stacks.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if n.isdigit():
            parsed.append((stack.split(";"), int(n)))
    return parsed


def _where(frame: str) -> str:
    """A frame as function and file, without its line or this checkout's path."""
    return frame.split(":")[0].replace(str(Path.cwd()) + "/", "")


def _shares(counts: collections.Counter[str], total: int, top: int) -> list[tuple[str, float]]:
    return [(name, count / total) for name, count in counts.most_common(top)]


def categorise(stacks: Path) -> dict[str, float]:
    """Share of samples by the innermost frame that belongs to a known category."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, n in samples(stacks):
        name = "other"
        for frame in reversed(frames[1:]):
            hit = [label for fragment, label in CATEGORIES if fragment in frame]
            if hit:
                name = hit[0]
                break
        counts[name] += n
    return dict(_shares(counts, sum(counts.values()), len(counts)))


def innermost(stacks: Path, top: int) -> list[tuple[str, float]]:
    """The ``top`` innermost frames (function and file) by their share of samples."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, n in samples(stacks):
        counts[_where(frames[-1])] += n
    return _shares(counts, sum(counts.values()), top)


def inclusive(stacks: Path, top: int) -> list[tuple[str, float]]:
    """The ``top`` functions (and file) by their share of samples anywhere on the stack
    (each counted once a sample, however often it recurs)."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, n in samples(stacks):
        total += n
        for frame in {_where(frame) for frame in frames[1:]}:
            counts[frame] += n
    return _shares(counts, total, top)


def _load(load: str, url: str, experiment: str, key: str, directory: Path,
          seconds: int, world: World) -> tuple[list[str], list[str], str]:
    """The warm-up's and the sampled run's wrk script arguments, and the path. Rewards
    need decisions of their own, unrewarded: made first by /choose runs (at its rate,
    below /reward's, half as long again as the rewards take), one set for each run."""
    body = world.choose_body(experiment, 10 if load == "rank" else None)
    if load == "pairs":
        return [experiment, key, body], [experiment, key, body], f"{url}/choose"
    if load != "reward":
        args = [body, key, str(directory)]
        return args, args, f"{url}/rank" if load == "rank" else f"{url}/choose"
    runs = []
    for name, length in (("warm", 5), ("load", math.ceil(1.5 * seconds))):
        ids = directory / name
        ids.mkdir()
        subprocess.run(["wrk", "-t1", "-c32", "-s", str(HERE / "wrk_choose.lua"),
                        f"-d{length}s", f"{url}/choose", "--", body, key, str(ids)],
                       check=True, stdout=subprocess.DEVNULL)
        runs.append([experiment, key, str(ids), "1"])
    return runs[0], runs[1], f"{url}/reward"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=12, help="seconds sampled")
    parser.add_argument("--rate", type=int, default=500, help="samples a second")
    parser.add_argument("--spread", choices=("paper", "default"), default="default")
    parser.add_argument("--top", type=int, default=0, help="also the N top functions (self)")
    parser.add_argument("--inclusive", type=int, default=0,
                        help="also the N top functions (anywhere on the stack)")
    parser.add_argument("--load", choices=("pairs", "choose", "rank", "reward"),
                        default="pairs",
                        help="every decision rewarded (wrk_pairs.lua), decisions only, "
                             "rankings of 10 only (/rank), or rewards only (of decisions "
                             "made before the sampling)")
    parser.add_argument("--setting", choices=("stochastic", "covariates"),
                        default="stochastic")
    parser.add_argument("--arms", type=int, default=100, help="K")
    parser.add_argument("--workers", type=int, default=1,
                        help="serving workers on the one experiment, sampled together")
    args = parser.parse_args()
    for tool in ("wrk", "py-spy"):
        if shutil.which(tool) is None and not (Path(sys.executable).parent / tool).exists():
            raise SystemExit(f"{tool} is needed: see this module's docstring")
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    token, port = "profile-token", free_port()
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "LINREBOOT_ADMIN_TOKEN": token, "LINREBOOT_LOG_LEVEL": "warning",
               "LINREBOOT_DATA_DIR": directory}
        env.pop("LINREBOOT_REDIS_URL", None)
        server = subprocess.Popen([sys.executable, "-m", "linreboot", "serve", "--port",
                                   str(port), "--workers", str(args.workers)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(120):
                try:
                    if httpx.get(f"{url}/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.25)
            world = World(setting=args.setting, arms=args.arms)
            experiment, key = _experiment(url, token, spread=args.spread, world=world)
            warm_args, load_args, path = _load(args.load, url, experiment, key,
                                               Path(directory), args.seconds + 3, world)
            script = HERE / {"pairs": "wrk_pairs.lua", "reward": "wrk_reward.lua"}.get(
                args.load, "wrk_choose.lua")
            wrk = ["wrk", "-t1", "-c32", "-s", str(script)]
            subprocess.run([*wrk, "-d3s", path, "--", *warm_args],
                           check=True, stdout=subprocess.DEVNULL)  # warm-up
            load = subprocess.Popen([*wrk, f"-d{args.seconds + 3}s", path, "--",
                                     *load_args], stdout=subprocess.DEVNULL)
            time.sleep(1)
            stacks = Path(directory) / "stacks.txt"
            subprocess.run([py_spy, "record", "--pid", str(server.pid), "--rate",
                            str(args.rate), "-d", str(args.seconds), "--format", "raw",
                            "--nonblocking", "-o", str(stacks),
                            *(["--subprocesses"] if args.workers > 1 else [])],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            load.wait()
            shares = categorise(stacks)
            functions = innermost(stacks, args.top)
            enclosing = inclusive(stacks, args.inclusive)
        finally:
            server.terminate()
            server.wait()
    driven = {"pairs": "choose + reward pairs", "choose": "/choose only",
              "rank": "/rank k = 10 only", "reward": "/reward only"}[args.load]
    workers = "one worker" if args.workers == 1 else f"{args.workers} workers"
    print(f"{workers}, {driven}, {args.seconds} s at {args.rate} samples/s; "
          f"LinReBoot ({args.spread} spread), {args.setting}, K = {args.arms}, d = 20")
    print("| where | share of the worker's samples |")
    print("|---|---:|")
    for name, share in shares.items():
        print(f"| {name} | {100 * share:.1f} % |")
    if functions:
        print("\n| function (innermost frame) | share |\n|---|---:|")
        for frame, share in functions:
            print(f"| `{frame}` | {100 * share:.1f} % |")
    if enclosing:
        print("\n| function (anywhere on the stack) | share |\n|---|---:|")
        for frame, share in enclosing:
            print(f"| `{frame}` | {100 * share:.1f} % |")


if __name__ == "__main__":
    main()
