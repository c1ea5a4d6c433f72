"""Plain domain records passed between the app and the service.

The app validates wire formats (pydantic) and builds these; the service checks
them against the experiment (dimensions, arm ids) and raises
:class:`service.errors.InvalidInput` with a message for the client.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Literal

from policies import PolicyName, Setting
from service import keys

ARM_ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,64}$"
# 1-64 of A-Z a-z 0-9 _ . - but not "." or "..", which URLs cannot carry as a
# path segment (clients normalise them away). No look-ahead: pydantic's regex
# engine has none.
EXPERIMENT_ID_PATTERN = (
    r"^(?:[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,63}|\.[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,62}"
    r"|\.\.[A-Za-z0-9_.\-]{1,62})$"
)
_ARM_ID = re.compile(ARM_ID_PATTERN)
_EXPERIMENT_ID = re.compile(EXPERIMENT_ID_PATTERN)

RewardStatus = Literal["applied", "duplicate", "conflict", "late", "not_found"]
LogEntryType = Literal["decision", "reward", "default", "late", "settings"]


def valid_arm_id(arm_id: str) -> bool:
    return bool(_ARM_ID.fullmatch(arm_id))


def valid_experiment_id(experiment_id: str) -> bool:
    return bool(_EXPERIMENT_ID.fullmatch(experiment_id))


@dataclass(frozen=True)
class ArmSpec:
    """An arm; ``features`` only in the stochastic setting (fixed feature vector)."""

    id: str
    features: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ExperimentSpec:
    """What a client asks for when creating an experiment.

    ``hyperparameters`` override :func:`policies.paper_config` fields
    (e.g. ``sigma_omega``, ``reg``); unknown names are rejected.
    ``max_stale_rewards``: a worker may decide from statistics that miss up to
    this many of the latest rewards (0: a decision reflects every reward
    acknowledged before its request arrived).
    ``default_reward``: applied, once, to every decision whose reward window
    ends without a reward (None: such decisions just expire).
    ``log_max_entries`` and ``log_max_age_seconds`` bound the decision log
    (0 entries: no log). ``log_all_contexts`` (contextual setting) logs every
    eligible arm's context with each decision, not only the chosen arm's:
    what an off-policy evaluation of a contextual experiment needs.
    ``propensities`` False: decisions carry and log no propensity (None), for
    the paper's baselines whose propensity takes milliseconds; their log cannot
    be evaluated off-policy.
    ``shards``: the experiment's statistics are kept as this many partial sums,
    each on a hash slot of its own (:mod:`service.shards`), so that its Redis
    work spreads over a cluster's masters.
    """

    id: str
    setting: Setting
    dim: int
    arms: tuple[ArmSpec, ...]
    policy: PolicyName = "linreboot"
    hyperparameters: dict[str, bool | float | str] = field(default_factory=dict)
    seed: int | None = None
    reward_window_seconds: int = 3600
    max_stale_rewards: int = 0  # rewards a decision's statistics may lag behind
    default_reward: float | None = None
    log_max_entries: int = 0  # decisions and outcomes kept in the decision log; 0: no log
    log_max_age_seconds: int = 7 * 24 * 3600
    log_all_contexts: bool = False  # contextual: every eligible arm's context in the log
    propensities: bool = True  # each decision's propensity computed, returned and logged
    shards: int = 1  # hash slots its statistics are spread over (service.shards)
    # A ranking's slot j reward modelled as w_j x'theta (a slot beyond the list: the last
    # weight); None: every slot 1. The scripts learn from r_j / w_j (outcomes.lua).
    position_weights: tuple[float, ...] | None = None


# The spread a LinReBoot experiment gets when its client names none: the rule
# that needs no tuning (no first pass over the arms, one sigma_omega, a spread
# for every arm; RESULTS.md, "A LinReBoot that needs no tuning"). The paper's
# is ``spread="paper"``. Written into the spec when the experiment is created,
# so an experiment keeps the rule it was created with.
SERVICE_SPREAD = "pooled"


def with_service_defaults(spec: ExperimentSpec) -> ExperimentSpec:
    """``spec`` with the service's LinReBoot spread where the client named none."""
    if spec.policy != "linreboot" or "spread" in spec.hyperparameters:
        return spec
    return replace(spec, hyperparameters={**spec.hyperparameters, "spread": SERVICE_SPREAD})


@dataclass(frozen=True)
class ArmState:
    """An arm's counters and estimates. With forgetting, ``pulls`` counts its
    outcomes and ``weight`` their discounted sum (None without forgetting);
    ``mean_reward`` and ``rss`` are discounted."""

    id: str
    active: bool
    pulls: int
    mean_reward: float | None
    rss: float | None
    features: tuple[float, ...] | None = None
    weight: float | None = None


@dataclass(frozen=True)
class Minute:
    """What an experiment did in one minute (by Redis's clock; recent.lua, keys.RECENT_MARKS)."""

    start: int  # seconds since the epoch, a multiple of 60
    decisions: int  # a ranking's slots each count, as in ExperimentView.decisions
    rewards: int
    defaulted: int


