"""Wire models: what clients send and receive, validated by pydantic v2.

Requests are strict (no booleans or strings where numbers belong), finite
(``allow_inf_nan=False``) and closed (unknown fields are errors). Limits that
come from :class:`service.settings.Settings` (dimensions, counts, the feature
bound) are applied by each request's ``to_domain(settings)``, which builds the
:mod:`service.domain` record the service takes; it reports problems as a
``RequestValidationError`` so that every 422 has the same shape.
Whether vectors have the experiment's dimension is the service's check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Self

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from policies import HYPERPARAMETERS, RANGES
from service import shards
from service.domain import (
    ARM_ID_PATTERN,
    EXPERIMENT_ID_PATTERN,
    MAX_RANKED,
    ArmSpec,
    ArmState,
    ChooseRequest,
    Decision,
    ExperimentSpec,
    ExperimentView,
    LogEntry,
    LogEntryType,
    PolicyName,
    RankedDecision,
    RewardOutcome,
    RewardStatus,
    Setting,
)
from service.settings import Settings

DECISION_ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
# What a reward names: a decision, or a ranking's slot ("<decision id>#<slot>",
# service.keys.slot_id).
REWARDED_ID_PATTERN = DECISION_ID_PATTERN[:-1] + r"(?:#[1-9][0-9]?)?$"
MAX_SLOTS = MAX_RANKED
MAX_SEED = 2**63 - 1
MAX_STALE_REWARDS = 1_000_000
MAX_LOG_ENTRIES = 1_000_000_000
MAX_LOG_AGE_SECONDS = 366 * 24 * 3600
MAX_SHARDS = shards.MAX_SHARDS
def _at_most(bound: int) -> str:
    """A pattern (no look-ahead: pydantic's engine has none) of the whole numbers from 0
    to ``bound``, leading zeros allowed up to ``bound``'s number of digits."""
    digits = str(bound)
    shorter = f"[0-9]{{1,{len(digits) - 1}}}"
    same = []
    for i, digit in enumerate(map(int, digits)):
        rest = len(digits) - i - 1
        if digit:
            same.append(digits[:i] + (f"[0-{digit - 1}]" if digit > 1 else "0")
                        + (f"[0-9]{{{rest}}}" if rest else ""))
    return "(?:" + "|".join([shorter, *same, digits]) + ")"


# A Redis stream entry id: two unsigned 64-bit integers, "<ms>-<seq>".
_U64 = _at_most(2**64 - 1)
_ENTRY_ID = rf"{_U64}-{_U64}"
# An entry id, or a sharded experiment's cursor: one per shard, joined by "~".
LOG_CURSOR_PATTERN = rf"^{_ENTRY_ID}(?:~{_ENTRY_ID}){{0,{shards.MAX_SHARDS - 1}}}$"

ExperimentId = Annotated[
    str,
    StringConstraints(pattern=EXPERIMENT_ID_PATTERN),
    Field(description="1-64 characters of A-Z a-z 0-9 _ . -, not . or ..", examples=["homepage"]),
]
ArmId = Annotated[
    str,
    StringConstraints(pattern=ARM_ID_PATTERN),
    Field(description="1-64 characters of A-Z a-z 0-9 _ . : -", examples=["article-17"]),
]
DecisionId = Annotated[
    str,
    StringConstraints(pattern=DECISION_ID_PATTERN),
    Field(description="as returned by /choose", examples=["3f1c9a0e8b7d4c2a9e6f5b4a3c2d1e0f"]),
]
RewardedId = Annotated[
    str,
    StringConstraints(pattern=REWARDED_ID_PATTERN),
    Field(description="a decision_id as /choose or /rank (each slot's) returned it",
          examples=["3f1c9a0e8b7d4c2a9e6f5b4a3c2d1e0f", "77b0d2c4#2"]),
]
# Constraints whose values are settings carry the setting's name under this key
# ("-name" for its negative); app.openapi publishes the running values.
SETTINGS_LIMITS = "x-settings-limits"


def _limits(**settings: str) -> dict[str, Any]:
    return {SETTINGS_LIMITS: settings}


Feature = Annotated[
    float, Field(json_schema_extra=_limits(minimum="-feature_bound", maximum="feature_bound"))
]
Vector = Annotated[
    list[Feature],
    Field(description="finite numbers, |x| <= feature bound",
          json_schema_extra=_limits(maxItems="max_dim")),
]


def _keys_are_arm_ids(schema: dict[str, Any]) -> None:
    """A dict keyed by arm ids: pydantic publishes the key pattern as patternProperties,
    which leaves other keys allowed; say that every key must match it."""
    ((pattern, values),) = schema.pop("patternProperties").items()
    schema["propertyNames"] = {**schema.get("propertyNames", {}), "pattern": pattern}
    schema["additionalProperties"] = values
    schema.update(_limits(maxProperties="max_arms"))


ArmContexts = Annotated[dict[ArmId, Vector], Field(json_schema_extra=_keys_are_arm_ids)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


def request_models() -> list[type[BaseModel]]:
    """Every request model: what a client's body is validated against."""
    found: list[type[BaseModel]] = []
    pending: list[type[BaseModel]] = [_Request]
    while pending:
        for sub in pending.pop().__subclasses__():
            found.append(sub)
            pending.append(sub)
    return found


class _Problems:
    """Collects limit violations as pydantic-style errors, raised together."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.errors: list[dict[str, Any]] = []

    def add(self, loc: tuple[str | int, ...], msg: str) -> None:
        self.errors.append({"type": "limit", "loc": ("body", *loc), "msg": msg})

    def count(self, loc: tuple[str | int, ...], items: Sequence[object], limit: int) -> None:
        if len(items) > limit:
            self.add(loc, f"at most {limit} items allowed")

    def vector(self, loc: tuple[str | int, ...], values: Sequence[float] | None) -> None:
        if values is None:
            return
        self.count(loc, values, self.settings.max_dim)
        bound = self.settings.feature_bound
        beyond = next((i for i, v in enumerate(values) if abs(v) > bound), None)
        if beyond is not None:
            self.add((*loc, beyond), f"magnitude exceeds the feature bound {bound:g}")

    def number(self, loc: tuple[str | int, ...], value: float) -> None:
        if abs(value) > self.settings.feature_bound:
            self.add(loc, f"magnitude exceeds the bound {self.settings.feature_bound:g}")

    def check(self) -> None:
        if self.errors:
            raise RequestValidationError(self.errors)


def _unique(ids: Sequence[str], field: str) -> None:
    first: dict[str, int] = {}
    for i, arm_id in enumerate(ids):
        if arm_id in first:
            raise ValueError(f"{field} must be distinct: item {i} repeats item {first[arm_id]}")
        first[arm_id] = i


# -- requests -----------------------------------------------------------------


class ArmIn(_Request):
    id: ArmId
    features: Vector | None = Field(
        default=None, description="the arm's fixed feature vector (stochastic setting only)"
    )

    def to_domain(self, problems: _Problems, loc: tuple[str | int, ...]) -> ArmSpec:
        problems.vector((*loc, "features"), self.features)
        return ArmSpec(self.id, tuple(self.features) if self.features is not None else None)


ArmsIn = Annotated[
    list[ArmIn], Field(min_length=1, json_schema_extra=_limits(maxItems="max_arms"))
]
ArmIds = Annotated[list[ArmId], Field(json_schema_extra=_limits(maxItems="max_arms"))]


def _arms_to_domain(arms: Sequence[ArmIn], problems: _Problems) -> tuple[ArmSpec, ...]:
    problems.count(("arms",), arms, problems.settings.max_arms)
    return tuple(arm.to_domain(problems, ("arms", i)) for i, arm in enumerate(arms))


def _policies_taking(name: str) -> str:
    return ", ".join(p for p, names in HYPERPARAMETERS.items() if name in names)


def _hyperparameter(name: str) -> Any:
    """An optional float field with the range and meaning of ``policies.RANGES``."""
    bounds = RANGES[name]
    return Field(
        default=None, ge=bounds.low, le=bounds.high,
        description=f"{bounds.meaning} ({_policies_taking(name)})",
    )


class Hyperparameters(_Request):
    """Overrides of the paper's defaults; omit to keep them (LinReBoot's spread
    excepted: the service's default is ``pooled``; and no policy takes the
    paper's first pass unless ``first_pass`` is true).

    Each policy takes only its own (``policies.HYPERPARAMETERS``); another
    policy's is refused at creation.
    """

    reg: float | None = _hyperparameter("reg")
    sigma_omega: float | None = _hyperparameter("sigma_omega")
    residuals: Literal["current", "observed"] | None = Field(
        default=None, description="LinReBoot residuals against the current or the observed "
        f"contexts ({_policies_taking('residuals')})",
    )
    spread: Literal["paper", "pooled"] | None = Field(
        default=None, description="LinReBoot bootstrap spread: paper (Section 3.3, sigma_omega "
        "tuned per setting, none for an arm never pulled) or pooled (every arm keeps a spread; "
        "the default) "
        f"({_policies_taking('spread')})",
    )
    first_pass: bool | None = Field(
        default=None, description="true: every arm is pulled once, in random order, before "
        "any competes (the paper's first K rounds); false (the default): an arm never pulled "
        f"competes with its prior score ({_policies_taking('first_pass')})",
    )
    ig_alpha: float | None = _hyperparameter("ig_alpha")
    ig_beta: float | None = _hyperparameter("ig_beta")
    ig_prior_precision: float | None = _hyperparameter("ig_prior_precision")
    phe_a: float | None = _hyperparameter("phe_a")
    giro_a: float | None = _hyperparameter("giro_a")
    reward_bound: float | None = _hyperparameter("reward_bound")
    ucb_delta: float | None = _hyperparameter("ucb_delta")
    noise_sd: float | None = _hyperparameter("noise_sd")
    theta_bound: float | None = _hyperparameter("theta_bound")
    context_bound: float | None = _hyperparameter("context_bound")
    ucb_alpha: float | None = _hyperparameter("ucb_alpha")
    discount: float | None = _hyperparameter("discount")
    epsilon: float | None = _hyperparameter("epsilon")

    def overrides(self) -> dict[str, bool | float | str]:
        return self.model_dump(exclude_none=True)


class CreateExperimentIn(_Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "homepage",
                    "setting": "covariates",
                    "dim": 3,
                    "arms": [{"id": "news"}, {"id": "sport"}, {"id": "weather"}],
                    "policy": "linreboot",
                    "hyperparameters": {"sigma_omega": 0.5},
                    "seed": 7,
                    "reward_window_seconds": 3600,
                }
            ]
        }
    )

    id: ExperimentId
    setting: Setting = Field(
        description="stochastic: fixed arm features; contextual: one context per arm per "
        "decision; covariates: one context per decision, one model per arm"
    )
    dim: int = Field(ge=1, description="context dimension d (at most max_dim)",
                     json_schema_extra=_limits(maximum="max_dim"))
    arms: ArmsIn
    policy: PolicyName = "linreboot"
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    reward_window_seconds: (
        Annotated[int, Field(ge=1, json_schema_extra=_limits(maximum="max_reward_window_seconds"))]
        | None
    ) = Field(default=None, description="how long a decision accepts its reward (default 3600)")
    max_stale_rewards: int = Field(
        default=0, ge=0, le=MAX_STALE_REWARDS,
        description="how many of the latest outcomes (rewards and default rewards applied) "
        "a decision may not yet reflect: 0 (the default) makes every decision reflect every "
        "reward acknowledged and default applied before its request arrived; more lets a "
        "worker keep its copy of the statistics longer (faster under heavy reward traffic)",
    )
    default_reward: Feature | None = Field(
        default=None, description="applied once to every decision whose reward window ends "
        "without a reward (counted as defaulted); a reward after the window is then late. "
        "Omit to let such decisions expire uncounted",
    )
    log_max_entries: int | None = Field(
        default=None, ge=0, le=MAX_LOG_ENTRIES,
        description="the decision log keeps at most about this many entries (decisions and "
        "outcomes), dropping the oldest; 0: no log (default LINREBOOT_DEFAULT_LOG_MAX_ENTRIES)",
    )
    log_max_age_seconds: int | None = Field(
        default=None, ge=1, le=MAX_LOG_AGE_SECONDS,
        description="the decision log drops entries older than this "
        "(default LINREBOOT_DEFAULT_LOG_MAX_AGE_SECONDS)",
    )
    log_all_contexts: bool = Field(
        default=False, description="contextual setting: log every eligible arm's context "
        "with each decision (8 d bytes per arm), not only the chosen arm's, so that "
        "`linreboot evaluate` can evaluate the experiment; needs a decision log",
    )
    propensities: bool = Field(
        default=True, description="compute, return and log each decision's propensity; "
        "false for the paper's baselines whose propensity takes milliseconds (LinTS-G, "
        "LinTS-IG, LinPHE, LinGIRO): decisions then carry null, and their log cannot be "
        "evaluated off-policy",
    )
    shards: int = Field(
        default=1, ge=1, le=MAX_SHARDS,
        description="keep the experiment's statistics as this many partial sums, each on "
        "a hash slot of its own, so that one hot experiment's Redis work spreads over a "
        "Redis Cluster's masters (README, \"On a Redis Cluster\"); 1 (the default) keeps "
        "it on one slot. Not with forgetting (discount) or the authors' variants",
    )
    position_weights: (
        Annotated[list[Annotated[float, Field(gt=0.0, le=1.0)]],
                  Field(min_length=1, max_length=MAX_SLOTS)] | None
    ) = Field(
        default=None, description="/rank: how much a reward at each position counts, "
        "w_1 >= w_2 >= ... in (0, 1] (a slot beyond the list takes the last); a slot j's "
        "reward r is modelled as w_j x'theta and learnt as r / w_j. Default: every slot 1",
    )

    @model_validator(mode="after")
    def _distinct_arms(self) -> Self:
        _unique([a.id for a in self.arms], "arm ids")
        return self

    def to_domain(self, settings: Settings) -> ExperimentSpec:
        problems = _Problems(settings)
        if self.dim > settings.max_dim:
            problems.add(("dim",), f"must be at most {settings.max_dim}")
        arms = _arms_to_domain(self.arms, problems)
        window = self.reward_window_seconds or settings.default_reward_window_seconds
        if window > settings.max_reward_window_seconds:
            problems.add(
                ("reward_window_seconds",), f"must be at most {settings.max_reward_window_seconds}"
            )
        if self.default_reward is not None:
            problems.number(("default_reward",), self.default_reward)
        problems.check()
        return ExperimentSpec(
            id=self.id,
            setting=self.setting,
            dim=self.dim,
            arms=arms,
            policy=self.policy,
            hyperparameters=self.hyperparameters.overrides(),
            seed=self.seed,
            reward_window_seconds=window,
            max_stale_rewards=self.max_stale_rewards,
            default_reward=self.default_reward,
            log_max_entries=(settings.default_log_max_entries if self.log_max_entries is None
                             else self.log_max_entries),
            log_max_age_seconds=self.log_max_age_seconds or settings.default_log_max_age_seconds,
            log_all_contexts=self.log_all_contexts,
            propensities=self.propensities,
            shards=self.shards,
            position_weights=(None if self.position_weights is None
                              else tuple(self.position_weights)),
        )


class AddArmsIn(_Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"arms": [{"id": "travel"}]}]})

    arms: ArmsIn

    @model_validator(mode="after")
    def _distinct_arms(self) -> Self:
        _unique([a.id for a in self.arms], "arm ids")
        return self

    def to_domain(self, settings: Settings) -> tuple[ArmSpec, ...]:
        problems = _Problems(settings)
        arms = _arms_to_domain(self.arms, problems)
        problems.check()
        return arms


# What a live experiment may change (service.experiments.LIVE_SETTINGS).
_PLAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")


class SettingsPatchIn(_Request):
    """Live settings: how decisions are made and kept, never what the statistics mean."""

    model_config = ConfigDict(
        extra="allow",  # refused below, with the names that may change
        json_schema_extra={"examples": [{"epsilon": 0.05, "reward_window_seconds": 600}]},
    )

    epsilon: float | None = Field(default=None, ge=0.0, le=1.0,
                                  description="probability of a uniform eligible arm")
    reward_window_seconds: int | None = Field(
        default=None, ge=1, json_schema_extra=_limits(maximum="max_reward_window_seconds"),
        description="the window of decisions made from now on")
    default_reward: Feature | None = Field(
        default=None, description="the default of decisions settled from now on (an "
        "experiment that has one only)")
    max_stale_rewards: int | None = Field(default=None, ge=0, le=MAX_STALE_REWARDS)
    log_max_entries: int | None = Field(default=None, ge=0, le=MAX_LOG_ENTRIES)
    log_max_age_seconds: int | None = Field(default=None, ge=1, le=MAX_LOG_AGE_SECONDS)

    @model_validator(mode="after")
    def _live_settings_only(self) -> Self:
        others = sorted(self.model_extra or {})
        if others:
            named = ", ".join(o if _PLAIN_NAME.fullmatch(o) else "<key>" for o in others)
            live = ", ".join(type(self).model_fields)
            raise ValueError(f"{named}: not a live setting; only {live} change on a live "
                             "experiment (the others would change what its statistics mean)")
        if not self.model_dump(exclude_none=True):
            raise ValueError(f"give one of {', '.join(type(self).model_fields)} at least")
        return self

    def to_domain(self, settings: Settings) -> dict[str, object]:
        changes = self.model_dump(exclude_none=True)
        problems = _Problems(settings)
        if "default_reward" in changes:
            problems.number(("default_reward",), changes["default_reward"])
        problems.check()
        return changes


class RetireArmsIn(_Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"arm_ids": ["weather"]}]})

    arm_ids: ArmIds = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct_arms(self) -> Self:
        _unique(self.arm_ids, "arm_ids")
        return self

    def to_domain(self, settings: Settings) -> tuple[str, ...]:
        problems = _Problems(settings)
        problems.count(("arm_ids",), self.arm_ids, settings.max_arms)
        problems.check()
        return tuple(self.arm_ids)


class ChooseIn(_Request):
    """One decision. Which context field to send depends on the experiment's setting."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"experiment_id": "homepage", "context": [0.2, -1.0, 0.5]},
                {
                    "experiment_id": "shelf",
                    "arm_contexts": {"a": [1.0, 0.0], "b": [0.0, 1.0]},
                    "excluded": ["b"],
                },
            ]
        }
    )

    experiment_id: ExperimentId
    context: Vector | None = Field(default=None, description="covariates setting: d numbers")
    arm_contexts: ArmContexts | None = Field(
        default=None, description="contextual setting: d numbers for every eligible arm"
    )
    eligible: ArmIds | None = Field(
        default=None, description="choose among these active arms only"
    )
    excluded: ArmIds = Field(default_factory=list, description="never choose these arms")
    decision_id: DecisionId | None = Field(
        default=None, description="an id of the caller's choosing (1-128 of A-Z a-z 0-9 _ . : "
        "-): the request is then idempotent, the same request again under it gets the same "
        "decision, recorded once (within its reward window); another request under it is a 409")

    @model_validator(mode="after")
    def _distinct_arms(self) -> Self:
        _unique(self.eligible or [], "eligible")
        _unique(self.excluded, "excluded")
        return self

    def to_domain(self, settings: Settings) -> ChooseRequest:
        problems = _Problems(settings)
        problems.vector(("context",), self.context)
        contexts = self.arm_contexts or {}
        problems.count(("arm_contexts",), list(contexts), settings.max_arms)
        for arm_id, vector in contexts.items():
            problems.vector(("arm_contexts", arm_id), vector)
        problems.count(("eligible",), self.eligible or [], settings.max_arms)
        problems.count(("excluded",), self.excluded, settings.max_arms)
        problems.check()
        return ChooseRequest(
            context=tuple(self.context) if self.context is not None else None,
            arm_contexts=(
                {k: tuple(v) for k, v in self.arm_contexts.items()}
                if self.arm_contexts is not None
                else None
            ),
            eligible=tuple(self.eligible) if self.eligible is not None else None,
            excluded=tuple(self.excluded),
            decision_id=self.decision_id,
            slots=self.slots(),
        )

    def slots(self) -> int | None:
        """How many arms to place: None for one decision (``/choose``)."""
        return None


