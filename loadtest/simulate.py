"""In-process simulator: the paper's environments against the policies, batched.

One call of :func:`run_cell` plays ``reps`` independent repetitions of one
(setting, dimension, policy) cell in a single batch: the same policy code the
service runs, with ``B = reps``.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from loadtest.environments import Environment, EnvSpec, Reading, make_spec, split_rngs
from loadtest.results import Array, Curve, recorded_rounds, summarise
from policies import (
    AUTHORS_VARIANTS,
    HYPERPARAMETERS,
    PolicyConfig,
    PolicyName,
    Setting,
    State,
    Variant,
    choose,
    init_state,
    paper_config,
    prepare,
    update,
)
from policies.config import Spread, authors_hyperparameters, reading_hyperparameters
from policies.ranking import rank
from policies.ridge import BufferedStreams

Progress = Callable[[int], None]
Centres = Literal["per-repetition", "once"]


@dataclass(frozen=True)
class Cell:
    """One curve of the experiment grid.

    ``sigma_omega`` overrides the paper's value for LinReBoot (tuning sweeps);
    ``overrides`` sets any other :class:`policies.PolicyConfig` field;
    ``switch_every`` makes the world switch its truth every so many rounds
    (:class:`loadtest.environments.EnvSpec`); ``centres`` ``once`` shares the
    arm features / context centres among the repetitions, drawn from the
    cell's seed (the authors' contextual script draws them once per d).
    ``first_pass`` pulls every arm once before any competes (the paper's
    first K rounds; ``PolicyConfig.first_pass``): the reproduction's cells
    have it, every other comparison's cells have it for every row or for
    none. Not in the label (a run's cells all start alike). The authors'
    variants always have it. ``n_arms`` and ``noise`` (an sd) make a world of
    another shape than the paper's (None: the paper's); ``delay`` makes each
    reward known that many decisions after its own (0: before the next).
    ``slots`` k > 1 makes each round a ranking (:func:`policies.ranking.rank`): a
    k-slot semi-bandit whose every slot's reward is seen, the regret against the best
    k-list; ``position_weights`` (w_1 >= w_2 >= ..., None: all 1) make slot j's arm
    examined with probability w_j (the position-based click model: its reward is
    then the arm's, else 0), and the policy learns ``r / w_j`` as the service does.
    """

    setting: Setting
    dim: int
    policy: PolicyName
    sigma_omega: float | None = None
    reading: Reading = "authors"
    overrides: tuple[tuple[str, object], ...] = field(default_factory=tuple)
    switch_every: int = 0
    centres: Centres = "per-repetition"
    first_pass: bool = False
    n_arms: int | None = None
    noise: float | None = None
    delay: int = 0
    slots: int = 1
    position_weights: tuple[float, ...] | None = None

    def config(self) -> PolicyConfig:
        """The paper's hyperparameters in this cell's world, then the cell's own.

        The authors' variants keep their code's constants (LinUCB's R = 1)
        whatever the reading.
        """
        changes: dict[str, object] = {
            **reading_hyperparameters(self.setting, self.dim, self.reading), **dict(self.overrides)
        }
        if changes.get("variant") == "authors":
            changes = {**changes, **authors_hyperparameters(self.policy, self.setting),
                       **dict(self.overrides)}
        if self.sigma_omega is not None:
            changes["sigma_omega"] = self.sigma_omega
        changes["first_pass"] = self.first_pass
        return paper_config(self.policy, self.setting, self.dim, **changes)

    def env_spec(self, seed: int = 0) -> EnvSpec:
        """The world this cell is played in (``seed``: the run's, for shared centres)."""
        centres_seed = cell_seed(seed, self) if self.centres == "once" else None
        return make_spec(self.setting, self.dim, reading=self.reading,
                         switch_every=self.switch_every, centres_seed=centres_seed,
                         n_arms=self.n_arms, noise=self.noise)

    @property
    def label(self) -> str:
        extra = [f"σω={self.sigma_omega:g}"] if self.sigma_omega is not None else []
        extra += [f"{k}={v}" for k, v in self.overrides]
        extra += ["centres once"] if self.centres == "once" and self.setting != "covariates" else []
        extra += [f"K={self.n_arms}"] if self.n_arms is not None else []
        extra += [f"noise sd {self.noise:g}"] if self.noise is not None else []
        extra += [f"delay {self.delay}"] if self.delay else []
        extra += [f"k={self.slots}"] if self.slots > 1 else []
        extra += (["weights " + "/".join(f"{w:g}" for w in self.position_weights)]
                  if self.position_weights is not None else [])
        return f"{self.policy} ({', '.join(extra)})" if extra else self.policy


@dataclass(frozen=True)
class Played:
    """A played batch.

    Attributes
    ----------
    cumulative : ndarray, shape (reps, horizon)
        Cumulative (pseudo-)regret: sum over rounds of best mean minus chosen mean (a
        ranking's: the best k-list's expected reward minus the chosen list's).
    arms : ndarray of int, shape (reps, horizon)
        The arm chosen in every round (a ranking's first).
    seconds : wall time of the whole batch.
    """

    cumulative: Array
    arms: NDArray[np.int32]
    seconds: float
    placed: NDArray[np.int64] | None = None  # rankings: every slot's arm, (reps, horizon, k)


def cell_seed(seed: int, cell: Cell) -> int:
    """The environment seed of a cell: the same worlds for every policy in a cell.

    The paper evaluates all algorithms "under the exact same environment", so
    the seed depends on the setting and dimension, never on the policy.
    """
    settings = ("stochastic", "contextual", "covariates")
    return seed * 1_000 + settings.index(cell.setting) * 100 + cell.dim


def decision_seed(seed: int, cell: Cell, rep: int) -> int:
    """The seed of repetition ``rep``'s experiment in per-decision mode (as sent to the service)."""
    return cell_seed(seed, cell) * 1_000 + rep


def decision_rngs(seeds: Sequence[int], number: int) -> list[np.random.Generator]:
    """The generators the service uses for decision ``number`` of each experiment.

    The service's workers share no generator state, so decision ``n`` of an
    experiment seeded ``s`` draws from ``SeedSequence([s, n])``.
    """
    return [np.random.default_rng(np.random.SeedSequence([s, number])) for s in seeds]


def play(
    cell: Cell,
    reps: int,
    horizon: int,
    seed: int,
    progress: Progress | None = None,
    per_decision_rng: bool = False,
) -> Played:
    """Play ``reps`` repetitions of ``cell`` for ``horizon`` rounds.

    With ``per_decision_rng`` every decision draws from a fresh generator seeded
    as the service seeds it (:func:`decision_rngs`), so the in-process run makes
    the same decisions as an HTTP replay of a seeded experiment; otherwise each
    repetition draws from one stream (faster). Round ``t`` (from 0) is decision
    number ``t + 1``, as in a service experiment, which is what a policy that
    forgets counts ages in.
    """
    return play_together([cell], reps, horizon, seed, progress, per_decision_rng)[0]


def play_together(
    cells: Sequence[Cell],
    reps: int,
    horizon: int,
    seed: int,
    progress: Progress | None = None,
    per_decision_rng: bool = False,
) -> list[Played]:
    """:func:`play` for cells that share their worlds, on one :class:`Environment`.

    Every policy of a (setting, d) cell plays the same worlds (:func:`cell_seed`),
    so a round's contexts and reward noise are drawn once for all of them: each
    cell gets the numbers it gets alone, and the contexts (most of a contextual
    round) cost once instead of once per policy. A cell's ``seconds`` are its
    policy's own time plus the whole of the worlds' (what it costs alone).
    """
    spec, env_seed = cells[0].env_spec(seed), cell_seed(seed, cells[0])
    slate = (cells[0].slots, cells[0].position_weights)
    if any(c.env_spec(seed) != spec or cell_seed(seed, c) != env_seed
           or (c.slots, c.position_weights) != slate for c in cells):
        raise ValueError("cells played together must share their worlds (setting, d, reading, "
                         "centres, switches, arms, noise, slots, position weights)")
    env = Environment(spec, split_rngs(env_seed, reps)[0])
    players = [Player.of(cell, seed, reps, horizon, per_decision_rng) for cell in cells]
    looks = examination(seed, cells[0])  # the world's, as its noise is
    worlds = 0.0
    for t in range(horizon):
        start = time.perf_counter()
        contexts = env.contexts()
        means = env.means(contexts)
        noise = ranking_noise(env, slate[0])
        looked = examined(looks, cells[0], reps)
        worlds += time.perf_counter() - start
        for player in players:
            player.step(t, env, contexts, means, noise, looked)
        if progress is not None and (t + 1) % 250 == 0:
            progress(250 * len(cells))
    if progress is not None:
        progress(horizon % 250 * len(cells))
    return [Played(np.cumsum(p.regret, axis=1), p.chosen, p.seconds + worlds,
                   None if p.placed is None else np.stack(p.placed, axis=1))
            for p in players]


@dataclass
class Player:
    """One cell's policy, its statistics and its streams, playing round by round.

    With ``delay`` D, the outcome of round t is learnt at the end of round t + D
    (the policy decides D rounds without it); outcomes still pending at the
    horizon are never learnt.
    """

    config: PolicyConfig
    state: State
    streams: BufferedStreams
    seeds: list[int]
    per_decision_rng: bool
    rows: NDArray[np.int64]
    regret: Array  # (reps, horizon)
    chosen: NDArray[np.int32]  # (reps, horizon)
    seconds: float = 0.0
    delay: int = 0
    slots: int = 1
    weights: Array | None = None  # each slot's position weight (a ranking's)
    placed: list[NDArray[np.int64]] | None = None  # a ranking's arms, round by round
    pending: collections.deque[tuple[NDArray[np.int64], Array, Array, Array | None]] = field(
        default_factory=collections.deque)

    @classmethod
    def of(cls, cell: Cell, seed: int, reps: int, horizon: int,
           per_decision_rng: bool) -> Player:
        config = cell.config()
        policy_rngs = split_rngs(cell_seed(seed, cell), reps)[1]
        if cell.delay < 0:
            raise ValueError("delay must be 0 or more rounds")
        return cls(config, init_state(config, cell.env_spec(seed).n_arms, reps),
                   BufferedStreams(policy_rngs),
                   [decision_seed(seed, cell, rep) for rep in range(reps)], per_decision_rng,
                   np.arange(reps), np.empty((reps, horizon)),
                   np.empty((reps, horizon), dtype=np.int32), delay=cell.delay,
                   slots=cell.slots, weights=slot_weights(cell),
                   placed=[] if cell.slots > 1 else None)

    def step(self, t: int, env: Environment, contexts: Array, means: Array,
             noise: Array, examined: NDArray[np.bool_] | None = None
             ) -> tuple[Array, NDArray[np.int64]]:
        """Round ``t`` (decision number ``t + 1``): choose, score, learn; regret and arms.

        A ranking's round (``slots`` > 1): ``noise`` (k, B), one per slot, and
        ``examined`` (k, B) whether each slot's arm was looked at (position weights)."""
        if self.slots > 1:
            return self._rank(t, env, contexts, means, noise, examined)
        start = time.perf_counter()
        rows = self.rows
        rngs = decision_rngs(self.seeds, t + 1) if self.per_decision_rng else self.streams
        arms = choose(self.config, self.state, contexts, rngs).arms
        lost = means.max(axis=1) - means[rows, arms]
        self.regret[:, t], self.chosen[:, t] = lost, arms
        rewards = env.rewards(contexts, arms, noise)
        numbers = np.full(rows.size, t + 1.0) if self.config.discounted else None
        if self.delay:
            self.pending.append((arms, contexts[rows, arms], rewards, numbers))
            if len(self.pending) > self.delay:
                update(self.config, self.state, *self.pending.popleft())
        else:
            update(self.config, self.state, arms, contexts[rows, arms], rewards, numbers)
        self.seconds += time.perf_counter() - start
        return lost, arms

    def _rank(self, t: int, env: Environment, contexts: Array, means: Array, noise: Array,
              examined: NDArray[np.bool_] | None) -> tuple[Array, NDArray[np.int64]]:
        """A ranking's round: k arms, every slot's reward seen and learnt (slot 1 first,
        each scaled by its weight as the service's outcomes.lua scales it); the regret
        against the best k-list (the top k means, in order: the weights do not
        increase)."""
        if self.delay:
            raise ValueError("a delay is not played with rankings")
        start = time.perf_counter()
        rows, k = self.rows, self.slots
        rngs = decision_rngs(self.seeds, t + 1) if self.per_decision_rng else self.streams
        ready = prepare(self.config, self.state, contexts)
        placed = rank(ready, rngs, k).arms  # (B, k)
        weights = np.ones(k) if self.weights is None else self.weights
        lost = regret_of(means, placed, self.weights)
        self.regret[:, t], self.chosen[:, t] = lost, placed[:, 0]
        assert self.placed is not None
        self.placed.append(placed)
        numbers = np.full(rows.size, t + 1.0) if self.config.discounted else None
        for j in range(k):
            rewards = env.rewards(contexts, placed[:, j], noise[j])
            if examined is not None:
                rewards = np.where(examined[j], rewards, 0.0)
            update(self.config, self.state, placed[:, j], contexts[rows, placed[:, j]],
                   rewards / weights[j], numbers)
        self.seconds += time.perf_counter() - start
        return lost, placed[:, 0]


def ranking_noise(env: Environment, slots: int) -> Array:
    """A round's reward noise: one draw per repetition, and a ranking's every slot its
    own, (k, B) (the HTTP replay draws it alike)."""
    return env.noise() if slots == 1 else np.stack([env.noise() for _ in range(slots)])


def examination(seed: int, cell: Cell) -> np.random.Generator:
    """Which ranked slots are examined (position weights): the world's generator."""
    return np.random.default_rng([cell_seed(seed, cell), 28])


def examined(looks: np.random.Generator, cell: Cell, reps: int) -> NDArray[np.bool_] | None:
    """This round's examined slots, (k, B), with probability each slot's weight."""
    weights = slot_weights(cell)
    return None if weights is None else looks.random((cell.slots, reps)) < weights[:, None]


def regret_of(means: Array, placed: NDArray[np.int64], weights: Array | None) -> Array:
    """Each repetition's loss this round against the best k-list (rankings of k arms,
    best first; the position weights do not increase)."""
    k = placed.shape[1]
    w = np.ones(k) if weights is None else weights
    rows = np.arange(means.shape[0])[:, None]
    return np.asarray(-np.sort(-means, axis=1)[:, :k] @ w - means[rows, placed] @ w)


def slot_weights(cell: Cell) -> Array | None:
    """Each of the cell's slots' position weight (beyond the list, the last one)."""
    if cell.position_weights is None:
        return None
    listed = np.array(cell.position_weights, dtype=np.float64)
    return listed[np.minimum(np.arange(cell.slots), listed.size - 1)]


def rounds(
    cell: Cell, reps: int, horizon: int, seed: int, per_decision_rng: bool = False
) -> Iterator[tuple[Array, NDArray[np.int64]]]:
    """:func:`play` round by round: each round's regret and chosen arms, shape (reps,).

    A generator, so that a benchmark can time the rounds of two runs in turn
    (``benchmarks/bench_policies.py``).
    """
    if cell.slots > 1:
        raise ValueError("rounds() plays decisions of one arm; play() plays rankings")
    env = Environment(cell.env_spec(seed), split_rngs(cell_seed(seed, cell), reps)[0])
    player = Player.of(cell, seed, reps, horizon, per_decision_rng)
    for t in range(horizon):
        contexts = env.contexts()
        yield player.step(t, env, contexts, env.means(contexts), env.noise())


def run_cell(
    cell: Cell,
    reps: int,
    horizon: int,
    seed: int,
    points: int = 200,
    progress: Progress | None = None,
    per_decision_rng: bool = False,
) -> Curve:
    """Play one cell and summarise it as a :class:`loadtest.results.Curve`."""
    played = play(cell, reps, horizon, seed, progress, per_decision_rng)
    return to_curve("in-process", cell, played, points)


def to_curve(source: str, cell: Cell, played: Played, points: int = 200) -> Curve:
    """Summarise a played batch as a :class:`loadtest.results.Curve`."""
    reps, horizon = played.cumulative.shape
    rounds = recorded_rounds(horizon, points)
    mean, se = summarise(played.cumulative, rounds)
    return Curve(
        source=source, setting=cell.setting, dim=cell.dim, policy=cell.policy,
        label=cell.label, reading=cell.reading, reps=reps, horizon=horizon,
        rounds=rounds, mean=mean, se=se, wall_seconds=played.seconds,
    )


def grid(
    settings: Sequence[Setting],
    dims: Sequence[int],
    policies: Sequence[PolicyName],
    sigma_omegas: Sequence[float] | None = None,
    reading: Reading = "authors",
    overrides: tuple[tuple[str, object], ...] = (),
    discounts: Sequence[float] = (1.0,),
    switch_every: int = 0,
    baselines: Variant = "project",
    centres: Centres = "per-repetition",
    spreads: Sequence[Spread] = ("paper",),
    first_pass: bool = False,
    slots: Sequence[int] = (1,),
    position_weights: tuple[float, ...] | None = None,
) -> list[Cell]:
    """Every cell of settings x dims x policies x discounts; LinReBoot once per sigma_omega
    and spread (``paper``, the plain label, or ``pooled``: see ``PolicyConfig.spread``).

    Each policy gets the ``overrides`` it takes (``policies.HYPERPARAMETERS``);
    a discount of 1 (no forgetting) is no override, so its label is the plain one.
    ``baselines="authors"`` runs the policies that have one in their authors'
    variant (``policies.AUTHORS_VARIANTS``, LinReBoot with the paper's spread
    among them); ``centres`` and ``first_pass`` (for every cell) as in :class:`Cell`;
    every cell once per ``slots`` value (k > 1: rankings, with ``position_weights``).
    """
    cells = []
    for setting in settings:
        for dim in dims:
            for policy in policies:
                sweep: Sequence[float | None] = (
                    sigma_omegas if sigma_omegas and policy == "linreboot" else [None]
                )
                own = tuple((k, v) for k, v in overrides if k in HYPERPARAMETERS[policy])
                if baselines == "authors" and policy in AUTHORS_VARIANTS:
                    own += (("variant", "authors"),)
                kinds = [(("spread", s),) if s != "paper" else () for s in spreads] \
                    if policy == "linreboot" else [()]
                for kind, sigma, discount, k in itertools.product(kinds, sweep, discounts,
                                                                  slots):
                    forget = (("discount", discount),) if discount != 1.0 else ()
                    # The pooled spread is ours only: the authors' LinReBoot is the paper's.
                    mine = tuple(o for o in own if o != ("variant", "authors")) if kind else own
                    cells.append(Cell(setting, dim, policy, sigma, reading, kind + mine + forget,
                                      switch_every, centres, first_pass, slots=k,
                                      position_weights=position_weights if k > 1 else None))
    return cells
