"""Policy statistics <-> Redis hash fields, as explicit little-endian float64.

A model's fields (``xtx``, ``xty``, ``yty``, ``n``, ``sum_y``) are packed into one
blob and an arm's fields (``pulls``, ``sum_r``, ``sum_r2``, ...) into another, in
the order of :func:`policies.layout`, so one reward adds to exactly two blobs;
:func:`recipe` tells ``reward.lua`` what it adds to each. A Gram matrix
(``xtx``, ``arm_xtx``) is stored as its upper triangle, row by row: half the
bytes, and half the arithmetic in the reward script.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies import PolicyConfig, State, layout
from policies.state import Axis

_FLOAT = np.dtype("<f8")
# What reward.lua adds, by the policies' FieldSpec.adds; Gram matrices are stored
# as their upper triangle (they are exactly symmetric: x_i x_j == x_j x_i).
_STORED_ADDITION = {"outer": "outer_upper"}


@dataclass(frozen=True)
class _Field:
    name: str
    shape: tuple[int, ...]  # in the policies' state
    count: int  # float64 values stored
    expand: np.ndarray | None  # upper triangle -> full matrix: stored index per (i, j)


def _upper_to_full(d: int) -> np.ndarray:
    """For each (i, j), the position of (min, max) in the row-major upper triangle."""
    index = np.empty((d, d), dtype=np.intp)
    rows, cols = np.triu_indices(d)
    index[rows, cols] = np.arange(rows.size)
    index[cols, rows] = np.arange(rows.size)
    return index


@functools.cache  # a handful of configs per process; read on every stale view
def _fields(config: PolicyConfig, axis: Axis) -> tuple[_Field, ...]:
    fields = []
    for name, spec in layout(config).items():
        if spec.axis != axis:
            continue
        if spec.adds == "outer":
            d = spec.shape[0]
            fields.append(_Field(name, spec.shape, d * (d + 1) // 2, _upper_to_full(d)))
        else:
            fields.append(_Field(name, spec.shape, math.prod(spec.shape), None))
    return tuple(fields)


def recipe(config: PolicyConfig, axis: Axis) -> str:
    """What an observation adds to each field of a blob, in order: ``reward.lua`` reads it."""
    return ",".join(
        _STORED_ADDITION.get(spec.adds, spec.adds)
        for spec in layout(config).values() if spec.axis == axis
    )


@functools.cache
def blob_size(config: PolicyConfig, axis: Axis) -> int:
    """Bytes of one packed model or arm blob."""
    return 8 * sum(f.count for f in _fields(config, axis))


def unpack(config: PolicyConfig, axis: Axis, blob: bytes | None) -> dict[str, np.ndarray]:
    """Unpack one blob; a missing blob is all zeros (nothing observed yet)."""
    size = blob_size(config, axis)
    if blob is None:
        flat = np.zeros(size // 8)
    elif len(blob) != size:
        raise ValueError(f"stored {axis} blob has {len(blob)} bytes, expected {size}")
    else:
        flat = np.frombuffer(blob, dtype=_FLOAT).astype(np.float64)
    return {name: value[0] for name, value in _columns(config, axis, flat[None]).items()}


def upgrade_blob(config: PolicyConfig, axis: Axis, blob: bytes) -> bytes:
    """A blob written before Gram matrices were stored as their upper triangle.

    The earlier format held every field whole, in layout order. Returns the
    blob in the current format; a blob already in it is returned unchanged.
    """
    if len(blob) == blob_size(config, axis):
        return blob
    fields = _fields(config, axis)
    legacy_size = 8 * sum(math.prod(f.shape) for f in fields)
    if len(blob) != legacy_size:
        raise ValueError(f"stored {axis} blob has {len(blob)} bytes, expected {legacy_size}")
    flat = np.frombuffer(blob, dtype=_FLOAT)
    parts, offset = [], 0
    for f in fields:
        value = flat[offset: offset + math.prod(f.shape)]
        offset += value.size
        if f.expand is not None:
            value = value.reshape(f.shape)[np.triu_indices(f.shape[0])]
        parts.append(value)
    return np.concatenate(parts).astype(_FLOAT).tobytes()


def _columns(config: PolicyConfig, axis: Axis, table: np.ndarray) -> dict[str, np.ndarray]:
    """Split a (slots, values) table into fields of shape (slots, *field shape)."""
    out: dict[str, np.ndarray] = {}
    offset = 0
    for f in _fields(config, axis):
        stored = table[:, offset: offset + f.count]
        out[f.name] = (stored if f.expand is None else stored[:, f.expand]).reshape(
            len(table), *f.shape
        )
        offset += f.count
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
        for name, value in _columns(config, axis, table).items():
            state[name] = value[None]
    return state
