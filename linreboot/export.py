"""``linreboot export``: an experiment's decision log, for off-policy evaluation.

Reads the experiment and its log over HTTP (``GET /experiments/{id}`` and
``GET /experiments/{id}/log``, admin token) and writes either

* ``jsonl``: one JSON object per decision, in the order the decisions were
  made, with its outcome joined when the log has one; or
* ``obp``: Open Bandit Pipeline's bandit feedback (the dict that
  ``obp.dataset.SyntheticBanditDataset.obtain_batch_bandit_feedback``
  returns) as a NumPy ``.npz`` file, one round per decision with an outcome,
  in the order the outcomes were applied.

Floats are written as the shortest decimals that round-trip (JSON) or as
float64 (npz), so a replay of the export through ``policies.update`` gives
the service's statistics bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np

Format = Literal["jsonl", "obp"]
PAGE = 1000  # log entries per request (the route's maximum)


async def fetch(http: httpx.AsyncClient, experiment_id: str, token: str
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The experiment and its whole log, oldest entry first.

    Raises
    ------
    ValueError
        With the service's message, if it refuses a request.
    """
    headers = {"Authorization": f"Bearer {token}"}
    experiment = _json(await http.get(f"/experiments/{experiment_id}", headers=headers))
    entries: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": PAGE, **({"after": after} if after else {})}
        page = _json(await http.get(f"/experiments/{experiment_id}/log", params=params,
                                    headers=headers))
        entries += page["entries"]
        after = page["next_after"]
        if after is None:
            return experiment, entries


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        try:
            message = response.json().get("message", response.text)
        except ValueError:
            message = response.text
        raise ValueError(f"{response.request.url.path}: {response.status_code} {message}")
    body: dict[str, Any] = response.json()
    return body


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
        "setting": np.array(experiment["setting"]),
        "config": np.array(json.dumps(experiment["config"], sort_keys=True)),
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


def write(experiment: dict[str, Any], entries: Sequence[dict[str, Any]], out: Path,
          fmt: Format) -> int:
    """Write the export; returns how many decisions (jsonl) or rounds (obp) it holds."""
    records = join(experiment, entries)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with out.open("w") as f:
            for record in records:
                f.write(json.dumps(record, allow_nan=False) + "\n")
        return len(records)
    feedback = bandit_feedback(experiment, records)
    with out.open("wb") as f:  # a file object: np.savez would append .npz to a name
        np.savez(f, **feedback)
    return int(feedback["n_rounds"])


def load_bandit_feedback(path: Path) -> dict[str, Any]:
    """An ``obp`` export as the dict OBP takes (counts as ints, arrays as arrays).

    Raises
    ------
    ValueError
        If the file is not such an export (a JSON lines export, say): one line
        saying which export it takes.
    """
    with path.open("rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04":  # an .npz is a zip file
        raise ValueError("not an obp export (.npz): write one with linreboot export "
                         "--format obp --out FILE.npz (the JSON lines export is for reading)")
    with np.load(path, allow_pickle=False) as data:
        feedback: dict[str, Any] = {name: data[name] for name in data.files}
    feedback["n_rounds"] = int(feedback["n_rounds"])
    feedback["n_actions"] = int(feedback["n_actions"])
    for name in ("setting", "config"):  # 0-d string arrays
        if name in feedback:
            feedback[name] = str(feedback[name])
    return feedback


async def export(http: httpx.AsyncClient, experiment_id: str, token: str, out: Path,
                 fmt: Format) -> int:
    """Fetch the experiment's log over ``http`` and write it to ``out`` as ``fmt``."""
    experiment, entries = await fetch(http, experiment_id, token)
    return write(experiment, entries, out, fmt)
