"""Room 4: reading an experiment's decision log (its entries, decoded in a thread)."""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import Callable, Mapping

import numpy as np

from service.definition import Definition, parse_index_ranges, ranges_count
from service.domain import LogEntry, LogEntryType
from service.errors import InvalidInput
from service.store import log_entry_json_bytes
from service.views import Room


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
        raw, more = await self._store.read_log(experiment_id, after, limit,
                                               self._settings.log_page_max_bytes,
                                               _log_entry_size(definition))
        entries = await asyncio.to_thread(
            lambda: [_log_entry(definition, entry_id, fields) for entry_id, fields in raw])
        return entries, (raw[-1][0] if more and raw else None)


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
