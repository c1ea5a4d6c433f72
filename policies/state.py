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
ridge term, so each policy adds its own regulariser), ``xty`` = X'y,
``yty`` = y'y, ``n`` observations, ``sum_y``; per arm ``pulls`` (s_k),
``sum_r``, ``sum_r2``, and for residuals against observed contexts
``arm_xtx`` and ``arm_xty``.
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
# What one observation (context x, reward r) adds to a field: x x', r x, r^2, 1 or r.
Addition = Literal["outer", "r_x", "r2", "one", "r"]


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
    fields = {
        "xtx": FieldSpec("model", (d, d), "outer"),
        "xty": FieldSpec("model", (d,), "r_x"),
        "yty": FieldSpec("model", (), "r2"),
        "n": FieldSpec("model", (), "one"),
        "sum_y": FieldSpec("model", (), "r"),
        "pulls": FieldSpec("arm", (), "one"),
        "sum_r": FieldSpec("arm", (), "r"),
        "sum_r2": FieldSpec("arm", (), "r2"),
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


def observation_delta(config: PolicyConfig, x: Array, reward: float) -> dict[str, Array]:
    """What one observation adds to each field of the chosen arm (and its model).

    Parameters
    ----------
    x : ndarray, shape (d,)
        The context the reward was observed with.
    reward : float

    Returns
    -------
    dict of ndarray, each of the slot shape given by :func:`layout`.
    """
    r = float(reward)
    additions: dict[Addition, Array | float] = {
        "outer": np.outer(x, x), "r_x": r * x, "r2": r * r, "one": 1.0, "r": r,
    }
    return {
        name: np.asarray(additions[spec.adds], dtype=np.float64)
        for name, spec in layout(config).items()
    }


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
    The same additions as :func:`observation_delta`, vectorised over the batch.
    """
    rows = np.arange(arms.shape[0])
    outer = x[:, :, None] * x[:, None, :]
    r2 = rewards * rewards
    # A shared model is slot 0 of every row: a plain slice, no fancy indexing.
    model = (slice(None), 0) if config.shared else (rows, arms)
    state["xtx"][model] += outer
    state["xty"][model] += rewards[:, None] * x
    state["yty"][model] += r2
    state["n"][model] += 1.0
    state["sum_y"][model] += rewards
    state["pulls"][rows, arms] += 1.0
    state["sum_r"][rows, arms] += rewards
    state["sum_r2"][rows, arms] += r2
    if "arm_xtx" in state:
        state["arm_xtx"][rows, arms] += outer
        state["arm_xty"][rows, arms] += rewards[:, None] * x
