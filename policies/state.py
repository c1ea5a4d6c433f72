"""Sufficient statistics of every policy, as named float64 arrays.

Every policy here is driven by sums, so a reward is an *addition* to the state:
that is what lets the service apply it with one atomic Lua script and what
lets the simulator keep 100 repetitions in one array.

Two kinds of field:

* **model** fields hold the ridge statistics of a model. With one theta shared
  by all arms (stochastic, contextual) there is one model slot; in the
  covariates setting there is one model per arm. In memory they have shape
  ``(B, M, ...)`` with ``M = 1`` or ``M = K``.
* **arm** fields hold the per-arm reward sums of Section 3.3, shape ``(B, K, ...)``.

Field names follow the paper: ``xtx`` = X'X (the Gram matrix *without* the
ridge term, so each policy adds its own regulariser), ``xty`` = X'y, ``n``
observations; per arm ``pulls`` (s_k), and for residuals against observed
contexts ``arm_xtx`` and ``arm_xty``.

Reward sums are kept **shifted**: ``shift_r`` is the arm's first reward, and
``sum_dr``, ``sum_dr2`` sum ``r - shift_r`` and its square (likewise
``shift_y``, ``sum_dy``, ``sum_dy2`` per model). The RSS of Section 3.3,
``sum r^2 - 2 mu sum r + s mu^2``, loses every digit when rewards are large
against their spread (mean 1e6 and sd 1: 8.8% error; mean/sd near 1e8: a
negative RSS, clamped to 0, which silently stops the arm's exploration);
about the first reward its terms are of the spread's size. The shift is set
once, by the slot's first observation, so the state stays a sum that the
service can add outcomes to one at a time, in any process (``service.folding``).

Forgetting
----------
With ``config.discount = gamma < 1`` every sum is discounted by the age of
its observations, counted in decision numbers: in statistics *at clock N*
the outcome (reward or default) of decision number ``n <= N`` weighs
``gamma ** (N - n)``, so ``xtx = sum_i gamma^(N - n_i) x_i x_i'``, ``n`` and
``pulls`` are sums of weights (effective counts, at most ``1 / (1 - gamma)``),
and so on; a half-life is ``ln 2 / ln(1 / gamma)`` decisions. A decision is
made from the statistics at the clock of the latest outcome they hold (the
highest decision number among the rewards and defaults applied): the newest
outcome weighs 1, and without new outcomes nothing is forgotten.
Decisions that got no outcome still count in the age of the others.

Each slot (model or arm) stores its sums at its own clock, its latest
observation's decision number (``model_at``, ``arm_at``), so an observation
touches only its two slots: it brings them to ``max(at, n)`` (multiplying
their sums by ``gamma ** (max(at, n) - at)``) and adds itself with weight
``gamma ** (max(at, n) - n)``; a decision brings every slot to the common
clock (:func:`discounted`). That is the same weighted sum whatever order the
outcomes arrive in (in exact arithmetic; in floating point the order of the
additions, fixed by the store, decides the last bits, as without forgetting),
never grows beyond its undiscounted size, and stays a change to two slots.
Powers are computed by repeated squaring (:func:`power`), whose products do
not depend on the platform's ``pow``. A slot's shift
(its first reward) does not decay: rewards that drift D away from it cost the
RSS a relative precision of about ``eps (D / spread)^2`` (1e-8 at D = 1e4
standard deviations), as a mean of D did before shifts. Its count, once it
underflows to 0 (an arm unused for about ``745 / ln(1 / gamma)`` decisions),
makes the slot start again, about a new shift (and the arm be explored
again). ``total_pulls`` counts an arm's
outcomes undiscounted, for display.

The ridge term is not discounted: ``reg I`` is added to the discounted Gram
matrix, so the prior keeps its weight ``lambda`` against an effective sample
of at most ``1 / (1 - gamma)`` observations, and as the data age out the
estimates return to the prior (theta 0, the prior's width) rather than
becoming ill-posed. With ``gamma = 1`` (the default) none of this exists:
the layout, the sums and their arithmetic are those without forgetting.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from policies.config import PolicyConfig
from policies.ridge import Equilibrated, perturbed_systems, ridge, solve

Array = NDArray[np.floating[Any]]
State = dict[str, Array]
T = TypeVar("T")
Axis = Literal["model", "arm"]
# What one observation (context x, reward r) does to a field: add x x', r x or 1;
# hold the slot's first reward c ("first_r", set when the slot's count is 0);
# add r - c ("dr") or (r - c)^2 ("dr2"). With forgetting: hold the slot's clock
# ("at", see Forgetting above) and count undiscounted ("tally").
# The authors' variants (policies.authors, simulation only, never in the store)
# add x itself ("x"), keep the largest norm of the ridge estimate so far
# ("norm_max"), mark the arms whose estimate their LinReBoot has refreshed
# ("fresh"), and for LinGIRO's bootstrap add the count and Gram matrix of the
# rows that bring pseudo-rewards ("late_one", "late_outer"), r^2 x x' ("r2_outer"),
# r x (x) x (x) x ("r_x3") and the pseudo-row-weighted fourth moments ("aug_x4").
Addition = Literal[
    "outer", "r_x", "one", "first_r", "dr", "dr2", "at", "tally", "x", "norm_max",
    "fresh", "late_one", "late_outer", "r2_outer", "r_x3", "aug_x4",
]
# What keeps its value when a slot is discounted to a later clock.
_NOT_DECAYED: frozenset[Addition] = frozenset({"first_r", "at", "tally"})


@dataclass(frozen=True)
class FieldSpec:
    """One named statistic: its axis, the shape of one slot, what an observation adds."""

    axis: Axis
    shape: tuple[int, ...]
    adds: Addition

    def per_arm(self, config: PolicyConfig) -> bool:
        """True when the store keeps one copy of this field per arm."""
        return self.axis == "arm" or not config.shared


def layout(config: PolicyConfig) -> dict[str, FieldSpec]:
    """The fields a policy's state is made of, in a fixed order."""
    d = config.dim
    # Each blob's count ("one") comes before its shift, the shift before the
    # shifted sums, and its clock ("at") before everything: the order
    # _add_discounted applies them in.
    clock = {"model_at": FieldSpec("model", (), "at")} if config.discounted else {}
    fields = {
        **clock,
        "xtx": FieldSpec("model", (d, d), "outer"),
        "xty": FieldSpec("model", (d,), "r_x"),
        "n": FieldSpec("model", (), "one"),
        "shift_y": FieldSpec("model", (), "first_r"),
        "sum_dy": FieldSpec("model", (), "dr"),
        "sum_dy2": FieldSpec("model", (), "dr2"),
    }
    if config.discounted:
        fields["arm_at"] = FieldSpec("arm", (), "at")
    fields |= {
        "pulls": FieldSpec("arm", (), "one"),
        "shift_r": FieldSpec("arm", (), "first_r"),
        "sum_dr": FieldSpec("arm", (), "dr"),
        "sum_dr2": FieldSpec("arm", (), "dr2"),
    }
    if needs_arm_gram(config):
        fields["arm_xtx"] = FieldSpec("arm", (d, d), "outer")
        fields["arm_xty"] = FieldSpec("arm", (d,), "r_x")
    if config.discounted:
        fields["total_pulls"] = FieldSpec("arm", (), "tally")
    return fields | _authors_fields(config)


