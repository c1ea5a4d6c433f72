"""Room 4: reading an experiment's decision log (its entries, decoded in a thread)."""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from service import keys, shards
from service.definition import Definition, parse_index_ranges, ranges_count
from service.domain import LogEntry, LogEntryType
from service.errors import InvalidInput
from service.store import log_entry_json_bytes
from service.views import Room

RawEntry = tuple[str, dict[str, bytes]]  # an entry id and its fields, as stored
# A sharded experiment's cursor: each member's position, joined (service.shards).
CURSOR_SEPARATOR = "~"


class DecisionLog(Room):
    """An experiment's decision log, page by page."""

    async def read(
        self, experiment_id: str, after: str | None = None, limit: int = 100
    ) -> tuple[builtins.list[LogEntry], str | None]:
        """Up to ``limit`` decision-log entries after ``after``, oldest first, and at most
        about ``LINREBOOT_LOG_PAGE_MAX_BYTES`` of them (at least one); and where to go on
        from (None on the last page): the last entry's id, or for a sharded experiment
        each shard's position (:func:`_merged`). The entries are decoded in a thread: a
        page of large contexts does not hold up the event loop."""
        if after is not None and not all(map(_valid_entry_id, after.split(CURSOR_SEPARATOR))):
            raise InvalidInput("after must be an entry_id (or a next_after) from the log")
        definition = await self.views.definition(experiment_id)
        positions = _positions(after, definition.spec.shards)
        raw, more, next_after = await self._read(definition, positions, limit)
        entries = await asyncio.to_thread(
            lambda: _log_entries(definition, raw))
        # (a sharded page may be empty yet not the last: other members' settings
        # entries, which only the home's log shows, were all it read)
        return entries, (next_after if more and (raw or definition.spec.shards > 1) else None)

    async def latest(
        self, experiment_id: str, since: float, limit: int, max_bytes: int
    ) -> tuple[builtins.list[LogEntry], bool]:
        """The log's latest entries from ``since`` (seconds since the epoch; 0: all of
        it) on, up to ``limit`` and about ``max_bytes`` of JSON, oldest first; and
        whether earlier ones of that stretch were left out. A sharded experiment's
        members are read alike, each within its share of the bounds, and merged:
        nothing is kept from before the oldest entry read of a member whose read
        stopped short (its earlier entries are unknown)."""
        definition = await self.views.definition(experiment_id)
        size = _log_entry_size(definition)
        start = f"{int(since * 1000)}-0" if since > 0 else None
        # Each member first its share of the bounds (decisions spread over the members
        # evenly, by their ids); then, while fewer than `limit` are known to be the
        # latest, the member whose read stopped latest reads as much again further back.
        member_ids = shards.members(experiment_id, definition.spec.shards)
        share = -(-limit // len(member_ids)), max(1, max_bytes // len(member_ids))
        pages = list(await asyncio.gather(*(
            self._store.read_latest_log(member_id, start, *share, size)
            for member_id in member_ids)))
        while True:
            kept, more, behind = _latest_of(pages, limit, max_bytes, size)
            if behind is None:
                break
            raw, _ = pages[behind]
            older, further = await self._store.read_latest_log(
                member_ids[behind], start, *share, size, before=raw[0][0])
            pages[behind] = (older + raw, further)
        entries = await asyncio.to_thread(
            lambda: _log_entries(definition, kept))
        return entries, more

    async def _read(self, definition: Definition, positions: Sequence[str | None], limit: int
                    ) -> tuple[builtins.list[RawEntry], bool, str | None]:
        """A page of raw entries, whether more may follow, and the cursor after it: of
        every member's log, merged, for a sharded experiment (service.shards)."""
        spec, max_bytes = definition.spec, self._settings.log_page_max_bytes
        size = _log_entry_size(definition)
        pages = await asyncio.gather(*(
            self._store.read_log(member_id, at, limit, max_bytes, size)
            if at is None or not _last_entry_id(at) else _nothing()
            for member_id, at in zip(shards.members(spec.id, spec.shards), positions,
                                     strict=True)))
        if len(pages) == 1:
            raw, more = pages[0]
            return raw, more, raw[-1][0] if raw else None
        return _merged(pages, positions, limit, max_bytes, size)


async def _nothing() -> tuple[builtins.list[RawEntry], bool]:
    return [], False


def _positions(after: str | None, shards_count: int) -> builtins.list[str | None]:
    """Where each member's log is read from: ``after`` is an entry id (every member reads
    after it) or, sharded, a cursor of one position per member."""
    if after is None:
        return [None] * shards_count
    parts = after.split(CURSOR_SEPARATOR)
    if len(parts) == 1:
        parts = parts * shards_count
    if len(parts) != shards_count or not all(_valid_entry_id(p) for p in parts):
        raise InvalidInput("after must be an entry_id (or a next_after) from the log")
    return list(parts)


def _merged(
    pages: Sequence[tuple[builtins.list[RawEntry], bool]], positions: Sequence[str | None],
    limit: int, max_bytes: int, size: Callable[[Mapping[str, bytes]], int],
) -> tuple[builtins.list[RawEntry], bool, str]:
    """One page of the members' logs in entry-id order (a member's settings changes
    are the home's, logged again: left out), within ``limit`` and ``max_bytes``;
    whether more may follow; and the cursor: each member's last entry shown (or
    where it was read from), so that the next page misses nothing a member writes
    meanwhile, even with an id before one shown. The page does not go past the
    last entry of a member's page that was cut short (that member's next entries
    may come before the others')."""
    cut = min((_id_key(raw[-1][0]) for raw, more in pages if more and raw), default=None)
    tagged = [(entry_id, shard, fields) for shard, (raw, _) in enumerate(pages)
              for entry_id, fields in raw
              if cut is None or _id_key(entry_id) <= cut]
    tagged.sort(key=lambda e: (_id_key(e[0]), e[1]))
    more = any(m for _, m in pages) or len(tagged) > limit
    at = [p or "0-0" for p in positions]
    page: builtins.list[RawEntry] = []
    spent = 0
    for entry_id, shard, fields in tagged:
        if len(page) >= limit or (page and spent + size(fields) > max_bytes):
            more = True
            break
        at[shard] = entry_id
        if shard == 0 or fields.get("type") != b"settings":
            page.append((entry_id, fields))
            spent += size(fields)
    more = more or len(page) >= limit  # as a member's: the limit reached, maybe more
    return page, more, CURSOR_SEPARATOR.join(at)


def _latest_of(
    pages: Sequence[tuple[builtins.list[RawEntry], bool]], limit: int, max_bytes: int,
    size: Callable[[Mapping[str, bytes]], int],
) -> tuple[builtins.list[RawEntry], bool, int | None]:
    """The latest entries the members' ``pages`` (each its latest, oldest first, and
    whether it stopped short) show for sure, within ``limit`` and ``max_bytes``, oldest
    first (a member's settings entries, the home's logged again, left out); whether
    earlier ones were left out; and which member to read further back, if more are
    wanted and may exist: the one whose page stopped latest, as none are kept from
    before its oldest entry (what it did not read may come after the others')."""
    if len(pages) == 1:  # one member: its read kept to the bounds already
        raw, more = pages[0]
        return raw, more, None
    cut = max(((_id_key(raw[0][0]), shard) for shard, (raw, more) in enumerate(pages)
               if more and raw), default=None)
    tagged = sorted(((entry_id, shard, fields) for shard, (raw, _) in enumerate(pages)
                     for entry_id, fields in raw
                     if (cut is None or _id_key(entry_id) >= cut[0])
                     and (shard == 0 or fields.get("type") != b"settings")),
                    key=lambda e: (_id_key(e[0]), e[1]))
    kept: builtins.list[RawEntry] = []
    spent, more = 0, cut is not None
    for entry_id, _, fields in reversed(tagged):
        if len(kept) >= limit or (kept and spent + size(fields) > max_bytes):
            return kept[::-1], True, None
        kept.append((entry_id, fields))
        spent += size(fields)
    return kept[::-1], more, None if cut is None else cut[1]


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


def _log_entry_size(definition: Definition) -> Callable[[Mapping[str, bytes]], int]:
    """About how many bytes of JSON an entry of this experiment's log takes: its packed
    fields (:func:`service.store.log_entry_json_bytes`) and its eligible arms, stored as
    index ranges and written as the arms' ids (quoted, with a comma)."""
    ids = [len(a.id) for a in definition.arms]
    each = (sum(ids) / len(ids) if ids else 0.0) + 3.0

    def size(fields: Mapping[str, bytes]) -> int:
        listed = ranges_count(fields.get("eligible", b"").decode())
        slots = fields["arms"].count(b",") + 1 if "arms" in fields else 1  # a ranking's
        return log_entry_json_bytes(fields) + slots * int(listed * each)

    return size


def _valid_entry_id(text: str) -> bool:
    """A Redis stream entry id: two unsigned 64-bit integers, "<ms>-<seq>"."""
    ms, _, seq = text.partition("-")
    return all(part.isdigit() and part.isascii() and int(part) < 2**64 for part in (ms, seq))


def _last_entry_id(text: str) -> bool:
    """The largest entry id there is: nothing can follow it."""
    ms, _, seq = text.partition("-")
    return int(ms) == int(seq) == 2**64 - 1


_OUTCOMES: dict[str, LogEntryType] = {"reward": "reward", "default": "default", "late": "late"}


def _log_entries(definition: Definition, raw: Sequence[RawEntry]) -> builtins.list[LogEntry]:
    """The entries as decide.lua, reward.lua, settle.lua or settings.lua wrote them, a
    ranking's (one entry) shown as one decision's entry per slot, in order."""
    return [entry for entry_id, fields in raw for entry in _log_entry(definition, entry_id,
                                                                        fields)]


def _log_entry(definition: Definition, entry_id: str, fields: dict[str, bytes]
               ) -> builtins.list[LogEntry]:
    """One stored entry's entries (a ranking's: one per slot, sharing its ``entry_id``)."""
    text = {k: v.decode() for k, v in fields.items() if k not in ("x", "contexts")}
    time_ms = int(entry_id.split("-", 1)[0])
    kind = text["type"]
    if kind == "settings":
        return [LogEntry(entry_id, time_ms / 1000, "settings", "",
                         changes=json.loads(text["changes"]))]
    if kind not in ("decision", "ranking"):
        return [LogEntry(entry_id, time_ms / 1000, _OUTCOMES[kind], text["id"],
                         reward=float(text["reward"]))]
    arms = definition.arms
    ranked = kind == "ranking"
    placed = text["arms" if ranked else "arm"].split(",")
    listed = text.get("propensities" if ranked else "propensity")
    propensities = listed.split(",") if listed else [None] * len(placed)
    contexts = np.frombuffer(fields["x"], dtype="<f8").reshape(len(placed), -1).tolist()
    number = int(text["number"])
    eligible = tuple(arms[i].id for i in parse_index_ranges(text["eligible"]))
    every = (tuple(map(tuple, np.frombuffer(fields["contexts"], dtype="<f8").reshape(
        -1, definition.spec.dim).tolist())) if "contexts" in fields else None)
    version = int(text["version"]) if text["version"] else None
    rewards_seen = int(text["rewards_seen"]) if text["rewards_seen"] else None
    return [LogEntry(
        entry_id, time_ms / 1000, "decision",
        keys.slot_id(text["id"], j) if ranked else text["id"], number=number, arm_id=arm_id,
        context=tuple(context), eligible=eligible, contexts=every,
        propensity=float(propensity) if propensity else None,
        position=j if ranked else _position(text), version=version, rewards_seen=rewards_seen)
        for j, (arm_id, context, propensity) in enumerate(
            zip(placed, contexts, propensities, strict=True), 1)]


def _position(text: Mapping[str, str]) -> int | None:
    """A slot's position as the versions before a ranking's one entry logged it."""
    return int(text["position"]) if "position" in text else None
