"""Policy statistics <-> Redis hash fields, as explicit little-endian float64.

A model's fields (``xtx``, ``xty``, ``n``, ``shift_y``, ...) are packed into one
blob and an arm's fields (``pulls``, ``shift_r``, ``sum_dr``, ...) into another, in
the order of :func:`policies.layout`, so one reward adds to exactly two blobs
(``service.folding`` adds them); :func:`recipe`, stored with the experiment,
names what a blob holds. A Gram matrix (``xtx``, ``arm_xtx``) is stored as its
upper triangle, row by row: half the bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies import PolicyConfig, State, layout
from policies.state import Axis, upper_indices

_FLOAT = np.dtype("<f8")
# What a stored field holds, by the policies' FieldSpec.adds; Gram matrices are stored
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
    """What an observation adds to each field of a blob, in order (the stored format's name)."""
    return ",".join(
        _STORED_ADDITION.get(spec.adds, spec.adds)
        for spec in layout(config).values() if spec.axis == axis
    )


# What the meta's recipes end with since outcomes are recorded for the workers
# to add (service.folding). The reward scripts of earlier versions added each
# reward to the sums themselves: one left running beside this version would
# add behind a fold's back, and the fold would write over its addition. They
# refuse a recipe with an addition they do not know, so they refuse these
# experiments instead (the start-up upgrade gives the suffix to experiments
# they created).
RECORDED = ",recorded"


def stored_recipe(config: PolicyConfig, axis: Axis) -> str:
    """The recipe as the meta stores it: :func:`recipe` and :data:`RECORDED`."""
    return recipe(config, axis) + RECORDED


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


def pack(config: PolicyConfig, axis: Axis, state: State) -> list[bytes]:
    """The blob of each slot of a batch-of-one ``state`` on ``axis``: :func:`unpack`'s
    inverse. One array operation a field for all the slots, not one a slot (a fold packs
    every arm it touched; in a worker each NumPy call costs several µs).

    A Gram matrix is stored as its upper triangle, which loses nothing: its
    additions are exactly symmetric (``x_i x_j == x_j x_i``).
    """
    parts = []
    for f in _fields(config, axis):
        value = np.asarray(state[f.name][0], dtype=np.float64)  # (slots, *shape)
        if f.expand is not None:
            rows, cols = upper_indices(value.shape[-1])
            parts.append(value[:, rows, cols])
        else:
            parts.append(value.reshape(value.shape[0], -1))
    packed = np.concatenate(parts, axis=1).astype(_FLOAT)
    data, width = packed.tobytes(), packed.shape[1] * _FLOAT.itemsize
    return [data[slot * width:(slot + 1) * width] for slot in range(packed.shape[0])]


def legacy_recipe(config: PolicyConfig, axis: Axis) -> str:
    """The recipe of the first version, which stored none: whole Gram matrices, raw sums."""
    if axis == "model":
        return "outer,r_x,r2,one,r"
    return "one,r,r2" + (",outer,r_x" if "arm_xtx" in layout(config) else "")


def upgrade_blob(config: PolicyConfig, axis: Axis, blob: bytes, stored_recipe: str) -> bytes:
    """A blob stored under ``stored_recipe``, in the current format.

    Earlier formats held Gram matrices whole (``outer``) and raw reward sums
    (``r`` = sum r, ``r2`` = sum r^2); the current one holds upper triangles
    and sums about a shift (``policies.state``). Raw sums become sums about
    the mean reward (any constant serves as the shift; the mean keeps the
    shifted sums smallest), so the digits that the raw sums still hold are
    kept and later rewards add about that shift. A blob already in the
    current format is returned unchanged.

    Raises
    ------
    ValueError
        If the blob does not have the size ``stored_recipe`` implies.
    """
    if stored_recipe == recipe(config, axis):
        if len(blob) != blob_size(config, axis):
            raise ValueError(f"stored {axis} blob has {len(blob)} bytes, expected "
                             f"{blob_size(config, axis)}")
        return blob
    d = config.dim
    sizes = {"outer": d * d, "outer_upper": d * (d + 1) // 2, "r_x": d}
    kinds = stored_recipe.split(",")
    expected = 8 * sum(sizes.get(kind, 1) for kind in kinds)
    if len(blob) != expected:
        raise ValueError(f"stored {axis} blob has {len(blob)} bytes, expected {expected}")
    flat = np.frombuffer(blob, dtype=_FLOAT).astype(np.float64)
    old: dict[str, np.ndarray] = {}
    offset = 0
    for kind in kinds:
        size = sizes.get(kind, 1)
        value = flat[offset: offset + size]
        offset += size
        old[kind] = value.reshape(d, d)[np.triu_indices(d)] if kind == "outer" else value
    if "outer" in old:
        old["outer_upper"] = old.pop("outer")
    if "r" in old:
        count, total, squares = old["one"], old.pop("r"), old.pop("r2")
        shift = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        old["first_r"] = shift
        old["dr"] = total - count * shift
        old["dr2"] = np.maximum(squares - shift * (2.0 * total - count * shift), 0.0)
    new = recipe(config, axis).split(",")
    return np.concatenate([old[kind] for kind in new]).astype(_FLOAT).tobytes()


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