def _authors_fields(config: PolicyConfig) -> dict[str, FieldSpec]:
    """What the authors' variants keep besides the sums (:mod:`policies.authors`).

    Their LinPHE shifts the perturbation by a multiple of ``sum x``; their
    LinUCB's radius holds the largest ``||theta_hat||`` of every update so far;
    their LinReBoot with a model per arm refreshes an arm's estimate only in
    the round after the arm is pulled, and only from round K + 1 on
    (``refreshed``: 1 once it has been, :mod:`policies.authors`);
    the moments of their LinGIRO's resample need the sums of its augmented
    history up to fourth order in ``x`` (:func:`giro_rows`), the fourth as the
    Gram matrix of the upper triangles of ``x x'`` (:func:`upper_triangle`).
    """
    if config.variant != "authors":
        return {}
    d = config.dim
    if config.name == "linphe":
        return {"sum_x": FieldSpec("model", (d,), "x")}
    if config.name == "linucb":
        return {"theta_norm_max": FieldSpec("model", (), "norm_max")}
    if config.name == "linreboot" and not config.shared:
        return {"refreshed": FieldSpec("arm", (), "fresh")}
    if config.name == "lingiro":
        p = d * (d + 1) // 2
        return {"late_n": FieldSpec("model", (), "late_one"),
                "late_xtx": FieldSpec("model", (d, d), "late_outer"),
                "r2_xtx": FieldSpec("model", (d, d), "r2_outer"),
                "r_x3": FieldSpec("model", (d, d, d), "r_x3"),
                "aug_x4": FieldSpec("model", (p, p), "aug_x4")}
    return {}


# Kept solutions
# ---------------
# With a model per arm one reward changes one of the K models, yet a round
# solved all K: a :class:`Sums` state keeps each model's ``theta_hat`` once
# asked for, beside its sums and the ``X'X`` and ``X'y`` it was solved from,
# and solves again only the models
# whose sums differ from those (an exact comparison: whatever changed them,
# ``update`` or a caller writing to the arrays). LAPACK solves each matrix
# of a stack alone, so a kept solution has the bits a fresh one would. A
# plain dict keeps nothing (each call solves), nor does a state with
# forgetting, where every model changes with the clock.
#
# A *frozen* Sums is its maker's promise that its arrays never change (the
# service's views are copied, never written): its solutions are then compared
# with the sums once, not on every call, a shared model's are kept too, and
# what is computed from the sums alone (``derived``) is kept while it lives.
# With contexts that come with each decision (a request's context) nothing else
# of a decision's preparation can be kept from one to the next.


