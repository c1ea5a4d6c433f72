"""``/ui``: a browser's view of the experiments, behind the admin token.

The token is typed into a login form and posted as JSON (never in a URL); the
answer is a session cookie (HttpOnly, SameSite=Strict, path /ui) that any worker
checks without state (app.auth.AdminTokens.session). The pages are HTML
(app.ui), not in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Annotated, Any, cast

from fastapi import APIRouter, Cookie, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from app import ui
from app.auth import SESSION_SECONDS, AdminTokens
from app.deps import ServiceDep
from app.schemas import ExperimentOut, LogEntryOut
from app.strict_json import StrictJSONRoute
from policies.config import POLICIES, PolicyName
from service import off_policy
from service.domain import ExperimentView, LogEntry, valid_experiment_id
from service.errors import NotFound, StoreTimedOut, StoreUnavailable
from service.experiments import ExperimentService

router = APIRouter(prefix="/ui", include_in_schema=False, route_class=StrictJSONRoute)
RECENT_ENTRIES = 5000  # an experiment's page reads at most this much of its last hour
COOKIE = "linreboot_ui"
Session = Annotated[str | None, Cookie(alias=COOKIE)]


class LoginIn(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    token: str = Field(min_length=1, max_length=4096)


def _signed_in(request: Request, session: str | None) -> bool:
    tokens: AdminTokens = request.app.state.admin_tokens
    return session is not None and tokens.valid_session(session)


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=ui.HEADERS)


@router.get("")
async def experiments(request: Request, service: ServiceDep, session: Session = None,
                      after: str | None = None) -> Response:
    if not _signed_in(request, session):
        return _html(ui.login_page())
    failure = await _readiness(service)
    not_ready = "" if failure is None else str(failure)
    if isinstance(failure, StoreTimedOut):  # listing would wait out a second deadline
        return _html(ui.experiments_page([], None, time.time(), not_ready), 503)
    try:
        views, next_after = await service.list(limit=100, after=after)
    except StoreUnavailable as exc:  # the page still says why
        return _html(ui.experiments_page([], None, time.time(), not_ready or str(exc)), 503)
    return _html(ui.experiments_page(views, next_after, time.time(), not_ready))


async def _readiness(service: ExperimentService) -> StoreUnavailable | None:
    """As /readyz answers: None when ready, else why not (the store's own words; a full
    store or a replica can still be read, a store that timed out most likely not)."""
    try:
        await service.ready()
    except StoreUnavailable as exc:  # StoreFull and StoreTimedOut among them
        return exc
    return None


@router.get("/experiments/{experiment_id}")
async def experiment(request: Request, experiment_id: str, service: ServiceDep,
                     session: Session = None) -> Response:
    if not _signed_in(request, session):
        return RedirectResponse("/ui", status_code=303)
    try:
        view = await _experiment(service, experiment_id)
        if view is None:
            return _html(ui.not_found_page(experiment_id), 404)
        now = time.time()
        entries, capped = await _log_since(service, experiment_id, now - 3600, RECENT_ENTRIES)
    except NotFound:  # deleted meanwhile
        return _html(ui.not_found_page(experiment_id), 404)
    except StoreUnavailable as exc:
        return _html(ui.unavailable_page(str(exc)), 503)
    return _html(ui.experiment_page(view, ui.recent_activity(entries, now, capped),
                                    ui.recent_shares(entries)))


@router.get("/experiments/{experiment_id}/evaluate")
async def evaluate(request: Request, experiment_id: str, service: ServiceDep,
                   session: Session = None, policy: str = "", hyperparameters: str = "",
                   minutes: str = "60", train_fraction: str = "0.5") -> Response:
    """Another policy's value on the experiment's recent log (service.off_policy, as
    ``linreboot evaluate`` computes it on an export): a page with IPS, SNIPS and DR.
    Every field is checked before the log is read; a wrong one gets the form back with
    a 400 that says what is wrong."""
    if not _signed_in(request, session):
        return RedirectResponse("/ui", status_code=303)
    try:
        view = await _experiment(service, experiment_id)
    except StoreUnavailable as exc:
        return _html(ui.unavailable_page(str(exc)), 503)
    if view is None:
        return _html(ui.not_found_page(experiment_id), 404)
    form = ui.EvaluationForm(policy=policy or view.spec.policy, hyperparameters=hyperparameters,
                             minutes=minutes, train_fraction=train_fraction)
    try:
        target = _target(view, form)
    except (ValueError, TypeError) as exc:
        return _html(ui.evaluation_page(view, form, error=str(exc)), 400)
    since = time.time() - 60 * int(form.minutes) if int(form.minutes) else 0.0
    try:
        entries, capped = await service.read_latest_log(
            experiment_id, since, ui.EVALUATED_ENTRIES, ui.EVALUATED_BYTES)
    except NotFound:
        return _html(ui.not_found_page(experiment_id), 404)
    except StoreUnavailable as exc:
        return _html(ui.evaluation_page(view, form, error=str(exc)), 503)
    try:
        report = await asyncio.to_thread(_evaluated, view, entries, target)
    except (ValueError, TypeError) as exc:
        return _html(ui.evaluation_page(view, form, error=str(exc)), 400)
    except KeyError:  # the log names an arm the view read before it lacks
        return _html(ui.evaluation_page(view, form, error=(
            "the experiment changed while its log was read (an arm was added): evaluate "
            "again")), 409)
    return _html(ui.evaluation_page(view, form, report=report, entries=len(entries),
                                    capped=capped))


@dataclass(frozen=True)
class _Target:
    """The evaluation form, checked: the target policy (None: the experiment's own, with
    its hyperparameters), the overrides and the training share."""

    policy: PolicyName | None
    overrides: dict[str, str]
    fraction: float


def _target(view: ExperimentView, form: ui.EvaluationForm) -> _Target:
    if form.minutes not in {str(minutes) for minutes, _ in ui.WINDOWS}:
        raise ValueError("the stretch of log is one of the form's (minutes "
                         f"{', '.join(str(m) for m, _ in ui.WINDOWS)}; 0: the whole log)")
    if form.policy not in POLICIES:
        raise ValueError(f"unknown policy {form.policy!r}: one of {', '.join(POLICIES)}")
    try:
        fraction = float(form.train_fraction)
    except ValueError:
        raise ValueError(f"the training share must be a number (got {form.train_fraction!r})"
                         ) from None
    if not 0.0 <= fraction < 1.0:  # (NaN too)
        raise ValueError("the training share must be at least 0 and below 1")
    overrides = off_policy.parse_overrides(form.hyperparameters.split())
    # The experiment's own policy keeps its hyperparameters (overrides on top); another
    # takes the paper's defaults, as linreboot evaluate --policy does. Its configuration
    # is made here as the evaluation makes it: refused now, not after the log's read.
    named = None if form.policy == view.spec.policy else cast(PolicyName, form.policy)
    off_policy.target_config(dict(view.config), named, overrides, view.spec.setting,
                             view.spec.dim)
    return _Target(named, overrides, fraction)


def _evaluated(view: ExperimentView, entries: list[LogEntry], target: _Target
               ) -> off_policy.Report:
    """``target`` evaluated on ``entries`` (the export's records and feedback, built
    from the API's own JSON of the experiment and the log)."""
    experiment: dict[str, Any] = ExperimentOut.from_domain(view).model_dump(mode="json")
    logged = [LogEntryOut.from_domain(e).model_dump(mode="json") for e in entries]
    feedback = off_policy.bandit_feedback(experiment, off_policy.join(experiment, logged))
    return off_policy.evaluate(feedback, target.policy, target.overrides, target.fraction)


async def _experiment(service: ExperimentService, experiment_id: str) -> ExperimentView | None:
    """The experiment's view; None if there is none (StoreUnavailable as it comes)."""
    try:
        if not valid_experiment_id(experiment_id):
            raise NotFound(experiment_id)
        return await service.get(experiment_id)
    except NotFound:
        return None


async def _log_since(service: ExperimentService, experiment_id: str, since: float,
                     cap: int) -> tuple[list[LogEntry], bool]:
    """The decision log's entries from ``since`` (seconds since the epoch; the log's ids
    are times), at most ``cap``; and whether the read stopped there."""
    entries: list[LogEntry] = []
    after: str | None = f"{int(since * 1000)}-0"
    while after is not None and len(entries) < cap:
        page, after = await service.read_log(experiment_id, after, 1000)
        entries += page
    return entries[:cap], after is not None or len(entries) > cap


@router.post("/login")
async def login(request: Request, body: LoginIn) -> Response:
    tokens: AdminTokens = request.app.state.admin_tokens
    session = tokens.session(body.token)
    if session is None:
        return JSONResponse({"error": "forbidden", "message": "the admin token is not valid"},
                            status_code=403)
    response = JSONResponse({"status": "signed in"})
    response.set_cookie(COOKIE, session, max_age=SESSION_SECONDS, path="/ui", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/logout")
async def logout() -> Response:
    response = JSONResponse({"status": "signed out"})
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response
