"""Room 4: reading an experiment's decision log (its entries, decoded in a thread)."""

from __future__ import annotations

import asyncio
import builtins
import json
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from service import shards
from service.definition import Definition, parse_index_ranges, ranges_count
from service.domain import LogEntry, LogEntryType
from service.errors import InvalidInput
from service.store import log_entry_json_bytes
from service.views import Room

RawEntry = tuple[str, dict[str, bytes]]  # an entry id and its fields, as stored
# A sharded experiment's log shows entries this much older than this worker's clock
# (Redis's clock stamps them): the members write their logs apart, and one may
# still write an entry of a millisecond another's page has shown.
SETTLE_SECONDS = 1.0


class DecisionLog(Room):
    """An experiment's decision log, page by page."""

    async def read(
        self, experiment_id: str, after: str | None = None, limit: int = 100
    ) -> tuple[builtins.list[LogEntry], str | None]:
        """Up to ``limit`` decision-log entries after the entry id ``after``, oldest first,
        and at most about ``LINREBOOT_LOG_PAGE_MAX_BYTES`` of them (at least one); and
        the entry id to go on from (None on the last page). The entries are decoded in
        a thread: a page of large contexts does not hold up the event loop."""
        if after is not None and not _valid_entry_id(after):
            raise InvalidInput("after must be an entry_id from the log")
        definition = await self.views.definition(experiment_id)
        if after is not None and _last_entry_id(after):
            return [], None
        raw, more = await self._read(definition, after, limit)
        entries = await asyncio.to_thread(
            lambda: [_log_entry(definition, entry_id, fields) for entry_id, fields in raw])
        return entries, (raw[-1][0] if more and raw else None)

    async def _read(self, definition: Definition, after: str | None, limit: int
                    ) -> tuple[builtins.list[RawEntry], bool]:
        """A page of raw entries, and whether more may follow: of every member's log,
        merged, for a sharded experiment (service.shards)."""
        spec, max_bytes = definition.spec, self._settings.log_page_max_bytes
        size = _log_entry_size(definition)
        pages = await asyncio.gather(*(
            self._store.read_log(member_id, after, limit, max_bytes, size)
            for member_id in shards.members(spec.id, spec.shards)))
        if len(pages) == 1:
            return pages[0]
        return _merged(pages, limit, max_bytes, size)


def _merged(
    pages: Sequence[tuple[builtins.list[RawEntry], bool]], limit: int, max_bytes: int,
    size: Callable[[Mapping[str, bytes]], int],
) -> tuple[builtins.list[RawEntry], bool]:
    """One page of the members' logs in entry-id order (a member's settings changes
    are the home's, logged again: left out), within ``limit`` and ``max_bytes``, and
    whether more may follow. Entries of two members may share an id (the same
    millisecond and sequence): a page never ends between them, since the next page
    starts after that id. Nor does it go past the last entry of a member's page that
    was cut short (that member's next entries may come before the others'), nor
    show the last :data:`SETTLE_SECONDS` (a member may still write an entry with an
    id before one shown: the next page would start after it)."""
    settled = (int((time.time() - SETTLE_SECONDS) * 1000), 2**64 - 1)
    cut = min([settled, *(_id_key(raw[-1][0]) for raw, more in pages if more and raw)])
    tagged = [(entry_id, shard, fields) for shard, (raw, _) in enumerate(pages)
              for entry_id, fields in raw
              if (shard == 0 or fields.get("type") != b"settings")
              and _id_key(entry_id) <= cut]
    tagged.sort(key=lambda e: (_id_key(e[0]), e[1]))
    more = any(m for _, m in pages)
    page: builtins.list[RawEntry] = []
    spent = 0
    for entry_id, _, fields in tagged:
        full = len(page) >= limit or (page and spent + size(fields) > max_bytes)
        if full and entry_id != page[-1][0]:
            return page, True
        page.append((entry_id, fields))
        spent += size(fields)
    return page, more or len(page) >= limit  # as a member's: the limit reached, maybe more


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
        return log_entry_json_bytes(fields) + int(listed * each)

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


def _log_entry(definition: Definition, entry_id: str, fields: dict[str, bytes]) -> LogEntry:
    """A decision-log entry as decide.lua, reward.lua, settle.lua or settings.lua wrote it."""
    text = {k: v.decode() for k, v in fields.items() if k not in ("x", "contexts")}
    time_ms = int(entry_id.split("-", 1)[0])
    kind = text["type"]
    if kind == "settings":
        return LogEntry(entry_id, time_ms / 1000, "settings", "",
                        changes=json.loads(text["changes"]))
    if kind != "decision":
        return LogEntry(entry_id, time_ms / 1000, _OUTCOMES[kind], text["id"],
                        reward=float(text["reward"]))
    arms = definition.arms
    return LogEntry(
        entry_id, time_ms / 1000, "decision", text["id"],
        number=int(text["number"]),
        arm_id=text["arm"],
        context=tuple(np.frombuffer(fields["x"], dtype="<f8").tolist()),
        eligible=tuple(arms[i].id for i in parse_index_ranges(text["eligible"])),
        contexts=(tuple(map(tuple, np.frombuffer(fields["contexts"], dtype="<f8").reshape(
            -1, definition.spec.dim).tolist())) if "contexts" in fields else None),
        propensity=float(text["propensity"]) if text.get("propensity") else None,
        version=int(text["version"]) if text["version"] else None,
        rewards_seen=int(text["rewards_seen"]) if text["rewards_seen"] else None,
    )
