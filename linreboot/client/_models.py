"""What the service answers, as typed, immutable pydantic models.

Every model ignores fields it does not know (``extra="ignore"``), so a client
keeps working against a newer service that adds fields; values that are open
sets on the service's side (policy names, reward statuses) are plain strings
for the same reason. Requests are not modelled: the service validates them and
answers a 422 that says what is wrong.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Arm",
    "CreatedExperiment",
    "Decision",
    "Experiment",
    "ExperimentPage",
    "RewardResult",
    "ServiceStatus",
]

COUNTED = frozenset({"applied", "duplicate"})


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Arm(_Answer):
    """One arm of an experiment and its counters."""

    id: str
    active: bool
    pulls: int
    mean_reward: float | None = None  # None until the arm has a reward
    rss: float | None = None  # residual sum of squares; None until rewarded
    features: list[float] | None = None  # stochastic setting only
    weight: float | None = None  # with a discount: the outcomes' discounted sum


class Experiment(_Answer):
    """An experiment, its counters and its estimates (``GET /experiments/{id}``)."""

    id: str
    setting: str  # stochastic, contextual or covariates
    policy: str
    dim: int
    seed: int | None = None
    reward_window_seconds: int
    max_stale_rewards: int = 0
    # The overrides given at creation (LinReBoot: with the service's spread if none was)
    hyperparameters: dict[str, bool | float | str] = {}
    config: dict[str, bool | float | str | int] = {}  # every hyperparameter in force
    created_at: float  # Unix time, seconds
    arms: list[Arm]
    theta_hat: dict[str, list[float]] = {}  # "shared", or one per arm id (covariates)
    decisions: int
    rewards: int
    duplicates: int
    # Fixed at creation (defaults: as a service before them answers)
    default_reward: float | None = None
    log_max_entries: int = 0
    log_max_age_seconds: int = 0
    log_all_contexts: bool = False
    propensities: bool = True  # False: decisions carry no propensity (None)


class NewKey(_Answer):
    """``POST /experiments/{id}/keys``: the experiment's new API key, shown only this once
    (the key before it stays valid until revoked)."""

    api_key: str


class Revoked(_Answer):
    """``DELETE /experiments/{id}/keys/previous``: False when no previous key was valid."""

    revoked: bool


class CreatedExperiment(_Answer):
    """``POST /experiments``: the experiment and its API key, shown only this once."""

    api_key: str
    experiment: Experiment


class ExperimentPage(_Answer):
    """One page of ``GET /experiments``; ``next_after`` is None on the last page."""

    experiments: list[Experiment]
    next_after: str | None = None


class Decision(_Answer):
    """``POST /choose``: the chosen arm; send ``decision_id`` back with the reward."""

    decision_id: str
    arm_id: str
    index: float | None = None  # the chosen arm's score; None while exploring
    exploring: bool = False  # the arm's first, forced pull
    decision_number: int
    expires_in_seconds: int  # the reward must arrive within this time
    propensity: float | None = None  # P(the policy chose this arm); None from older services


class Slot(_Answer):
    """One position of a ranking; send its ``decision_id`` back with its reward."""

    slot: int  # the position, 1 the first
    decision_id: str
    arm_id: str
    index: float | None = None  # the arm's score; None while exploring
    exploring: bool = False  # the arm's first, forced pull
    propensity: float | None = None  # P(the policy placed this arm at this position)


class Ranking(_Answer):
    """``POST /rank``: k distinct arms in order, best first, each slot rewarded on its own."""

    decision_id: str
    decision_number: int
    expires_in_seconds: int  # each slot's reward must arrive within this time
    slots: list[Slot]

    @property
    def arm_ids(self) -> list[str]:
        """The arms, in order."""
        return [slot.arm_id for slot in self.slots]


class RewardResult(_Answer):
    """What the service did with one reward.

    ``status`` is ``applied`` (counted now) or ``duplicate`` (the same reward
    was counted before: typically a retry whose first reply was lost); both
    mean the reward counts exactly once, and :attr:`counted` is True. In a
    batch, an item may also be ``conflict`` (a different reward was already
    applied) or ``not_found`` (unknown or expired decision); a single reward
    raises :class:`~linreboot.client.RewardConflict` or
    :class:`~linreboot.client.DecisionNotFound` instead.
    """

    decision_id: str
    status: str
    message: str = ""

    @property
    def counted(self) -> bool:
        """The reward is in the statistics, exactly once (``applied`` or ``duplicate``)."""
        return self.status in COUNTED


class ServiceStatus(_Answer):
    """``/healthz`` (``ok``) and ``/readyz`` (``ready``)."""

    status: str
