"""Candidate default rules against the baselines, every row with the same start.

The protocol of RESULTS.md, "Choosing the default": rules are compared on
validation worlds, then reported once on a test set written down (and
committed) before it is run. A *world* is one row of a table: one of the
paper's settings at a dimension, optionally with another number of arms, another
noise sd, delayed rewards or a drifting theta, and its own seed; or a
supervised-to-bandit reduction of a scikit-learn data set
(``loadtest.classification``, the covariates setting; needs the ``data`` extra).
Every policy of a world plays the same repetitions of it
(``loadtest.simulate.play_together``), with the same start: the paper's first
pass for every row or for none (``--first-pass``).

Per world and policy: final regret (mistakes for a data set), mean ± s.e.
and sd; the 95th percentile; and the *lock-ins*, the repetitions whose regret
over the last 20% of rounds exceeds 3 times the median repetition's. Then,
for ``--default``, the check of issue 24 against the best (lowest mean) of
``--baselines`` in each world: mean at most the best's plus one paired
standard error, 95th percentile at most 1.25 times the best's, lock-ins at
most the best's.

Policies are named as ``linreboot simulate`` names them (``linreboot`` is the
paper's spread), plus ``pooled`` (``linreboot`` with ``spread="pooled"`` and
the service's sigma_omega for the kind of model) and ``pooled:S`` (with
``sigma_omega = S``). Usage::

    .venv/bin/python -m benchmarks.bench_default --spec benchmarks/protocol/validation.json \\
        --jobs 2 --out results/validation
    .venv/bin/python -m benchmarks.bench_default --settings stochastic --dims 5 \\
        --reps 40 --horizon 3000 --policies pooled linucb-const lints-g greedy
    .venv/bin/python -m benchmarks.bench_default --report results/validation/raw.csv

``--out`` writes ``raw.csv`` (every repetition's final and last-20% regret)
and ``tables.md``; ``--report`` prints the tables again from a ``raw.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from loadtest.simulate import Cell, play_together
from policies import PolicyName, Setting, paper_config

DEFAULT_POLICIES = ("pooled", "linreboot", "greedy", "linucb-const", "lints-g", "lints-ig")
BASELINES = ("linucb-const", "lints-ig", "lints-g", "greedy")
TAIL_SHARE = 0.2  # the last 20% of rounds, where a locked-in repetition keeps losing
LOCK_IN_FACTOR = 3.0
P95_FACTOR = 1.25


@dataclass(frozen=True)
class World:
    """One row of a table: a seeded world (or a data set) and how rewards reach the policy."""

    setting: Setting = "covariates"
    dim: int = 5
    n_arms: int | None = None  # None: the paper's (100, 100, 10)
    noise: float | None = None  # an sd; None: the setting's
    delay: int = 0  # decisions before a reward is learnt
    switch_every: int = 0  # rounds between draws of a new theta; 0: never
    seed: int = 0
    dataset: str | None = None  # a scikit-learn data set instead of a synthetic world

    @property
    def label(self) -> str:
        if self.dataset is not None:
            return f"{self.dataset} (seed {self.seed})"
        extra = [f"K={self.n_arms}"] if self.n_arms is not None else []
        extra += [f"noise sd {self.noise:g}"] if self.noise is not None else []
        extra += [f"delay {self.delay}"] if self.delay else []
        extra += [f"switch every {self.switch_every}"] if self.switch_every else []
        extra += [f"seed {self.seed}"]
        return f"{self.setting} d={self.dim} ({', '.join(extra)})"


@dataclass(frozen=True)
class Job:
    world: World
    policies: tuple[str, ...]
    reps: int
    horizon: int
    first_pass: bool


@dataclass
class Outcome:
    """Every repetition's final regret and its regret over the last 20% of rounds."""

    final: dict[str, list[float]] = field(default_factory=dict)
    tail: dict[str, list[float]] = field(default_factory=dict)


