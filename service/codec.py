"""Policy statistics <-> Redis hash fields, as explicit little-endian float64.

A model's fields (``xtx``, ``xty``, ``yty``, ``n``, ``sum_y``) are packed into one
blob and an arm's fields (``pulls``, ``sum_r``, ``sum_r2``, ...) into another, in
the order of :func:`policies.layout`, so one reward adds to exactly two blobs;
:func:`recipe` tells ``reward.lua`` what it adds to each.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from policies import PolicyConfig, State, layout
from policies.state import Axis

_FLOAT = np.dtype("<f8")


@functools.cache  # a handful of configs per process; read on every stale view
def _fields(config: PolicyConfig, axis: Axis) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(
        (name, spec.shape) for name, spec in layout(config).items() if spec.axis == axis
    )


def recipe(config: PolicyConfig, axis: Axis) -> str:
    """What an observation adds to each field of a blob, in order: ``reward.lua`` reads it."""
    return ",".join(spec.adds for spec in layout(config).values() if spec.axis == axis)


@functools.cache
def blob_size(config: PolicyConfig, axis: Axis) -> int:
    """Bytes of one packed model or arm blob."""
    return 8 * sum(math.prod(shape) for _, shape in _fields(config, axis))


def unpack(config: PolicyConfig, axis: Axis, blob: bytes | None) -> dict[str, np.ndarray]:
    """Unpack one blob; a missing blob is all zeros (nothing observed yet)."""
    fields = _fields(config, axis)
    size = blob_size(config, axis)
    if blob is None:
        flat = np.zeros(size // 8)
    elif len(blob) != size:
        raise ValueError(f"stored {axis} blob has {len(blob)} bytes, expected {size}")
    else:
        flat = np.frombuffer(blob, dtype=_FLOAT).astype(np.float64)
    out: dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in fields:
        count = math.prod(shape)
        out[name] = flat[offset: offset + count].reshape(shape)
        offset += count
    return out


def assemble_state(
    config: PolicyConfig,
    model_blobs: Sequence[bytes | None],
    arm_blobs: Sequence[bytes | None],
) -> State:
    """Build a batch-of-one policy state from stored blobs.

    Parameters
    ----------
    model_blobs : one blob (shared model) or one per arm (covariates), arm order.
    arm_blobs : one per arm, in the order the arms are scored.
    """
    state: State = {}
    axes: tuple[tuple[Axis, Sequence[bytes | None]], ...] = (
        ("model", model_blobs), ("arm", arm_blobs),
    )
    for axis, blobs in axes:
        size = blob_size(config, axis)
        empty = bytes(size)
        if any(b is not None and len(b) != size for b in blobs):
            raise ValueError(f"a stored {axis} blob does not have {size} bytes")
        # One buffer for all slots: one frombuffer instead of one per arm.
        table = np.frombuffer(b"".join(b or empty for b in blobs), dtype=_FLOAT)
        table = table.astype(np.float64).reshape(len(blobs), size // 8)
        offset = 0
        for name, shape in _fields(config, axis):
            count = math.prod(shape)
            state[name] = table[None, :, offset: offset + count].reshape(1, len(blobs), *shape)
            offset += count
    return state
