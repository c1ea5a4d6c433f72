"""The pages of ``/ui``: server-rendered HTML, every value escaped, the assets of
``app/static/ui`` (no CDN, no inline script: the pages' Content-Security-Policy
allows nothing but the app's own files)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from policies import HYPERPARAMETERS
from policies.config import POLICIES
from service.domain import ArmState, ExperimentView, LogEntry
from service.off_policy import LOW_ESS, Report

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
REFRESH_SECONDS = 5  # an experiment's page reloads itself this often
LIST_REFRESH_SECONDS = 30  # the list too: 100 experiments' views a reload, per open tab
EVALUATED_ENTRIES = 20_000  # the evaluation form reads at most this much log (about 1 s)
EVALUATED_BYTES = 32 * 2**20  # ... and about this much of its JSON (contexts can be large)
_Z_95 = 1.959963984540054


def _page(title: str, body: str, *, signed_in: bool = True, refresh: int = 0) -> str:
    logout = ('<form id="logout"><button type="submit">Sign out</button></form>'
              if signed_in else "")
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)} · linreboot</title>"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<link rel=\"stylesheet\" href=\"/static/ui/ui.css\"></head>"
        f"<body data-refresh=\"{refresh}\"><header><a href=\"/ui\">linreboot</a>"
        f"<span class=\"muted\">experiments</span>{logout}</header>"
        f"<main>{body}</main><script src=\"/static/ui/ui.js\"></script></body></html>"
    )


def login_page() -> str:
    body = (
        "<div class=\"login\"><h1>Sign in</h1>"
        "<form id=\"login\"><label for=\"token\">Admin token "
        "<span class=\"muted\">(LINREBOOT_ADMIN_TOKEN)</span></label>"
        "<input id=\"token\" type=\"password\" autocomplete=\"current-password\" required>"
        "<div id=\"error\" class=\"error\"></div>"
        "<button type=\"submit\">Sign in</button></form></div>"
    )
    return _page("Sign in", body, signed_in=False)


def experiments_page(views: Sequence[ExperimentView], next_after: str | None,
                     now: float, not_ready: str = "") -> str:
    """The experiments, a page of them, each with its decisions and rewards of this
    minute (since its start) and of the last hour (this minute and the 59 before:
    ExperimentView.recent) beside its totals; above them, whether the service is
    ready (``not_ready``: why not, as /readyz says)."""
    def row(v: ExperimentView) -> str:
        cells = (sum(a.active for a in v.arms),
                 _since(v, now, 60, "decisions"), _since(v, now, 3600, "decisions"), v.decisions,
                 _since(v, now, 60, "rewards"), _since(v, now, 3600, "rewards"), v.rewards,
                 _rate(v.rewards, v.decisions), _since(v, now, 3600, "defaulted"), v.defaulted,
                 v.late)
        return (f"<tr><td><a href=\"/ui/experiments/{escape(v.spec.id)}\">"
                f"{escape(v.spec.id)}</a></td><td>{escape(v.spec.policy)}</td>"
                f"<td>{escape(v.spec.setting)}</td>"
                + "".join(f"<td class=\"num\">{cell}</td>" for cell in cells) + "</tr>")

    more = (f"<p><a href=\"/ui?after={escape(next_after)}\">Next page</a></p>"
            if next_after else "")
    spans = ("<th class=\"num\">this minute</th><th class=\"num\">last hour</th>"
             "<th class=\"num\">all</th>")
    head = (
        "<thead><tr><th rowspan=\"2\">id</th><th rowspan=\"2\">policy</th>"
        "<th rowspan=\"2\">setting</th><th rowspan=\"2\" class=\"num\">active arms</th>"
        "<th colspan=\"3\" class=\"group\">decisions</th>"
        "<th colspan=\"3\" class=\"group\">rewards</th>"
        "<th rowspan=\"2\" class=\"num\">share rewarded</th>"
        "<th colspan=\"2\" class=\"group\">default rewards</th>"
        "<th rowspan=\"2\" class=\"num\">late rewards</th></tr>"
        f"<tr>{spans}{spans}<th class=\"num\">last hour</th><th class=\"num\">all</th></tr>"
        "</thead>")
    readiness = (f"<p id=\"readiness\" class=\"error\">Not ready: {escape(not_ready)}</p>"
                 if not_ready else
                 "<p id=\"readiness\" class=\"ready\">Ready: Redis answers and accepts "
                 "writes (/readyz).</p>")
    body = (
        "<h1>Experiments</h1>" + readiness
        + (f"<table id=\"experiments\">{head}<tbody>{''.join(map(row, views))}</tbody></table>"
           if views
           else "<p class=\"muted\">No experiments yet: create one with POST /experiments.</p>")
        + more
    )
    return _page("Experiments", body, refresh=LIST_REFRESH_SECONDS)


def _since(view: ExperimentView, now: float, seconds: int, counter: str) -> int:
    """A counter of the minutes that began in the last ``seconds`` (60: this minute)."""
    return sum(getattr(m, counter) for m in view.recent if m.start > now - seconds)


def recent_activity(entries: Sequence[LogEntry], now: float, capped: bool) -> str:
    """The decision log's last hour (``entries``, oldest first; ``capped``: the read
    stopped at its bound, so the counts are lower bounds): decisions, rewards and
    default rewards in the last minute and hour, the mean reward minute by minute, the
    logged propensities' distribution and the effective sample size an evaluation of
    the uniform policy would have on them."""
    if not entries:
        return ("<h2>Last hour</h2><p class=\"muted\">Nothing in the decision log in the "
                "last hour (or the experiment keeps none: log_max_entries 0).</p>")
    at_least = "≥ " if capped else ""
    counts = "".join(
        f"<tr><td>{escape(label)}</td>"
        + "".join(f"<td class=\"num\">{at_least}"
                  f"{sum(e.type == kind and e.time >= now - span for e in entries)}</td>"
                  for span in (60, 3600))
        + "</tr>"
        for label, kind in (("decisions", "decision"), ("rewards", "reward"),
                            ("default rewards", "default"), ("late rewards", "late")))
    minutes: list[list[float]] = [[] for _ in range(60)]
    for e in entries:
        if e.type in ("reward", "default") and e.reward is not None and e.time >= now - 3600:
            # (an entry a little after `now`, by Redis's clock, is this minute's)
            minutes[min(59, max(0, int((now - e.time) // 60)))].append(e.reward)
    means = [sum(m) / len(m) if m else None for m in reversed(minutes)]  # oldest first
    propensities = [e.propensity for e in entries
                    if e.type == "decision" and e.propensity is not None]
    return (
        "<h2>Last hour</h2><table><thead><tr><th></th><th class=\"num\">last minute</th>"
        f"<th class=\"num\">last hour</th></tr></thead><tbody>{counts}</tbody></table>"
        "<h2>Mean reward, minute by minute</h2>"
        + _bars(means, "minutes ago, 60 to 0")
        + "<h2>Logged propensities</h2>"
        + _propensity_summary(propensities, entries)
    )


def _bars(values: Sequence[float | None], caption: str) -> str:
    """A small SVG bar chart (no script, no style: the page's CSP allows neither inline)."""
    present = [v for v in values if v is not None]
    if not present:
        return "<p class=\"muted\">No outcome in the last hour.</p>"
    low, high = min(0.0, *present), max(0.0, *present)
    span = (high - low) or 1.0
    width, height, bar = 600, 120, 600 / len(values)
    zero = height * high / span
    rects = "".join(
        f"<rect x=\"{i * bar:.1f}\" y=\"{min(zero, zero - v * height / span):.1f}\" "
        f"width=\"{bar * 0.8:.1f}\" height=\"{abs(v) * height / span:.1f}\" "
        f"fill=\"#4c78a8\"><title>{v:.4g}</title></rect>"
        for i, v in enumerate(values) if v is not None)
    return (f"<svg viewBox=\"0 0 {width} {height + 2}\" width=\"{width}\" "
            f"height=\"{height + 2}\" role=\"img\" aria-label=\"{escape(caption)}\">"
            f"{rects}<line x1=\"0\" x2=\"{width}\" y1=\"{zero:.1f}\" y2=\"{zero:.1f}\" "
            f"stroke=\"#68707f\"/></svg><p class=\"muted\">{escape(caption)}; "
            f"from {high:.4g} (top) to {low:.4g} (bottom).</p>")


def _propensity_summary(propensities: Sequence[float], entries: Sequence[LogEntry]) -> str:
    """Their histogram in tenths, and the effective sample size ``(sum w)^2 / sum w^2``
    of the uniform policy's weights ``w = (1 / K) / p`` (K the decision's eligible arms):
    how many rounds an off-policy evaluation of uniform play would have."""
    if not propensities:
        return ("<p class=\"muted\">No propensity logged in the last hour (an experiment "
                "created with propensities false logs none).</p>")
    buckets = [0] * 10
    for p in propensities:
        buckets[min(9, int(p * 10))] += 1
    weights = [1.0 / (len(e.eligible or ()) or 1) / e.propensity for e in entries
               if e.type == "decision" and e.propensity]
    ess = sum(weights) ** 2 / sum(w * w for w in weights) if weights else 0.0
    share = [b / len(propensities) for b in buckets]
    return (_bars(share, "share of decisions by propensity, in tenths from 0 to 1")
            + f"<p>{len(propensities)} decisions; smallest propensity "
            f"{min(propensities):.3g}; effective sample size of an evaluation of uniform "
            f"play: {ess:.0f} (linreboot evaluate; docs/API.md).</p>")


def recent_shares(entries: Sequence[LogEntry]) -> dict[str, float]:
    """Each arm's share of the decisions in ``entries`` (a ranking's slots each count)."""
    chosen = Counter(e.arm_id for e in entries if e.type == "decision" and e.arm_id is not None)
    total = sum(chosen.values())
    return {arm: count / total for arm, count in chosen.items()}


def experiment_page(view: ExperimentView, activity: str = "",
                    recent: dict[str, float] | None = None) -> str:
    spec = view.spec
    cards = "".join(
        f"<div class=\"card\"><span class=\"muted\">{escape(name)}</span>"
        f"<b>{escape(value)}</b></div>"
        for name, value in (
            ("decisions", str(view.decisions)), ("rewards", str(view.rewards)),
            ("share rewarded", _rate(view.rewards, view.decisions)),
            ("default rewards", str(view.defaulted)), ("late rewards", str(view.late)),
            ("defaults missed", str(view.defaults_missed)),
            ("duplicates", str(view.duplicates))))
    total = sum(a.pulls for a in view.arms)
    arms = "".join(_arm_row(arm, total, (recent or {}).get(arm.id, 0.0)) for arm in view.arms)
    theta = "".join(
        f"<tr><td>{escape(name)}</td><td>{escape(', '.join(f'{x:.4g}' for x in values))}</td></tr>"
        for name, values in view.theta_hat.items())
    settings = "".join(
        f"<tr><td>{escape(name)}</td><td>{escape(str(value))}</td></tr>"
        for name, value in (
            ("policy", spec.policy), ("setting", spec.setting), ("dim", spec.dim),
            ("created", datetime.fromtimestamp(view.created_at, UTC).isoformat(
                timespec="seconds")),
            ("reward window (s)", spec.reward_window_seconds),
            ("default reward", spec.default_reward), ("max stale rewards",
                                                      spec.max_stale_rewards),
            ("decision log", f"{spec.log_max_entries} entries, {spec.log_max_age_seconds} s"),
            ("propensities", spec.propensities), ("shards", spec.shards),
            ("position weights", spec.position_weights),
            # the policy's own hyperparameters, not every field of the config
            *((name, view.config[name]) for name in HYPERPARAMETERS[spec.policy]
              if name in view.config)))
    body = (
        f"<h1>{escape(spec.id)}</h1><div class=\"cards\">{cards}</div>"
        "<h2>Arms</h2><table><thead><tr><th>arm</th><th>active</th>"
        "<th class=\"num\">pulls</th><th>share of pulls</th>"
        "<th class=\"num\">share of the last hour's decisions</th>"
        "<th class=\"num\">mean reward</th><th class=\"num\">95% interval</th></tr></thead>"
        f"<tbody>{arms}</tbody></table>"
        + activity
        + (f"<h2>Estimated theta</h2><table><tbody>{theta}</tbody></table>" if theta else "")
        + "<h2>Evaluate another policy</h2>"
        + _evaluation_form(spec.id, EvaluationForm(policy=spec.policy))
        + f"<h2>Settings</h2><table><tbody>{settings}</tbody></table>"
        + f"<p class=\"muted\">This page reloads every {REFRESH_SECONDS} s.</p>"
    )
    return _page(spec.id, body, refresh=REFRESH_SECONDS)


@dataclass(frozen=True)
class EvaluationForm:
    """What the evaluation form asks, as typed (the route checks it)."""

    policy: str
    hyperparameters: str = ""  # name=value pairs, space-separated (linreboot evaluate --set)
    minutes: str = "60"  # the log's last so many minutes (one of WINDOWS); "0": all of it
    train_fraction: str = "0.5"


WINDOWS = ((15, "last 15 minutes"), (60, "last hour"), (360, "last 6 hours"),
           (1440, "last 24 hours"), (0, "the whole log"))


def _evaluation_form(experiment_id: str, form: EvaluationForm) -> str:
    """A GET form (it changes nothing): the target policy and its hyperparameters, the
    stretch of log, the share of it the target is fitted on."""
    policies = "".join(
        f"<option value=\"{escape(name)}\"{' selected' if name == form.policy else ''}>"
        f"{escape(name)}</option>" for name in POLICIES)
    windows = "".join(
        f"<option value=\"{minutes}\"{' selected' if str(minutes) == form.minutes else ''}>"
        f"{escape(label)}</option>" for minutes, label in WINDOWS)
    return (
        f"<form id=\"evaluate\" method=\"get\" "
        f"action=\"/ui/experiments/{escape(experiment_id)}/evaluate\" class=\"evaluate\">"
        f"<label>target policy <select name=\"policy\">{policies}</select></label>"
        "<label>hyperparameters <input name=\"hyperparameters\" "
        f"value=\"{escape(form.hyperparameters)}\" placeholder=\"ucb_alpha=0.5 epsilon=0.1\">"
        "</label>"
        f"<label>log <select name=\"minutes\">{windows}</select></label>"
        "<label>share fitted on <input name=\"train_fraction\" inputmode=\"decimal\" "
        f"size=\"4\" value=\"{escape(form.train_fraction)}\"></label>"
        "<button type=\"submit\">Evaluate</button></form>"
        "<p class=\"muted\">The target is fitted on the first share of the log's rounds and "
        "held fixed; its mean reward on the rest is estimated by IPS, self-normalised IPS "
        "and doubly robust, each with a 95% interval (as <code>linreboot evaluate</code> "
        "does on an export). The experiment's own policy keeps its hyperparameters; another "
        "takes the paper's defaults, and the hyperparameters field overrides either.</p>"
    )


def evaluation_page(view: ExperimentView, form: EvaluationForm, *, report: Report | None = None,
                    entries: int = 0, capped: bool = False, error: str = "") -> str:
    """The evaluation's estimates (or why there are none), under the form again."""
    spec = view.spec
    back = f"<p><a href=\"/ui/experiments/{escape(spec.id)}\">Back to {escape(spec.id)}</a></p>"
    if report is None:
        result = f"<div class=\"error\" id=\"evaluation-error\">{escape(error)}</div>"
    else:
        named = {"logged policy (on-policy)": report.logged,
                 **{name.upper(): e for name, e in report.estimates.items()}}
        rows = "".join(
            f"<tr><td>{escape(name)}</td><td class=\"num\">{e.value:.4f}</td>"
            f"<td class=\"num\">[{e.low:.4f}, {e.high:.4f}]</td></tr>"
            for name, e in named.items())
        longer = (f", the latest of a longer stretch: the form reads at most "
                  f"{EVALUATED_ENTRIES:,} (and {EVALUATED_BYTES // 2**20} MB); linreboot "
                  "evaluate reads a whole export" if capped else "")
        read = f"{entries} log entries{longer}"
        warning = (f"<p class=\"error\">An effective sample size below {LOW_ESS:.0f} makes "
                   "the intervals unreliable: the target rarely agrees with the log.</p>"
                   if report.effective_sample_size < LOW_ESS else "")
        result = (
            f"<p>Target <b>{escape(report.target)}</b>, fitted on the first "
            f"{report.train_rounds} {escape(report.unit)}, evaluated on the other "
            f"{report.rounds}; effective sample size {report.effective_sample_size:.0f} "
            f"(from {escape(read)}).</p>"
            "<table id=\"estimates\"><thead><tr><th>estimator</th><th class=\"num\">value</th>"
            f"<th class=\"num\">95% interval</th></tr></thead><tbody>{rows}</tbody></table>"
            + warning)
    body = (f"<h1>Evaluate another policy on {escape(spec.id)}</h1>" + result
            + "<h2>Again</h2>" + _evaluation_form(spec.id, form) + back)
    return _page(f"evaluate {spec.id}", body)


def unavailable_page(reason: str) -> str:
    body = (f"<h1>Not ready</h1><p id=\"readiness\" class=\"error\">{escape(reason)}</p>"
            "<p><a href=\"/ui\">All experiments</a></p>")
    return _page("Not ready", body)


def not_found_page(experiment_id: str) -> str:
    body = (f"<h1>No experiment {escape(experiment_id)}</h1>"
            "<p><a href=\"/ui\">All experiments</a></p>")
    return _page("Not found", body)


def _arm_row(arm: ArmState, total: int, recent: float) -> str:
    share = arm.pulls / total if total else 0.0
    mean = "" if arm.mean_reward is None else f"{arm.mean_reward:.4g}"
    return (f"<tr><td>{escape(arm.id)}</td><td>{'yes' if arm.active else 'retired'}</td>"
            f"<td class=\"num\">{arm.pulls}</td>"
            f"<td><meter min=\"0\" max=\"1\" value=\"{share:.4f}\"></meter> "
            f"{100 * share:.1f}%</td><td class=\"num\">{100 * recent:.1f}%</td>"
            f"<td class=\"num\">{mean}</td>"
            f"<td class=\"num\">{_interval(arm)}</td></tr>")


def _interval(arm: ArmState) -> str:
    """The mean reward's normal 95% interval from the arm's residual sum of squares."""
    if arm.mean_reward is None or arm.rss is None or arm.pulls < 2:
        return ""
    half = _Z_95 * math.sqrt(max(arm.rss, 0.0) / (arm.pulls - 1) / arm.pulls)
    return f"[{arm.mean_reward - half:.4g}, {arm.mean_reward + half:.4g}]"


def _rate(part: int, whole: int) -> str:
    return f"{part / whole:.3f}" if whole else ""