class RankIn(ChooseIn):
    """A ranking: ``k`` distinct arms in order, each slot rewarded on its own. The other
    fields as for ``/choose``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"experiment_id": "homepage", "context": [0.2, -1.0, 0.5], "k": 3},
            ]
        }
    )

    k: int = Field(ge=1, le=MAX_SLOTS, description="how many arms to place (at most the "
                   "eligible arms)")

    def slots(self) -> int | None:
        return self.k


class RewardItemIn(_Request):
    decision_id: RewardedId
    reward: Feature


class RewardIn(_Request):
    """One reward (``decision_id`` and ``reward``) or a batch (``rewards``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"experiment_id": "homepage", "decision_id": "3f1c9a0e", "reward": 1.0},
                {
                    "experiment_id": "homepage",
                    "rewards": [
                        {"decision_id": "3f1c9a0e", "reward": 1.0},
                        {"decision_id": "77b0d2c4", "reward": 0.0},
                    ],
                },
            ]
        }
    )

    experiment_id: ExperimentId
    decision_id: RewardedId | None = None
    reward: Feature | None = None
    rewards: (
        Annotated[
            list[RewardItemIn],
            Field(min_length=1, json_schema_extra=_limits(maxItems="max_batch_rewards")),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        single = self.decision_id is not None or self.reward is not None
        if single == (self.rewards is not None):
            raise ValueError("send either decision_id and reward, or rewards (a list)")
        if single and (self.decision_id is None or self.reward is None):
            raise ValueError("a single reward needs both decision_id and reward")
        return self

    @property
    def is_batch(self) -> bool:
        return self.rewards is not None

    def to_domain(self, settings: Settings) -> list[tuple[str, float]]:
        """The ``(decision_id, reward)`` pairs, in order."""
        problems = _Problems(settings)
        if self.rewards is None:
            assert self.decision_id is not None and self.reward is not None  # _one_form
            items = [(self.decision_id, self.reward)]
            problems.number(("reward",), self.reward)
        else:
            items = [(r.decision_id, r.reward) for r in self.rewards]
            problems.count(("rewards",), self.rewards, settings.max_batch_rewards)
            for i, r in enumerate(self.rewards):
                problems.number(("rewards", i, "reward"), r.reward)
        problems.check()
        return items


# -- responses ----------------------------------------------------------------


class ArmOut(BaseModel):
    id: str
    active: bool
    pulls: int
    mean_reward: float | None = Field(description="null until the arm has a reward")
    rss: float | None = Field(description="residual sum of squares; null until rewarded")
    features: list[float] | None = None
    weight: float | None = Field(
        default=None, description="with a discount: the sum of the weights of the arm's "
        "outcomes, its effective number of rewards (pulls counts them undiscounted; "
        "mean_reward and rss are discounted); null without a discount",
    )

    @classmethod
    def from_domain(cls, arm: ArmState) -> ArmOut:
        features = list(arm.features) if arm.features is not None else None
        return cls(
            id=arm.id,
            active=arm.active,
            pulls=arm.pulls,
            mean_reward=arm.mean_reward,
            rss=arm.rss,
            features=features,
            weight=arm.weight,
        )


class MinuteOut(BaseModel):
    minute: int = Field(description="the minute's start, Unix time in seconds (Redis's clock)")
    decisions: int = Field(description="decisions made (a ranking's slots each count)")
    rewards: int = Field(description="rewards applied")
    defaulted: int = Field(description="default rewards applied")


class ExperimentOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "homepage",
                    "setting": "covariates",
                    "policy": "linreboot",
                    "dim": 3,
                    "seed": 7,
                    "reward_window_seconds": 3600,
                    "hyperparameters": {"sigma_omega": 0.5},
                    "config": {"name": "linreboot", "reg": 0.1, "sigma_omega": 0.5},
                    "created_at": 1767225600.0,
                    "arms": [
                        {"id": "news", "active": True, "pulls": 12, "mean_reward": 0.41,
                         "rss": 2.9, "features": None},
                    ],
                    "theta_hat": {"news": [0.1, 0.0, -0.3]},
                    "decisions": 30,
                    "rewards": 25,
                    "duplicates": 1,
                    "default_reward": 0.0,
                    "defaulted": 3,
                    "late": 1,
                    "defaults_missed": 0,
                    "log_max_entries": 100000,
                    "log_max_age_seconds": 604800,
                    "recent": [{"minute": 1767225540, "decisions": 12, "rewards": 9,
                                "defaulted": 1},
                               {"minute": 1767225600, "decisions": 4, "rewards": 3,
                                "defaulted": 0}],
                }
            ]
        }
    )

    id: str
    setting: Setting
    policy: PolicyName
    dim: int
    seed: int | None
    reward_window_seconds: int
    max_stale_rewards: int
    hyperparameters: dict[str, bool | float | str] = Field(
        description="the overrides given at creation, with the service's LinReBoot spread "
        "where none was given")
    config: dict[str, bool | float | str | int] = Field(description="every hyperparameter in force")
    created_at: float = Field(description="Unix time, seconds")
    arms: list[ArmOut]
    theta_hat: dict[str, list[float]] = Field(
        description='ridge estimate: "shared", or one per arm id (covariates)'
    )
    decisions: int = Field(description="decisions made")
    rewards: int = Field(description="rewards applied")
    duplicates: int = Field(description="repeated rewards recognised and not applied again")
    default_reward: float | None = Field(
        default=None, description="applied to decisions whose window ends without a reward")
    defaulted: int = Field(default=0, description="decisions that got the default reward")
    late: int = Field(
        default=0, description="rewards that arrived after their decision's window (with a "
        "default reward), not applied")
    defaults_missed: int = Field(
        default=0, description="decisions that expired before their default could be applied "
        "(the service was stopped for longer than LINREBOOT_DEFAULT_REWARD_GRACE_SECONDS), or "
        "whose stored record was damaged")
    log_max_entries: int = Field(default=0, description="decision log bound; 0: no log")
    log_max_age_seconds: int = Field(default=0, description="decision log age bound")
    log_all_contexts: bool = Field(
        default=False, description="every eligible arm's context is logged with a decision")
    propensities: bool = Field(
        default=True, description="decisions carry and log their propensity")
    shards: int = Field(default=1, description="hash slots its statistics are spread over")
    position_weights: list[float] | None = Field(
        default=None, description="/rank: how much a reward at each position counts")
    previous_key_valid: bool = Field(
        default=False, description="the key before the last rotation is still accepted "
        "(until DELETE /experiments/{id}/keys/previous)")
    recent: list[MinuteOut] = Field(
        default_factory=list, description="the last hour minute by minute (the current "
        "minute so far last), only the minutes with activity")

    @classmethod
    def from_domain(cls, view: ExperimentView) -> ExperimentOut:
        spec = view.spec
        return cls(
            id=spec.id,
            setting=spec.setting,
            policy=spec.policy,
            dim=spec.dim,
            seed=spec.seed,
            reward_window_seconds=spec.reward_window_seconds,
            max_stale_rewards=spec.max_stale_rewards,
            hyperparameters=dict(spec.hyperparameters),
            config=dict(view.config),
            created_at=view.created_at,
            arms=[ArmOut.from_domain(a) for a in view.arms],
            theta_hat=view.theta_hat,
            decisions=view.decisions,
            rewards=view.rewards,
            duplicates=view.duplicates,
            default_reward=spec.default_reward,
            defaulted=view.defaulted,
            late=view.late,
            defaults_missed=view.defaults_missed,
            log_max_entries=spec.log_max_entries,
            log_max_age_seconds=spec.log_max_age_seconds,
            log_all_contexts=spec.log_all_contexts,
            propensities=spec.propensities,
            shards=spec.shards,
            position_weights=(None if spec.position_weights is None
                              else list(spec.position_weights)),
            previous_key_valid=view.previous_key_valid,
            recent=[MinuteOut(minute=m.start, decisions=m.decisions, rewards=m.rewards,
                              defaulted=m.defaulted) for m in view.recent],
        )