RECENT_MINUTES = 60  # how many minutes back an experiment's activity is kept


@dataclass(frozen=True)
class ExperimentView:
    """An experiment as stored, with what it has learnt."""

    spec: ExperimentSpec
    config: dict[str, bool | float | str | int]
    created_at: float
    arms: tuple[ArmState, ...]
    theta_hat: dict[str, list[float]]  # "shared" or one entry per arm id (covariates)
    decisions: int
    rewards: int
    duplicates: int
    defaulted: int = 0
    late: int = 0
    defaults_missed: int = 0
    previous_key_valid: bool = False  # a rotated-out key is still accepted, until revoked
    recent: tuple[Minute, ...] = ()  # the last hour's minutes with activity, oldest first


MAX_RANKED = 64  # the most arms one ranking (/rank) places


@dataclass(frozen=True)
class ChooseRequest:
    """One decision request.

    Exactly one of the context fields, by setting: stochastic needs none;
    contextual needs ``arm_contexts`` for every eligible arm; covariates needs
    ``context``. ``eligible`` and ``excluded`` restrict the active arms.
    ``decision_id``, chosen by the caller, makes the request idempotent: the
    same request again under it gets the same decision, recorded once.
    """

    context: tuple[float, ...] | None = None
    arm_contexts: dict[str, tuple[float, ...]] | None = None
    eligible: tuple[str, ...] | None = None
    excluded: tuple[str, ...] = ()
    decision_id: str | None = None
    slots: int | None = None  # a ranking of this many arms (``/rank``); None: one arm

    def digest(self) -> str:
        """What the request asks for, as a hash: the same request gives the same one (a
        ranking's differs from a decision's: the two are answered differently)."""
        asked: list[object] = [self.context, self.arm_contexts, self.eligible, self.excluded]
        if self.slots is not None:
            asked.append({"slots": self.slots})
        text = json.dumps(asked, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Decision:
    decision_id: str
    arm_id: str
    index: float | None  # None while the arm is still in its first, exploring pull
    exploring: bool
    decision_number: int
    expires_in_seconds: int
    # the probability that the policy chose this arm (policies.propensity); None when the
    # experiment computes none (ExperimentSpec.propensities)
    propensity: float | None


@dataclass(frozen=True)
class RankedDecision:
    """k distinct arms in order (``/rank``), one decision number. Each slot is a
    :class:`Decision` of its own (:attr:`slots`), whose ``decision_id`` (the ranking's
    id, ``#`` and the slot, 1 the first position) its reward names; its ``propensity``
    is the probability that its arm was placed at its position. Kept by column, slot
    by slot: a serving worker answers from the columns and makes no Decision."""

    decision_id: str
    decision_number: int
    expires_in_seconds: int  # the longest of the slots' (each slot's: ``windows``)
    arm_ids: tuple[str, ...]
    indices: tuple[float | None, ...]  # None while the arm is in its first, exploring pull
    propensities: tuple[float | None, ...]
    windows: tuple[int, ...]  # how long each slot's reward may still come in (seconds)

    def slot_ids(self) -> list[str]:
        """Each slot's decision id, the first position's first."""
        return keys.slot_ids(self.decision_id, len(self.arm_ids))

    @property
    def slots(self) -> tuple[Decision, ...]:
        return tuple(
            Decision(decision_id=slot_id, arm_id=arm_id, index=index, exploring=index is None,
                     decision_number=self.decision_number, expires_in_seconds=window,
                     propensity=propensity)
            for slot_id, arm_id, index, propensity, window in zip(
                self.slot_ids(), self.arm_ids, self.indices, self.propensities, self.windows,
                strict=True))


@dataclass(frozen=True)
class RewardOutcome:
    decision_id: str
    status: RewardStatus
    message: str


@dataclass(frozen=True)
class LogEntry:
    """One entry of an experiment's decision log: a decision, or an outcome of one.

    A decision has ``number`` to ``rewards_seen``; an outcome (``reward``: a
    reward applied; ``default``: the default reward applied; ``late``: a
    reward that arrived after the window, not applied) has ``reward``; a
    ``settings`` entry (live settings changed) has ``changes`` and no decision.
    ``context`` is the chosen arm's; ``eligible`` the arms it was chosen
    from; ``contexts`` theirs, in that order (an experiment with
    ``log_all_contexts``); ``propensity`` None where the decision recorded none.
    """

    entry_id: str  # "<ms>-<seq>": the log's order, which is the order things happened
    time: float  # Unix time, s (Redis's clock, to the ms)
    type: LogEntryType
    decision_id: str
    number: int | None = None
    arm_id: str | None = None
    context: tuple[float, ...] | None = None
    eligible: tuple[str, ...] | None = None
    contexts: tuple[tuple[float, ...], ...] | None = None
    propensity: float | None = None
    position: int | None = None  # a ranking's slot (1 the first); None for /choose's
    version: int | None = None
    rewards_seen: int | None = None
    reward: float | None = None
    changes: dict[str, object] | None = None  # a "settings" entry: what PATCH changed
