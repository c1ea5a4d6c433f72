"""The pages of ``/ui``: server-rendered HTML, every value escaped, the assets of
``app/static/ui`` (no CDN, no inline script: the pages' Content-Security-Policy
allows nothing but the app's own files)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from policies import HYPERPARAMETERS
from service.domain import ArmState, ExperimentView

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
REFRESH_SECONDS = 5  # an experiment's page reloads itself this often
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


def experiments_page(views: Sequence[ExperimentView], next_after: str | None) -> str:
    rows = "".join(
        f"<tr><td><a href=\"/ui/experiments/{escape(v.spec.id)}\">{escape(v.spec.id)}</a></td>"
        f"<td>{escape(v.spec.policy)}</td><td>{escape(v.spec.setting)}</td>"
        f"<td class=\"num\">{sum(a.active for a in v.arms)}</td>"
        f"<td class=\"num\">{v.decisions}</td><td class=\"num\">{v.rewards}</td>"
        f"<td class=\"num\">{_rate(v.rewards, v.decisions)}</td>"
        f"<td class=\"num\">{v.defaulted}</td><td class=\"num\">{v.late}</td></tr>"
        for v in views)
    more = (f"<p><a href=\"/ui?after={escape(next_after)}\">Next page</a></p>"
            if next_after else "")
    body = (
        "<h1>Experiments</h1>"
        + ("<table><thead><tr><th>id</th><th>policy</th><th>setting</th>"
           "<th class=\"num\">active arms</th><th class=\"num\">decisions</th>"
           "<th class=\"num\">rewards</th><th class=\"num\">share rewarded</th>"
           "<th class=\"num\">default rewards</th><th class=\"num\">late rewards</th></tr>"
           f"</thead><tbody>{rows}</tbody></table>" if views
           else "<p class=\"muted\">No experiments yet: create one with POST /experiments.</p>")
        + more
    )
    return _page("Experiments", body)


def experiment_page(view: ExperimentView) -> str:
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
    arms = "".join(_arm_row(arm, total) for arm in view.arms)
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
        "<th class=\"num\">mean reward</th><th class=\"num\">95% interval</th></tr></thead>"
        f"<tbody>{arms}</tbody></table>"
        + (f"<h2>Estimated theta</h2><table><tbody>{theta}</tbody></table>" if theta else "")
        + f"<h2>Settings</h2><table><tbody>{settings}</tbody></table>"
        + f"<p class=\"muted\">This page reloads every {REFRESH_SECONDS} s.</p>"
    )
    return _page(spec.id, body, refresh=REFRESH_SECONDS)


def not_found_page(experiment_id: str) -> str:
    body = (f"<h1>No experiment {escape(experiment_id)}</h1>"
            "<p><a href=\"/ui\">All experiments</a></p>")
    return _page("Not found", body)


def _arm_row(arm: ArmState, total: int) -> str:
    share = arm.pulls / total if total else 0.0
    mean = "" if arm.mean_reward is None else f"{arm.mean_reward:.4g}"
    return (f"<tr><td>{escape(arm.id)}</td><td>{'yes' if arm.active else 'retired'}</td>"
            f"<td class=\"num\">{arm.pulls}</td>"
            f"<td><meter min=\"0\" max=\"1\" value=\"{share:.4f}\"></meter> "
            f"{100 * share:.1f}%</td><td class=\"num\">{mean}</td>"
            f"<td class=\"num\">{_interval(arm)}</td></tr>")


def _interval(arm: ArmState) -> str:
    """The mean reward's normal 95% interval from the arm's residual sum of squares."""
    if arm.mean_reward is None or arm.rss is None or arm.pulls < 2:
        return ""
    half = _Z_95 * math.sqrt(max(arm.rss, 0.0) / (arm.pulls - 1) / arm.pulls)
    return f"[{arm.mean_reward - half:.4g}, {arm.mean_reward + half:.4g}]"


def _rate(part: int, whole: int) -> str:
    return f"{part / whole:.3f}" if whole else ""
