"""Policy names, settings and validated hyperparameters.

The paper's defaults live here, per setting and dimension (appendix
"Supplement to Experiments"), so the simulator and the service agree on them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, get_args

Setting = Literal["stochastic", "contextual", "covariates"]
PolicyName = Literal[
    "linreboot", "lints-g", "lints-ig", "linphe", "lingiro", "linucb", "linucb-const", "greedy"
]
Residuals = Literal["current", "observed"]
# How LinReBoot sizes each arm's bootstrap spread. "paper": Section 3.3,
# ``sigma_omega sqrt(RSS_k) / s_k`` (the paper's algorithm, with its tuned
# sigma_omega; none for an arm never pulled). "pooled": a pseudo-residual of the
# variance pooled over the arms, and a cap from the model's own uncertainty
# (policies.indices.pooled_scale), with sigma_omega per setting (POOLED_SIGMA_OMEGA).
Spread = Literal["paper", "pooled"]
# "project": the textbook form of each baseline (the default, and the only one
# the service offers); "authors": as the paper's authors' experiment code runs
# it (policies.authors), for reproducing their published figures.
Variant = Literal["project", "authors"]

SETTINGS: tuple[Setting, ...] = get_args(Setting)
POLICIES: tuple[PolicyName, ...] = get_args(PolicyName)
PAPER_POLICIES: tuple[PolicyName, ...] = (
    "linreboot", "lints-g", "lints-ig", "lingiro", "linphe", "linucb",
)
# PolicyConfig fields the service never takes (not hyperparameters on the wire).
SIMULATION_ONLY: tuple[str, ...] = ("variant",)
# PolicyConfig fields that are not numbers (RANGES checks the numbers).
CHOICES: dict[str, tuple[str, ...]] = {
    "residuals": get_args(Residuals),
    "spread": get_args(Spread),
    "first_pass": ("true", "false"),
}
# The policies whose authors' variant differs from ours (policies.authors).
AUTHORS_VARIANTS: tuple[PolicyName, ...] = (
    "linreboot", "lints-g", "lints-ig", "lingiro", "linphe", "linucb")

# Paper's tuned sigma_omega (appendix, "LinReBoot in ..." subsections).
_PAPER_SIGMA_OMEGA: dict[Setting, dict[int, float]] = {
    "stochastic": {5: 0.3, 10: 0.4, 20: 0.5},
    "contextual": {5: 0.05, 10: 0.05, 20: 0.05},
    "covariates": {5: 1.0, 10: 1.0, 20: 0.5},
}
# sigma_omega of spread="pooled" (docs/DEFAULT.md, RESULTS.md "Choosing the
# default"): the model's own posterior width (1) where the arms' features are
# fixed, so that nothing but the draws explores, and half of it (0.5) where each
# request brings new contexts, which explore for free.
POOLED_SIGMA_OMEGA: dict[Setting, float] = {
    "stochastic": 1.0, "contextual": 0.5, "covariates": 0.5,
}
_FALLBACK_SIGMA_OMEGA: dict[Setting, float] = {
    "stochastic": 0.5, "contextual": 0.05, "covariates": 1.0,
}
# Reward bounds used by LinPHE and LinGIRO ("Other Linear Bandit Algorithms").
_REWARD_BOUND: dict[Setting, float] = {
    "stochastic": 1.0 + 3.0 / math.sqrt(10.0),
    "contextual": 1.0 + 3.0 / math.sqrt(2.0),
    "covariates": 1.3,
}
# Noise standard deviation of the paper's environments (authors' reading),
# used by LinUCB's confidence radius.
_NOISE_SD: dict[Setting, float] = {
    "stochastic": math.sqrt(0.1),
    "contextual": math.sqrt(0.5),
    "covariates": 0.1,
}
# The environments' reading of the appendix (loadtest.environments): "literal"
# changes the covariates world only where these constants are concerned (the
# contextual contexts lose their rescaling but keep a norm near 1): raw
# contexts x ~ N(0, I_d) and noise variance 0.1.
Reading = Literal["authors", "literal"]


def _literal_covariates(dim: int) -> dict[str, float]:
    """LinUCB's R and L and LinPHE/LinGIRO's U for the literal covariates world.

    Noise sd sqrt(0.1) (a variance, as the text says). ``||x||`` of a raw
    ``N(0, I_d)`` context is about ``sqrt(d)``, and beyond ``sqrt(d) + 3`` for
    about one context in a hundred (chi tail), so ``L = sqrt(d) + 3``. The mean
    reward ``x' theta_k`` is ``N(0, ||theta_k||^2)`` with ``||theta_k|| <= 1``,
    so the authors' rule for U (a bound on the mean plus three noise sd: 1.3 =
    1 + 3 x 0.1 in their reading) gives ``U = 3 + 3 sqrt(0.1)``.
    """
    sd = math.sqrt(0.1)
    return {"noise_sd": sd, "context_bound": math.sqrt(dim) + 3.0,
            "reward_bound": 3.0 + 3.0 * sd}


@dataclass(frozen=True)
class Range:
    """The closed interval a hyperparameter must lie in, and what it means."""

    low: float
    high: float
    meaning: str

    def holds(self, value: float) -> bool:
        return math.isfinite(value) and self.low <= value <= self.high


# Every range keeps each policy's arithmetic finite for features and rewards up
# to 1e6 and d up to 256: e.g. LinGIRO squares reward_bound, LinUCB divides by
# reg inside a logarithm, and LinTS-IG draws a Gamma(ig_alpha + n/2) variate
# that it divides by (below shape 0.5 it can underflow to 0).
RANGES: dict[str, Range] = {
    "reg": Range(1e-6, 1e6, "ridge regularisation lambda"),
    "sigma_omega": Range(0.0, 100.0, "LinReBoot bootstrap-weight standard deviation"),
    "ig_alpha": Range(0.5, 1e6, "LinTS-IG prior shape alpha of sigma^2"),
    "ig_beta": Range(1e-6, 1e6, "LinTS-IG prior rate beta of sigma^2"),
    "ig_prior_precision": Range(1e-6, 1e6, "LinTS-IG prior precision of theta (its ridge)"),
    "phe_a": Range(0.0, 100.0, "LinPHE pseudo-rewards per past round"),
    "giro_a": Range(0.0, 100.0, "LinGIRO pseudo-rounds at each bound per past round"),
    "reward_bound": Range(1e-6, 1e7, "LinPHE/LinGIRO bound U on the absolute reward"),
    "ucb_delta": Range(1e-12, 0.5, "LinUCB confidence level delta"),
    "noise_sd": Range(1e-6, 1e6, "LinUCB noise scale R"),
    "theta_bound": Range(1e-6, 1e6, "LinUCB bound S on the norm of theta"),
    "context_bound": Range(1e-6, 1e7, "LinUCB bound L on the norm of a context"),
    "ucb_alpha": Range(0.0, 1e6, "linucb-const width alpha"),
    "discount": Range(0.5, 1.0, "weight of an outcome per decision of age (1: no forgetting)"),
    "epsilon": Range(0.0, 1.0, "probability of a uniformly random eligible arm instead"),
}

# The hyperparameters each policy reads; ``residuals`` is "current" or "observed".
# Every policy is driven by sums, so every one can forget (``discount``);
# ``epsilon`` is read by policies.draw, so every policy takes it.
# ``first_pass`` (every arm pulled once before any competes) is every policy's choice.
_EVERY_POLICY = ("discount", "epsilon", "first_pass")
HYPERPARAMETERS: dict[PolicyName, tuple[str, ...]] = {
    "linreboot": ("reg", "sigma_omega", "residuals", "spread", *_EVERY_POLICY),
    "greedy": ("reg", "residuals", *_EVERY_POLICY),
    "lints-g": ("reg", *_EVERY_POLICY),
    "lints-ig": ("ig_alpha", "ig_beta", "ig_prior_precision", *_EVERY_POLICY),
    "linphe": ("reg", "phe_a", "reward_bound", *_EVERY_POLICY),
    "lingiro": ("reg", "giro_a", "reward_bound", *_EVERY_POLICY),
    "linucb": ("reg", "ucb_delta", "noise_sd", "theta_bound", "context_bound", *_EVERY_POLICY),
    "linucb-const": ("reg", "ucb_alpha", *_EVERY_POLICY),
}


def check_hyperparameters(name: PolicyName, names: Iterable[str]) -> None:
    """Refuse hyperparameters that ``name`` does not read.

    Raises
    ------
    ValueError
        Naming the policy's own hyperparameters (never echoing the others).
    """
    own = HYPERPARAMETERS[name]
    if any(given not in own for given in names):
        raise ValueError(f"{name} takes only these hyperparameters: {', '.join(own)}")


def parse_hyperparameter(name: PolicyName, key: str, text: str) -> float | str | bool:
    """The value of hyperparameter ``key`` of policy ``name`` written as ``text``
    (a command line's ``--set key=text``): a number, or one of its choices.

    Raises
    ------
    ValueError
        One line naming what is wrong and what is allowed.
    """
    check_hyperparameters(name, [key])
    if key in CHOICES:
        if text not in CHOICES[key]:
            raise ValueError(f"{key} must be one of {', '.join(CHOICES[key])}")
        return text == "true" if key == "first_pass" else text
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{key} must be a number ({RANGES[key].meaning})") from None


def shared_model(setting: Setting) -> bool:
    """True when one theta is shared by all arms (stochastic, contextual)."""
    return setting != "covariates"


@dataclass(frozen=True)
class PolicyConfig:
    """Everything a policy needs besides its state and the contexts.

    Attributes
    ----------
    name : which algorithm.
    setting : stochastic / contextual (one shared theta) or covariates (theta per arm).
    dim : context dimension d.
    reg : ridge regularisation lambda (0.1 in the paper).
    sigma_omega : LinReBoot bootstrap-weight standard deviation (0 gives greedy).
    residuals : LinReBoot residuals against the ``current`` context (Algorithms 2, 3)
        or the context each reward was ``observed`` with.
    spread : LinReBoot's bootstrap spread: ``paper`` (Section 3.3,
        ``sigma_omega sqrt(RSS_k) / s_k``, 0 for an arm never pulled) or
        ``pooled`` (every arm keeps a spread, :func:`policies.indices.pooled_scale`).
    first_pass : pull every eligible arm once, in random order, before any
        competes (the paper's first K rounds, which its experiments give every
        algorithm). Off by default for every policy: an arm never pulled is
        scored from the prior like any other (its ridge estimate from the
        other arms' data with one shared theta, 0 with a model per arm; the
        paper's spread gives it none). The paper's reproduction turns it on;
        the authors' variants always have it (set to true).
    ig_alpha, ig_beta, ig_prior_precision : LinTS-IG normal-inverse-gamma prior.
    phe_a, giro_a : LinPHE / LinGIRO perturbation scale a.
    reward_bound : |reward| bound U used by LinPHE / LinGIRO pseudo-rewards.
    ucb_delta, noise_sd, theta_bound, context_bound : LinUCB radius
        (Abbasi-Yadkori et al. 2011, Theorem 2).
    ucb_alpha : constant width of ``linucb-const``.
    variant : ``project`` (default) or ``authors``, the form the paper's
        authors' experiment code gives LinReBoot, LinTS-G, LinTS-IG, LinPHE, LinGIRO and LinUCB
        (:mod:`policies.authors`). Simulation only: not a service
        hyperparameter (the authors' LinUCB keeps a running maximum, which
        is not a sum the store can add to), and without forgetting.
    discount : gamma, how fast the statistics forget (1: never; see
        :mod:`policies.state`). An outcome of decision number ``n`` weighs
        ``gamma ** (N - n)`` in a decision made from statistics whose latest
        outcome is of decision ``N``.
    epsilon : probability that a decision is uniform among the eligible arms
        instead of the policy's choice (0: never). Not in the paper; it makes
        every arm's propensity at least ``epsilon / K``, which off-policy
        evaluation of a deterministic policy (LinUCB, greedy) needs.
    """

    name: PolicyName
    setting: Setting
    dim: int
    reg: float = 0.1
    sigma_omega: float = 0.5
    residuals: Residuals = "current"
    spread: Spread = "paper"
    ig_alpha: float = 2.0
    ig_beta: float = 2.0
    ig_prior_precision: float = 0.2
    phe_a: float = 0.5
    giro_a: float = 1.0
    reward_bound: float = 1.0 + 3.0 / math.sqrt(10.0)
    ucb_delta: float = 0.05
    noise_sd: float = math.sqrt(0.1)
    theta_bound: float = 1.0
    context_bound: float = 1.0
    ucb_alpha: float = 1.0
    discount: float = 1.0
    epsilon: float = 0.0
    first_pass: bool = False
    variant: Variant = "project"

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r}; choose one of {', '.join(POLICIES)}")
        if self.setting not in SETTINGS:
            raise ValueError(f"unknown setting {self.setting!r}; choose one of {SETTINGS}")
        if self.residuals not in get_args(Residuals):
            raise ValueError("residuals must be 'current' or 'observed'")
        if self.spread not in get_args(Spread):
            raise ValueError("spread must be 'paper' or 'pooled'")
        if self.spread == "pooled" and self.name != "linreboot":
            raise ValueError("only linreboot has a pooled spread")
        if self.variant not in get_args(Variant):
            raise ValueError("variant must be 'project' or 'authors'")
        if self.variant == "authors" and self.name not in AUTHORS_VARIANTS:
            raise ValueError(f"only {', '.join(AUTHORS_VARIANTS)} have an authors' variant")
        if self.variant == "authors" and self.discount < 1.0:
            raise ValueError("the authors' variants do not forget: discount must be 1")
        if self.variant == "authors" and self.epsilon > 0.0:
            raise ValueError("the authors' variants explore as their code does: epsilon must be 0")
        if self.variant == "authors" and self.spread != "paper":
            raise ValueError("the authors' LinReBoot is the paper's: spread must be 'paper'")
        if not isinstance(self.first_pass, bool):
            raise ValueError("first_pass must be true or false")
        if self.variant == "authors":  # their code's start, whatever was asked
            object.__setattr__(self, "first_pass", True)
        if not 1 <= self.dim <= 256:
            raise ValueError("dim must be between 1 and 256")
        for field, bounds in RANGES.items():
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not bounds.holds(
                float(value)
            ):
                raise ValueError(f"{field} must be a number from {bounds.low:g} to {bounds.high:g}")
        if self.variant == "authors" and self.name == "lingiro" and self.giro_a % 1 != 0:
            raise ValueError("the authors' LinGIRO adds whole pairs of pseudo-rows: "
                             "giro_a must be a whole number")

    @property
    def discounted(self) -> bool:
        """The statistics forget (``discount < 1``)."""
        return self.discount < 1.0

    @property
    def forces_pass(self) -> bool:
        """Every arm is pulled once before any competes (``first_pass``), except in
        the authors' LinGIRO with a model per arm, whose loop has no such pass
        (an arm never pulled scores 0 there)."""
        authors_giro_per_arm = (self.variant == "authors" and self.name == "lingiro"
                                and not self.shared)
        return self.first_pass and not authors_giro_per_arm

    @property
    def first_pass_in_order(self) -> bool:
        """The first pass takes the arms in their order, not at random.

        The authors' LinReBoot with a model per arm pulls arm t in round t,
        and which arm comes last matters there: it is the only one whose
        estimate their loop refreshes after the pass (:mod:`policies.authors`).
        """
        return self.variant == "authors" and self.name == "linreboot" and not self.shared

    @property
    def shared(self) -> bool:
        """One theta for all arms (stochastic, contextual) rather than one per arm."""
        return shared_model(self.setting)


def stored_config(fields: dict[str, object]) -> PolicyConfig:
    """A :class:`PolicyConfig` from its stored fields (``dataclasses.asdict``).

    Configs stored before ``first_pass`` was a field had the pass exactly
    when the spread was the paper's (every baseline, and LinReBoot unless
    pooled): an experiment keeps the start it was created with.
    """
    if "first_pass" not in fields:
        fields = {**fields, "first_pass": fields.get("spread", "paper") == "paper"}
    return PolicyConfig(**fields)  # type: ignore[arg-type]


def paper_sigma_omega(setting: Setting, dim: int) -> float:
    """The paper's tuned sigma_omega for a setting and dimension."""
    return _PAPER_SIGMA_OMEGA[setting].get(dim, _FALLBACK_SIGMA_OMEGA[setting])


