"""The OpenAPI document, with the constraints validation really enforces.

FastAPI passes every schema through its own OpenAPI model, which turns each
numeric bound into a float (``seed``'s maximum 2**63 - 1 became
9.223372036854776e18, which is 2**63), and a model cannot know the limits
that come from :class:`service.settings.Settings`. So the published
document takes each request model's schema from pydantic itself (exact
integers), and a constraint marked with a setting's name
(:data:`app.schemas.SETTINGS_LIMITS`) gets that setting's running value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from app.schemas import SETTINGS_LIMITS, request_models
from service.settings import Settings

__all__ = ["publish_limits"]

_REF_TEMPLATE = "#/components/schemas/{model}"


def publish_limits(app: FastAPI, settings: Settings) -> None:
    """Make ``app.openapi()`` publish exact request schemas and ``settings``' limits."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()  # cached by FastAPI as app.openapi_schema
            _exact_request_schemas(document)
            _resolve_limits(document, settings)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def _exact_request_schemas(document: dict[str, Any]) -> None:
    schemas = document.get("components", {}).get("schemas", {})
    for model in request_models():
        if model.__name__ in schemas:
            schema = model.model_json_schema(ref_template=_REF_TEMPLATE)
            schema.pop("$defs", None)  # each nested model is a component of its own
            schemas[model.__name__] = schema


def _resolve_limits(node: Any, settings: Settings) -> None:
    if isinstance(node, dict):
        for keyword, name in node.pop(SETTINGS_LIMITS, {}).items():
            value = getattr(settings, name.removeprefix("-"))
            node[keyword] = -value if name.startswith("-") else value
        for value in node.values():
            _resolve_limits(value, settings)
    elif isinstance(node, list):
        for value in node:
            _resolve_limits(value, settings)