def policy_overrides(name: str) -> tuple[PolicyName, tuple[tuple[str, object], ...]]:
    """``pooled`` and ``pooled:S`` as LinReBoot overrides; other names as they are."""
    policy, _, sigma = name.partition(":")
    if policy != "pooled":
        return policy, ()  # type: ignore[return-value]
    extra: tuple[tuple[str, object], ...] = (("sigma_omega", float(sigma)),) if sigma else ()
    return "linreboot", (("spread", "pooled"), *extra)


def play_world(job: Job) -> Outcome:
    """Every policy of ``job`` on the same repetitions of its world."""
    if job.world.dataset is not None:
        return _play_dataset(job)
    w = job.world
    cells = []
    for name in job.policies:
        policy, overrides = policy_overrides(name)
        cells.append(Cell(w.setting, w.dim, policy, overrides=overrides,
                          switch_every=w.switch_every, first_pass=job.first_pass,
                          n_arms=w.n_arms, noise=w.noise, delay=w.delay))
    played = play_together(cells, job.reps, job.horizon, w.seed)
    cut = job.horizon - max(1, round(TAIL_SHARE * job.horizon))
    out = Outcome()
    for name, p in zip(job.policies, played, strict=True):
        out.final[name] = p.cumulative[:, -1].tolist()
        out.tail[name] = (p.cumulative[:, -1] - p.cumulative[:, cut - 1]).tolist()
    return out


def _play_dataset(job: Job) -> Outcome:
    from loadtest.classification import classification_mistakes, sklearn_dataset
    from loadtest.environments import split_rngs

    data = sklearn_dataset(job.world.dataset or "")
    cut = job.horizon - max(1, round(TAIL_SHARE * job.horizon))
    out = Outcome()
    for name in job.policies:
        policy, overrides = policy_overrides(name)
        config = paper_config(policy, "covariates", data.dim, first_pass=job.first_pass,
                              **dict(overrides))
        mistakes = classification_mistakes(config, data, split_rngs(job.world.seed, job.reps),
                                           job.horizon)
        out.final[name] = mistakes.sum(axis=1).astype(float).tolist()
        out.tail[name] = mistakes[:, cut:].sum(axis=1).astype(float).tolist()
    return out


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Row:
    """One policy in one world."""

    mean: float
    se: float
    sd: float
    p95: float
    lock_ins: int

    @classmethod
    def of(cls, final: Sequence[float], tail: Sequence[float]) -> Row:
        v, t = np.asarray(final), np.asarray(tail)
        sd = float(v.std(ddof=1)) if v.size > 1 else 0.0
        return cls(float(v.mean()), sd / math.sqrt(v.size), sd,
                   float(np.percentile(v, 95)), lock_ins(t))


