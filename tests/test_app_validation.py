"""Bad input is refused with a 4xx that says what is wrong, echoes nothing, changes nothing.

Each table row is (name, body, status, words the message must contain, strings
the response must not contain). Bodies are raw JSON text so that the
non-standard tokens (NaN, Infinity) can be sent as a careless client would.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.schemas import (
    DECISION_ID_PATTERN,
    MAX_LOG_AGE_SECONDS,
    MAX_LOG_ENTRIES,
    MAX_SEED,
    MAX_SHARDS,
    MAX_SLOTS,
    MAX_STALE_REWARDS,
    REWARDED_ID_PATTERN,
)
from service.domain import ARM_ID_PATTERN, EXPERIMENT_ID_PATTERN
from service.settings import Settings
from tests.conftest import ADMIN, COVARIATES, STOCHASTIC, Api

pytestmark = pytest.mark.anyio

Case = tuple[str, str, int, tuple[str, ...], tuple[str, ...]]
_SETTINGS = Settings()
_MAX_BODY = _SETTINGS.max_body_bytes
_MAX_ARMS = _SETTINGS.max_arms
_MAX_DIM = _SETTINGS.max_dim
_MAX_BATCH = _SETTINGS.max_batch_rewards

_NON_FINITE = ("non-finite",)
_NOT_A_NUMBER = ("valid number",)
_BOUND = ("bound",)
_PATTERN = ("pattern",)


def _choose(context: str, extra: str = "", experiment: str = '"cov"') -> str:
    return f'{{"experiment_id": {experiment}, "context": {context}{extra}}}'


CHOOSE_CASES: list[Case] = [
    ("bare NaN", _choose("[0.5, NaN, 0.25]"), 422, _NON_FINITE, ("NaN",)),
    ("bare Infinity", _choose("[0.5, Infinity, 0.25]"), 422, _NON_FINITE, ("Infinity",)),
    ("bare -Infinity", _choose("[-Infinity, 0.5, 0.25]"), 422, _NON_FINITE, ("Infinity",)),
    ('"NaN" string', _choose('[0.5, "NaN", 0.25]'), 422, _NOT_A_NUMBER, ("NaN",)),
    ('"Infinity" string', _choose('["Infinity", 0.5, 0.25]'), 422, _NOT_A_NUMBER, ("Infinity",)),
    ("numeric string", _choose('["0.75", 0.5, 0.25]'), 422, _NOT_A_NUMBER, ("0.75",)),
    ("1e309 overflows", _choose("[0.5, 1e309, 0.25]"), 422, _NON_FINITE, ("1e309", "inf")),
    ("above the bound", _choose("[0.5, 1e7, 0.25]"), 422, _BOUND, ("1e7", "1e+07", "10000000")),
    ("boolean", _choose("[0.5, true, 0.25]"), 422, _NOT_A_NUMBER, ("true",)),
    ("too short", _choose("[0.5, 0.25]"), 422, ("context", "3"), ()),
    ("too long", _choose("[0.5, 0.25, 0.125, 0.0625]"), 422, ("context", "3"), ()),
    ("above max_dim", _choose(json.dumps([0.5] * (_MAX_DIM + 1))), 422, ("at most",), ()),
    ("missing context", '{"experiment_id": "cov"}', 422, ("context",), ()),
    ("context null", _choose("null"), 422, ("context",), ()),
    ("context not a list", _choose('{"x": 1}'), 422, ("context", "list"), ()),
    ("arm_contexts for covariates", '{"experiment_id": "cov", "arm_contexts": '
     '{"a": [1, 2, 3]}, "context": [1, 2, 3]}', 422, ("arm_contexts",), ()),
    ("unknown arm", _choose("[0.5, 0.5, 0.5]", ', "eligible": ["ghost-arm"]'), 422,
     ("arm",), ("ghost-arm",)),
    ("unknown excluded arm", _choose("[0.5, 0.5, 0.5]", ', "excluded": ["ghost-arm"]'), 422,
     ("arm",), ("ghost-arm",)),
    ("arm id with braces", _choose("[0.5, 0.5, 0.5]", ', "eligible": ["ev{il}"]'), 422,
     _PATTERN, ("ev{il}",)),
    ("empty arm id", _choose("[0.5, 0.5, 0.5]", ', "eligible": [""]'), 422, _PATTERN, ()),
    ("duplicate eligible", _choose("[0.5, 0.5, 0.5]", ', "eligible": ["a", "a"]'), 422,
     ("distinct",), ()),
    ("everything excluded", _choose("[0.5, 0.5, 0.5]", ', "excluded": ["a", "b"]'), 422,
     ("eligible",), ()),
    ("arm_contexts key with a bad value", '{"experiment_id": "cov", "arm_contexts": '
     '{"evil-key": ["x", 2, 3]}}', 422, _NOT_A_NUMBER, ("evil-key",)),
    ("arm_contexts key that is a field name", '{"experiment_id": "cov", "arm_contexts": '
     '{"eligible": ["x", 2, 3]}}', 422, _NOT_A_NUMBER, ("eligible",)),
    ("arm_contexts key with markup and a bad value", '{"experiment_id": "cov", "arm_contexts": '
     '{"<script>alert(1)</script>": [true]}}', 422, _PATTERN, ("script", "alert")),
    ("arm_contexts key over the bound", '{"experiment_id": "ctx", "arm_contexts": '
     '{"evil-key": [1e7, 0]}}', 422, _BOUND, ("evil-key",)),
    ("unknown field with markup", _choose("[0.5, 0.5, 0.5]", ', "<img src=x onerror=1>": 1'),
     422, ("extra",), ("img", "onerror")),
    ("unknown field with control chars", _choose("[0.5, 0.5, 0.5]", ', "\\u001b[31mRED\\u0007": 1'),
     422, ("extra",), ("\\u001b", "\\u0007", "31mRED")),
    ("arm_contexts key with braces", '{"experiment_id": "cov", "arm_contexts": '
     '{"ev{il}": [1, 2, 3]}}', 422, _PATTERN, ("ev{il}",)),
    ("experiment id with control char", _choose("[0.5, 0.5, 0.5]", "", '"evil\\u0001id"'), 422,
     _PATTERN, ("evil",)),
    ("experiment id with newline", _choose("[0.5, 0.5, 0.5]", "", '"cov\\n"'), 422,
     _PATTERN, ()),
    ("experiment id with braces", _choose("[0.5, 0.5, 0.5]", "", '"ev{il}"'), 422,
     _PATTERN, ("ev{il}",)),
    ("experiment id a number", _choose("[0.5, 0.5, 0.5]", "", "17"), 422,
     ("valid string",), ()),
    ("unknown field", _choose("[0.5, 0.5, 0.5]", ', "contxt": [1]'), 422, ("extra",), ()),
    ("not an object", "[1, 2, 3]", 422, ("object",), ()),
    ("null body", "null", 422, ("required",), ()),
    ("malformed JSON", '{"experiment_id": "cov", "context": [0.5,', 422, ("invalid json",),
     ()),
    ("deeply nested", "[" * 100_000 + "]" * 100_000, 422, ("invalid json",), ()),
    ("5,001-digit integer", _choose(f"[0.5, {'7' * 5001}, 0.25]"), 422,
     ("more than 4300 digits",), ("UTF-8", "7" * 20)),
    ("401-digit integer (beyond a float, within Python's int limit)",
     _choose(f"[0.5, {'7' * 401}, 0.25]"), 422, ("beyond 1.8e308",), ("7" * 20,)),
    ("5,001-digit seed in a field of ints", _choose("[0.5, 0.5, 0.5]", f', "seed": -{"7" * 5001}'),
     422, ("more than 4300 digits",), ("UTF-8", "7" * 20)),
    ("not UTF-8", '{"experiment_id": "cov", "context": [0.5, 0.5, 0.5], "x": "\udcff"}', 422,
     ("UTF-8",), ()),
    ("oversized body", _choose("[0.5, 0.5, 0.5]", f', "pad": "{"x" * _MAX_BODY}"'), 413,
     ("larger than",), ("xxxx",)),
]


def _reward(reward: str, decision: str = '"DECISION"') -> str:
    return f'{{"experiment_id": "cov", "decision_id": {decision}, "reward": {reward}}}'


def _batch(*items: str) -> str:
    return f'{{"experiment_id": "cov", "rewards": [{", ".join(items)}]}}'


_GOOD_ITEM = '{"decision_id": "DECISION", "reward": 1.0}'

REWARD_CASES: list[Case] = [
    ("bare NaN", _reward("NaN"), 422, _NON_FINITE, ("NaN",)),
    ("bare Infinity", _reward("Infinity"), 422, _NON_FINITE, ("Infinity",)),
    ('"NaN" string', _reward('"NaN"'), 422, _NOT_A_NUMBER, ("NaN",)),
    ('"Infinity" string', _reward('"Infinity"'), 422, _NOT_A_NUMBER, ("Infinity",)),
    ("1e309 overflows", _reward("1e309"), 422, _NON_FINITE, ("1e309", "inf")),
    ("above the bound", _reward("1e7"), 422, _BOUND, ("1e7", "1e+07", "10000000")),
    ("boolean", _reward("true"), 422, _NOT_A_NUMBER, ("true",)),
    ("null reward", _reward("null"), 422, ("reward",), ()),
    ("missing reward", '{"experiment_id": "cov", "decision_id": "DECISION"}', 422,
     ("reward",), ()),
    ("neither form", '{"experiment_id": "cov"}', 422, ("rewards",), ()),
    ("both forms", _reward("1.0").rstrip("}") + f', "rewards": [{_GOOD_ITEM}]}}', 422,
     ("either",), ()),
    ("decision id with braces", _reward("1.0", '"ev{il}"'), 422, _PATTERN, ("ev{il}",)),
    ("decision id with control char", _reward("1.0", '"evil\\u0007"'), 422, _PATTERN,
     ("evil",)),
    ("empty batch", _batch(), 422, ("rewards",), ()),
    ("batch with one NaN", _batch(_GOOD_ITEM, '{"decision_id": "DECISION", "reward": NaN}'),
     422, _NON_FINITE, ("NaN",)),
    ("batch with one above the bound",
     _batch(_GOOD_ITEM, '{"decision_id": "DECISION", "reward": -2e6}'), 422, _BOUND,
     ("2e6", "2e+06", "2000000")),
    ("batch with a boolean", _batch(_GOOD_ITEM, '{"decision_id": "DECISION", "reward": false}'),
     422, _NOT_A_NUMBER, ("false",)),
    ("batch too large", _batch(*[_GOOD_ITEM] * (_MAX_BATCH + 1)), 422, ("at most",), ()),
    ("batch item with extra field",
     _batch('{"decision_id": "DECISION", "reward": 1.0, "weight": 2}'), 422, ("extra",), ()),
    ("batch item with a marked-up field",
     _batch('{"decision_id": "DECISION", "reward": 1.0, "<b>bold</b>": 2}'), 422, ("extra",),
     ("<b>", "bold", "\\u003c")),
    ("oversized body", _reward("1.0").rstrip("}") + f', "pad": "{"x" * _MAX_BODY}"}}', 413,
     ("larger than",), ("xxxx",)),
]


def _create(**changes: object) -> str:
    return json.dumps({**COVARIATES, "id": "new", **changes})


def _arms(*ids: str) -> list[dict[str, object]]:
    return [{"id": i} for i in ids]


_STOCHASTIC_NEW = {**STOCHASTIC, "id": "new"}

CREATE_CASES: list[Case] = [
    ("NaN feature", json.dumps(_STOCHASTIC_NEW).replace("1.0, 0.0", "NaN, 0.0"), 422,
     _NON_FINITE, ("NaN",)),
    ("Infinity feature", json.dumps(_STOCHASTIC_NEW).replace("1.0, 0.0", "Infinity, 0.0"), 422,
     _NON_FINITE, ("Infinity",)),
    ("1e309 feature", json.dumps(_STOCHASTIC_NEW).replace("1.0, 0.0", "1e309, 0.0"), 422,
     _NON_FINITE, ("1e309",)),
    ('"NaN" feature', json.dumps(_STOCHASTIC_NEW).replace("1.0, 0.0", '"NaN", 0.0'), 422,
     _NOT_A_NUMBER, ("NaN",)),
    ("feature above the bound", json.dumps(_STOCHASTIC_NEW).replace("1.0, 0.0", "1e7, 0.0"), 422,
     _BOUND, ("1e7", "1e+07", "10000000")),
    ("boolean feature", json.dumps(_STOCHASTIC_NEW).replace("1.0, 0.0", "true, 0.0"), 422,
     _NOT_A_NUMBER, ("true",)),
    ("features of the wrong length",
     json.dumps(_STOCHASTIC_NEW).replace("1.0, 0.0", "1.0, 0.0, 0.0"), 422, ("features",), ()),
    ("features outside the stochastic setting",
     _create(arms=[{"id": "a", "features": [1, 2, 3]}]), 422, ("features",), ()),
    ("duplicate arm ids", _create(arms=_arms("a", "b", "a")), 422, ("distinct",), ()),
    ("empty arm id", _create(arms=_arms("a", "")), 422, _PATTERN, ()),
    ("arm id with braces", _create(arms=_arms("a", "ev{il}")), 422, _PATTERN, ("ev{il}",)),
    ("arm id with control char", _create(arms=_arms("a", "evil\x00")), 422, _PATTERN,
     ("evil",)),
    ("no arms", _create(arms=[]), 422, ("arms",), ()),
    ("too many arms", _create(arms=_arms(*(f"arm{i}" for i in range(_MAX_ARMS + 1)))), 422,
     ("at most",), (f"arm{_MAX_ARMS}",)),
    ("id with control char", _create(id="evil\x1bid"), 422, _PATTERN, ("evil",)),
    ("id with braces", _create(id="ev{il}"), 422, _PATTERN, ("ev{il}",)),
    ("id too long", _create(id="x" * 65), 422, _PATTERN, ("x" * 65,)),
    ("empty id", _create(id=""), 422, _PATTERN, ()),
    ("id .", _create(id="."), 422, _PATTERN, ()),  # a URL cannot name it: /experiments/.
    ("id ..", _create(id=".."), 422, _PATTERN, ()),
    ("dim boolean", _create(dim=True), 422, ("valid integer",), ("true",)),
    ("dim float", _create(dim=3.0), 422, ("valid integer",), ()),
    ("dim zero", _create(dim=0), 422, ("greater than",), ()),
    ("dim above max_dim", _create(dim=_MAX_DIM + 1), 422, ("at most",), ()),
    ("unknown setting", _create(setting="adversarial"), 422, ("stochastic",), ("adversarial",)),
    ("unknown policy", _create(policy="oracle"), 422, ("linreboot",), ("oracle",)),
    ("unknown hyperparameter", _create(hyperparameters={"temperature": 1.0}), 422,
     ("unknown hyperparameter 'temperature'", "sigma_omega"), ()),
    ('"NaN" hyperparameter', _create(hyperparameters={"reg": "NaN"}), 422, _NOT_A_NUMBER,
     ("NaN",)),
    ("NaN hyperparameter", _create(hyperparameters={"reg": 1}).replace("1}", "NaN}"), 422,
     _NON_FINITE, ("NaN",)),
    ("negative regularisation", _create(hyperparameters={"reg": -1.0}), 422, ("reg",), ()),
    # Issue 8, finding 3: accepted at creation, then 500 (or null indices) later.
    ("reward_bound 1e308", _create(policy="lingiro", hyperparameters={"reward_bound": 1e308}),
     422, ("reward_bound", "less than"), ()),
    ("reg 1e-300", _create(hyperparameters={"reg": 1e-300}), 422, ("reg", "greater than"), ()),
    ("lints-ig priors 1e-300", _create(policy="lints-ig", hyperparameters={
        "ig_alpha": 1e-300, "ig_beta": 1e-300, "ig_prior_precision": 1e-300}), 422,
     ("ig_alpha", "ig_beta", "ig_prior_precision"), ()),
    ("noise_sd 1e308", _create(policy="linucb", hyperparameters={"noise_sd": 1e308}), 422,
     ("noise_sd",), ()),
    ("another policy's hyperparameter", _create(hyperparameters={"ucb_alpha": 1.0}), 422,
     ("linreboot takes only", "sigma_omega"), ()),
    ("sigma_omega for greedy", _create(policy="greedy", hyperparameters={"sigma_omega": 1.0}),
     422, ("greedy takes only",), ()),
    ("reg for lints-ig", _create(policy="lints-ig", hyperparameters={"reg": 1.0}), 422,
     ("ig_prior_precision",), ()),
    # Forgetting: a discount outside [0.5, 1] (above 1 the sums would grow without bound).
    ("discount above 1", _create(hyperparameters={"discount": 1.01}), 422,
     ("discount", "less than"), ()),
    ("discount below 0.5", _create(hyperparameters={"discount": 0.4}), 422,
     ("discount", "greater than"), ()),
    ("discount 0", _create(policy="linucb", hyperparameters={"discount": 0}), 422,
     ("discount", "greater than"), ()),
    ("negative seed", _create(seed=-1), 422, ("greater than",), ()),
    ("reward window above max", _create(reward_window_seconds=10**9), 422, ("at most",), ()),
    ("negative staleness", _create(max_stale_rewards=-1), 422, ("greater than",), ()),
    ("boolean staleness", _create(max_stale_rewards=True), 422, ("integer",), ()),
    ("oversized body", _create(pad="x" * _MAX_BODY), 413, ("larger than",), ("xxxx",)),
]

ADD_ARMS_CASES: list[Case] = [
    ("duplicate arm ids", json.dumps({"arms": _arms("c", "c")}), 422, ("distinct",), ()),
    ("existing arm id", json.dumps({"arms": _arms("a")}), 409, ("exists",), ()),
    ("arm id with braces", json.dumps({"arms": _arms("ev{il}")}), 422, _PATTERN, ("ev{il}",)),
    ("features for covariates", json.dumps({"arms": [{"id": "c", "features": [1, 2, 3]}]}),
     422, ("features",), ()),
    ("NaN features", '{"arms": [{"id": "c", "features": [NaN, 1, 2]}]}', 422, _NON_FINITE,
     ("NaN",)),
    ("no arms", json.dumps({"arms": []}), 422, ("arms",), ()),
]

RETIRE_CASES: list[Case] = [
    ("unknown arm", json.dumps({"arm_ids": ["ghost-arm"]}), 404, ("arm",), ("ghost-arm",)),
    ("every arm", json.dumps({"arm_ids": ["a", "b"]}), 422, ("every",), ()),
    ("duplicate arm ids", json.dumps({"arm_ids": ["a", "a"]}), 422, ("distinct",), ()),
    ("arm id with braces", json.dumps({"arm_ids": ["ev{il}"]}), 422, _PATTERN, ("ev{il}",)),
]


def _ids(cases: list[Case]) -> list[str]:
    return [case[0] for case in cases]


def _assert_refused(
    response: httpx.Response, status: int, words: tuple[str, ...], forbidden: tuple[str, ...]
) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) <= {"error", "message", "details"}, body
    message = body["message"].lower()
    for word in words:
        assert word.lower() in message, (word, body["message"])
    for token in forbidden:
        assert token not in response.text, (token, response.text[:300])
    for detail in body.get("details") or []:
        assert set(detail) == {"loc", "msg", "type"}, detail  # no "input", no "ctx"


@pytest.fixture
async def cov(api: Api) -> AsyncIterator[tuple[str, str]]:
    """The covariates experiment after one rewarded and one pending decision: (key, pending)."""
    key = await api.create(COVARIATES)
    rewarded = await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
    assert (await api.reward(key, {"experiment_id": "cov", "decision_id": rewarded,
                                   "reward": 0.5})).status_code == 200
    pending = await api.decide(key, {"experiment_id": "cov", "context": [0.3, 0.2, 0.1]})
    yield key, pending


async def _post(client: httpx.AsyncClient, path: str, body: str, headers: dict[str, str]
                ) -> httpx.Response:
    return await client.post(
        path, content=body.encode(errors="surrogateescape"),  # "\udcff": the byte 0xff
        headers={**headers, "Content-Type": "application/json"},
    )


@pytest.mark.parametrize(("name", "body", "status", "words", "forbidden"), CHOOSE_CASES,
                         ids=_ids(CHOOSE_CASES))
async def test_choose_refuses(
    api: Api, cov: tuple[str, str], name: str, body: str, status: int,
    words: tuple[str, ...], forbidden: tuple[str, ...],
) -> None:
    key, _ = cov
    before = await api.state("cov")
    response = await _post(api.http, "/choose", body, {"X-API-Key": key})
    _assert_refused(response, status, words, forbidden)
    assert await api.state("cov") == before


@pytest.mark.parametrize(("name", "body", "status", "words", "forbidden"), REWARD_CASES,
                         ids=_ids(REWARD_CASES))
async def test_reward_refuses(
    api: Api, cov: tuple[str, str], name: str, body: str, status: int,
    words: tuple[str, ...], forbidden: tuple[str, ...],
) -> None:
    key, pending = cov
    before = await api.state("cov")
    response = await _post(api.http, "/reward", body.replace("DECISION", pending),
                           {"X-API-Key": key})
    _assert_refused(response, status, words, forbidden)
    assert await api.state("cov") == before
    # The pending decision is still waiting for its (one) reward.
    retry = await api.reward(key, {"experiment_id": "cov", "decision_id": pending, "reward": 1.0})
    assert retry.json()["status"] == "applied"


@pytest.mark.parametrize(("name", "body", "status", "words", "forbidden"), CREATE_CASES,
                         ids=_ids(CREATE_CASES))
async def test_create_refuses(
    api: Api, cov: tuple[str, str], name: str, body: str, status: int,
    words: tuple[str, ...], forbidden: tuple[str, ...],
) -> None:
    before = (await api.ids(), await api.state("cov"))
    response = await _post(api.http, "/experiments", body, ADMIN)
    _assert_refused(response, status, words, forbidden)
    assert (await api.ids(), await api.state("cov")) == before


@pytest.mark.parametrize(("name", "body", "status", "words", "forbidden"), ADD_ARMS_CASES,
                         ids=_ids(ADD_ARMS_CASES))
async def test_add_arms_refuses(
    api: Api, cov: tuple[str, str], name: str, body: str, status: int,
    words: tuple[str, ...], forbidden: tuple[str, ...],
) -> None:
    before = await api.state("cov")
    response = await _post(api.http, "/experiments/cov/arms", body, ADMIN)
    _assert_refused(response, status, words, forbidden)
    assert await api.state("cov") == before


@pytest.mark.parametrize(("name", "body", "status", "words", "forbidden"), RETIRE_CASES,
                         ids=_ids(RETIRE_CASES))
async def test_retire_arms_refuses(
    api: Api, cov: tuple[str, str], name: str, body: str, status: int,
    words: tuple[str, ...], forbidden: tuple[str, ...],
) -> None:
    before = await api.state("cov")
    response = await _post(api.http, "/experiments/cov/arms/retire", body, ADMIN)
    _assert_refused(response, status, words, forbidden)
    assert await api.state("cov") == before


@pytest.mark.parametrize("path", ["/experiments/ev%7Bil%7D", "/experiments/evil%01id",
                                  "/experiments/" + "x" * 65])
async def test_bad_experiment_id_in_path(api: Api, cov: tuple[str, str], path: str) -> None:
    before = await api.ids()
    for method in ("GET", "DELETE"):
        response = await api.http.request(method, path, headers=ADMIN)
        _assert_refused(response, 422, _PATTERN, ("ev{il}", "evil", "x" * 65))
    assert await api.ids() == before


async def test_chunked_body_over_the_limit_is_413(api: Api, cov: tuple[str, str]) -> None:
    """No Content-Length: the limit is enforced while the body is read."""
    key, _ = cov
    before = await api.state("cov")
    chunk = b" " * 65_536

    async def body() -> AsyncIterator[bytes]:
        yield b'{"experiment_id": "cov", "context": [0.5, 0.5, 0.5]'
        for _ in range(_MAX_BODY // len(chunk) + 2):
            yield chunk
        yield b"}"

    response = await api.http.post(
        "/choose", content=body(), headers={"X-API-Key": key, "Content-Type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    _assert_refused(response, 413, ("larger than",), ())
    assert await api.state("cov") == before


async def test_declared_length_over_the_limit_is_413_before_reading(
    api: Api, cov: tuple[str, str]
) -> None:
    key, _ = cov
    response = await api.http.post(
        "/choose",
        content=b"{}",
        headers={"X-API-Key": key, "Content-Type": "application/json",
                 "Content-Length": str(_MAX_BODY + 1)},
    )
    _assert_refused(response, 413, ("larger than",), ())


async def test_body_at_the_limit_is_accepted(api: Api, cov: tuple[str, str]) -> None:
    key, _ = cov
    head = '{"experiment_id": "cov", "context": [0.5, 0.5, 0.5]'
    body = head + " " * (_MAX_BODY - len(head) - 1) + "}"
    assert len(body) == _MAX_BODY
    response = await _post(api.http, "/choose", body, {"X-API-Key": key})
    assert response.status_code == 200, response.text


_GOOD_BODIES = {
    "/choose": '{"experiment_id": "cov", "context": [1, 2, 3]}',
    "/reward": '{"experiment_id": "cov", "decision_id": "DECISION", "reward": 1.0}',
    "/experiments": _create(),
    "/experiments/cov/arms": '{"arms": [{"id": "c"}]}',
    "/experiments/cov/arms/retire": '{"arm_ids": ["a"]}',
}
_NOT_JSON_TYPES = [
    "application/x-www-form-urlencoded",  # what curl -d sends
    "text/plain",
    "multipart/form-data; boundary=x",
    "application/jsonp",
    None,  # no Content-Type at all
]


@pytest.mark.parametrize("content_type", _NOT_JSON_TYPES)
@pytest.mark.parametrize("path", list(_GOOD_BODIES))
async def test_a_body_not_declared_as_json_is_415_saying_so(
    api: Api, cov: tuple[str, str], path: str, content_type: str | None
) -> None:
    """A valid JSON body with another content type: 415 naming the header, nothing changed."""
    key, pending = cov
    headers = {"X-API-Key": key} if path in ("/choose", "/reward") else dict(ADMIN)
    if content_type is not None:
        headers["Content-Type"] = content_type
    before = (await api.ids(), await api.state("cov"))
    response = await api.http.post(
        path, content=_GOOD_BODIES[path].replace("DECISION", pending).encode(), headers=headers
    )
    assert "content-type" not in response.request.headers or content_type is not None
    _assert_refused(response, 415, ("Content-Type: application/json",), ())
    assert response.json()["error"] == "unsupported_media_type"
    assert (await api.ids(), await api.state("cov")) == before
    # Credentials still come first: without them, 401.
    no_credentials = {k: v for k, v in headers.items() if k == "Content-Type"}
    assert (await api.http.post(path, content=b"{}", headers=no_credentials)).status_code == 401


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8",
                                          "Application/JSON", "application/vnd.api+json"])
@pytest.mark.parametrize("path", ["/choose", "/experiments"])
async def test_json_content_types_are_accepted(
    api: Api, cov: tuple[str, str], path: str, content_type: str
) -> None:
    key, _ = cov
    headers = {"X-API-Key": key} if path == "/choose" else dict(ADMIN)
    response = await api.http.post(path, content=_GOOD_BODIES[path].encode(),
                                   headers={**headers, "Content-Type": content_type})
    assert response.status_code in (200, 201), response.text


async def test_error_lists_every_problem(api: Api, cov: tuple[str, str]) -> None:
    key, _ = cov
    body = '{"experiment_id": "cov", "context": [true, "x", 1e7], "excluded": [""]}'
    response = await _post(api.http, "/choose", body, {"X-API-Key": key})
    assert response.status_code == 422
    locs = [d["loc"] for d in response.json()["details"]]
    assert ["body", "context", 0] in locs
    assert ["body", "context", 1] in locs
    assert ["body", "excluded", 0] in locs


# -- the published constraints are the enforced ones ---------------------------------
#
# For every request body: what the OpenAPI document publishes (a constraint at a
# path: "arms[].id" is the id of an item of arms, "arm_contexts{key}" a key of
# the dict, "arm_contexts{}" one of its values) must be this table, and each
# constraint must be what validation enforces: a value at the bound is not
# refused there, a value just beyond it is a 422 located there. Hyperparameters
# are left out (each policy has its own; their ranges are tested with them).

_FB = _SETTINGS.feature_bound
_VECTOR = {"maxItems": _SETTINGS.max_dim, "[]": {"minimum": -_FB, "maximum": _FB}}
_ARMS = {"minItems": 1, "maxItems": _MAX_ARMS, "[].id": {"pattern": ARM_ID_PATTERN},
         "[].features": _VECTOR}
_ARM_IDS = {"maxItems": _MAX_ARMS, "[]": {"pattern": ARM_ID_PATTERN}}
_REWARD = {"minimum": -_FB, "maximum": _FB}


def _flat(tree: dict[str, object], path: str = "") -> dict[tuple[str, str], object]:
    """{"arms": {"minItems": 1, "[].id": {...}}} -> {("arms", "minItems"): 1, ...}."""
    flat: dict[tuple[str, str], object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, path + ("." if path and key[0].isalpha() else "") + key))
        else:
            flat[(path, key)] = value
    return flat


PUBLISHED: dict[str, dict[tuple[str, str], object]] = {
    "/experiments": _flat({
        "id": {"pattern": EXPERIMENT_ID_PATTERN},
        "dim": {"minimum": 1, "maximum": _MAX_DIM},
        "arms": _ARMS,
        "seed": {"minimum": 0, "maximum": MAX_SEED},
        "reward_window_seconds": {"minimum": 1,
                                  "maximum": _SETTINGS.max_reward_window_seconds},
        "max_stale_rewards": {"minimum": 0, "maximum": MAX_STALE_REWARDS},
        "default_reward": _REWARD,
        "log_max_entries": {"minimum": 0, "maximum": MAX_LOG_ENTRIES},
        "log_max_age_seconds": {"minimum": 1, "maximum": MAX_LOG_AGE_SECONDS},
        "shards": {"minimum": 1, "maximum": MAX_SHARDS},
        "position_weights": {"minItems": 1, "maxItems": MAX_SLOTS,
                             "[]": {"exclusiveMinimum": 0.0, "maximum": 1.0}},
    }),
    "/experiments/{experiment_id}/arms": _flat({"arms": _ARMS}),
    "/experiments/{experiment_id}/arms/retire": _flat({"arm_ids": {**_ARM_IDS, "minItems": 1}}),
    "/choose": _flat({
        "experiment_id": {"pattern": EXPERIMENT_ID_PATTERN},
        "context": _VECTOR,
        "arm_contexts": {"maxProperties": _MAX_ARMS, "{key}": {"pattern": ARM_ID_PATTERN},
                         "{}": _VECTOR},
        "eligible": _ARM_IDS,
        "excluded": _ARM_IDS,
        "decision_id": {"pattern": DECISION_ID_PATTERN},
    }),
    "/rank": _flat({
        "experiment_id": {"pattern": EXPERIMENT_ID_PATTERN},
        "context": _VECTOR,
        "arm_contexts": {"maxProperties": _MAX_ARMS, "{key}": {"pattern": ARM_ID_PATTERN},
                         "{}": _VECTOR},
        "eligible": _ARM_IDS,
        "excluded": _ARM_IDS,
        "decision_id": {"pattern": DECISION_ID_PATTERN},
        "k": {"minimum": 1, "maximum": MAX_SLOTS},
    }),
    "/reward": _flat({
        "experiment_id": {"pattern": EXPERIMENT_ID_PATTERN},
        "decision_id": {"pattern": REWARDED_ID_PATTERN},
        "reward": _REWARD,
        "rewards": {"minItems": 1, "maxItems": _MAX_BATCH,
                    "[].decision_id": {"pattern": REWARDED_ID_PATTERN}, "[].reward": _REWARD},
    }),
}
_BASES: dict[str, list[dict[str, object]]] = {
    "/experiments": [{"id": "new", "setting": "covariates", "dim": 3, "arms": [{"id": "a"}]}],
    "/experiments/{experiment_id}/arms": [{"arms": [{"id": "c"}]}],
    "/experiments/{experiment_id}/arms/retire": [{"arm_ids": ["a"]}],
    "/choose": [{"experiment_id": "cov", "context": [0.5, 0.5, 0.5]}],
    "/rank": [{"experiment_id": "cov", "context": [0.5, 0.5, 0.5], "k": 1}],
    "/reward": [{"experiment_id": "cov", "decision_id": "d", "reward": 1.0},
                {"experiment_id": "cov", "rewards": [{"decision_id": "d", "reward": 1.0}]}],
}
_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
             "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
             "pattern")
_TOKEN = re.compile(r"\[\]|\{key\}|\{\}|[A-Za-z_]+")


def _published(document: dict[str, Any], template: str
               ) -> dict[tuple[str, str], tuple[object, dict[str, Any]]]:
    """(path, keyword) -> (value, the schema that holds it) of a route's request body."""
    body = document["paths"][template]["post"]["requestBody"]["content"]["application/json"]
    found: dict[tuple[str, str], tuple[object, dict[str, Any]]] = {}

    def walk(schema: dict[str, Any], path: str) -> None:
        if "$ref" in schema:
            schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        assert "patternProperties" not in schema, path  # it would leave other keys open
        for branch in schema.get("anyOf", []):
            walk(branch, path)
        found.update({(path, k): (schema[k], schema) for k in _KEYWORDS if k in schema})
        for name, sub in schema.get("properties", {}).items():
            if name != "hyperparameters":
                walk(sub, f"{path}.{name}" if path else name)
        for suffix, keyword in (("[]", "items"), ("{}", "additionalProperties"),
                                ("{key}", "propertyNames")):
            if isinstance(schema.get(keyword), dict):
                walk(schema[keyword], path + suffix)

    walk(body["schema"], "")
    return found