class ExperimentCreatedOut(BaseModel):
    api_key: str = Field(
        description="the experiment's key for X-API-Key; shown only now, store it",
        examples=["3q2-8xVd0cP1m4mJm0U7g6q9t4nEw6bB1oG3H0cZr4E"],
    )
    experiment: ExperimentOut


class KeyOut(BaseModel):
    api_key: str = Field(
        description="the experiment's new key for X-API-Key; shown only now, store it (the "
        "key before it stays valid until DELETE /experiments/{id}/keys/previous)",
        examples=["Vq2-8xVd0cP1m4mJm0U7g6q9t4nEw6bB1oG3H0cZr4E"],
    )


class RevokedOut(BaseModel):
    revoked: bool = Field(description="false when no previous key was valid")


class ExperimentListOut(BaseModel):
    experiments: list[ExperimentOut] = Field(description="in id order")
    next_after: str | None = Field(
        description="pass as ?after= for the next page; null on the last page"
    )


class DecisionOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "decision_id": "3f1c9a0e8b7d4c2a9e6f5b4a3c2d1e0f",
                    "arm_id": "news",
                    "index": 0.73,
                    "exploring": False,
                    "decision_number": 30,
                    "expires_in_seconds": 3600,
                    "propensity": 0.61,
                }
            ]
        }
    )

    decision_id: str = Field(description="send it back with the reward")
    arm_id: str
    index: float | None = Field(description="the chosen arm's score; null while exploring")
    exploring: bool = Field(description="true while the arm is in its first, forced pull")
    decision_number: int
    expires_in_seconds: int = Field(description="the reward must arrive within this time")
    propensity: float | None = Field(
        ge=0.0, le=1.0, description="the probability that the policy chose this arm, given "
        "the statistics it used (logged; Open Bandit Pipeline's pscore); null when the "
        "experiment was created with propensities false",
    )

    @staticmethod
    def fields_of(decision: Decision) -> dict[str, Any]:
        """The response's fields, as :class:`app.direct_route.Trusted` serialises them."""
        return {
            "decision_id": decision.decision_id,
            "arm_id": decision.arm_id,
            "index": decision.index,
            "exploring": decision.exploring,
            "decision_number": decision.decision_number,
            "expires_in_seconds": decision.expires_in_seconds,
            "propensity": decision.propensity,
        }


