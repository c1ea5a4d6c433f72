"""``linreboot export``: an experiment's decision log, for off-policy evaluation.

Reads the experiment and its log over HTTP (``GET /experiments/{id}`` and
``GET /experiments/{id}/log``, admin token) and writes either

* ``jsonl``: one JSON object per decision, in the order the decisions were
  made, with its outcome joined when the log has one; or
* ``obp``: Open Bandit Pipeline's bandit feedback (the dict that
  ``obp.dataset.SyntheticBanditDataset.obtain_batch_bandit_feedback``
  returns) as a NumPy ``.npz`` file, one round per decision with an outcome,
  in the order the outcomes were applied.

The records and the feedback are built by :mod:`service.off_policy` (which
``/ui``'s evaluation form also reads the log through). Floats are written as
the shortest decimals that round-trip (JSON) or as float64 (npz), so a replay
of the export through ``policies.update`` gives the service's statistics bit
for bit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np

from service.off_policy import bandit_feedback, join

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