def _put(node: Any, tokens: list[str], value: Any) -> Any:
    """``node`` (a copy) with ``value`` at the path's place (index 0, key "a")."""
    if not tokens:
        return value
    token, rest = tokens[0], tokens[1:]
    if token == "[]":
        return [_put(node[0] if node else None, rest, value)]
    if token == "{key}":
        return {value: [0.5]}
    if token == "{}":
        return {"a": _put(next(iter(node.values())) if node else None, rest, value)}
    return {**(node or {}), token: _put((node or {}).get(token), rest, value)}


def _items(schema: dict[str, Any], count: int) -> Any:
    """``count`` distinct valid items for a list or dict published as ``schema``."""
    if "additionalProperties" in schema:
        return {f"a{i}": [0.5] for i in range(count)}
    item = schema["items"]
    if item.get("$ref", "").endswith("/RewardItemIn"):
        return [{"decision_id": f"d{i}", "reward": 1.0} for i in range(count)]
    if "$ref" in item:  # ArmIn
        return [{"id": f"a{i}"} for i in range(count)]
    return [f"a{i}" for i in range(count)] if item.get("type") == "string" else [0.5] * count


def _at_and_beyond(keyword: str, value: Any, schema: dict[str, Any]) -> tuple[Any, Any]:
    integer = schema.get("type") == "integer"
    if keyword == "maximum":
        return value, value + 1 if integer else math.nextafter(value, math.inf)
    if keyword == "minimum":
        return value, value - 1 if integer else math.nextafter(value, -math.inf)
    if keyword == "exclusiveMinimum":
        return value + 1 if integer else math.nextafter(value, math.inf), value
    if keyword in ("maxItems", "maxProperties"):
        return _items(schema, value), _items(schema, value + 1)
    if keyword == "minItems":
        return _items(schema, value), _items(schema, value - 1)
    assert keyword == "pattern", keyword
    return "a", "ev{il}"


