"""``/ui``: a browser's view of the experiments, behind the admin token.

The token is typed into a login form and posted as JSON (never in a URL); the
answer is a session cookie (HttpOnly, SameSite=Strict, path /ui) that any worker
checks without state (app.auth.AdminTokens.session). The pages are HTML
(app.ui), not in the OpenAPI document.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Cookie, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from app import ui
from app.auth import SESSION_SECONDS, AdminTokens
from app.deps import ServiceDep
from app.strict_json import StrictJSONRoute
from service.domain import LogEntry, valid_experiment_id
from service.errors import NotFound
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
    views, next_after = await service.list(limit=100, after=after)
    return _html(ui.experiments_page(views, next_after))


@router.get("/experiments/{experiment_id}")
async def experiment(request: Request, experiment_id: str, service: ServiceDep,
                     session: Session = None) -> Response:
    if not _signed_in(request, session):
        return RedirectResponse("/ui", status_code=303)
    try:
        if not valid_experiment_id(experiment_id):
            raise NotFound(experiment_id)
        view = await service.get(experiment_id)
    except NotFound:
        return _html(ui.not_found_page(experiment_id), 404)
    now = time.time()
    entries, capped = await _last_hour(service, experiment_id, now)
    return _html(ui.experiment_page(view, ui.recent_activity(entries, now, capped),
                                    ui.recent_shares(entries)))


async def _last_hour(service: ExperimentService, experiment_id: str, now: float
                     ) -> tuple[list[LogEntry], bool]:
    """The decision log's entries of the last hour, at most RECENT_ENTRIES (the log's
    ids are times: the read starts at an hour ago); and whether it stopped there."""
    entries: list[LogEntry] = []
    after: str | None = f"{int((now - 3600) * 1000)}-0"
    while after is not None and len(entries) < RECENT_ENTRIES:
        page, after = await service.read_log(experiment_id, after, 1000)
        entries += page
    return entries[:RECENT_ENTRIES], after is not None or len(entries) > RECENT_ENTRIES


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
