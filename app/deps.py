"""Dependencies: the lifespan's resources, and the two kinds of credentials.

Management (``/experiments``) takes the admin token as
``Authorization: Bearer <token>``; ``/choose`` and ``/reward`` take the
experiment's own key as ``X-API-Key``, and nothing else. Missing credentials
are 401, wrong ones 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Path, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from app.auth import AdminTokens
from app.metrics import Metrics
from app.schemas import DECISION_ID_PATTERN
from service.definition import IdempotencyKey
from service.domain import EXPERIMENT_ID_PATTERN
from service.experiments import ExperimentService
from service.settings import Settings

__all__ = [
    "API_KEY_HEADER",
    "AdminDep",
    "ExperimentCaller",
    "ExperimentCallerDep",
    "ExperimentIdPath",
    "IdempotencyDep",
    "MetricsDep",
    "ServiceDep",
    "SettingsDep",
    "experiment_caller",
]


async def _service(request: Request) -> ExperimentService:
    service: ExperimentService = request.app.state.service
    return service


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


ServiceDep = Annotated[ExperimentService, Depends(_service)]
SettingsDep = Annotated[Settings, Depends(_settings)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
ExperimentIdPath = Annotated[
    str,
    Path(pattern=EXPERIMENT_ID_PATTERN,
         description="1-64 characters of A-Z a-z 0-9 _ . -, not . or .."),
]

_bearer = HTTPBearer(auto_error=False, description="the admin token (LINREBOOT_ADMIN_TOKEN)")
API_KEY_HEADER = "X-API-Key"
_api_key = APIKeyHeader(
    name=API_KEY_HEADER, auto_error=False, description="the experiment's key, from its creation"
)


async def _require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    if credentials is None:
        raise HTTPException(
            401,
            "admin token required: send Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    tokens: AdminTokens = request.app.state.admin_tokens
    if not tokens.valid(credentials.credentials):
        raise HTTPException(403, "the admin token is not valid")


AdminDep = Depends(_require_admin)


async def _idempotency(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    key: Annotated[str | None, Header(
        alias="Idempotency-Key", pattern=DECISION_ID_PATTERN,
        description="1-128 of A-Z a-z 0-9 _ . : -, new for each change: the same request "
        "sent again under it (after a lost reply or a 503) is answered as made, once")] = None,
) -> IdempotencyKey | None:
    """The change's ``Idempotency-Key``, with the admin token it came with (checked by the
    router's :data:`AdminDep` first). The response, whatever its status, says it back
    (:class:`app.middleware.AccessLogMiddleware`): a client then knows that the change
    may be sent again under it."""
    if key is None or credentials is None:
        return None
    request.state.idempotency_key = key
    return IdempotencyKey(key, credentials.credentials)


IdempotencyDep = Annotated[IdempotencyKey | None, Depends(_idempotency)]


@dataclass(frozen=True)
class ExperimentCaller:
    """A ``/choose`` or ``/reward`` call: the ``X-API-Key`` it came with, and the app's parts.

    One dependency instead of four: FastAPI solves each dependency on every
    request, which is a large share of a decision's cost. The key itself is
    checked by the store, in the same script that records the decision or reward.
    """

    key: str
    request: Request

    @property
    def service(self) -> ExperimentService:
        service: ExperimentService = self.request.app.state.service
        return service

    @property
    def settings(self) -> Settings:
        settings: Settings = self.request.app.state.settings
        return settings

    @property
    def metrics(self) -> Metrics:
        metrics: Metrics = self.request.app.state.metrics
        return metrics

    def names(self, experiment_id: str) -> None:
        """The experiment the call is for, for the access log."""
        self.request.state.experiment_id = experiment_id

    def traces(self, decision_ids: list[str]) -> None:
        """The decision (or a batch's decisions) the call made or rewarded, for the access log."""
        if len(decision_ids) == 1:
            self.request.state.decision_id = decision_ids[0]
        else:
            self.request.state.decision_ids = decision_ids


def experiment_caller(request: Request, key: str | None) -> ExperimentCaller:
    """The caller of a decision route; 401 without a key."""
    if not key:
        raise HTTPException(
            401,
            "API key required: send the experiment's key as X-API-Key",
            headers={"WWW-Authenticate": 'ApiKey header="X-API-Key"'},
        )
    return ExperimentCaller(key, request)


async def _experiment_caller(
    request: Request, key: Annotated[str | None, Security(_api_key)]
) -> ExperimentCaller:
    return experiment_caller(request, key)


# What the decision routes declare (for OpenAPI); app.direct_route calls
# experiment_caller itself instead of having FastAPI solve this per request.
ExperimentCallerDep = Annotated[ExperimentCaller, Depends(_experiment_caller)]
