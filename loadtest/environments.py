"""Seeded synthetic worlds of the LinReBoot paper, batched over independent repetitions.

Three settings, from the appendix "Experimental Setting" of Wu et al. (UAI 2022);
where the text is ambiguous the authors' published simulation code decides (the
``"authors"`` reading, the default), and ``"literal"`` follows the text word for word:

``stochastic``
    K = 100 fixed arms. ``theta_i ~ U(-0.5, 0.5)`` scaled to ``||theta|| = 1``; arm
    features ``x_ik ~ U(0, 1)``, each ``x_k`` scaled to unit norm. Noise ``N(0, 0.1)``,
    0.1 being the variance.
``contextual``
    K = 100 arms with random contexts. ``theta`` as above; per-arm centres ``nu_k``
    drawn like the stochastic features and fixed per repetition; each round arm k sees
    ``x_k ~ N_d(nu_k, I / (2K))``, rescaled to unit norm in the authors' reading.
    Noise variance 0.5.
``covariates``
    K = 10 arms with a parameter each. ``theta_k`` is a vector of signs (``n_minus ~
    Binomial(d, 1/2)`` of them negative, at distinct random places) plus
    ``U(-0.95, 0.95)`` per entry, scaled to norm ``k / K``. Each round one context
    ``x ~ N(0, I_d)`` is shared by every arm. Authors: ``x`` rescaled to unit norm and
    noise sd 0.1; literal: raw ``x`` and noise variance 0.1.

A drifting world
----------------
Any setting can also *switch* (``switch_every = P``): the truth holds for
rounds 1..P, then ``theta`` (every ``theta_k`` in the covariates setting) is
drawn afresh from the same distribution for rounds P+1..2P, and so on; the
arms' features and context centres stay. A piecewise-stationary world with
changes at known times, in which a policy that never forgets learns each
new theta ever more slowly (the policies' ``discount``).

Randomness and reproducibility
------------------------------
Repetition ``b`` draws only from ``rngs[b]``, in a fixed order: first its truth
(``theta``, then the arm features or centres; for covariates ``theta_1 .. theta_K`` one
by one, each as binomial, choice, uniform), then four integers that seed two private
sub-streams, one for contexts and one for reward noise (a switching world then
draws four more, for a third sub-stream from which each switch draws the new
truth, repetition by repetition, as the first was drawn). Keeping contexts and noise on
separate streams means each stream is read strictly in order, so it can be drawn in
blocks of rounds (one ``standard_normal`` call per repetition per block, see
``block_rounds``) without changing a single value: NumPy fills an array from the bit
generator sequentially, so drawing ``n`` rounds at once equals ``n`` draws of one.
Hence a batch of B repetitions equals B separate ``B = 1`` runs bitwise, whatever the
block size, and the noise of the j-th reward does not depend on how many contexts were
drawn before it. Arithmetic is vectorised over the batch with per-row reductions only
(``einsum``, no BLAS calls whose summation order might depend on memory layout).

References
----------
S. Wu, C.-H. Wang, Y. Li, G. Cheng. "Residual Bootstrap Exploration for Stochastic
Linear Bandit", UAI 2022, Appendix "Experimental Setting".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

__all__ = [
    "DEFAULT_N_ARMS",
    "READINGS",
    "SETTINGS",
    "EnvSpec",
    "Environment",
    "Reading",
    "Setting",
    "instant_regret",
    "make_spec",
    "optimal_arm",
    "seeded_rngs",
    "split_rngs",
]

Setting = Literal["stochastic", "contextual", "covariates"]
Reading = Literal["authors", "literal"]

SETTINGS: tuple[Setting, ...] = get_args(Setting)
READINGS: tuple[Reading, ...] = get_args(Reading)

DEFAULT_N_ARMS: dict[Setting, int] = {"stochastic": 100, "contextual": 100, "covariates": 10}

# Noise variances of the appendix. The covariates setting under the authors' reading uses
# sd 0.1 instead (their code passes sigma = 0.1 as a standard deviation).
_NOISE_VARIANCE: dict[Setting, float] = {"stochastic": 0.1, "contextual": 0.5, "covariates": 0.1}
_AUTHORS_COVARIATES_NOISE_SD = 0.1

# Buffer sizing: at most this many normal draws per repetition per refill (128 KiB), and
# at most this many rounds per refill. Block size never changes a value, only speed.
_BLOCK_VALUES = 16_384
_MAX_BLOCK_ROUNDS = 1_024


@dataclass(frozen=True)
class EnvSpec:
    """What world to simulate.

    Parameters
    ----------
    setting : {"stochastic", "contextual", "covariates"}
        Which of the paper's three environments.
    dim : int
        Context dimension d (the paper uses 5, 10 and 20).
    n_arms : int
        Number of arms K (paper: 100, 100, 10; see `make_spec` for the defaults).
    reading : {"authors", "literal"}
        ``"authors"`` follows the published code where the text is ambiguous (unit-norm
        contexts in the contextual and covariates settings; noise sd 0.1 for covariates);
        ``"literal"`` follows the text (no rescaling; every noise level a variance).
    switch_every : int
        0 (default): the truth never changes. P: theta is drawn afresh every P rounds
        (after rounds P, 2P, ...; see "A drifting world").
    centres_seed : int or None
        None (default): every repetition draws its own arm features (stochastic) or
        context centres ``nu_k`` (contextual). An int: they are drawn once, from
        ``default_rng(centres_seed)``, and shared by every repetition, as the
        authors' contextual script draws ``nu_k`` once per d ("predefined before
        the simulation"); each repetition still draws its own theta.
    noise : float or None
        None (default): the reading's noise of the setting (:attr:`noise_sd`). A
        float: the noise standard deviation instead (worlds of other shapes than
        the paper's); nothing else changes, and no draw but the noise's scale.
    """

    setting: Setting
    dim: int
    n_arms: int
    reading: Reading = "authors"
    switch_every: int = 0
    centres_seed: int | None = None
    noise: float | None = None

    def __post_init__(self) -> None:
        if self.setting not in SETTINGS:
            raise ValueError(f"setting must be one of {SETTINGS}, got {self.setting!r}")
        if self.reading not in READINGS:
            raise ValueError(f"reading must be one of {READINGS}, got {self.reading!r}")
        for name in ("dim", "n_arms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        every = self.switch_every
        if isinstance(every, bool) or not isinstance(every, int | np.integer) or every < 0:
            raise ValueError(f"switch_every must be 0 (never) or a positive integer, got {every!r}")
        seed = self.centres_seed
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0
        ):
            raise ValueError(f"centres_seed must be None or a non-negative integer, got {seed!r}")
        if self.noise is not None and not (isinstance(self.noise, float | int)
                                           and 0.0 <= self.noise < math.inf):
            raise ValueError(f"noise must be None or a finite sd >= 0, got {self.noise!r}")

    @property
    def noise_sd(self) -> float:
        """Standard deviation of the Gaussian reward noise."""
        if self.noise is not None:
            return float(self.noise)
        if self.setting == "covariates" and self.reading == "authors":
            return _AUTHORS_COVARIATES_NOISE_SD
        return math.sqrt(_NOISE_VARIANCE[self.setting])

    @property
    def context_sd(self) -> float:
        """Per-coordinate sd of the raw contextual draws, ``sqrt(1 / (2K))``."""
        return math.sqrt(1.0 / (2 * self.n_arms))


def make_spec(
    setting: Setting, dim: int, *, n_arms: int | None = None, reading: Reading = "authors",
    switch_every: int = 0, centres_seed: int | None = None, noise: float | None = None,
) -> EnvSpec:
    """Build an `EnvSpec`, with the paper's number of arms unless `n_arms` is given.

    Parameters
    ----------
    setting : {"stochastic", "contextual", "covariates"}
    dim : int
        Context dimension d.
    n_arms : int, optional
        Number of arms K; default 100 (stochastic), 100 (contextual), 10 (covariates).
    reading : {"authors", "literal"}, default "authors"
    switch_every : int, default 0
        Rounds between switches of the truth; 0: never.
    centres_seed : int, optional
        Draw the arm features / context centres once from this seed (see `EnvSpec`).
    noise : float, optional
        The noise sd instead of the setting's (see `EnvSpec`).

    Returns
    -------
    EnvSpec
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    k = DEFAULT_N_ARMS[setting] if n_arms is None else n_arms
    return EnvSpec(setting=setting, dim=dim, n_arms=k, reading=reading,
                   switch_every=switch_every, centres_seed=centres_seed, noise=noise)


# --------------------------------------------------------------------------- seeding


def _child_sequences(seed: int, batch: int, start: int) -> list[np.random.SeedSequence]:
    # Equal to SeedSequence(seed).spawn(start + batch)[start:], built directly so that
    # repetition i can be run on its own.
    if batch < 1 or start < 0:
        raise ValueError(f"need batch >= 1 and start >= 0, got batch={batch}, start={start}")
    return [np.random.SeedSequence(seed, spawn_key=(i,)) for i in range(start, start + batch)]


def seeded_rngs(seed: int, batch: int, *, start: int = 0) -> list[np.random.Generator]:
    """One independent Generator per repetition: ``SeedSequence(seed).spawn(batch)``.

    Parameters
    ----------
    seed : int
        Master seed of the run.
    batch : int
        Number of repetitions B.
    start : int, default 0
        Index of the first repetition, so ``seeded_rngs(s, 1, start=i)`` reproduces
        repetition i of ``seeded_rngs(s, 100)``.

    Returns
    -------
    list of numpy.random.Generator, length B
    """
    return [np.random.default_rng(seq) for seq in _child_sequences(seed, batch, start)]


def split_rngs(
    seed: int, batch: int, *, start: int = 0
) -> tuple[list[np.random.Generator], list[np.random.Generator]]:
    """Independent environment and policy streams for every repetition.

    Repetition i gets ``SeedSequence(seed).spawn(...)[i].spawn(2)``: child 0 drives the
    environment, child 1 the policy, so changing the policy never changes the world.

    Parameters
    ----------
    seed, batch, start
        As in `seeded_rngs`.

    Returns
    -------
    env_rngs, policy_rngs : list of numpy.random.Generator, each length B
    """
    pairs = [seq.spawn(2) for seq in _child_sequences(seed, batch, start)]
    env = [np.random.default_rng(pair[0]) for pair in pairs]
    policy = [np.random.default_rng(pair[1]) for pair in pairs]
    return env, policy


def _substream(rng: np.random.Generator) -> np.random.Generator:
    """A generator seeded from four draws of `rng` (consumes exactly four integers)."""
    entropy = rng.integers(0, 2**63, size=4, dtype=np.int64)
    return np.random.default_rng(np.random.SeedSequence([int(e) for e in entropy]))


# --------------------------------------------------------------------------- truth


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dot products along the last axis, broadcasting the leading axes.

    ``einsum`` rather than ``matmul``: it runs NumPy's own loop, so each row's result
    depends on that row's values only, not on the batch size or on BLAS kernels; and it
    is several times faster than ``sum(a * b, axis=-1)`` for short rows.
    """
    return np.einsum("...i,...i->...", a, b)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Scale every vector along the last axis to unit Euclidean norm (new array, same shape)."""
    return x / np.sqrt(_rowdot(x, x))[..., None]


def _shared_theta(rng: np.random.Generator, dim: int) -> np.ndarray:
    """``theta_i ~ U(-0.5, 0.5)`` scaled to unit norm, shape (d,)."""
    return _unit_rows(rng.uniform(-0.5, 0.5, size=dim))


def _unit_uniform_rows(rng: np.random.Generator, n_arms: int, dim: int) -> np.ndarray:
    """``x_ik ~ U(0, 1)``, each row scaled to unit norm, shape (K, d)."""
    return _unit_rows(rng.uniform(0.0, 1.0, size=(n_arms, dim)))


def _covariate_theta(rng: np.random.Generator, dim: int, norm: float) -> np.ndarray:
    """One ``theta_k`` of the covariates setting, shape (d,), with ``||theta_k|| = norm``."""
    n_minus = int(rng.binomial(dim, 0.5))
    signs = np.ones(dim)
    signs[rng.choice(dim, size=n_minus, replace=False)] = -1.0
    v = signs + rng.uniform(-0.95, 0.95, size=dim)
    return norm * _unit_rows(v)


def _draw_theta(spec: EnvSpec, rng: np.random.Generator) -> np.ndarray:
    """One repetition's parameter: shape (d,), or (K, d) for covariates."""
    k, d = spec.n_arms, spec.dim
    if spec.setting == "covariates":
        return np.stack([_covariate_theta(rng, d, (j + 1) / k) for j in range(k)])
    return _shared_theta(rng, d)


def _draw_truth(spec: EnvSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Draw one repetition's parameters and arm features.

    Returns
    -------
    theta : ndarray, shape (d,), or (K, d) for covariates
    features : ndarray, shape (K, d), or None for covariates
        Fixed arm features (stochastic) or context centres ``nu_k`` (contextual).
    """
    theta = _draw_theta(spec, rng)
    if spec.setting == "covariates":
        return theta, None
    if spec.centres_seed is not None:
        return theta, _shared_centres(spec.centres_seed, spec.n_arms, spec.dim)
    return theta, _unit_uniform_rows(rng, spec.n_arms, spec.dim)


def _shared_centres(seed: int, n_arms: int, dim: int) -> np.ndarray:
    """The features / centres every repetition shares: a fresh copy of one draw."""
    return _unit_uniform_rows(np.random.default_rng(seed), n_arms, dim)


def _stack_features(features: list[np.ndarray | None]) -> np.ndarray | None:
    """Stack per-repetition (K, d) features to (B, K, d), read-only; None if absent."""
    present = [f for f in features if f is not None]
    return _read_only(np.stack(present)) if present else None


def _read_only(x: np.ndarray) -> np.ndarray:
    x.flags.writeable = False
    return x


class _NormalBuffer:
    """Standard normal draws of shape (B, *shape) per round, refilled in blocks of rounds.

    Each repetition's block is one ``standard_normal`` call on its own generator, so the
    values equal round-by-round draws exactly. The buffer is reused between refills; the
    views handed out by `next` must not outlive the next call (callers derive new arrays).
    """

    def __init__(
        self, rngs: Sequence[np.random.Generator], shape: tuple[int, ...], block_rounds: int
    ) -> None:
        self._rngs = list(rngs)
        self._buf = np.empty((len(self._rngs), block_rounds, *shape))
        self._pos = block_rounds

    def next(self) -> np.ndarray:
        """This round's draws, shape (B, *shape), a view into the buffer."""
        if self._pos == self._buf.shape[1]:
            for rng, block in zip(self._rngs, self._buf, strict=True):
                rng.standard_normal(out=block)
            self._pos = 0
        out = self._buf[:, self._pos]
        self._pos += 1
        return out


def _auto_block_rounds(values_per_round: int) -> int:
    return max(1, min(_MAX_BLOCK_ROUNDS, _BLOCK_VALUES // max(values_per_round, 1)))


# --------------------------------------------------------------------------- environment


class Environment:
    """B independent seeded worlds of one setting. Knows the truth; knows nothing of policies.

    Parameters
    ----------
    spec : EnvSpec
        The world to simulate.
    rngs : sequence of numpy.random.Generator, length B
        One generator per repetition; repetition b draws from ``rngs[b]`` only.
    block_rounds : int, optional
        Rounds of contexts and of noise drawn per refill of the internal buffers. Only a
        speed/memory knob: every value is the same for any block size. Default: as many
        rounds as fit in 16384 draws per repetition (8 rounds of contexts at K=100, d=20),
        at most 1024.

    Attributes
    ----------
    spec : EnvSpec
    theta : ndarray, shape (B, d), or (B, K, d) for covariates
        True parameter(s) of the current round, read-only (a switching world
        replaces it at its switches).
    round : int
        Rounds begun so far (calls of `contexts`).
    arm_features : ndarray, shape (B, K, d), or None for covariates
        Stochastic: the fixed arm features. Contextual: the context centres ``nu_k``.

    Notes
    -----
    Arrays returned by `contexts` are read-only: in the stochastic setting they are the
    stored features themselves, and a policy must not be able to edit the truth.
    """

    def __init__(
        self,
        spec: EnvSpec,
        rngs: Sequence[np.random.Generator],
        *,
        block_rounds: int | None = None,
    ) -> None:
        if len(rngs) < 1:
            raise ValueError("need at least one generator (one per repetition)")
        if block_rounds is not None and block_rounds < 1:
            raise ValueError(f"block_rounds must be >= 1, got {block_rounds}")
        self.spec = spec
        truths = [_draw_truth(spec, rng) for rng in rngs]
        self.theta = _read_only(np.stack([theta for theta, _ in truths]))
        self.arm_features = _stack_features([features for _, features in truths])
        # Sub-streams are seeded after the truth, contexts first, in repetition order.
        ctx_rngs = [_substream(rng) for rng in rngs]
        noise_rngs = [_substream(rng) for rng in rngs]
        self._switch_rngs = [_substream(rng) for rng in rngs] if spec.switch_every else []
        self._ctx = self._context_buffer(ctx_rngs, block_rounds)
        self._noise = _NormalBuffer(noise_rngs, (), block_rounds or _MAX_BLOCK_ROUNDS)
        self._rows = np.arange(len(rngs))
        self.round = 0

    def _context_buffer(
        self, rngs: list[np.random.Generator], block_rounds: int | None
    ) -> _NormalBuffer | None:
        k, d = self.spec.n_arms, self.spec.dim
        shapes: dict[Setting, tuple[int, ...] | None] = {
            "stochastic": None,  # fixed features: the stream is seeded but never read
            "contextual": (k, d),
            "covariates": (d,),
        }
        shape = shapes[self.spec.setting]
        if shape is None:
            return None
        return _NormalBuffer(rngs, shape, block_rounds or _auto_block_rounds(math.prod(shape)))

    @property
    def batch(self) -> int:
        """Number of repetitions B."""
        return int(self.theta.shape[0])

    @property
    def noise_sd(self) -> float:
        """Standard deviation of the reward noise."""
        return self.spec.noise_sd

    def contexts(self) -> np.ndarray:
        """Begin a round: draw its contexts (and switch the truth when it is due).

        Stochastic: the fixed arm features, no randomness consumed. Contextual: a fresh
        ``N_d(nu_k, I / (2K))`` draw per arm. Covariates: one ``N(0, I_d)`` draw per
        repetition, repeated for every arm. Authors' reading rescales the random
        draws to unit norm.

        Returns
        -------
        ndarray, shape (B, K, d), read-only
        """
        every = self.spec.switch_every
        if every and self.round and self.round % every == 0:
            self.theta = _read_only(np.stack([_draw_theta(self.spec, rng)
                                              for rng in self._switch_rngs]))
        self.round += 1
        if self._ctx is None:  # stochastic
            assert self.arm_features is not None
            return self.arm_features
        z = self._ctx.next()
        if self.arm_features is not None:  # contextual: nu_k + sd * z, a new array
            x = z * self.spec.context_sd
            x += self.arm_features
        else:  # covariates: z itself; the repeat below makes the copy
            x = z
        if self.spec.reading == "authors":
            x = _unit_rows(x)
        if self.spec.setting == "covariates":
            x = np.repeat(x[:, None, :], self.spec.n_arms, axis=1)
        return _read_only(x)

    def _check_contexts(self, contexts: np.ndarray) -> None:
        expected = (self.batch, self.spec.n_arms, self.spec.dim)
        if np.shape(contexts) != expected:
            raise ValueError(f"contexts must have shape {expected}, got {contexts.shape}")

    def means(self, contexts: np.ndarray) -> np.ndarray:
        """True mean reward of every arm.

        Parameters
        ----------
        contexts : ndarray, shape (B, K, d)

        Returns
        -------
        ndarray, shape (B, K)
            ``x_k . theta`` (stochastic, contextual) or ``x_k . theta_k`` (covariates).
        """
        self._check_contexts(contexts)
        theta = self.theta if self.spec.setting == "covariates" else self.theta[:, None, :]
        return _rowdot(np.asarray(contexts), theta)

    def _check_arms(self, arms: np.ndarray) -> np.ndarray:
        arms = np.asarray(arms)
        if arms.shape != (self.batch,) or not np.issubdtype(arms.dtype, np.integer):
            raise ValueError(f"arms must be integers of shape ({self.batch},), got {arms!r}")
        if arms.min() < 0 or arms.max() >= self.spec.n_arms:
            raise ValueError(f"arms must lie in [0, {self.spec.n_arms}), got {arms!r}")
        return arms

    def noise(self) -> np.ndarray:
        """This round's reward noise, shape (B,): one draw per repetition, whichever arm
        is pulled (so policies played in the same worlds see the same noise)."""
        return self.spec.noise_sd * self._noise.next()

    def rewards(
        self, contexts: np.ndarray, arms: np.ndarray, noise: np.ndarray | None = None
    ) -> np.ndarray:
        """Noisy rewards of the chosen arms: true mean plus Gaussian noise.

        Parameters
        ----------
        contexts : ndarray, shape (B, K, d)
            This round's contexts, as returned by `contexts`.
        arms : ndarray of int, shape (B,)
            Chosen arm of every repetition, in ``[0, K)``.
        noise : ndarray, shape (B,), optional
            This round's :meth:`noise`, when several policies share the round;
            drawn here otherwise.

        Returns
        -------
        ndarray, shape (B,)
        """
        self._check_contexts(contexts)
        arms = self._check_arms(arms)
        x = np.asarray(contexts)[self._rows, arms]
        theta = self.theta[self._rows, arms] if self.spec.setting == "covariates" else self.theta
        return _rowdot(x, theta) + (self.noise() if noise is None else noise)


# --------------------------------------------------------------------------- regret


def optimal_arm(means: np.ndarray) -> np.ndarray:
    """Best arm of every repetition (lowest index on ties).

    Parameters
    ----------
    means : ndarray, shape (B, K)

    Returns
    -------
    ndarray of int, shape (B,)
    """
    return np.argmax(means, axis=-1)


def instant_regret(means: np.ndarray, arms: np.ndarray) -> np.ndarray:
    """Pseudo-regret of this round, ``max_k mu_k - mu_arm``, per repetition.

    Parameters
    ----------
    means : ndarray, shape (B, K)
    arms : ndarray of int, shape (B,)

    Returns
    -------
    ndarray, shape (B,), non-negative
    """
    chosen = np.take_along_axis(means, np.asarray(arms)[:, None], axis=-1)[:, 0]
    return np.max(means, axis=-1) - chosen
