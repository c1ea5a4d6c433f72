"""``linreboot evaluate``: the value of another policy, estimated from an exported log.

Reads an experiment's log as ``linreboot export --format obp`` writes it,
fits the target (a policy and its hyperparameters) on the log's first rounds
and holds it fixed (:func:`policies.evaluation.fitted_target`), and
estimates its mean reward on the remaining rounds by IPS, self-normalised
IPS and doubly robust, each with a 95% interval, next to what the logging
policy earned on the same rounds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from policies import HYPERPARAMETERS, PolicyConfig, paper_config
from policies.config import POLICIES, PolicyName, Setting, parse_hyperparameter
from policies.evaluation import (
    Estimate,
    doubly_robust,
    fitted_slate_target,
    fitted_target,
    ips,
    ridge_reward_model,
    slate_ips,
    snips,
)
from policies.propensity import SERVICE

ESTIMATORS = ("ips", "snips", "dr")
LOW_ESS = 100.0  # below this many effective rounds the normal intervals are not to be trusted


@dataclass(frozen=True)
class Report:
    """What ``linreboot evaluate`` prints."""

    target: str
    train_rounds: int
    rounds: int
    effective_sample_size: float
    logged: Estimate
    estimates: dict[str, Estimate]
    unit: str = "rounds"  # what train_rounds and rounds count ("rankings": a log of /rank)

    def as_dict(self) -> dict[str, Any]:
        def pair(e: Estimate) -> dict[str, float]:
            return {"value": e.value, "stderr": e.stderr, "low": e.low, "high": e.high}

        return {"target": self.target, "train_rounds": self.train_rounds,
                "rounds": self.rounds, "unit": self.unit,
                "effective_sample_size": self.effective_sample_size,
                "logged": pair(self.logged),
                **{name: pair(e) for name, e in self.estimates.items()}}

    def markdown(self) -> str:
        lines = [
            f"target: {self.target}, fitted on the first {self.train_rounds} {self.unit}, "
            f"evaluated on the other {self.rounds} "
            f"(effective sample size {self.effective_sample_size:.0f}"
            f"{' slots' if self.unit == 'rankings' else ''})",
            "",
            "| estimator | value | 95% interval |",
            "|---|---:|---|",
        ]
        named = {"logged policy (on-policy)": self.logged,
                 **{name.upper(): e for name, e in self.estimates.items()}}
        for name, e in named.items():
            lines.append(f"| {name} | {e.value:.4f} | [{e.low:.4f}, {e.high:.4f}] |")
        if self.effective_sample_size < LOW_ESS:
            lines += ["", f"warning: an effective sample size below {LOW_ESS:.0f} makes the "
                      "intervals unreliable (the target rarely agrees with the log; give "
                      "the logging experiment a larger epsilon)"]
        return "\n".join(lines)


def evaluate(feedback: dict[str, Any], policy: PolicyName | None,
             overrides: dict[str, str], train_fraction: float = 0.5) -> Report:
    """Estimate the value of ``policy`` (default: the logged one) with ``overrides``
    (``--set`` pairs, as written: :func:`policies.config.parse_hyperparameter`).

    The target is held fixed after its training rounds, so it takes no first
    pass: the logged policy's is dropped, and ``first_pass=true`` is refused
    (:func:`policies.evaluation.fitted_target`).

    Raises
    ------
    ValueError
        Saying what in the log or the arguments keeps it from being evaluated.
    """
    setting = _setting(feedback)
    n = int(feedback["n_rounds"])
    if not 0.0 <= train_fraction < 1.0:
        raise ValueError("--train-fraction must be at least 0 and below 1")
    train = int(train_fraction * n)
    if n - train < 2:
        raise ValueError(f"the log has {n} rounds with an outcome: too few to evaluate on")
    pscore = np.asarray(feedback["pscore"], dtype=np.float64)
    ranked = bool(np.asarray(feedback.get("position", [0]), dtype=np.int64).any())
    if not ranked:  # (a log of rankings splits by ranking: _rankings checks its own)
        _require_propensities(pscore[train:])
    logged_config = json.loads(feedback["config"])
    name: PolicyName = policy or logged_config["name"]
    if name not in POLICIES:
        raise ValueError(f"the log names an unknown policy {name!r}")
    hyperparameters: dict[str, bool | float | str] = (
        {k: v for k, v in logged_config.items()
         if k in HYPERPARAMETERS[name] and k != "first_pass"} if policy is None else {})
    hyperparameters.update(
        {key: parse_hyperparameter(name, key, text) for key, text in overrides.items()})
    if hyperparameters.get("first_pass") is True:
        raise ValueError("a target held fixed after its training rounds takes no first pass: "
                         "leave out first_pass=true (an arm it never saw is scored from the "
                         "prior)")
    dim = int(logged_config.get("dim", feedback["context"].shape[-1]))
    config = paper_config(name, setting, dim, **hyperparameters)

    contexts = _contexts(feedback, setting)  # (n, K, d)
    actions = np.asarray(feedback["action"], dtype=np.int64)
    rewards = np.asarray(feedback["reward"], dtype=np.float64)
    if ranked:
        return _rankings(feedback, config, _describe(name, hyperparameters), contexts,
                         actions, rewards, pscore, train_fraction)
    target = fitted_target(config, contexts[None], actions[None], rewards[None],
                           np.asarray(feedback["eligible"], dtype=bool)[None], train,
                           accuracy=SERVICE,
                           numbers=np.asarray(feedback["decision_number"], float)[None])[0]
    rest = slice(train, None)
    x, a, p, r = contexts[rest], actions[rest], pscore[rest], rewards[rest]
    weights = target[np.arange(a.size), a] / p
    ess = float(weights.sum() ** 2 / (weights**2).sum()) if weights.any() else 0.0
    model = ridge_reward_model(x, a, r)
    return Report(
        target=_describe(name, hyperparameters), train_rounds=train, rounds=n - train,
        effective_sample_size=ess,
        logged=Estimate(float(r.mean()), float(r.std(ddof=1) / math.sqrt(r.size))),
        estimates={"ips": ips(r, a, p, target), "snips": snips(r, a, p, target),
                   "dr": doubly_robust(r, a, p, target, model)},
    )


def _rankings(feedback: dict[str, Any], config: PolicyConfig, target: str,
              contexts: np.ndarray[Any, Any], actions: np.ndarray[Any, Any],
              rewards: np.ndarray[Any, Any], pscore: np.ndarray[Any, Any],
              train_fraction: float) -> Report:
    """A log of rankings (``/rank``): the target fitted on the first rankings' slots
    (each reward over its position's weight, as the service learns it) and held fixed;
    its value, the expected sum of a ranking's slot rewards, by independent IPS over
    the other rankings (:func:`policies.evaluation.slate_ips`), next to the logged
    rankings' mean sum. A slot without an outcome is not in the export: it counts 0."""
    if "slate_id" not in feedback:
        raise ValueError("this log of rankings lacks slate_id: export it again with "
                         "linreboot export --format obp")
    positions = np.asarray(feedback["position"], dtype=np.int64)
    ids = np.asarray(feedback["slate_id"], dtype=np.int64)
    # Rankings in the order their first slot's outcome was applied: the first ones train.
    _, first = np.unique(ids, return_index=True)
    order = np.argsort(np.argsort(first))  # each distinct ranking's place in that order
    slates = order[np.unique(ids, return_inverse=True)[1]]
    count = int(first.size)
    train_count = int(train_fraction * count)
    if count - train_count < 2:
        raise ValueError(f"the log has {count} rankings with an outcome: too few to "
                         "evaluate on")
    listed = feedback.get("position_weights")
    weights = (np.ones(positions.size) if listed is None
               else np.asarray(listed)[np.minimum(positions, len(listed) - 1)])
    train = slates < train_count
    _require_propensities(pscore[~train])  # (evaluate() checked rounds, not rankings)
    probability = fitted_slate_target(config, contexts, actions, positions, rewards / weights,
                                      np.asarray(feedback["eligible"], dtype=bool), slates,
                                      train)
    rest = ~train
    r, p, evaluated = rewards[rest], pscore[rest], slates[rest] - train_count
    w = probability / p
    ess = float(w.sum() ** 2 / (w**2).sum()) if w.any() else 0.0
    logged = np.asarray(np.bincount(evaluated, weights=r), dtype=np.float64)
    return Report(
        target=target, train_rounds=train_count, rounds=count - train_count,
        effective_sample_size=ess,
        logged=Estimate(float(logged.mean()), float(logged.std(ddof=1) / math.sqrt(logged.size))),
        estimates={"iips": slate_ips(r, evaluated, p, probability)}, unit="rankings")


def _require_propensities(pscore: np.ndarray[Any, Any]) -> None:
    missing = int(np.isnan(pscore).sum())
    if missing:
        raise ValueError(f"{missing} rounds have no logged propensity (decided by a version "
                         "that did not log them, or by an experiment created with "
                         "propensities false)")


def _setting(feedback: dict[str, Any]) -> Setting:
    setting = feedback.get("setting")
    if setting is None or "eligible" not in feedback or "config" not in feedback:
        raise ValueError("the log lacks the experiment's setting: export it again with "
                         "linreboot export --format obp")
    if setting == "contextual" and "arm_contexts" not in feedback:
        raise ValueError("this contextual experiment's log keeps only the chosen arm's "
                         "context, and the target's choice needs every arm's: create the "
                         "experiment with log_all_contexts true to evaluate it")
    if setting not in ("stochastic", "contextual", "covariates"):
        raise ValueError(f"the log names an unknown setting {setting!r}")
    return cast(Setting, setting)


def _contexts(feedback: dict[str, Any], setting: str) -> np.ndarray[Any, Any]:
    """Every arm's context in each round, shape (n, K, d) (a read-only broadcast)."""
    n, n_arms = int(feedback["n_rounds"]), int(feedback["n_actions"])
    if setting == "stochastic":
        features = np.asarray(feedback["action_context"], dtype=np.float64)
        return np.broadcast_to(features, (n, *features.shape))
    if setting == "contextual":
        return np.asarray(feedback["arm_contexts"], dtype=np.float64)
    context = np.asarray(feedback["context"], dtype=np.float64)
    return np.broadcast_to(context[:, None, :], (n, n_arms, context.shape[1]))


def _describe(name: str, hyperparameters: dict[str, bool | float | str]) -> str:
    given = ", ".join(f"{k}={v}" for k, v in sorted(hyperparameters.items()))
    return f"{name} ({given})" if given else name


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``--set name=value`` pairs, values as written (:func:`evaluate` reads them for the
    target policy, which knows its hyperparameters and their kinds)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes name=value, e.g. ucb_alpha=0.5 (got {pair!r})")
        out[key] = value
    return out
