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
once, by the slot's first observation, so the state stays a sum that one
atomic script can add to (``service/lua/reward.lua`` does the same IEEE
operations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from policies.config import PolicyConfig

Array = NDArray[np.floating[Any]]
State = dict[str, Array]
Axis = Literal["model", "arm"]
# What one observation (context x, reward r) does to a field: add x x', r x or 1;
# hold the slot's first reward c ("first_r", set when the slot's count is 0);
# add r - c ("dr") or (r - c)^2 ("dr2").
Addition = Literal["outer", "r_x", "one", "first_r", "dr", "dr2"]


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
    # shifted sums: the order reward.lua applies them in.
    fields = {
        "xtx": FieldSpec("model", (d, d), "outer"),
        "xty": FieldSpec("model", (d,), "r_x"),
        "n": FieldSpec("model", (), "one"),
        "shift_y": FieldSpec("model", (), "first_r"),
        "sum_dy": FieldSpec("model", (), "dr"),
        "sum_dy2": FieldSpec("model", (), "dr2"),
        "pulls": FieldSpec("arm", (), "one"),
        "shift_r": FieldSpec("arm", (), "first_r"),
        "sum_dr": FieldSpec("arm", (), "dr"),
        "sum_dr2": FieldSpec("arm", (), "dr2"),
    }
    if needs_arm_gram(config):
        fields["arm_xtx"] = FieldSpec("arm", (d, d), "outer")
        fields["arm_xty"] = FieldSpec("arm", (d,), "r_x")
    return fields


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
    return {
        name: np.zeros(
            (batch, n_models if spec.axis == "model" else n_arms, *spec.shape), dtype=np.float64
        )
        for name, spec in layout(config).items()
    }


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
) -> None:
    """Add one observation per experiment to ``state``, in place.

    Parameters
    ----------
    arms : ndarray of int, shape (B,)
        The arm each experiment pulled.
    x : ndarray, shape (B, d)
        The context each reward was observed with.
    rewards : ndarray, shape (B,)

    Notes
    -----
    The additions of :func:`layout`'s fields, vectorised over the batch.
    """
    rows = np.arange(arms.shape[0])
    outer = x[:, :, None] * x[:, None, :]
    # A shared model is slot 0 of every row: a plain slice, no fancy indexing.
    model = (slice(None), 0) if config.shared else (rows, arms)
    state["xtx"][model] += outer
    state["xty"][model] += rewards[:, None] * x
    _add_shifted(state, model, ("n", "shift_y", "sum_dy", "sum_dy2"), rewards)
    _add_shifted(state, (rows, arms), ("pulls", "shift_r", "sum_dr", "sum_dr2"), rewards)
    if "arm_xtx" in state:
        state["arm_xtx"][rows, arms] += outer
        state["arm_xty"][rows, arms] += rewards[:, None] * x


def _add_shifted(
    state: State, slots: Any, names: tuple[str, str, str, str], rewards: Array
) -> None:
    """Count, shift and shifted sums of one observation per row, in place."""
    count, shift, sum_d, sum_d2 = names
    first = np.where(state[count][slots] == 0.0, rewards, state[shift][slots])
    state[shift][slots] = first
    deviation = rewards - first
    state[count][slots] += 1.0
    state[sum_d][slots] += deviation
    state[sum_d2][slots] += deviation * deviation
