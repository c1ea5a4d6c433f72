"""Every Redis key of the service, in one place.

All keys of one experiment share the hash tag ``{experiment_id}`` so Redis
Cluster keeps them in one slot and a Lua script may touch them together.
"""

from __future__ import annotations

PREFIX = "lrb"
EXPERIMENT_INDEX = f"{PREFIX}:experiments"  # a set of ids; its own slot, updated outside scripts


def meta(experiment_id: str) -> str:
    """Hash: spec and config (JSON), key hash, created_at, version."""
    return f"{PREFIX}:{{{experiment_id}}}:meta"


def arms(experiment_id: str) -> str:
    """Hash: arm id -> JSON {index, features, active}."""
    return f"{PREFIX}:{{{experiment_id}}}:arms"


def stats(experiment_id: str) -> str:
    """Hash: packed float64 statistics per model and per arm, plus counters."""
    return f"{PREFIX}:{{{experiment_id}}}:stats"


def decision(experiment_id: str, decision_id: str) -> str:
    """Hash: one pending (or rewarded) decision; expires after the reward window."""
    return f"{PREFIX}:{{{experiment_id}}}:decision:{decision_id}"


def pending(experiment_id: str) -> str:
    """List: "<expiry> <decision id>" of every decision not yet expired, oldest first.

    decide.lua appends to it and drops expired entries from its head; DELETE
    reads it to delete the decisions (and their contexts) with the experiment.
    """
    return f"{PREFIX}:{{{experiment_id}}}:pending"


def deleted_pending(experiment_id: str, token: str) -> str:
    """List: the pending list of a deleted experiment, while its decisions are deleted."""
    return f"{PREFIX}:{{{experiment_id}}}:deleted-pending:{token}"


# Fields of the stats hash.
SHARED_MODEL_FIELD = "model"
DECISIONS = "decisions"  # decisions recorded
DECISION_SEQUENCE = "decision_seq"  # last decision number (skips one per unused reservation)
REWARDS = "rewards"
DUPLICATES = "duplicates"


def model_field(arm_id: str | None) -> str:
    """The stats field of a model: the shared one, or one arm's (covariates)."""
    return SHARED_MODEL_FIELD if arm_id is None else f"model:{arm_id}"


def arm_field(arm_id: str) -> str:
    return f"arm:{arm_id}"