class Sums(dict[str, Array]):
    """A state (named sums, as any :data:`State`) that keeps solutions of its sums.

    What it keeps is an attribute, not an item: iterating over the state,
    copying it (``dict(state)``: the copy keeps nothing) or storing it sees
    the sums only. ``frozen``: the arrays never change (see the notes above).
    """

    def __init__(self, *args: Any, frozen: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: dict[str, Array] = {}
        self.frozen = frozen
        # Of a frozen state: the kept solutions found current, and what was computed
        # from its sums alone (:func:`derived`). Neither is inherited (inherit_kept).
        self.checked: set[str] = set()
        self.derived: dict[str, Any] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy or a pickle carries the sums only.
        return (Sums, (dict(self),))

def inherit_kept(target: State, source: State) -> None:
    """Give ``target`` (a :class:`Sums` of the same models, in the same order) copies of
    what ``source`` keeps: its first :func:`kept_theta` then solves only the models whose
    sums differ from those the copies were solved from (a reward changes one model of a
    model per arm). Copies, since :func:`kept_theta` updates what it keeps in place and
    ``source`` may still be in use."""
    kept = getattr(source, "kept", None)
    if kept and isinstance(target, Sums):
        target.kept = {name: value.copy() for name, value in kept.items()}
        target.checked.clear()  # compared with the target's own sums first, if frozen


def derived(state: State, name: str, fresh: Callable[[], T]) -> T:
    """``fresh()``, a value computed from ``state``'s sums alone: kept under ``name`` while
    ``state`` is a frozen :class:`Sums` (the same bits), else computed on every call."""
    if not getattr(state, "frozen", False):
        return fresh()
    store = state.derived  # type: ignore[attr-defined]
    if name not in store:
        value = store[name] = fresh()
        # Read-only, as kept solutions are: a caller writing into one would change every
        # later decision made from this state.
        for array in value if isinstance(value, tuple) else (value,):
            if isinstance(array, np.ndarray):
                array.flags.writeable = False
    kept: T = store[name]
    return kept


def kept_theta(state: State, reg: float) -> Array:
    """``theta_hat`` of every model, (B, M, d): :func:`policies.ridge.ridge`'s, kept
    (read-only)."""
    return _kept_solution(state, reg, ("theta", "reg", "xtx", "xty"), ridge, True)


def kept_ridge_and_inverse(state: State, reg: float) -> tuple[Array, Array]:
    """``theta_hat`` (B, M, d) and ``(X'X + reg I)^-1`` (B, M, d, d) of every model, from
    one floored solve of ``[X'y, I]`` (``policies.ridge.solve``), kept as
    :func:`kept_theta` keeps ``theta_hat`` where the stack is large enough for it to
    pay (:data:`KEEP_INVERSES_FROM`; the same bits either way). Read-only.

    A context's leverage ``x' (X'X + reg I)^-1 x`` is then a matrix-vector
    product, not a solve: the service asks it of K arms per request, the
    simulator of every arm each round, though a reward changes one model of a
    model per arm.
    """
    return _kept_theta_and_matrix(state, reg, "ridge|inverse", _ridge_and_inverse)


def kept_draw_basis(state: State, weight: float, reg: float, bare_root: bool
                    ) -> tuple[Array, Array]:
    """``theta_hat = G^-1 X'y`` (B, M, d) and ``W = G^-1 S^-1 R`` (B, M, d, d) of every
    model, with ``G = weight X'X + reg I`` and ``S^-1 R`` the floored root of ``G``
    itself, or with ``bare_root`` of ``X'X`` (``policies.ridge.perturbed_systems``),
    from one floored solve of ``[X'y, S^-1 R]`` (``Factor.times_root`` applies
    ``S^-1 R``). Kept as :func:`kept_ridge_and_inverse` keeps its solution (the same
    bits either way). Read-only.

    A Thompson sampler's draw ``G^-1 (X'y + c S^-1 R z)`` is then
    ``theta_hat + c W z``: a matrix-vector product per model instead of a solve, for
    models per arm, which a reward changes one at a time while every draw uses all.
    As with every kept solution, the arrays returned are views that the next call on
    this state, after its sums changed, overwrites in place: use them before the next
    update (the service prepares a view's sums once; the simulator every round).
    """
    basis = functools.partial(_draw_basis, weight=weight, bare_root=bare_root)
    return _kept_theta_and_matrix(state, reg, f"draw basis {weight!r} {bare_root!r}", basis)


def _kept_theta_and_matrix(state: State, reg: float, name: str,
                           fresh: Callable[[Array, Array, float], Array]
                           ) -> tuple[Array, Array]:
    """``fresh``'s ``[theta_hat, matrix]`` (..., d, 1 + d) split in two, kept under
    ``name`` from :data:`KEEP_INVERSES_FROM` models x d^3 on."""
    xtx = state["xtx"]
    keep = xtx[..., 0, 0].size * xtx.shape[-1] ** 3 >= KEEP_INVERSES_FROM
    names = (name, f"{name} reg", f"{name} xtx", f"{name} xty")
    both = _kept_solution(state, reg, names, fresh, keep)
    return both[..., 0], both[..., 1:]


def _draw_basis(xtx: Array, xty: Array, reg: float, *, weight: float, bare_root: bool
                ) -> Array:
    """``[theta_hat, W]`` of :func:`kept_draw_basis`, shape (..., d, 1 + d)."""
    if bare_root:
        gram, rooted = perturbed_systems(xtx, weight, reg)
    else:
        gram = rooted = Equilibrated.of(xtx if weight == 1.0 else weight * xtx, reg)
    root = rooted.factor()
    lift = root.root / root.scale[..., :, None]  # S^-1 R
    return gram.solve(np.concatenate([xty[..., None], lift], axis=-1))


# A solve with d + 1 right-hand sides (the inverses, the draw bases) costs about four
# times a factorisation, so keeping pays from a small stack on (measured for the
# inverses, B = 1, K = 10: d = 10 and 20 kept 170 and 200 µs a round, fresh 209 and
# 288; d = 5 kept 173, fresh 163). Either way the bits are the same.
KEEP_INVERSES_FROM = 5_000


def _ridge_and_inverse(xtx: Array, xty: Array, reg: float) -> Array:
    """``[theta_hat, (X'X + reg I)^-1]``, shape (..., d, 1 + d)."""
    identity = np.broadcast_to(np.eye(xtx.shape[-1]), xtx.shape)
    return solve(xtx, reg, np.concatenate([xty[..., None], identity], axis=-1))


def _kept_solution(state: State, reg: float, names: tuple[str, str, str, str],
                   fresh: Callable[[Array, Array, float], Array], keep: bool) -> Array:
    """``fresh(xtx, xty, reg)``, kept under ``names`` (solution, reg, and the X'X and X'y
    it was solved from) and redone for the models whose sums moved (module notes)."""
    xtx, xty = state["xtx"], state["xty"]
    store = getattr(state, "kept", None)
    frozen = getattr(state, "frozen", False)
    # Nothing to keep in; forgetting; or one model per row, which every reward changes
    # (but not while the sums are frozen).
    if (not keep or store is None or "model_at" in state
            or (xtx.shape[1] == 1 and not frozen)):
        return fresh(xtx, xty, reg)
    solution_name, reg_name, xtx_name, xty_name = names
    checked: set[str] = getattr(state, "checked", set())
    solution = store.get(solution_name)
    if solution is None or store[reg_name][()] != reg or store[xtx_name].shape != xtx.shape:
        solution = store[solution_name] = fresh(xtx, xty, reg)
        store[reg_name] = np.array(reg)
        store[xtx_name], store[xty_name] = xtx.copy(), xty.copy()
        if frozen:
            checked.add(solution_name)
        return _read_only(solution)
    if solution_name in checked:  # frozen sums, compared already
        return _read_only(solution)
    seen_xtx, seen_xty = store[xtx_name], store[xty_name]
    # Models whose sums moved since they were solved (a NaN never equals itself: solved again).
    stale = (xtx != seen_xtx).reshape(*xtx.shape[:2], -1).any(axis=-1)
    stale |= (xty != seen_xty).any(axis=-1)
    where = _changed(stale)
    if where is not None:
        solution[where] = fresh(xtx[where], xty[where], reg)
        seen_xtx[where], seen_xty[where] = xtx[where], xty[where]
    if frozen:
        checked.add(solution_name)
    return _read_only(solution)


def _changed(stale: NDArray[np.bool_]) -> Any:
    """An index of the (row, model) pairs marked in ``stale`` (B, M), keeping both axes;
    None when there are none. One pair (one run's reward) is a slice: views, no copies."""
    changed = np.count_nonzero(stale)
    if not changed:
        return None
    if changed == 1:
        row, model = divmod(int(stale.argmax()), stale.shape[1])
        return (slice(row, row + 1), model)
    return np.nonzero(stale)


def _read_only(kept: Array) -> Array:
    """A read-only view: what is kept is written by :func:`_kept_solution` only."""
    view = kept.view()
    view.flags.writeable = False
    return view


def upper_triangle(matrices: Array) -> Array:
    """The row-major upper triangles of a stack of (d, d) matrices, shape (..., d (d+1) / 2)."""
    rows, cols = upper_indices(matrices.shape[-1])
    return matrices[..., rows, cols]


@functools.lru_cache(maxsize=64)
def upper_indices(d: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """``np.triu_indices(d)``, read-only, made once a size (14 µs a call at d = 20: a fold
    packs every Gram matrix it writes back)."""
    rows, cols = np.triu_indices(d)
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols


def giro_rows(config: PolicyConfig, state: State, model: Any) -> Array:
    """1 where the observation just counted in ``model`` brings the authors' pseudo-rows, else 0.

    Their ``Linear_GIRO`` adds ``a`` rows ``(x, +U)`` and ``a`` rows ``(x, -U)``
    with every reward, except, with one shared model, the rewards of the first
    pass over the K arms (its rounds 1..K), shape (B,).
    """
    count = state["n"][model]
    if not config.shared:
        return np.ones_like(count)
    return (count > state["pulls"].shape[1]).astype(np.float64)


def needs_arm_gram(config: PolicyConfig) -> bool:
    """Per-arm X'X is needed only for observed-context residuals with a shared model.

    With a model per arm the model's own ``xtx`` already is the arm's Gram matrix,
    and in the stochastic setting every observation of an arm has the same
    features, so the current and observed residuals coincide.
    """
    return (
        config.name in ("linreboot", "greedy")
        and config.residuals == "observed"
        and config.setting == "contextual"
    )


def init_state(config: PolicyConfig, n_arms: int, batch: int = 1) -> State:
    """Zero statistics for ``batch`` independent experiments with ``n_arms`` arms."""
    n_models = 1 if config.shared else n_arms
    return Sums({
        name: np.zeros(
            (batch, n_models if spec.axis == "model" else n_arms, *spec.shape), dtype=np.float64
        )
        for name, spec in layout(config).items()
    })


def raw_reward_sums(count: Array, shift: Array, sum_d: Array, sum_d2: Array
                    ) -> tuple[Array, Array]:
    """``sum r`` and ``sum r^2`` from shifted sums (as precise as keeping them raw)."""
    total = sum_d + count * shift
    return total, sum_d2 + shift * (2.0 * sum_d + count * shift)


def apply_observations(
    config: PolicyConfig,
    state: State,
    arms: NDArray[np.int64],
    x: Array,
    rewards: Array,
    numbers: Array | None = None,
) -> None:
    """Add one observation per experiment to ``state``, in place.

    Parameters
    ----------
    arms : ndarray of int, shape (B,)
        The arm each experiment pulled.
    x : ndarray, shape (B, d)
        The context each reward was observed with.
    rewards : ndarray, shape (B,)
    numbers : ndarray, shape (B,), optional
        With forgetting, the decision number each observation belongs to
        (whole numbers from 1); default one after each row's clock (a new
        decision). Ignored without forgetting.

    Notes
    -----
    The additions of :func:`layout`'s fields, vectorised over the batch.
    """
    rows = batch_rows(arms.shape[0])
    outer = x[:, :, None] * x[:, None, :]
    if not config.discounted:
        _add_plain(config, state, _Slots.of(config, rows, arms, state["pulls"].shape[1]),
                   outer, x, rewards)
        return
    # A shared model is slot 0 of every row: a plain slice, no fancy indexing.
    model = (slice(None), 0) if config.shared else (rows, arms)
    if numbers is None:
        numbers = clock(state) + 1.0
    observation = _Observation(outer, rewards[:, None] * x, rewards, numbers)
    _add_discounted(config, state, "model", model, observation)
    _add_discounted(config, state, "arm", (rows, arms), observation)


def apply_sequence(
    config: PolicyConfig,
    state: State,
    arms: NDArray[np.int64],
    x: Array,
    rewards: Array,
    numbers: Array | None = None,
) -> None:
    """Add observations of one experiment (a batch-of-one ``state``) in order, in place.

    The same sums, bit for bit, as :func:`apply_observations` called once per
    observation in order (``arms``, ``x``, ``rewards``, ``numbers`` as there,
    one entry per observation): the same IEEE operations on each slot in the
    same order, without the per-call work of a batch (a slot's observations
    depend on each other: its count decides whether it takes the reward as its
    shift). With forgetting, and in the authors' variants, one
    :func:`apply_observations` call per observation.
    """
    if config.discounted or config.variant == "authors":
        for i in range(arms.shape[0]):
            apply_observations(config, state, arms[i: i + 1], x[i: i + 1], rewards[i: i + 1],
                               None if numbers is None else numbers[i: i + 1])
        return
    outer = x[:, :, None] * x[:, None, :]
    r_x = rewards[:, None] * x
    xtx, xty = state["xtx"][0], state["xty"][0]
    model_sums = tuple(state[name][0] for name in ("n", "shift_y", "sum_dy", "sum_dy2"))
    arm_sums = tuple(state[name][0] for name in _ARM_FIELDS)
    arm_grams = (state["arm_xtx"][0], state["arm_xty"][0]) if "arm_xtx" in state else None
    for i, k in enumerate(arms.tolist()):
        m = 0 if config.shared else k
        reward = rewards[i]
        xtx[m] += outer[i]
        xty[m] += r_x[i]
        _add_shifted_one(model_sums, m, reward)
        _add_shifted_one(arm_sums, k, reward)
        if arm_grams is not None:
            arm_grams[0][k] += outer[i]
            arm_grams[1][k] += r_x[i]


def _add_shifted_one(sums: tuple[Array, ...], slot: int, reward: np.floating[Any]) -> None:
    """:func:`_add_shifted` of one observation into one slot of (K,) views."""
    count, shift, sum_d, sum_d2 = sums
    counted = count[slot]
    if counted == 0.0:  # the slot's first observation sets its shift
        shift[slot] = reward
    deviation = reward - shift[slot]
    count[slot] = counted + 1.0
    sum_d[slot] += deviation
    sum_d2[slot] += deviation * deviation


@functools.lru_cache(maxsize=64)
def batch_rows(batch: int) -> NDArray[np.int64]:
    """``arange(batch)``, read-only: every update and decision of a batch indexes its
    rows with it."""
    rows = np.arange(batch)
    rows.flags.writeable = False
    return rows


@dataclass(frozen=True)
class _Slots:
    """Where one observation per row goes: its model's slot and its arm's.

    Fancy indices for a batch; for one experiment (the service's batch, a
    single run) basic indices instead (the arm's number), whose views are
    added to in place: the same additions without a gather and a scatter per
    field.
    """

    model: Any  # indexes (B, M, ...) fields
    arm: Any  # indexes (B, K, ...) fields
    arm_flat: Any  # indexes the flattened (B, K) fields; None where ``arm`` is basic
    single: tuple[int, int] | None = None  # one experiment: its model's and arm's numbers

    @classmethod
    def of(cls, config: PolicyConfig, rows: NDArray[np.int64], arms: NDArray[np.int64],
           n_arms: int) -> _Slots:
        if rows.shape[0] == 1:  # the same shapes as the fancy indices give: (1, ...)
            k = int(arms[0])
            m = 0 if config.shared else k
            return cls((slice(None), m), (slice(None), k), None, (m, k))
        # A shared model is slot 0 of every row: a plain slice, no fancy indexing.
        pair = (rows, arms)
        return cls((slice(None), 0) if config.shared else pair, pair, rows * n_arms + arms)


_ARM_FIELDS = ("pulls", "shift_r", "sum_dr", "sum_dr2")


def _add_plain(config: PolicyConfig, state: State, slots: _Slots, outer: Array, x: Array,
               rewards: Array) -> None:
    """The additions without forgetting: a sum per field, in layout order."""
    model = slots.model
    r_x = rewards[:, None] * x
    state["xtx"][model] += outer
    state["xty"][model] += r_x
    model_fields, arm_fields = ("n", "shift_y", "sum_dy", "sum_dy2"), _ARM_FIELDS
    if slots.single is not None:
        # One experiment (the service's batch, a single run): the same IEEE operations on
        # scalars, about a tenth of the array calls' cost at B = 1.
        m, k = slots.single
        reward = rewards[0]
        _add_shifted_one(tuple(state[name][0] for name in model_fields), m, reward)
        _add_shifted_one(tuple(state[name][0] for name in arm_fields), k, reward)
    elif slots.arm_flat is not None and (
            state["pulls"].flags.c_contiguous and state["shift_r"].flags.c_contiguous
            and state["sum_dr"].flags.c_contiguous and state["sum_dr2"].flags.c_contiguous):
        # Per-arm scalars through their flat views: one integer index, not a pair.
        _add_shifted(state, model, model_fields, rewards)
        _add_shifted(state, slots.arm_flat, arm_fields, rewards, flat=True)
    else:
        _add_shifted(state, model, model_fields, rewards)
        _add_shifted(state, slots.arm, arm_fields, rewards)
    if "arm_xtx" in state:
        state["arm_xtx"][slots.arm] += outer
        state["arm_xty"][slots.arm] += r_x
    if "sum_x" in state:
        state["sum_x"][model] += x
    if "theta_norm_max" in state:
        norms = np.linalg.norm(ridge(state["xtx"][model], state["xty"][model], config.reg), axis=-1)
        state["theta_norm_max"][model] = np.maximum(state["theta_norm_max"][model], norms)
    if "refreshed" in state:
        # Their loop refreshes the arm it just pulled from round K + 1 on: the
        # pulls of the first pass but the last leave their arm at beta = 0.
        state["refreshed"][slots.arm] = np.all(state["pulls"] > 0, axis=1)
    if "aug_x4" in state:
        _add_giro(config, state, model, outer, x, rewards)


def _add_giro(config: PolicyConfig, state: State, model: Any, outer: Array, x: Array,
              rewards: Array) -> None:
    """The authors' LinGIRO's sums of one observation per row (``n`` already counts it)."""
    late = giro_rows(config, state, model)
    state["late_n"][model] += late
    state["late_xtx"][model] += late[:, None, None] * outer
    state["r2_xtx"][model] += (rewards * rewards)[:, None, None] * outer
    state["r_x3"][model] += (rewards[:, None, None] * outer)[..., None] * x[:, None, None, :]
    upper = upper_triangle(outer)
    weight = 1.0 + 2.0 * config.giro_a * late  # the row and its 2a pseudo-rows
    state["aug_x4"][model] += (weight[:, None] * upper)[:, :, None] * upper[:, None, :]


def _add_shifted(state: State, slots: Any, names: tuple[str, str, str, str], rewards: Array,
                 flat: bool = False) -> None:
    """Count, shift and shifted sums of one observation per row, in place.

    With ``flat``, ``slots`` index the fields' flattened views (the fields
    must be C-contiguous, so that those views are the fields themselves).
    """
    count, shift, sum_d, sum_d2 = (state[name].reshape(-1) if flat else state[name]
                                   for name in names)
    counted = count[slots]
    first = shift[slots]
    fresh = counted == 0.0
    if np.count_nonzero(fresh):  # a slot's first observation sets its shift
        first = np.where(fresh, rewards, first)
        shift[slots] = first
    deviation = rewards - first
    count[slots] = counted + 1.0
    sum_d[slots] += deviation
    sum_d2[slots] += deviation * deviation


# -- shards: partial sums merged ------------------------------------------------
# A sharded experiment (service.shards) keeps its observations' sums as S
# partial states, one per shard, each built by the additions above from the
# observations that shard recorded. The statistics are their merge: the plain
# sums add; a slot's shifted sums (count, first reward c, sum of r - c, of
# (r - c)^2) move onto one shift first. Only sums that add merge so: not the
# clocks of forgetting, nor the authors' running maxima and flags.

_SHIFTED_ADDITIONS: frozenset[Addition] = frozenset({"one", "first_r", "dr", "dr2"})
_PLAIN_ADDITIONS: frozenset[Addition] = frozenset({"outer", "r_x", "x"})


def mergeable(config: PolicyConfig) -> bool:
    """True when partial states of this policy merge into the whole (:func:`merge_sums`)."""
    return not config.discounted and all(
        spec.adds in _SHIFTED_ADDITIONS or spec.adds in _PLAIN_ADDITIONS
        for spec in layout(config).values())


def merge_sums(config: PolicyConfig, parts: list[State]) -> State:
    """The state of the observations of every part: ``parts`` are states (same arms,
    same batch) each of which saw some of them.

    The counts are exact; every other sum is the whole's up to the order of the
    additions (its rounding differs from adding all observations in one order by
    at most a few ulps of the sum of the terms' magnitudes). A slot's shifted sums
    move onto the shift of the first part that has observations in it: with
    ``delta`` the difference of the shifts, ``sum (r - c) = sum (r - c') + n delta``
    and ``sum (r - c)^2 = sum (r - c')^2 + 2 delta sum (r - c') + n delta^2``. One
    part is returned as a copy, bit for bit.
    """
    if not mergeable(config):
        raise ValueError(f"{config.name} with these settings keeps sums that do not merge")
    merged = {name: value.copy() for name, value in parts[0].items()}
    groups = _shifted_groups(config)
    for part in parts[1:]:
        for name, spec in layout(config).items():
            if spec.adds in _PLAIN_ADDITIONS:
                merged[name] += part[name]
        for names in groups:
            _merge_shifted(tuple(merged[n] for n in names), tuple(part[n] for n in names))
    return merged


def _shifted_groups(config: PolicyConfig) -> list[tuple[str, str, str, str]]:
    """The (count, shift, sum of deviations, of squares) fields, one group per axis."""
    order = ("one", "first_r", "dr", "dr2")
    groups: dict[str, dict[str, str]] = {}
    for name, spec in layout(config).items():
        if spec.adds in _SHIFTED_ADDITIONS:
            groups.setdefault(spec.axis, {})[spec.adds] = name
    return [tuple(group[kind] for kind in order) for group in groups.values()]  # type: ignore[misc]


def _merge_shifted(into: tuple[Array, ...], part: tuple[Array, ...]) -> None:
    """Add ``part``'s shifted sums to ``into``'s, in place, onto ``into``'s shifts (or
    ``part``'s where ``into`` has no observation yet)."""
    count, shift, sum_d, sum_d2 = into
    p_count, p_shift, p_d, p_d2 = part
    base = np.where(count == 0.0, p_shift, shift)
    delta = np.where(p_count == 0.0, 0.0, p_shift - base)
    sum_d2 += p_d2 + 2.0 * delta * p_d + p_count * delta * delta
    sum_d += p_d + p_count * delta
    count += p_count
    shift[...] = base


# -- forgetting (see the module docstring) ------------------------------------


def power(base: float, exponents: Array) -> Array:
    """``base ** k`` for whole ``k >= 0``, by repeated squaring, elementwise.

    The result times ``base ** (2 ** i)`` for each set bit ``i``, lowest
    first: the same bits on every platform, which ``numpy.power`` (the C
    library's ``pow``) may not give. Exponents
    below ``_TABLE`` are looked up in a table of those very products (the
    simulator's ages), which saves the loop.
    """
    k = np.asarray(exponents).astype(np.int64)
    # One reduction for both bounds: a negative k is huge as unsigned.
    if k.size and k.view(np.uint64).max() < _TABLE:
        return _power_table(float(base))[k]
    if k.size and k.min() < 0:
        raise ValueError("exponents must be 0 or more")
    return _squared_powers(float(base), k)


_TABLE = 1 << 14


@functools.cache
def _power_table(base: float) -> Array:
    """``power(base, k)`` for every ``k`` below ``_TABLE`` (read-only; 128 KiB per base)."""
    table = _squared_powers(base, np.arange(_TABLE))
    table.flags.writeable = False
    return table


def _squared_powers(base: float, k: NDArray[np.int64]) -> Array:
    result = np.ones(k.shape)
    square = base
    while k.any():
        odd = (k & 1) == 1
        result = np.where(odd, result * square, result)
        k = k >> 1
        square = square * square
    return result


def clock(state: State) -> Array:
    """Each row's clock: the latest decision number among its slots, shape (B,)."""
    return np.maximum(state["model_at"].max(axis=1), state["arm_at"].max(axis=1))


def discounted(config: PolicyConfig, state: State, at: Array | None = None) -> State:
    """The statistics every slot holds at the clock ``at`` (default :func:`clock`).

    A new state (``state`` itself without forgetting, or when every slot is
    at the clock already): each slot's sums times ``gamma ** (at - slot's
    clock)``. ``at`` has shape (B,) and is at least every slot's clock.
    """
    if not config.discounted:
        return state
    target = clock(state) if at is None else np.asarray(at, dtype=np.float64)
    target = np.broadcast_to(target, state["model_at"].shape[:1])[:, None]
    ages = {axis: target - state[f"{axis}_at"] for axis in ("model", "arm")}
    if not any(age.any() for age in ages.values()):
        return state
    out = dict(state)
    for axis, age in ages.items():
        factor = power(config.discount, age)
        out[f"{axis}_at"] = state[f"{axis}_at"] + age
        for name, adds, extra_dims in _fields_of(config, axis):
            if adds not in _NOT_DECAYED:
                out[name] = state[name] * factor.reshape(factor.shape + (1,) * extra_dims)
    return out


@functools.cache
def _fields_of(config: PolicyConfig, axis: Axis) -> tuple[tuple[str, Addition, int], ...]:
    """The fields of one axis, in layout order: name, addition, dimensions of one slot."""
    return tuple((name, spec.adds, len(spec.shape)) for name, spec in layout(config).items()
                 if spec.axis == axis)


@dataclass(frozen=True)
class _Observation:
    outer: Array  # (B, d, d)
    r_x: Array  # (B, d)
    rewards: Array  # (B,)
    numbers: Array  # (B,)


def _add_discounted(
    config: PolicyConfig, state: State, axis: Axis, slots: Any, o: _Observation
) -> None:
    """One observation per row into one slot per row, field by field in layout order.

    The slot goes to the clock ``now = max(at, n)``: its sums are multiplied
    by ``gamma ** (now - at)`` and the observation is added with weight
    ``gamma ** (now - n)``.
    """
    gamma = config.discount
    decay: Array = np.ones(0)  # set by the slot's clock, which comes first
    weight: Array = decay
    first: Array = decay
    fresh: NDArray[np.bool_] = np.ones(0, dtype=bool)
    for name, adds, _ in _fields_of(config, axis):
        value = state[name][slots]
        if adds == "at":
            now = np.maximum(value, o.numbers)
            decay, weight = power(gamma, now - value), power(gamma, now - o.numbers)
            state[name][slots] = now
            continue
        if adds == "tally":
            state[name][slots] = value + 1.0
            continue
        if adds == "first_r":
            first = np.where(fresh, o.rewards, value)
            state[name][slots] = first
            continue
        shape = (-1,) + (1,) * (value.ndim - 1)
        kept = value * decay.reshape(shape)
        if adds == "one":
            fresh = kept == 0.0
            state[name][slots] = kept + weight
            continue
        if adds == "outer":
            added = o.outer
        elif adds == "r_x":
            added = o.r_x
        else:
            deviation = o.rewards - first
            added = deviation if adds == "dr" else deviation * deviation
        state[name][slots] = kept + weight.reshape(shape) * added