class SlotOut(BaseModel):
    slot: int = Field(description="the position, 1 the first")
    decision_id: str = Field(description="send it back with this slot's reward")
    arm_id: str
    index: float | None = Field(description="the arm's score; null while exploring")
    exploring: bool = Field(description="true while the arm is in its first, forced pull")
    propensity: float | None = Field(
        ge=0.0, le=1.0, description="the probability that the policy placed this arm at this "
        "position, given the statistics it used (logged; Open Bandit Pipeline's "
        "pscore_item_position); null when the experiment was created with propensities false",
    )


class RankingOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "decision_id": "77b0d2c4",
                    "decision_number": 31,
                    "expires_in_seconds": 3600,
                    "slots": [
                        {"slot": 1, "decision_id": "77b0d2c4#1", "arm_id": "news",
                         "index": 0.73, "exploring": False, "propensity": 0.61},
                        {"slot": 2, "decision_id": "77b0d2c4#2", "arm_id": "sport",
                         "index": 0.52, "exploring": False, "propensity": 0.44},
                    ],
                }
            ]
        }
    )

    decision_id: str = Field(description="the ranking's id; each slot has its own to reward")
    decision_number: int
    expires_in_seconds: int = Field(description="each slot's reward must arrive within this "
                                    "time")
    slots: list[SlotOut]

    @staticmethod
    def fields_of(ranking: RankedDecision) -> dict[str, Any]:
        """The response's fields, as :class:`app.direct_route.Trusted` serialises them."""
        return {
            "decision_id": ranking.decision_id,
            "decision_number": ranking.decision_number,
            "expires_in_seconds": ranking.expires_in_seconds,
            "slots": [{"slot": j, "decision_id": slot_id, "arm_id": arm_id, "index": index,
                       "exploring": index is None, "propensity": propensity}
                      for j, (slot_id, arm_id, index, propensity) in enumerate(zip(
                          ranking.slot_ids(), ranking.arm_ids, ranking.indices,
                          ranking.propensities, strict=True), 1)],
        }


class RewardOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"decision_id": "3f1c9a0e", "status": "applied", "message": "reward applied"},
                {
                    "decision_id": "3f1c9a0e",
                    "status": "duplicate",
                    "message": "this reward was already applied; not applied again",
                },
            ]
        }
    )

    decision_id: str
    status: RewardStatus = Field(
        description="applied; duplicate (same reward again: safe retry, not applied again); "
        "conflict (a different reward was applied); late (the window has ended and the "
        "default reward counts instead; not applied); not_found (unknown or expired)"
    )
    message: str

    @staticmethod
    def fields_of(outcome: RewardOutcome) -> dict[str, Any]:
        """The response's fields, as :class:`app.direct_route.Trusted` serialises them."""
        return {"decision_id": outcome.decision_id, "status": outcome.status,
                "message": outcome.message}


class RewardBatchOut(BaseModel):
    results: list[RewardOut] = Field(description="one per item, in request order")

    @staticmethod
    def fields_of(outcomes: Sequence[RewardOutcome]) -> dict[str, Any]:
        """The response's fields, as :class:`app.direct_route.Trusted` serialises them."""
        return {"results": [RewardOut.fields_of(outcome) for outcome in outcomes]}


class LogEntryOut(BaseModel):
    """A decision (``number`` to ``rewards_seen``) or an outcome (``reward``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"entry_id": "1767225600123-0", "time": 1767225600.123, "type": "decision",
                 "decision_id": "3f1c9a0e8b7d4c2a9e6f5b4a3c2d1e0f", "number": 30,
                 "arm_id": "news", "context": [0.2, -1.0, 0.5],
                 "eligible": ["news", "sport", "weather"], "propensity": 0.61,
                 "version": 4503599627370497, "rewards_seen": 25},
                {"entry_id": "1767225601456-0", "time": 1767225601.456, "type": "reward",
                 "decision_id": "3f1c9a0e8b7d4c2a9e6f5b4a3c2d1e0f", "reward": 1.0},
            ]
        }
    )

    entry_id: str = Field(description="pass as ?after= to read on from this entry")
    time: float = Field(description="Unix time, seconds (the store's clock, to the ms)")
    type: LogEntryType = Field(
        description="decision; reward (applied); default (the default reward applied); late "
        "(a reward after the window, not applied); settings (live settings changed: "
        "changes, and an empty decision_id)")
    decision_id: str
    number: int | None = Field(default=None, description="the decision number")
    arm_id: str | None = Field(default=None, description="the arm chosen")
    context: list[float] | None = Field(default=None, description="the chosen arm's context")
    eligible: list[str] | None = Field(default=None, description="the arms it was chosen from")
    contexts: list[list[float]] | None = Field(
        default=None, description="their contexts, in that order (an experiment with "
        "log_all_contexts); else null")
    propensity: float | None = Field(
        default=None, description="probability of choosing this arm (a ranking's slot: of "
        "placing it at this position); null if not recorded")
    position: int | None = Field(
        default=None, description="a ranking's slot (1 the first; its decision_id ends "
        "#<position>); null for a decision of /choose")
    version: int | None = Field(default=None, description="definition version it was made at")
    rewards_seen: int | None = Field(
        default=None, description="the outcomes of the statistics it was made from (rewards "
        "and default rewards applied)")
    reward: float | None = Field(default=None, description="an outcome's reward")
    changes: dict[str, Any] | None = Field(
        default=None, description="a settings entry: the settings PATCH changed, new values")

    @classmethod
    def from_domain(cls, entry: LogEntry) -> LogEntryOut:
        return cls(
            entry_id=entry.entry_id, time=entry.time, type=entry.type,
            decision_id=entry.decision_id, number=entry.number, arm_id=entry.arm_id,
            context=None if entry.context is None else list(entry.context),
            eligible=None if entry.eligible is None else list(entry.eligible),
            contexts=None if entry.contexts is None else [list(c) for c in entry.contexts],
            propensity=entry.propensity, position=entry.position, version=entry.version,
            rewards_seen=entry.rewards_seen, reward=entry.reward, changes=entry.changes,
        )


class LogPageOut(BaseModel):
    entries: list[LogEntryOut] = Field(description="oldest first: the order things happened")
    next_after: str | None = Field(
        description="pass as ?after= for the next page; null when this page is the last "
        "(to follow the log, pass the last entry's entry_id)")


class StatusOut(BaseModel):
    status: Literal["ok", "ready"]


class ErrorDetail(BaseModel):
    loc: list[str | int] = Field(description="where: body, path or header, then field names")
    msg: str
    type: str


class ErrorOut(BaseModel):
    """Every error response. Never echoes the offending input."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {  # what /choose answers to "context": ["0.2", -1.0, 0.5] (a test sends it)
                    "error": "invalid_input",
                    "message": "invalid request: body.context.0: Input should be a valid number",
                    "details": [
                        {"loc": ["body", "context", 0], "msg": "Input should be a valid number",
                         "type": "float_type"}
                    ],
                }
            ]
        }
    )

    error: str = Field(description="a stable machine-readable code")
    message: str = Field(description="what is wrong, for people")
    details: list[ErrorDetail] | None = None
