"""DirectRoute: FastAPI documents /choose and /reward, DirectRoute serves them.

The behaviour of both routes (401, 422 in FastAPI's format, statuses) is
tested through the app in test_app_api and test_app_validation; here: the
OpenAPI description still says what the handler does, and a route whose
signature DirectRoute cannot serve is refused when the app is built.
"""

from __future__ import annotations

import pytest
from fastapi import APIRouter
from pydantic import SecretStr

from app.deps import ExperimentCallerDep
from app.direct_route import DirectRoute
from app.main import create_app
from app.schemas import ChooseIn, DecisionOut
from service.settings import Settings


def test_openapi_documents_the_directly_served_routes() -> None:
    spec = create_app(Settings(admin_token=SecretStr("x" * 32))).openapi()
    for path, body in (("/choose", "ChooseIn"), ("/reward", "RewardIn")):
        operation = spec["paths"][path]["post"]
        assert operation["security"] == [{"APIKeyHeader": []}]
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith(f"/{body}")
        assert {"200", "401", "403", "422"} <= set(operation["responses"])
    assert spec["components"]["securitySchemes"]["APIKeyHeader"]["name"] == "X-API-Key"


def test_a_route_direct_route_cannot_serve_is_refused() -> None:
    router = APIRouter(route_class=DirectRoute)

    async def no_caller(body: ChooseIn) -> DecisionOut:
        raise AssertionError("never called")

    async def not_a_model(body: int, caller: ExperimentCallerDep) -> DecisionOut:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="body, caller"):
        router.post("/no-caller")(no_caller)
    with pytest.raises(TypeError, match="pydantic model"):
        router.post("/not-a-model")(not_a_model)
