"""Every Redis key of the service, in one place.

All keys of one experiment share the hash tag ``{experiment_id}`` so Redis
Cluster keeps them in one slot and a Lua script may touch them together.
"""

from __future__ import annotations

PREFIX = "lrb"
EXPERIMENT_INDEX = f"{PREFIX}:experiments"  # a set of ids; its own slot, updated outside scripts
# The ids of the experiments with a default reward, which the sweeper visits;
# a set in its own slot, like EXPERIMENT_INDEX.
DEFAULT_REWARD_INDEX = f"{PREFIX}:default-reward-experiments"


def meta(experiment_id: str) -> str:
    """Hash: spec and config (JSON), key hash, created_at, version."""
    return f"{PREFIX}:{{{experiment_id}}}:meta"


def arms(experiment_id: str) -> str:
    """Hash: arm id -> JSON {index, features, active}."""
    return f"{PREFIX}:{{{experiment_id}}}:arms"


def stats(experiment_id: str) -> str:
    """Hash: packed float64 statistics per model and per arm, plus counters.

    The statistics are these sums with the records of :func:`outcomes` added.
    """
    return f"{PREFIX}:{{{experiment_id}}}:stats"


def request(experiment_id: str, decision_id: str) -> str:
    """String: a decision whose id the caller chose (idempotent ``/choose``): the digest
    of its request and the decision answered (and the incarnation), so that a retry gets
    the same answer; expires with the decision's record, or after
    ``LINREBOOT_IDEMPOTENCY_SECONDS`` if sooner."""
    return f"{PREFIX}:{{{experiment_id}}}:request:{decision_id}"


# Between a ranking's decision id and a slot's number: not a character of the ids callers
# choose (app.schemas.DECISION_ID_PATTERN), so a slot's id is never a caller's.
SLOT_SEPARATOR = "#"


def slot_id(decision_id: str, slot: int) -> str:
    """The decision id of a ranking's slot (1 the first position): its reward's and its
    log entry's, and its record's once it has its reward; slot 0 names the ranking's own
    record, which holds its slots' until then (``service/lua/outcomes.lua``)."""
    return f"{decision_id}{SLOT_SEPARATOR}{slot}"


def slot_ids(decision_id: str, slots: int) -> list[str]:
    """The decision ids of a ranking's ``slots`` slots, the first position's first."""
    return [f"{decision_id}{SLOT_SEPARATOR}{slot}" for slot in range(1, slots + 1)]


def ranking_of(decision_id: str) -> str:
    """The ranking a slot's decision id belongs to; any other decision id as it is."""
    return decision_id.partition(SLOT_SEPARATOR)[0]


def decision(experiment_id: str, decision_id: str) -> str:
    """String: one pending (or rewarded, or settled) decision's record (its format is in
    ``lua/outcomes.lua``; a hash when an earlier version wrote it); expires after the
    reward window (and the grace period, with a default reward)."""
    return f"{PREFIX}:{{{experiment_id}}}:decision:{decision_id}"


def pending(experiment_id: str) -> str:
    """List: "<deadline> <decision id>" of every decision whose window is open, oldest first.

    The deadline is the end of the decision's reward window (Unix time, s, to
    the ms). decide.lua appends to it; without a default reward it drops the
    expired entries from its head, with one settle.lua moves the entries whose
    window has ended to :func:`settled`. DELETE reads it to delete the
    decisions (and their contexts) with the experiment.
    """
    return f"{PREFIX}:{{{experiment_id}}}:pending"


def settled(experiment_id: str) -> str:
    """List: "<expiry> <decision id>" of settled decisions kept for late rewards, oldest first.

    With a default reward only: settle.lua appends each decision whose window
    has ended (its record now holds its outcome but no context) and drops
    the expired ones; DELETE reads it as it reads :func:`pending`.
    """
    return f"{PREFIX}:{{{experiment_id}}}:settled"


def log(experiment_id: str) -> str:
    """Stream: the decision log, decisions and their outcomes in the order they happened.

    Written by decide.lua, reward.lua and settle.lua (so it never disagrees with
    the statistics); bounded by the experiment's log_max_entries and
    log_max_age_seconds.
    """
    return f"{PREFIX}:{{{experiment_id}}}:log"


def outcomes(experiment_id: str) -> str:
    """String: outcomes (rewards, default rewards) recorded but not yet in the sums.

    reward.lua and settle.lua do no arithmetic: they APPEND each outcome as a
    record (``service.folding`` reads them; ``outcomes.lua`` writes them), and
    the workers add the records to the sums: every view adds those it reads,
    and every ``FOLD_EVERY`` rewards a worker writes the sums back and cuts
    the records it added from the front (fold.lua). Created empty with the
    experiment, so that the experiment's keys all exist while its slot
    migrates (a key a script would create then is refused).
    """
    return f"{PREFIX}:{{{experiment_id}}}:outcomes"


def creating(experiment_id: str) -> str:
    """String: a claim on the id while a sharded experiment is created or deleted
    (its shards' members, service.lifecycle): a token; expires on its own if the
    creation or deletion stops."""
    return f"{PREFIX}:{{{experiment_id}}}:creating"


def deleted_pending(experiment_id: str, token: str) -> str:
    """List: a list of decisions of a deleted experiment, while its decisions are deleted."""
    return f"{PREFIX}:{{{experiment_id}}}:deleted-pending:{token}"


def calls(experiment_id: str) -> str:
    """Hash: the answers of the experiment's last changes by their calls' tokens, kept
    while a call may be sent again (a minute: service/lua/once.lua)."""
    return f"{PREFIX}:{{{experiment_id}}}:calls"


# Fields of the stats hash.
SHARED_MODEL_FIELD = "model"
DECISIONS = "decisions"  # decisions recorded
DECISION_SEQUENCE = "decision_seq"  # last decision number (skips one per unused reservation)
REWARDS = "rewards"
DUPLICATES = "duplicates"
DEFAULTED = "defaulted"  # decisions that got the default reward
LATE = "late"  # rewards that arrived after their window (and default)
DEFAULTS_MISSED = "defaults_missed"  # decisions the default could not reach: expired, or damaged
FOLDED = "folded"  # outcomes (keys.outcomes) added to the sums so far
# The records the last folds took, up to 32 KB (tail.lua): the index '<folded> <count>
# <slot>:<records>/<bytes>,...' here, each fold's records in folded_tail_field(slot).
FOLDED_TAIL = "folded_tail"
TAIL_FOLDS = 16  # the ring of slots: at most this many folds kept
# The last hour, minute by minute (recent.lua): 60 slots of a minute and the counters
# decisions, rewards and defaulted as that minute began (uint32, 3 float64), and the
# minute last marked. RECENT_OLD: an earlier version's counts (60 slots of 4 uint32),
# dropped at the first mark.
RECENT_MARKS = "recent_marks"
RECENT_MINUTE = "recent_minute"
RECENT_OLD = "recent"


def folded_tail_field(slot: int) -> str:
    """The stats field of the folded tail's ``slot``: one fold's records."""
    return f"{FOLDED_TAIL}:{slot}"


def model_field(arm_id: str | None) -> str:
    """The stats field of a model: the shared one, or one arm's (covariates)."""
    return SHARED_MODEL_FIELD if arm_id is None else f"model:{arm_id}"


def arm_field(arm_id: str) -> str:
    return f"arm:{arm_id}"
