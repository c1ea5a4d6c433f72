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
    of different sources (in-process, http) are told apart by line style. One
    (setting, d) of one source (the demo) is :func:`regret_and_final` instead.
    """
    settings = [s for s in _SETTING_ORDER if any(c.setting == s for c in curves)]
    dims = sorted({c.dim for c in curves})
    labels = list(dict.fromkeys(c.label for c in curves))
    sources = list(dict.fromkeys(c.source for c in curves))
    if len(settings) == 1 and len(dims) == 1 and len(sources) == 1:
        return regret_and_final(curves, path, title)
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


def regret_and_final(curves: Sequence[Curve], path: Path, title: str | None = None) -> Path:
    """One world's policies, told apart at a glance: the regret curves, each labelled at
    its end (labels spread so none overlap; no legend to match colours against), and
    beside them every policy's final regret as a bar with its standard error, best on
    top, where curves that run together are still apart. The caption says what the
    shaded bands and the error bars are."""
    order = sorted(curves, key=lambda c: c.final_mean)
    spare = iter(_SPARE * (1 + len(order) // len(_SPARE)))
    colours = {c.label: _POLICY_COLOURS.get(c.label) or next(spare) for c in order}
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(11.5, 0.32 * len(order) + 3.6),
                                   gridspec_kw={"width_ratios": [2.3, 1]})
    for c in order:
        ax.plot(c.rounds, c.mean, color=colours[c.label], lw=1.6)
        ax.fill_between(c.rounds, c.mean - c.se, c.mean + c.se, color=colours[c.label],
                        alpha=0.12, lw=0)
    finals = [c.final_mean for c in order]
    low, high = ax.get_ylim()
    spots = spread_labels(finals, gap=0.055 * (high - low))
    end = max(int(c.rounds[-1]) for c in order)
    for c, y, spot in zip(order, finals, spots, strict=True):
        ax.annotate(c.label, xy=(end, y), xytext=(end * 1.03, spot), color=colours[c.label],
                    fontsize=8.5, va="center",
                    arrowprops={"arrowstyle": "-", "color": colours[c.label], "lw": 0.6})
    ax.set_xlim(0, end * 1.42)  # room for the labels
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= end])
    ax.set_ylim(min(low, min(spots)), max(high, max(spots)))
    setting, dim = order[0].setting, order[0].dim
    ax.set_title(f"{_SETTING_TITLES[setting]}, d = {dim}: cumulative regret", fontsize=10)
    ax.set_xlabel("round t")
    ax.set_ylabel("cumulative regret")
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    positions = range(len(order))
    bars.barh(list(positions), finals, xerr=[c.final_se for c in order],
              color=[colours[c.label] for c in order], alpha=0.85, capsize=3)
    bars.set_yticks(list(positions), [c.label for c in order], fontsize=8.5)
    bars.invert_yaxis()  # the best on top
    bars.set_title("final regret (best on top)", fontsize=10)
    bars.set_xlabel("cumulative regret at the last round")
    bars.grid(axis="x", alpha=0.3)
    bars.spines[["top", "right"]].set_visible(False)
    reps = order[0].reps
    caption = (f"Mean over {reps} repetitions; shaded bands and error bars: "
               "± 1 standard error of the mean.")
    fig.suptitle(title or "", fontsize=11)
    fig.text(0.5, 0.01, caption, ha="center", fontsize=8.5, color="0.3")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95 if title else 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def spread_labels(values: Sequence[float], gap: float) -> list[float]:
    """Heights for labels of ``values`` (sorted ascending): each at its value, or
    ``gap`` above the label below it if that is higher."""
    spots: list[float] = []
    for value in values:
        spots.append(max(value, spots[-1] + gap) if spots else value)
    return spots
