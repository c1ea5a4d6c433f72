"""Outcomes recorded by the scripts, added to the statistics by the workers.

``reward.lua`` and ``settle.lua`` do no arithmetic: each outcome (reward or
default reward) is recorded in the stats hash as field ``u:<n>``
(:data:`service.keys.UNFOLDED`; ``n`` counts the experiment's outcomes): the
decision's stats fields, its number, the reward and its context. The sums
in the stats hash plus those outcomes, added in the order of ``n``, are the
statistics. This module adds them, with ``policies.apply_observations`` (the
simulator's update, so the service has no second implementation of it):

* every view a worker reads adds the outcomes it read with the sums
  (:func:`fold_into`);
* every :data:`FOLD_EVERY` outcomes, the worker whose call took the count
  past a multiple writes the sums back with the oldest outcomes added and
  removes those (:func:`folded_blobs`, ``fold_read.lua`` and ``fold.lua``),
  so that few are left. A fold that fails (the worker stopped, Redis away)
  is done by the next one: the outcomes wait meanwhile.

The outcomes are added one at a time, in recorded order, so the sums are
those of adding the outcomes one after another in the order the scripts
recorded them, bit for bit, wherever they are added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from policies import PolicyConfig, State
from policies.state import apply_observations
from service import keys
from service.codec import assemble_state, pack

# Outcomes between folds: a view adds fewer than this many (each costs a
# worker about one policy update), and a fold's Redis time (its reads, the
# sums it writes back) is shared by this many outcomes.
FOLD_EVERY = 16
# The most outcomes one fold takes: after folding stopped for a while (no
# worker could reach Redis), the folds that follow catch up, each bounded.
FOLD_LIMIT = 1024


@dataclass(frozen=True)
class Entry:
    """One outcome as ``outcomes.lua`` records it."""

    model_field: str
    arm_field: str
    number: float | None  # the decision's number (None: a decision without one)
    reward: float
    x: np.ndarray  # the context, shape (d,)


def parse(raw: bytes) -> Entry:
    """An outcome as recorded: model field, arm field, number, reward, context."""
    model_field, arm_field, number, reward, x = raw.split(b"\n", 4)
    return Entry(model_field.decode(), arm_field.decode(),
                 float(number) if number else None, float(reward),
                 np.frombuffer(x, dtype="<f8").astype(np.float64))


def fields_of(raw_entries: Iterable[bytes]) -> list[str]:
    """The stats fields the outcomes add to (model, arm), first seen first: as
    ``fold_read.lua`` lists them."""
    seen: dict[str, None] = {}
    for raw in raw_entries:
        model_field, arm_field, _ = raw.split(b"\n", 2)
        seen.setdefault(model_field.decode())
        seen.setdefault(arm_field.decode())
    return list(seen)


def fold_into(
    config: PolicyConfig, state: State, arm_index: Mapping[str, int], raw_entries: Iterable[bytes]
) -> None:
    """Add recorded outcomes to a batch-of-one ``state`` in place, in order.

    ``arm_index`` maps an arm's stats field (``arm:<id>``) to its position in
    the state's arm axis.

    Raises
    ------
    ValueError
        If an outcome names an arm the state does not hold, a model field that
        is not its arm's, or a context of another dimension (a damaged store).
    """
    for raw in raw_entries:
        entry = parse(raw)
        k = arm_index.get(entry.arm_field)
        arm_id = entry.arm_field.removeprefix("arm:")
        if k is None or entry.model_field != keys.model_field(None if config.shared else arm_id):
            raise ValueError(f"a recorded outcome names fields {entry.model_field!r}, "
                             f"{entry.arm_field!r} that this experiment does not have")
        if entry.x.shape != (config.dim,):
            raise ValueError(f"a recorded outcome has a context of {entry.x.size} numbers, "
                             f"not {config.dim}")
        numbers = None if entry.number is None else np.array([entry.number])
        apply_observations(config, state, np.array([k]), entry.x[None],
                           np.array([entry.reward]), numbers)


def folded_blobs(
    config: PolicyConfig,
    fields: Sequence[str],
    blobs: Sequence[bytes | None],
    raw_entries: Sequence[bytes],
) -> dict[str, bytes]:
    """The stats fields ``fields`` (stored as ``blobs``, None: not written yet) with
    the outcomes ``raw_entries`` added: what ``fold.lua`` writes back.

    ``fields`` are the model and arm fields the outcomes add to
    (``fold_read.lua`` lists them); the state holds just those arms.
    """
    stored = dict(zip(fields, blobs, strict=True))
    arm_fields = [f for f in fields if f.startswith("arm:")]
    arm_ids = [f.removeprefix("arm:") for f in arm_fields]
    model_fields = ([keys.model_field(None)] if config.shared
                    else [keys.model_field(a) for a in arm_ids])
    state = assemble_state(config, [stored.get(f) for f in model_fields],
                           [stored.get(f) for f in arm_fields])
    fold_into(config, state, {f: k for k, f in enumerate(arm_fields)}, raw_entries)
    out = {f: pack(config, "model", state, slot) for slot, f in enumerate(model_fields)}
    out |= {f: pack(config, "arm", state, slot) for slot, f in enumerate(arm_fields)}
    return out
