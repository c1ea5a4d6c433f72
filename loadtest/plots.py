"""Figure 1 of the paper: cumulative regret, settings x dimensions, one curve per policy."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from loadtest.results import Curve

_SETTING_TITLES = {
    "stochastic": "Stochastic linear bandit",
    "contextual": "Contextual linear bandit",
    "covariates": "Bandit with covariates",
}
_SETTING_ORDER = ("stochastic", "contextual", "covariates")
# One colour per policy in every figure; other labels (sweeps) take the rest.
_POLICY_COLOURS = {
    "linreboot": "tab:blue", "lints-g": "tab:orange", "lints-ig": "tab:green",
    "lingiro": "tab:red", "linphe": "tab:purple", "linucb": "tab:brown",
    "greedy": "tab:gray", "linucb-const": "tab:olive",
}
_SPARE = ("tab:pink", "tab:cyan", "black", "gold", "navy", "lime", "teal", "maroon")


def regret_grid(curves: Sequence[Curve], path: Path, title: str | None = None) -> Path:
    """Plot mean cumulative regret with a +-1 s.e. band, one panel per (setting, d).

    Rows are settings and columns dimensions, as in the paper's Figure 1; curves
    of different sources (in-process, http) are told apart by line style.
    """
    settings = [s for s in _SETTING_ORDER if any(c.setting == s for c in curves)]
    dims = sorted({c.dim for c in curves})
    labels = list(dict.fromkeys(c.label for c in curves))
    sources = list(dict.fromkeys(c.source for c in curves))
    spare = iter(_SPARE * (1 + len(labels) // len(_SPARE)))
    colours = {lab: _POLICY_COLOURS.get(lab) or next(spare) for lab in labels}
    styles = dict(zip(sources, ["-", "--", ":", "-."], strict=False))
    width = max(4.2 * len(dims), 7.5)
    columns = max(1, min(len(labels) * len(sources), int(width // 1.9)))
    legend_rows = -(-len(labels) * len(sources) // columns)
    legend_inches = 0.3 * legend_rows + 0.6  # the legend and the shared x label
    height = 3.3 * len(settings) + legend_inches + (0.4 if title else 0.0)
    fig, axes = plt.subplots(len(settings), len(dims), figsize=(width, height), squeeze=False)
    for i, setting in enumerate(settings):
        for j, dim in enumerate(dims):
            ax = axes[i][j]
            for c in curves:
                if c.setting != setting or c.dim != dim:
                    continue
                name = c.label if len(sources) == 1 else f"{c.label} [{c.source}]"
                ax.plot(c.rounds, c.mean, styles[c.source], color=colours[c.label], label=name)
                ax.fill_between(
                    c.rounds, c.mean - c.se, c.mean + c.se, color=colours[c.label], alpha=0.2
                )
            ax.set_title(f"{_SETTING_TITLES[setting]}, d = {dim}", fontsize=10)
            ax.set_xlabel("round t")
            ax.set_ylabel("cumulative regret")
            ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=columns, frameon=False)
    if title:
        fig.suptitle(title)
    top = 1 - 0.4 / height if title else 1
    fig.tight_layout(rect=(0, (0.3 * legend_rows + 0.15) / height, 1, top))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def regret_by_slots(curves: Sequence[Curve], path: Path, title: str | None = None) -> Path:
    """Final cumulative regret against k (rankings of k arms: the label's ``k=``, 1 when
    it has none), one panel per (setting, d), one line per policy with +-1 s.e. bars."""
    panels = sorted({(_SETTING_ORDER.index(c.setting), c.dim) for c in curves})
    lines: dict[str, list[Curve]] = {}
    for c in curves:
        lines.setdefault(_without_slots(c.label), []).append(c)
    spare = iter(_SPARE * (1 + len(lines) // len(_SPARE)))
    colours = {lab: _POLICY_COLOURS.get(lab) or next(spare) for lab in lines}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (order, dim) in zip(axes[0], panels, strict=True):
        setting = _SETTING_ORDER[order]
        for label, members in lines.items():
            here = sorted((c for c in members if c.setting == setting and c.dim == dim),
                          key=lambda c: slots_of(c.label))
            if here:
                ax.errorbar([slots_of(c.label) for c in here],
                            [c.final_mean for c in here], [c.final_se for c in here],
                            marker="o", capsize=3, color=colours[label], label=label)
        ax.set_title(f"{_SETTING_TITLES[setting]}, d = {dim}", fontsize=10)
        ax.set_xlabel("k (arms ranked per round)")
        ax.set_ylabel("final regret against the best k-list")
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    columns = max(1, min(len(names), len(panels) * 2))
    fig.legend(handles, names, loc="lower center", ncol=columns, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    rows = -(-len(names) // columns)
    fig.tight_layout(rect=(0, (0.3 * rows + 0.1) / 3.8, 1, 0.93 if title else 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def slots_of(label: str) -> int:
    """The k of a cell's label (:attr:`loadtest.simulate.Cell.label`): 1 without one."""
    found = re.search(r"\bk=(\d+)", label)
    return int(found.group(1)) if found else 1


def _without_slots(label: str) -> str:
    """A cell's label without its k and position weights, which the x axis and the title
    say (``linucb (ucb_alpha=1.0, k=5, weights 1/0.5)`` -> ``linucb (ucb_alpha=1.0)``)."""
    text = re.sub(r"(, )?(k=\d+|weights [0-9./]+)", "", label).replace("(, ", "(")
    return text.replace(" ()", "")
