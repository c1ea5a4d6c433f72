"""DirectRoute: FastAPI documents /choose and /reward, DirectRoute serves them.

The behaviour of both routes (401, 422 in FastAPI's format, statuses) is
tested through the app in test_app_api and test_app_validation; here: the
OpenAPI description still says what the handler does, and a route whose
signature DirectRoute cannot serve is refused when the app is built; and the
lane (DirectLaneAPI) answers every request the whole stack would answer, the same.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from pydantic import SecretStr

from app.deps import ExperimentCallerDep
from app.direct_route import DirectLaneAPI, DirectRoute
from app.main import create_app
from app.schemas import ChooseIn, DecisionOut
from service.settings import Settings
from tests.conftest import ADMIN_TOKEN


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


# Requests to the direct paths whose answers do not depend on the draw: each is
# answered by the lane as FastAPI's whole stack answers it.
def _requests(key: str, decision_id: str) -> list[tuple[str, dict[str, str], bytes]]:
    json_ = {"Content-Type": "application/json"}
    keyed = {**json_, "X-API-Key": key}
    choose = b'{"experiment_id": "sto"}'
    return [
        ("/choose", json_, choose),  # no key: 401
        ("/choose", {**json_, "X-API-Key": "wrong"}, choose),  # 403
        ("/choose", keyed, b'{"experiment_id": "nope"}'),  # a missing experiment: 403
        ("/choose", keyed, b'{"experiment_id": "sto"'),  # malformed JSON: 422
        ("/choose", {**keyed, "Content-Type": "text/plain"}, choose),  # 415
        ("/choose", keyed, b'{"experiment_id": "sto", "excluded": ["zz"]}'),  # unknown arm
        ("/choose", keyed, b'{"experiment_id": "sto", "pad": "' + b"x" * 5000 + b'"}'),  # 413
        ("/choose", keyed, b""),  # no body: 422
        ("/reward", keyed, b'{"experiment_id": "sto", "decision_id": "' + b"0" * 32
         + b'", "reward": 1}'),  # 404
        ("/reward", keyed, b'{"experiment_id": "sto", "decision_id": "' + decision_id.encode()
         + b'", "reward": NaN}'),  # 422
        ("/reward", keyed, b'{"experiment_id": "sto", "decision_id": "' + decision_id.encode()
         + b'", "reward": 0.5}'),  # applied: 200
    ]


@pytest.mark.anyio
async def test_the_lane_answers_as_the_whole_stack_does(app_settings: Settings) -> None:
    settings = app_settings.model_copy(update={"max_body_bytes": 4096})
    lane, stack = create_app(settings), create_app(settings)
    assert isinstance(stack, DirectLaneAPI)
    stack.lane = False  # every request through FastAPI's stack
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    answers: dict[str, list[tuple[int, bytes, str | None]]] = {}
    async with lane.router.lifespan_context(lane), stack.router.lifespan_context(stack):
        for name, app in (("lane", lane), ("stack", stack)):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                created = await http.post("/experiments", headers=admin, json={
                    "id": "sto", "setting": "stochastic", "dim": 2,
                    "arms": [{"id": "a", "features": [1, 0]}, {"id": "b", "features": [0, 1]}]})
                key = created.json()["api_key"]
                decision = (await http.post("/choose", json={"experiment_id": "sto"},
                                            headers={"X-API-Key": key})).json()["decision_id"]
                answers[name] = []
                for path, headers, body in _requests(key, decision):
                    response = await http.post(path, headers=headers, content=body)
                    # The id and the request id differ between the runs; the rest may not.
                    text = response.content.replace(decision.encode(), b"<id>")
                    answers[name].append((response.status_code, text,
                                          response.headers.get("allow")))
                    assert response.headers["x-request-id"]
                await http.delete("/experiments/sto", headers=admin)
    assert answers["lane"] == answers["stack"]
    assert [status for status, _, _ in answers["lane"]] == [
        401, 403, 403, 422, 415, 422, 413, 422, 404, 422, 200]


@pytest.mark.anyio
async def test_the_lane_is_taken_by_the_direct_paths_only(
    app: DirectLaneAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POST /choose and /reward take the lane; every other request (another method, a
    path with a slash more, a root path) FastAPI's stack."""
    taken: list[str] = []
    paths, lane = app._direct

    async def counted_lane(scope: Any, receive: Any, send: Any) -> None:
        taken.append("lane")
        await lane(scope, receive, send)

    stack = FastAPI.__call__

    async def counted_stack(self: FastAPI, scope: Any, receive: Any, send: Any) -> None:
        taken.append("stack")
        await stack(self, scope, receive, send)

    monkeypatch.setitem(app.__dict__, "_direct", (paths, counted_lane))
    monkeypatch.setattr(FastAPI, "__call__", counted_stack)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        for method, path in (("POST", "/choose"), ("POST", "/reward"), ("GET", "/choose"),
                             ("POST", "/choose/"), ("POST", "/experiments")):
            await http.request(method, path, json={})
    rooted = httpx.ASGITransport(app=app, raise_app_exceptions=False, root_path="/api")
    async with httpx.AsyncClient(transport=rooted, base_url="http://t") as http:
        await http.post("/api/choose", json={})
    assert taken == ["lane", "lane", "stack", "stack", "stack", "stack"]


@pytest.mark.anyio
@pytest.mark.parametrize("failing", ["the endpoint", "the exception handler"])
async def test_the_lane_answers_a_failure_as_the_stack_does(
    app_settings: Settings, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """An unexpected error in the endpoint, or in the handler of an expected one: the
    JSON 500 of the app's handler, and the error raised again for the server to log."""
    from service.errors import DomainError, Forbidden

    lane, stack = create_app(app_settings), create_app(app_settings)
    assert isinstance(stack, DirectLaneAPI)
    stack.lane = False
    answers: list[object] = []
    async with lane.router.lifespan_context(lane), stack.router.lifespan_context(stack):
        for app in (lane, stack):
            async def broken(*_args: object) -> None:
                raise RuntimeError("broken") if failing == "the endpoint" else Forbidden("no")

            async def failing_handler(*_args: object) -> None:
                raise RuntimeError("the handler failed")

            monkeypatch.setattr(app.state.service, "choose", broken)
            if failing == "the exception handler":
                monkeypatch.setitem(app.exception_handlers, DomainError, failing_handler)
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                with pytest.raises(RuntimeError) as raised:
                    await http.post("/choose", json={"experiment_id": "x"},
                                    headers={"X-API-Key": "k"})
            answers.append(str(raised.value))
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                response = await http.post("/choose", json={"experiment_id": "x"},
                                           headers={"X-API-Key": "k"})
            answers.append((response.status_code, response.json()))
    assert answers[:2] == answers[2:]
    assert answers[1] == (500, {"error": "internal_error", "message": "internal server error"})
