"""Off-policy evaluation of an experiment's decision log: the log as Open Bandit
Pipeline's bandit feedback, and another policy's value estimated from it.

:func:`join` and :func:`bandit_feedback` turn the log's entries (as
``GET /experiments/{id}/log`` gives them) into OBP's dict, which ``linreboot
export --format obp`` writes; :func:`evaluate` fits the target (a policy and
its hyperparameters) on the log's first rounds and holds it fixed
(:func:`policies.evaluation.fitted_target`), and estimates its mean reward on
the remaining rounds by IPS, self-normalised IPS and doubly robust, each with a
95% interval, next to what the logging policy earned on the same rounds.
``linreboot evaluate`` runs it on an export, ``/ui`` on an experiment's recent
log. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
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


def join(experiment: dict[str, Any], entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per logged decision, in decision order, with its outcome.

    ``outcome`` is ``{type, reward, time, entry_id}`` (type ``reward`` or
    ``default``; sorting by ``entry_id`` gives the order the outcomes were
    applied in) or None while unknown; ``late_rewards`` lists rewards that
    arrived after the window (not applied). Outcomes whose decision is no
    longer in the log (dropped by its bounds) are left out.
    """
    index = {arm["id"]: i for i, arm in enumerate(experiment["arms"])}
    records: dict[str, dict[str, Any]] = {}
    for entry in entries:
        record = records.get(entry["decision_id"])
        if entry["type"] == "decision":
            records[entry["decision_id"]] = {
                "decision_id": entry["decision_id"], "time": entry["time"],
                "number": entry["number"], "arm_id": entry["arm_id"],
                "arm_index": index[entry["arm_id"]], "context": entry["context"],
                "eligible": entry["eligible"], "contexts": entry.get("contexts"),
                "propensity": entry["propensity"], "position": entry.get("position"),
                "version": entry["version"], "rewards_seen": entry["rewards_seen"],
                "outcome": None, "late_rewards": [],
            }
        elif record is None:
            continue
        elif entry["type"] == "late":
            record["late_rewards"].append({"reward": entry["reward"], "time": entry["time"]})
        else:
            record["outcome"] = {"type": entry["type"], "reward": entry["reward"],
                                 "time": entry["time"], "entry_id": entry["entry_id"]}
    return list(records.values())


def entry_order(entry_id: str) -> tuple[int, int]:
    """A log entry id as a sortable pair: (ms, sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


def in_application_order(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with an outcome, in the order the outcomes were applied."""
    done = [r for r in records if r["outcome"] is not None]
    return sorted(done, key=lambda r: entry_order(r["outcome"]["entry_id"]))


def bandit_feedback(experiment: dict[str, Any], records: Sequence[dict[str, Any]]
                    ) -> dict[str, Any]:
    """Open Bandit Pipeline's bandit feedback of the decisions with an outcome.

    ``action`` is the arm's index in the experiment's arm order,
    ``context`` the chosen arm's context (in the covariates setting the
    round's context), ``action_context`` the arms' features in the
    stochastic setting (else one-hot rows, OBP's default), ``pscore`` the
    logged propensity (NaN where none was logged: a ranking's slot's is the
    probability of its arm at its position, OBP's ``pscore_item_position``),
    ``position`` a ranking's slot from 0 (0 for a decision of ``/choose``),
    ``slate_id`` (OBP's slate datasets') the round's ranking, numbered from 0 in
    the order of their first round (each decision of ``/choose`` a slate of its
    own), and ``position_weights`` (not OBP's) the experiment's, if any;
    ``defaulted`` (not OBP's) marks the rounds whose reward is the default,
    ``decision_number`` (not OBP's) gives each round's decision number, which
    an experiment with a ``discount`` weighs its outcomes by; ``eligible``
    (not OBP's, rounds x arms) the arms each decision was chosen from, and
    ``setting`` and ``config`` (JSON) the experiment's, which ``linreboot
    evaluate`` needs; and ``arm_contexts`` (not OBP's, rounds x arms x d)
    every eligible arm's context in each round (zeros for the others), when
    a contextual experiment logged them all (``log_all_contexts``).
    """
    rounds = in_application_order(records)
    arms = experiment["arms"]
    dim = int(experiment["dim"])
    features = [a.get("features") for a in arms]
    action_context = (np.array(features, dtype=np.float64) if all(f is not None for f in features)
                      else np.eye(len(arms)))
    every = ({"arm_contexts": _arm_contexts(arms, rounds, dim)}
             if rounds and all(r.get("contexts") is not None for r in rounds) else {})
    return {
        **every,
        "n_rounds": len(rounds),
        "n_actions": len(arms),
        "action": np.array([r["arm_index"] for r in rounds], dtype=np.int64),
        "reward": np.array([r["outcome"]["reward"] for r in rounds], dtype=np.float64),
        "pscore": np.array([np.nan if r["propensity"] is None else r["propensity"]
                            for r in rounds], dtype=np.float64),
        "context": np.array([r["context"] for r in rounds], dtype=np.float64).reshape(-1, dim),
        "action_context": action_context,
        "position": np.array([(r["position"] or 1) - 1 for r in rounds], dtype=np.int64),
        "slate_id": _slate_ids(rounds),
        **({} if experiment.get("position_weights") is None
           else {"position_weights": np.array(experiment["position_weights"], np.float64)}),
        "defaulted": np.array([r["outcome"]["type"] == "default" for r in rounds], dtype=bool),
        "decision_number": np.array([r["number"] for r in rounds], dtype=np.int64),
        "eligible": _eligible(arms, rounds),
        "setting": str(experiment["setting"]),  # (np.savez writes both as 0-d arrays)
        "config": json.dumps(experiment["config"], sort_keys=True),
    }