def authors_hyperparameters(name: PolicyName, setting: Setting) -> dict[str, float]:
    """Where the authors' experiment scripts set a baseline otherwise than we do.

    LinUCB: their radius has ``R = 1`` whatever the noise. LinTS-IG: prior
    precision ``1 / tau^2`` with ``tau^2 = 10`` in the covariates setting
    (``LB_covariates_Exp.py``), ``tau^2 = 5`` elsewhere (as ours).
    """
    if name == "linucb":
        return {"noise_sd": 1.0}
    if name == "lints-ig" and setting == "covariates":
        return {"ig_prior_precision": 0.1}
    return {}


def reading_hyperparameters(setting: Setting, dim: int, reading: Reading) -> dict[str, float]:
    """What a world read ``literally`` changes in the paper's hyperparameters.

    Under ``literal`` the covariates world's noise and contexts are larger, and
    LinUCB's R and L and LinPHE/LinGIRO's U follow them
    (:func:`_literal_covariates`); nothing else changes.
    """
    if reading == "literal" and setting == "covariates":
        return _literal_covariates(dim)
    return {}


def paper_config(name: PolicyName, setting: Setting, dim: int, **overrides: object) -> PolicyConfig:
    """The paper's hyperparameters for ``name`` in ``setting`` at dimension ``dim``.

    Without the paper's first pass unless ``first_pass=True`` is given (the
    reproduction gives it). ``greedy`` is LinReBoot with sigma_omega = 0; ``residuals`` defaults to
    ``current`` (Algorithm 2), the variant that measured better (BENCHMARKS.md).
    LinReBoot with ``spread="pooled"`` takes :data:`POOLED_SIGMA_OMEGA` of its
    setting, unless ``sigma_omega`` is given.
    With ``variant="authors"`` the authors' scripts' values come first
    (:func:`authors_hyperparameters`), then ``overrides``. The paper's values
    are those of the authors' reading of the environments; for the literal
    one, override with :func:`reading_hyperparameters`.
    """
    if name == "greedy":
        sigma_omega = 0.0
    elif overrides.get("spread") == "pooled":
        sigma_omega = POOLED_SIGMA_OMEGA[setting]
    else:
        sigma_omega = paper_sigma_omega(setting, dim)
    base = PolicyConfig(
        name=name,
        setting=setting,
        dim=dim,
        sigma_omega=sigma_omega,
        reward_bound=_REWARD_BOUND[setting],
        noise_sd=_NOISE_SD[setting],
    )
    if overrides.get("variant") == "authors":
        overrides = {**authors_hyperparameters(name, setting), **overrides}
    return replace(base, **overrides) if overrides else base  # type: ignore[arg-type]