def _rows() -> list[tuple[str, str, str, object]]:
    return [(t, path, k, v) for t, table in PUBLISHED.items() for (path, k), v in table.items()]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    """The OpenAPI document of an app with the tests' settings (building it takes 0.3 s)."""
    return json.loads(json.dumps(create_app(_SETTINGS).openapi()))  # as served


async def test_the_served_document_is_the_apps(api: Api, document: dict[str, Any]) -> None:
    assert (await api.http.get("/openapi.json")).json() == document


@pytest.mark.parametrize("template", list(PUBLISHED))
def test_every_published_constraint_is_in_the_table(
    document: dict[str, Any], template: str
) -> None:
    assert set(_published(document, template)) == set(PUBLISHED[template])


@pytest.mark.parametrize(("template", "path", "keyword", "expected"), _rows(),
                         ids=[f"{t} {p} {k}" for t, p, k, _ in _rows()])
async def test_published_constraints_are_what_validation_enforces(
    api: Api, document: dict[str, Any], template: str, path: str, keyword: str,
    expected: object,
) -> None:
    value, schema = _published(document, template)[(path, keyword)]
    assert (value, type(value)) == (expected, type(expected))  # 2**63 - 1, not 9.2e18
    tokens = _TOKEN.findall(path)
    base = next(b for b in _BASES[template] if tokens[0] in b or b is _BASES[template][-1])
    loc = ["body", *(0 if t == "[]" else "<key>" if t in ("{}", "{key}") else t for t in tokens)]
    url = template.replace("{experiment_id}", "cov")
    headers = {**ADMIN} if template.startswith("/experiments") else {"X-API-Key": "any-key"}
    at, beyond = _at_and_beyond(keyword, value, schema)
    for probe, refused in ((at, False), (beyond, True)):
        response = await api.http.post(url, json=_put(base, tokens, probe), headers=headers)
        locs = [d["loc"] for d in response.json().get("details") or []]
        assert (loc in locs) == refused, (probe if not refused else "beyond", response.text[:300])
        if refused:
            assert response.status_code == 422


