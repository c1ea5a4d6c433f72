"""Outcomes recorded by the scripts, added to the statistics by the workers.

``reward.lua`` and ``settle.lua`` do no arithmetic: each outcome (reward or
default reward) is appended to the experiment's outcomes string
(:func:`service.keys.outcomes`) as one record: the decision's stats fields,
its number, the reward and its context. The sums in the stats hash plus
those records, added in order, are the statistics. This module adds them,
with ``policies.state.apply_sequence`` (the simulator's update, for a
sequence of observations of one experiment: the service has no arithmetic
of its own):

* every view a worker reads adds the records it read with the sums
  (:func:`fold_into`);
* every :data:`FOLD_EVERY` rewards (or default rewards), the worker whose
  call took the experiment's counter past a multiple writes the sums back
  with the records added and cuts those records from the string
  (:func:`folded_blobs`; ``fold_read.lua`` and ``fold.lua``; from its own view
  when that holds the stored sums and the first of the records, without reading
  the stored sums: :func:`held_blobs`), so that few are
  left, and keeps the records the last folds took (in the stats hash, a field
  a fold, indexed by ``folded_tail``: the last fold's and as many whole earlier
  folds' as fit in 32 KB, about 170 outcomes at d = 20), so that a view the folds overtook by
  fewer outcomes than that (as ``max_stale_rewards`` allows) still catches up
  by the records it lacks. A fold that fails (the worker stopped, Redis away) is
  done by the next one: the records wait meanwhile, counted by every view.

The records are added one at a time, in order, so the sums are those of
adding the outcomes one after another in the order the scripts recorded
them, bit for bit, wherever they are added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from policies import PolicyConfig, State
from policies.state import apply_sequence, layout
from service import keys
from service.codec import assemble_state, pack

# Rewards (and, counted apart, default rewards) between folds: a view adds
# about this many records at most (each costs a worker about 10 µs; more
# after a fold failed), and a fold's cost (three round trips and the sums
# decoded, added to and encoded: about a millisecond of the worker's CPU at
# d = 20, and its Redis time) is shared by this many outcomes. 32 rather
# than 16: a tenth of a reward's worker CPU was its share of the folds.
FOLD_EVERY = 32
# The most records one fold takes: after folding stopped for a while (no
# worker could reach Redis), the folds that follow catch up, each bounded
# (fold.lua unpacks two values per field written: at most 4 per record, far
# below Lua's limit of about 8,000).
FOLD_LIMIT = 512


def split_records(text: bytes, limit: int | None = None) -> tuple[list[bytes], int]:
    """The payloads of the records at the front of an outcomes string (all, or up to
    ``limit``), and how many bytes of it they take (outcomes.lua writes
    ``<payload length>:<payload>`` per record)."""
    payloads: list[bytes] = []
    at = 0
    while at < len(text) and (limit is None or len(payloads) < limit):
        colon = text.index(b":", at)
        end = colon + 1 + int(text[at:colon])
        if end > len(text):
            raise ValueError("the outcomes string ends inside a record")
        payloads.append(text[colon + 1: end])
        at = end
    return payloads, at


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
        is not its arm's, a context of another dimension, or no decision number
        in an experiment that forgets (a damaged store).
    """
    rows = [raw.split(b"\n", 4) for raw in raw_entries]
    if not rows:
        return
    width = 8 * config.dim
    arms = np.empty(len(rows), dtype=np.int64)
    for i, (model_field, arm_field, number, _, x) in enumerate(rows):
        k = arm_index.get(arm_field.decode())
        arm_id = arm_field.decode().removeprefix("arm:")
        if k is None or model_field.decode() != keys.model_field(
                None if config.shared else arm_id):
            raise ValueError(f"a recorded outcome names fields {model_field.decode()!r}, "
                             f"{arm_field.decode()!r} that this experiment does not have")
        if len(x) != width:
            raise ValueError(f"a recorded outcome has a context of {len(x) / 8:g} numbers, "
                             f"not {config.dim}")
        if not number and config.discounted:
            # Its weight would depend on which slots the state holds (their clock).
            raise ValueError("a recorded outcome of an experiment that forgets has no "
                             "decision number")
        arms[i] = k
    contexts = np.frombuffer(b"".join(row[4] for row in rows), dtype="<f8")
    rewards = np.array([float(row[3]) for row in rows])
    numbers = (np.array([float(row[2]) for row in rows]) if config.discounted else None)
    apply_sequence(config, state, arms, contexts.astype(np.float64).reshape(len(rows), -1),
                   rewards, numbers)


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
    model_fields = _model_fields(config, arm_fields)
    state = assemble_state(config, [stored.get(f) for f in model_fields],
                           [stored.get(f) for f in arm_fields])
    return _added_and_packed(config, state, model_fields, arm_fields, raw_entries)


def held_blobs(
    config: PolicyConfig,
    sums: State,
    arm_positions: Mapping[str, int],
    fields: Sequence[str],
    raw_entries: Sequence[bytes],
) -> dict[str, bytes] | None:
    """:func:`folded_blobs`' answer from statistics a worker holds, without reading the
    stored blobs: ``sums`` (every arm, at ``arm_positions``) are the stored sums with the
    fold's first outcomes added (a view's), and ``raw_entries`` are the fold's outcomes
    they lack. The same additions in the same order as adding all to the stored sums:
    the same bits. None when a field names an arm ``sums`` do not hold (added since).
    ``sums`` are not changed."""
    arm_fields = [f for f in fields if f.startswith("arm:")]
    positions = [arm_positions.get(f) for f in arm_fields]
    if any(position is None for position in positions):
        return None
    take = np.array(positions, dtype=np.int64)
    state = {name: sums[name][:, take] if spec.per_arm(config) else sums[name].copy()
             for name, spec in layout(config).items()}
    return _added_and_packed(config, state, _model_fields(config, arm_fields), arm_fields,
                             raw_entries)


def _model_fields(config: PolicyConfig, arm_fields: Sequence[str]) -> list[str]:
    """The model fields of the arms' outcomes: one shared, or each arm's."""
    if config.shared:
        return [keys.model_field(None)]
    return [keys.model_field(f.removeprefix("arm:")) for f in arm_fields]


def _added_and_packed(
    config: PolicyConfig, state: State, model_fields: Sequence[str], arm_fields: Sequence[str],
    raw_entries: Sequence[bytes],
) -> dict[str, bytes]:
    """``state`` (the arms of ``arm_fields``, in turn) with the outcomes added, as blobs."""
    fold_into(config, state, {f: k for k, f in enumerate(arm_fields)}, raw_entries)
    return {**dict(zip(model_fields, pack(config, "model", state), strict=True)),
            **dict(zip(arm_fields, pack(config, "arm", state), strict=True))}
