"""Error responses for the OpenAPI document (the handlers are in :mod:`app.errors`)."""

from __future__ import annotations

from typing import Any

from app.schemas import ErrorOut, RewardOut

__all__ = ["ADMIN_ERRORS", "KEY_ERRORS", "REWARD_RESPONSES", "STORE_ERRORS"]

Responses = dict[int | str, dict[str, Any]]


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description}


STORE_ERRORS: Responses = {
    503: _error("Redis is unavailable (store_unavailable) or out of memory (store_full); "
                "retry after the Retry-After header's seconds"),
}
_BODY_ERRORS: Responses = {
    413: _error("the body is larger than max_body_bytes"),
    415: _error("the body is not declared as JSON: send Content-Type: application/json"),
    422: _error("the request is invalid; details says where and why, without echoing it"),
}
ADMIN_ERRORS: Responses = {
    401: _error("no admin token (Authorization: Bearer <token>)"),
    403: _error("wrong admin token"),
    404: _error("no such experiment or arm"),
    409: _error("an experiment or arm with this id already exists"),
    **_BODY_ERRORS,
    **STORE_ERRORS,
}
KEY_ERRORS: Responses = {
    401: _error("no X-API-Key header"),
    403: _error("the key is not this experiment's, or there is no such experiment (the same "
                "answer, so that ids cannot be probed without a key)"),
    **_BODY_ERRORS,
    **STORE_ERRORS,
}
REWARD_RESPONSES: Responses = {
    404: {
        "model": RewardOut,
        "description": "single reward: no pending decision with this id in this experiment "
        "(unknown, expired or another experiment's), status not_found",
    },
    409: {
        "model": RewardOut,
        "description": "single reward: a different reward was already applied (status "
        "conflict), or the decision's window has ended and its default reward counts instead "
        "(status late)",
    },
}