@pytest.mark.anyio
@pytest.mark.parametrize(("key", "shown"), [("sigma", "sigma"), ("Sigma_Omega2", "Sigma_Omega2"),
                                            ("ev{il}", "<key>"), ("x" * 60, "<key>"),
                                            ("a\u001bb", "<key>")])
async def test_an_unknown_hyperparameter_is_named_with_the_valid_ones(
    api: Api, key: str, shown: str
) -> None:
    """Issue 29: the 422 named neither the unknown key nor the valid ones. A plain name
    is shown back (it cannot carry markup, control characters or a long secret);
    anything else stays <key>."""
    response = await api.http.post("/experiments", headers=ADMIN, json={
        "id": "e", "setting": "covariates", "dim": 2, "arms": [{"id": "a"}],
        "hyperparameters": {key: 1.0}})
    assert response.status_code == 422
    body = response.json()
    assert f"unknown hyperparameter '{shown}'" in body["message"]
    assert "sigma_omega" in body["message"] and "ucb_alpha" in body["message"]
    assert body["details"][0]["loc"] == ["body", "hyperparameters", shown]
    if shown == "<key>":
        assert key not in response.text



@pytest.mark.parametrize(("document", "refused"), [
    (b'{"experiment_id": "e", "reward": 0.5, "k": 3}', False),
    (b'\xef\xbb\xbf{"a": [1, 2.5e-3]}', False),  # a UTF-8 BOM
    ('{"a": "\u00e9"}'.encode("utf-16"), False), ('{"a": -0.0}'.encode("utf-32-le"), False),
    ('{"a": null}', False),
    (b'{"a": 1} x', True), ("\ufeff{}", True), (b"\xff\xfe\x00", True), (b"", True),
    (b'{"a": 1e999}', True), (b"[NaN]", True), (b"-Infinity", True), (b"1" * 5000, True)])
def test_bodies_parse_as_json_loads_parses_them_but_for_what_is_not_finite(
        document: bytes | str, refused: bool) -> None:
    """``loads_strict`` (one decoder for every body) takes what :func:`json.loads` takes,
    with the same values (BOMs, UTF-16 and 32 bytes), and refuses as a JSONDecodeError
    what it refuses (trailing data, a BOM in a str, bytes that are not text), and
    non-finite numbers and integers longer than Python reads."""
    from app.strict_json import loads_strict

    if refused:
        with pytest.raises(json.JSONDecodeError):
            loads_strict(document)
    else:
        assert loads_strict(document) == json.loads(document)