def _slate_ids(rounds: Sequence[dict[str, Any]]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Each round's ranking (a slot's decision id is its ranking's, '#' and the slot)."""
    numbered: dict[str, int] = {}
    return np.array([numbered.setdefault(r["decision_id"].partition("#")[0], len(numbered))
                     for r in rounds], dtype=np.int64)


def _arm_contexts(arms: Sequence[dict[str, Any]], rounds: Sequence[dict[str, Any]], dim: int
                  ) -> np.ndarray[Any, np.dtype[np.float64]]:
    index = {arm["id"]: i for i, arm in enumerate(arms)}
    out = np.zeros((len(rounds), len(arms), dim))
    for row, record in enumerate(rounds):
        out[row, [index[a] for a in record["eligible"]]] = record["contexts"]
    return out


def _eligible(arms: Sequence[dict[str, Any]], rounds: Sequence[dict[str, Any]]
              ) -> np.ndarray[Any, np.dtype[np.bool_]]:
    index = {arm["id"]: i for i, arm in enumerate(arms)}
    mask = np.zeros((len(rounds), len(arms)), dtype=bool)
    for row, record in enumerate(rounds):
        mask[row, [index[a] for a in record["eligible"] or ()]] = True
    return mask


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
    n = int(feedback["n_rounds"])
    if not 0.0 <= train_fraction < 1.0:
        raise ValueError("the training share (--train-fraction) must be at least 0 and below 1")
    train = int(train_fraction * n)
    if n - train < 2:  # (before the setting: an empty log lacks every arm's contexts)
        raise ValueError(f"the log has {n} rounds with an outcome: too few to evaluate on")
    setting = _setting(feedback)
    pscore = np.asarray(feedback["pscore"], dtype=np.float64)
    ranked = bool(np.asarray(feedback.get("position", [0]), dtype=np.int64).any())
    if not ranked:  # (a log of rankings splits by ranking: _rankings checks its own)
        _require_propensities(pscore[train:])
    logged_config = json.loads(feedback["config"])
    dim = int(logged_config.get("dim", feedback["context"].shape[-1]))
    config, name, hyperparameters = target_config(logged_config, policy, overrides, setting,
                                                  dim)

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


def target_config(logged_config: dict[str, Any], policy: PolicyName | None,
                  overrides: dict[str, str], setting: Setting, dim: int
                  ) -> tuple[PolicyConfig, PolicyName, dict[str, bool | float | str]]:
    """The target's configuration: ``policy`` with the paper's defaults, or (None) the
    logged one with its hyperparameters; either with ``overrides`` (as written) on
    top; and its name and the hyperparameters given. No first pass (the target is held
    fixed after its training rounds).

    Raises
    ------
    ValueError
        Naming the override, or the combination, the policy does not take.
    """
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
    return paper_config(name, setting, dim, **hyperparameters), name, hyperparameters


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
