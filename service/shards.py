"""One experiment's statistics over several hash slots: its shards.

An experiment created with ``shards`` S > 1 is kept as S *members*: the
experiment's own keys (member 0, its home) and S - 1 more keyspaces
(``<id>~1`` ... ``<id>~S-1``; ``~`` is not allowed in an experiment id), each
under its own hash tag and so, on a Redis Cluster, on a slot of its own. Every
member is a whole experiment as the scripts see it: a copy of the definition
(meta and arms), its own counters, outcomes string, pending decisions and
decision log, and the partial sums of the outcomes it recorded. So every
script runs on a member unchanged, and a decision or reward touches one slot.

* A decision belongs to the member :func:`shard_of` its id: it is recorded
  there, and its reward goes there (exactly once, by that member's script).
  The ids the service makes put a worker's decisions of an experiment :data:`RUN` in
  a row on one member, then :data:`RUN` on the next (:class:`Runs`): the decisions of
  a batch, and the rewards that follow them soon, then go to Redis as one script call
  rather than one a member, and every member gets its share.
  Decision numbers stay unique: member s numbers its decisions s + S, s + 2S, ...
  (``number_step``, ``number_start`` in its meta).
* A decision is made from the merge of every member's sums
  (:func:`policies.state.merge_sums`): its own member's as current as an
  unsharded experiment's (up to ``max_stale_rewards``), the others' as this
  worker last caught up with them, at most :data:`SYNC_SECONDS` before.
* Each member keeps its own decision log, of ``log_max_entries / S`` entries;
  a page of the experiment's log merges theirs in time order (to the ms).
* The home holds the experiment's definition: a change (settings, arms, keys)
  is made there, by the scripts of an unsharded experiment, and then copied to
  every other member (:func:`sync_members`, ``sync_member.lua``: the same fields,
  version included). A decision that finds the members' definitions differ (a
  copy under way, or one that stopped halfway) makes the copy itself, so a
  change interrupted halfway is completed by the next decision or change.

Only sums that add can be split so: not an experiment that forgets, nor the
authors' variants (:func:`policies.state.mergeable`).
"""

from __future__ import annotations

import json
import secrets
import zlib
from collections.abc import Callable

from policies import PolicyConfig
from policies.state import mergeable
from service import keys
from service.domain import ExperimentSpec
from service.errors import InvalidInput
from service.store import Store

SEPARATOR = "~"  # not in EXPERIMENT_ID_PATTERN: a member id is never an experiment's
MAX_SHARDS = 16
# How old the other members' statistics may be when a decision is made (seconds): a
# decision on member s reads member s's latest outcomes as an unsharded decision does,
# and catches up the others when this worker's copy of them is older than this.
SYNC_SECONDS = 0.05
# How many decisions in a row a worker records on one member of a sharded experiment
# (the ids it makes): about the most a batch of one worker's carries under load.
RUN = 32
RUNS_KEPT = 4096  # experiments whose place a worker keeps (beyond: all start afresh)


def member(experiment_id: str, shard: int) -> str:
    """The id whose keys hold member ``shard`` of the experiment (the experiment's own for 0)."""
    return experiment_id if shard == 0 else f"{experiment_id}{SEPARATOR}{shard}"


def members(experiment_id: str, shards: int) -> list[str]:
    """Every member's id, the home first."""
    return [member(experiment_id, s) for s in range(shards)]


def home(member_id: str) -> str:
    """The experiment a member belongs to."""
    return member_id.split(SEPARATOR, 1)[0]


def shard_of(decision_id: str, shards: int) -> int:
    """The member a decision is recorded on, and its reward applied to."""
    if shards == 1:
        return 0
    return zlib.crc32(keys.ranking_of(decision_id).encode()) % shards  # a ranking's slots together


def new_decision_id(shard: int, shards: int) -> str:
    """A fresh decision id, as random as ``uuid4().hex``, that :func:`shard_of` puts on
    member ``shard`` (about ``shards`` draws)."""
    while True:
        candidate = secrets.token_hex(16)
        if shard_of(candidate, shards) == shard:
            return candidate


class Runs:
    """Where a worker's fresh decision ids go, experiment by experiment: :data:`RUN` in a
    row on one member, then :data:`RUN` on the next, round and round, from a place
    ``start`` draws for each experiment (so that workers do not move in step)."""

    def __init__(self, start: Callable[[int], int] = secrets.randbelow) -> None:
        self._start = start
        self._made: dict[str, int] = {}  # the experiment's ids made, from its start

    def new_id(self, experiment_id: str, shards: int) -> str:
        made = self._made.get(experiment_id)
        if made is None:
            if len(self._made) >= RUNS_KEPT:
                self._made.clear()
            made = self._start(RUN * shards)
        self._made[experiment_id] = made + 1
        return new_decision_id(made // RUN % shards, shards)

    def move_on(self, experiment_id: str, shard: int, shards: int) -> None:
        """The experiment's next ids not on member ``shard``, which refused one (its
        master out of memory, or failing over): if they were to go there, they go to the
        next member's run."""
        made = self._made.get(experiment_id)
        if made is not None and made // RUN % shards == shard:
            self._made[experiment_id] = (made // RUN + 1) * RUN


def numbering(shard: int, shards: int) -> dict[str, str]:
    """A member's meta fields for its decision numbers: s + S, s + 2S, ... (none unsharded)."""
    if shards == 1:
        return {}
    return {"number_step": str(shards), "number_start": str(shard)}


def log_share(log_max_entries: int, shards: int) -> int:
    """The entries each member's log keeps, so that the merged log keeps about
    ``log_max_entries``."""
    return -(-log_max_entries // shards)


# A member's own meta fields, never copied from the home.
_OWN_FIELDS = frozenset({"incarnation", "created_at", "number_start"})
# Definition fields a change may remove from the home's meta (a member drops them too).
_OPTIONAL_FIELDS = ("key_hash_old", "log_max_entries", "log_max_age_seconds", "default_reward")


def count_of(meta: dict[str, str]) -> int:
    """The shard count a stored meta hash says (1 when its spec names none).

    Raises ValueError for a damaged spec."""
    try:
        return int(json.loads(meta["spec"]).get("shards", 1))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"a damaged spec: {exc}") from None


async def sync_members(store: Store, experiment_id: str) -> bool:
    """Copy the home's definition to every other member; False if the experiment is gone.

    Idempotent: any worker may run it, any number of times, in any order with
    another's: each copy is the home's definition as read then, with its version,
    and a member keeps a newer one (``sync_member.lua``).
    """
    raw = await store.read_definition(experiment_id)
    if raw is None:
        return False
    meta, arms = raw
    fields = {k: v for k, v in meta.items() if k not in _OWN_FIELDS}
    absent = [f for f in _OPTIONAL_FIELDS if f not in meta]
    for member_id in members(experiment_id, count_of(meta))[1:]:
        await store.sync_member(member_id, meta["incarnation"], fields, absent, arms)
    return True


def check(spec: ExperimentSpec, config: PolicyConfig) -> None:
    """Refuse a shard count the experiment cannot have."""
    if not 1 <= spec.shards <= MAX_SHARDS:
        raise InvalidInput(f"shards must be between 1 and {MAX_SHARDS}")
    if spec.shards > 1 and not mergeable(config):
        raise InvalidInput(
            "shards above 1 need statistics that add up across shards: not with forgetting "
            "(discount below 1) nor with variant 'authors'")