def lock_ins(tail: np.ndarray) -> int:
    """Repetitions whose last-20% regret exceeds 3 times the median repetition's."""
    return int(np.count_nonzero(tail > LOCK_IN_FACTOR * np.median(tail)))


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of ``a - b``, repetition by repetition."""
    d = np.asarray(a) - np.asarray(b)
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else 0.0


@dataclass(frozen=True)
class Check:
    """``default`` against the best of the baselines in one world (issue 24's targets)."""

    best: str
    difference: float
    se: float
    p95_ratio: float
    lock_ins: tuple[int, int]

    @property
    def mean_ok(self) -> bool:
        return self.difference <= self.se

    @property
    def tail_ok(self) -> bool:
        return self.p95_ratio <= P95_FACTOR

    @property
    def lock_ins_ok(self) -> bool:
        return self.lock_ins[0] <= self.lock_ins[1]


def check(outcome: Outcome, default: str, baselines: Sequence[str]) -> Check:
    rows = {name: Row.of(outcome.final[name], outcome.tail[name]) for name in outcome.final}
    best = min((b for b in baselines if b in rows), key=lambda b: rows[b].mean)
    diff, se = paired(outcome.final[default], outcome.final[best])
    ratio = rows[default].p95 / rows[best].p95 if rows[best].p95 > 0 else math.inf
    return Check(best, diff, se, ratio, (rows[default].lock_ins, rows[best].lock_ins))


# --------------------------------------------------------------------------- tables


def tables(results: dict[World, Outcome], policies: Sequence[str], default: str | None,
           baselines: Sequence[str]) -> str:
    """The final-regret, tail and check tables in Markdown."""
    head = "| world | " + " | ".join(policies) + " |\n|---" + "|---" * len(policies) + "|"
    lines = ["Final regret, mean ± s.e. (sd); the lowest mean in bold", "", head]
    for world, outcome in results.items():
        rows = {p: Row.of(outcome.final[p], outcome.tail[p]) for p in policies}
        low = min(r.mean for r in rows.values())
        cells = [(f"**{r.mean:.1f}**" if r.mean == low else f"{r.mean:.1f}")
                 + f" ± {r.se:.1f} ({r.sd:.0f})" for r in rows.values()]
        lines.append(f"| {world.label} | " + " | ".join(cells) + " |")
    lines += ["", "Tail: 95th percentile of final regret / lock-ins (repetitions whose regret "
              "over the last 20% of rounds exceeds 3x the median repetition's)", "", head]
    for world, outcome in results.items():
        rows = {p: Row.of(outcome.final[p], outcome.tail[p]) for p in policies}
        lines.append(f"| {world.label} | "
                     + " | ".join(f"{r.p95:.0f} / {r.lock_ins}" for r in rows.values()) + " |")
    if default is None or default not in policies:
        return "\n".join(lines)
    lines += ["", f"{default} against the best (lowest mean) of {', '.join(baselines)}: "
              "mean difference ± paired s.e. (target: at most one s.e.), 95th percentile "
              f"ratio (target: at most {P95_FACTOR}), lock-ins (target: at most the best's)",
              "", "| world | best | difference | p95 ratio | lock-ins | met |",
              "|---|---|---|---|---|---|"]
    met = 0
    for world, outcome in results.items():
        c = check(outcome, default, baselines)
        verdict = [name for name, ok in (("mean", c.mean_ok), ("tail", c.tail_ok),
                                         ("lock-ins", c.lock_ins_ok)) if not ok]
        met += not verdict
        lines.append(f"| {world.label} | {c.best} | {c.difference:+.1f} ± {c.se:.1f} | "
                     f"{c.p95_ratio:.2f} | {c.lock_ins[0]} vs {c.lock_ins[1]} | "
                     + ("yes" if not verdict else "no: " + ", ".join(verdict)) + " |")
    lines += ["", f"All three targets met in {met} of {len(results)} worlds.", "",
              *fairness(results, policies, [default, *baselines])]
    return "\n".join(lines)


def _group(world: World) -> str:
    return "data sets" if world.dataset is not None else world.setting


def fairness(results: dict[World, Outcome], policies: Sequence[str],
             rows: Sequence[str]) -> list[str]:
    """Every row held to the same three targets against the best of the others."""
    rows = [r for r in dict.fromkeys(rows) if r in policies]
    groups = list(dict.fromkeys(_group(w) for w in results))
    lines = ["Each row held to the same three targets against the best (lowest mean) of "
             "the other rows: worlds where all three hold", "",
             "| row | " + " | ".join(groups) + " | all |", "|---" * (len(groups) + 2) + "|"]
    for row in rows:
        others = [r for r in rows if r != row]
        counts = dict.fromkeys(groups, 0)
        for world, outcome in results.items():
            c = check(outcome, row, others)
            counts[_group(world)] += c.mean_ok and c.tail_ok and c.lock_ins_ok
        sizes = {g: sum(_group(w) == g for w in results) for g in groups}
        lines.append(f"| {row} | " + " | ".join(f"{counts[g]} of {sizes[g]}" for g in groups)
                     + f" | {sum(counts.values())} of {len(results)} |")
    return lines


def write_raw(path: Path, results: dict[World, Outcome]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["world", "policy", "rep", "final", "tail"])
        for world, outcome in results.items():
            for name, finals in outcome.final.items():
                for rep, (v, t) in enumerate(zip(finals, outcome.tail[name], strict=True)):
                    out.writerow([json.dumps(asdict(world)), name, rep, repr(v), repr(t)])


def read_raw(path: Path) -> tuple[dict[World, Outcome], list[str]]:
    results: dict[World, Outcome] = {}
    policies: list[str] = []
    with path.open() as f:
        for row in csv.DictReader(f):
            world = World(**json.loads(row["world"]))
            outcome = results.setdefault(world, Outcome())
            outcome.final.setdefault(row["policy"], []).append(float(row["final"]))
            outcome.tail.setdefault(row["policy"], []).append(float(row["tail"]))
            if row["policy"] not in policies:
                policies.append(row["policy"])
    return results, policies


# --------------------------------------------------------------------------- command line


def _spec_jobs(path: Path) -> tuple[list[Job], dict[str, Any]]:
    spec = json.loads(path.read_text())
    policies = tuple(spec["policies"])
    jobs = [Job(World(**w), policies, int(spec["reps"]), int(spec["horizon"]),
                bool(spec.get("first_pass", False))) for w in spec["worlds"]]
    return jobs, spec


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=None,
                        help="a JSON file naming the worlds, policies, repetitions, rounds and "
                        "start (benchmarks/protocol/); the options below are ignored")
    parser.add_argument("--report", type=Path, default=None,
                        help="print the tables of a raw.csv written by --out, run nothing")
    parser.add_argument("--settings", nargs="+", default=["stochastic", "contextual",
                                                          "covariates"])
    parser.add_argument("--dims", nargs="+", type=int, default=[5, 10, 20])
    parser.add_argument("--datasets", nargs="*", default=[])
    parser.add_argument("--arms", type=int, default=None)
    parser.add_argument("--noise", type=float, default=None, help="noise sd")
    parser.add_argument("--delay", type=int, default=0)
    parser.add_argument("--switch-every", type=int, default=0)
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--horizon", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-pass", choices=("on", "off"), default="off",
                        help="every policy pulls each arm once first (on) or none does (off, "
                        "the default)")
    parser.add_argument("--default", default="pooled",
                        help="the policy checked against the best baseline")
    parser.add_argument("--baselines", nargs="+", default=list(BASELINES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None,
                        help="a directory for raw.csv and tables.md")
    args = parser.parse_args(argv)
    default, baselines = args.default, args.baselines
    if args.report is not None:
        results, policies = read_raw(args.report)
        print(tables(results, policies, default, baselines))
        return
    if args.spec is not None:
        jobs, spec = _spec_jobs(args.spec)
        default, baselines = spec.get("default", default), spec.get("baselines", baselines)
        title = f"{spec.get('name', args.spec.stem)}: {spec['reps']} repetitions x " \
                f"{spec['horizon']} rounds, first pass {'on' if jobs[0].first_pass else 'off'}"
    else:
        worlds = [World(s, d, args.arms, args.noise, args.delay, args.switch_every, args.seed)
                  for s in args.settings for d in args.dims]
        worlds += [World(dataset=name, seed=args.seed) for name in args.datasets]
        jobs = [Job(w, tuple(args.policies), args.reps, args.horizon, args.first_pass == "on")
                for w in worlds]
        title = f"{args.reps} repetitions x {args.horizon} rounds, first pass {args.first_pass}"
    policies = list(jobs[0].policies)
    with ProcessPoolExecutor(args.jobs) as pool:
        outcomes = list(tqdm(pool.map(play_world, jobs), total=len(jobs), unit="world",
                             desc="worlds"))
    results = {job.world: outcome for job, outcome in zip(jobs, outcomes, strict=True)}
    text = f"{title}\n\n{tables(results, policies, default, baselines)}"
    print(text)
    if args.out is not None:
        write_raw(args.out / "raw.csv", results)
        (args.out / "tables.md").write_text(text + "\n")
        print(f"\nraw: {args.out / 'raw.csv'}; tables: {args.out / 'tables.md'}")


if __name__ == "__main__":
    main()
