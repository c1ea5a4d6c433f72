"""Pure NumPy bandit math: LinReBoot and the paper's baselines, batched.

Public surface: :class:`PolicyConfig`, :func:`paper_config`, :func:`init_state`,
:func:`choose` (or its two halves :func:`prepare` and :func:`draw`), :func:`update`,
:func:`layout`, :func:`raw_reward_sums`, :func:`discounted` (the statistics of a
policy that forgets, at a clock).
"""

from policies.config import (
    AUTHORS_VARIANTS,
    HYPERPARAMETERS,
    PAPER_POLICIES,
    POLICIES,
    RANGES,
    SETTINGS,
    PolicyConfig,
    PolicyName,
    Range,
    Residuals,
    Setting,
    Variant,
    check_hyperparameters,
    paper_config,
    paper_sigma_omega,
)
from policies.policy import Choice, Ready, choose, draw, prepare, update
from policies.state import FieldSpec, State, discounted, init_state, layout, raw_reward_sums

__all__ = [
    "AUTHORS_VARIANTS",
    "HYPERPARAMETERS",
    "PAPER_POLICIES",
    "POLICIES",
    "RANGES",
    "SETTINGS",
    "Choice",
    "FieldSpec",
    "PolicyConfig",
    "PolicyName",
    "Range",
    "Ready",
    "Residuals",
    "Setting",
    "State",
    "Variant",
    "check_hyperparameters",
    "choose",
    "discounted",
    "draw",
    "init_state",
    "layout",
    "paper_config",
    "paper_sigma_omega",
    "prepare",
    "raw_reward_sums",
    "update",
]
