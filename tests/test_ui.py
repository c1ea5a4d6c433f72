"""``/ui`` (issue 30, part 1): the login and the pages, over HTTP with the app's real
parts (the browser test comes with the pages' charts)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from app.auth import AdminTokens
from service.experiments import ExperimentService
from service.settings import Settings
from tests.conftest import ADMIN_TOKEN, CONTEXTUAL, COVARIATES, Api

pytestmark = pytest.mark.anyio


async def _sign_in(api: Api) -> None:
    reply = await api.http.post("/ui/login", json={"token": ADMIN_TOKEN})
    assert reply.status_code == 200, reply.text


async def test_the_pages_ask_for_the_admin_token_first(api: Api) -> None:
    await api.create(COVARIATES)
    page = await api.http.get("/ui")
    assert page.status_code == 200 and 'id="login"' in page.text
    assert "cov" not in page.text  # nothing of the experiments before signing in
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"
    one = await api.http.get("/ui/experiments/cov")
    assert (one.status_code, one.headers["location"]) == (303, "/ui")


async def test_a_wrong_token_is_refused_and_a_right_one_gives_a_strict_cookie(api: Api) -> None:
    wrong = await api.http.post("/ui/login", json={"token": "not-the-token"})
    assert wrong.status_code == 403 and "not valid" in wrong.json()["message"]
    assert "set-cookie" not in wrong.headers
    form = await api.http.post("/ui/login", data={"token": ADMIN_TOKEN})
    assert form.status_code == 415  # JSON only: a cross-site form cannot sign in
    right = await api.http.post("/ui/login", json={"token": ADMIN_TOKEN})
    cookie = right.headers["set-cookie"].lower()
    assert right.status_code == 200
    for attribute in ("httponly", "samesite=strict", "path=/ui", "max-age="):
        assert attribute in cookie, attribute
    assert ADMIN_TOKEN.lower() not in cookie  # the token itself never leaves


async def test_signed_in_the_experiments_and_one_experiment_are_shown(api: Api) -> None:
    key = await api.create(COVARIATES)
    await api.create({**COVARIATES, "id": "cov-2"})
    decision = await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
    await api.reward(key, {"experiment_id": "cov", "decision_id": decision, "reward": 1.0})
    await _sign_in(api)
    listing = await api.http.get("/ui")
    assert listing.status_code == 200
    assert 'href="/ui/experiments/cov"' in listing.text
    assert 'href="/ui/experiments/cov-2"' in listing.text
    page = await api.http.get("/ui/experiments/cov")
    assert page.status_code == 200
    for shown in ("<h1>cov</h1>", "<td>a</td>", "<td>b</td>", "share rewarded",
                  "1.000", 'data-refresh="5"', "linreboot"):
        assert shown in page.text, shown
    missing = await api.http.get("/ui/experiments/nope")
    assert missing.status_code == 404 and "No experiment nope" in missing.text
    odd = await api.http.get("/ui/experiments/%3Cscript%3E")
    assert odd.status_code == 404 and "<script>" not in odd.text  # escaped


async def test_signing_out_ends_the_session(api: Api) -> None:
    await api.create(COVARIATES)
    await _sign_in(api)
    assert 'href="/ui/experiments/cov"' in (await api.http.get("/ui")).text
    assert (await api.http.post("/ui/logout", json={})).status_code == 200
    assert 'id="login"' in (await api.http.get("/ui")).text


def test_a_session_is_its_tokens_and_expires(tmp_path: Path) -> None:
    """Signed with the admin token it was made with: another token's, an expired one or
    a tampered one is refused; removing the token from the token file ends it."""
    file = tmp_path / "tokens"
    file.write_text("first-token-0123456789\nsecond-token-0123456789\n")
    tokens = AdminTokens(Settings(admin_token=SecretStr("change-me"),  # (the default)
                                  admin_token_file=file))
    session = tokens.session("first-token-0123456789", now=1000.0)
    assert session is not None and tokens.session("wrong", now=1000.0) is None
    assert tokens.valid_session(session, now=1000.0)
    assert not tokens.valid_session(session, now=1000.0 + 9 * 3600)  # expired (8 h)
    expires, _, signature = session.partition(".")
    assert not tokens.valid_session(f"{int(expires) + 3600}.{signature}", now=1000.0)
    assert not tokens.valid_session("garbage", now=1000.0)
    file.write_text("second-token-0123456789\n")
    assert not tokens.valid_session(session, now=1000.0)


async def test_an_experiments_last_hour_from_its_decision_log(api: Api) -> None:
    """Counts of the last minute and hour, the mean reward minute by minute (an SVG, no
    script), the logged propensities and the uniform policy's effective sample size."""
    key = await api.create(COVARIATES)
    for i in range(6):
        decision = await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
        await api.reward(key, {"experiment_id": "cov", "decision_id": decision,
                               "reward": float(i % 2)})
    await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
    await _sign_in(api)
    page = (await api.http.get("/ui/experiments/cov")).text
    assert "<h2>Last hour</h2>" in page
    rows = dict(re.findall(r'<tr><td>(\w[\w ]*)</td><td class="num">(\d+)</td>', page))
    assert (rows["decisions"], rows["rewards"], rows["default rewards"]) == ("7", "6", "0")
    assert page.count("<rect") >= 2 and "<script>" not in page.split("</main>")[0]
    assert "7 decisions; smallest propensity" in page
    # each arm's share of the last hour's decisions, the shares of the 7 made
    shares = [float(x) for x in re.findall(
        r'%</td><td class="num">([\d.]+)%</td>', page)]
    assert len(shares) == 2 and sum(shares) == pytest.approx(100.0, abs=0.11)
    assert re.search(r"effective sample size of an evaluation of uniform play: \d+", page)


def test_an_outcome_logged_just_after_now_is_this_minutes() -> None:
    """Redis's clock may run ahead of the page's: such an outcome is the last minute's,
    not an hour ago's (the page's first version put it 59 minutes back)."""
    from app.ui import recent_activity
    from service.domain import LogEntry

    entries = [LogEntry("1-0", 1000.5, "reward", "d", reward=1.0)]
    svg = recent_activity(entries, now=1000.0, capped=False)
    bars = re.findall(r'<rect x="([\d.]+)"', svg)
    assert [float(x) for x in bars] == [590.0]  # the 60th minute: the last, at the right


async def _logged_experiment(api: Api, decisions: int) -> None:
    """The covariates experiment, explored (epsilon 0.2), with its decisions rewarded:
    arm a pays more when the first feature is positive."""
    key = await api.create({**COVARIATES, "hyperparameters": {"epsilon": 0.2}})
    for i in range(decisions):
        context = [0.5 if i % 2 else -0.5, 0.2, 0.1]
        decision = (await api.choose(key, {"experiment_id": "cov", "context": context})).json()
        reward = float((decision["arm_id"] == "a") == (context[0] > 0))
        await api.reward(key, {"experiment_id": "cov", "decision_id": decision["decision_id"],
                               "reward": reward})


async def test_the_evaluation_form_scores_the_policy_it_names_as_the_cli_does(api: Api) -> None:
    """The form's estimates are ``linreboot evaluate``'s on an export of the same log
    (service.off_policy both): another policy named (greedy), and the experiment's own."""
    from linreboot.export import fetch
    from service.off_policy import bandit_feedback, evaluate, join

    await _logged_experiment(api, 80)
    await _sign_in(api)
    page = await api.http.get("/ui/experiments/cov")
    assert 'id="evaluate"' in page.text and 'action="/ui/experiments/cov/evaluate"' in page.text
    experiment, entries = await fetch(api.http, "cov", ADMIN_TOKEN)
    feedback = bandit_feedback(experiment, join(experiment, entries))
    for policy, named, overrides in (("greedy", "greedy", {}),
                                     ("linreboot", None, {"epsilon": "0.05"})):
        answer = await api.http.get("/ui/experiments/cov/evaluate", params={
            "policy": policy, "minutes": 60, "train_fraction": "0.4",
            "hyperparameters": " ".join(f"{k}={v}" for k, v in overrides.items())})
        assert answer.status_code == 200, answer.text
        shown = dict(re.findall(r'<tr><td>([\w ()-]+)</td><td class="num">(-?[\d.]+)</td>',
                                answer.text))
        report = evaluate(feedback, named, overrides, 0.4)  # type: ignore[arg-type]
        assert report.target in answer.text.replace("&#x27;", "'")
        assert shown == {"logged policy (on-policy)": f"{report.logged.value:.4f}",
                         **{k.upper(): f"{e.value:.4f}" for k, e in report.estimates.items()}}
        assert f"fitted on the first {report.train_rounds} rounds" in answer.text


@pytest.mark.parametrize(("params", "message"), [
    ({"policy": "nope"}, "unknown policy &#x27;nope&#x27;"),
    ({"policy": "greedy", "train_fraction": "half"}, "must be a number"),
    ({"policy": "greedy", "train_fraction": "1.5"}, "at least 0 and below 1"),
    ({"policy": "linucb-const", "hyperparameters": "ucb_alpha=abc"}, "ucb_alpha"),
    ({"policy": "greedy", "hyperparameters": "alpha"}, "name=value"),
    ({"policy": "greedy", "minutes": "30"}, "the stretch of log is one of the form"),
    ({"policy": "greedy", "minutes": "9" * 400}, "the stretch of log is one of the form"),
    ({"policy": "greedy", "train_fraction": "nan"}, "at least 0 and below 1"),
    ({"policy": "linucb-const", "hyperparameters": "ucb_alpha=nan"}, "ucb_alpha"),
    ({"policy": "greedy", "hyperparameters": "first_pass=true"}, "takes no first pass"),
])
async def test_a_wrong_evaluation_is_refused_saying_what_is_wrong(
        api: Api, params: dict[str, str], message: str) -> None:
    await _logged_experiment(api, 6)
    await _sign_in(api)
    answer = await api.http.get("/ui/experiments/cov/evaluate", params=params)
    assert answer.status_code == 400 and message in answer.text, answer.text
    assert 'id="evaluate"' in answer.text  # the form again, to correct it


async def test_the_evaluation_needs_a_session_and_an_experiment(api: Api) -> None:
    await _logged_experiment(api, 2)
    before = await api.http.get("/ui/experiments/cov/evaluate", params={"policy": "greedy"})
    assert (before.status_code, before.headers["location"]) == (303, "/ui")
    await _sign_in(api)
    missing = await api.http.get("/ui/experiments/nope/evaluate", params={"policy": "greedy"})
    assert missing.status_code == 404
    empty = await api.http.get("/ui/experiments/cov/evaluate", params={"policy": "greedy"})
    assert empty.status_code == 400 and "too few to evaluate on" in empty.text


async def test_the_experiments_list_shows_this_minute_and_the_last_hour(api: Api) -> None:
    """Each experiment's decisions and rewards of this minute and the last hour (its
    per-minute counts) beside its totals."""
    key = await api.create(COVARIATES)
    for _ in range(3):
        decision = await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
        await api.reward(key, {"experiment_id": "cov", "decision_id": decision, "reward": 1.0})
    await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
    await _sign_in(api)
    listing = (await api.http.get("/ui")).text
    assert "this minute" in listing and "last hour" in listing
    row = re.search(r'<tr><td><a href="/ui/experiments/cov">cov</a></td>(.*?)</tr>', listing)
    assert row is not None
    cells = re.findall(r'<td class="num">([^<]*)</td>', row.group(1))
    arms, minute_d, hour_d, all_d, minute_r, hour_r, all_r, share, *_ = cells
    assert (arms, hour_d, all_d, hour_r, all_r, share) == ("2", "4", "4", "3", "3", "0.750")
    # this minute's: all of them, or (had the minute ended meanwhile) fewer
    assert 0 <= int(minute_d) <= 4 and 0 <= int(minute_r) <= 3


async def test_the_experiments_page_says_whether_the_service_is_ready(
        api: Api, redis_db: str) -> None:
    """Ready as /readyz says it; with Redis out of memory (maxmemory far below its use),
    not, and why, while the page still shows the experiments (reads still work)."""
    import redis

    await api.create(COVARIATES)
    await _sign_in(api)
    assert re.search(r'id="readiness" class="ready">Ready', (await api.http.get("/ui")).text)
    client = redis.Redis.from_url(redis_db)
    try:
        client.config_set("maxmemory", 1)  # every write refused
        page = (await api.http.get("/ui")).text
        assert (await api.http.get("/readyz")).status_code == 503
    finally:
        client.config_set("maxmemory", 0)
        client.close()
    assert re.search(r'id="readiness" class="error">Not ready: [^<]*out of memory', page)
    assert 'href="/ui/experiments/cov"' in page


@pytest.mark.parametrize("count", [1, 3], ids=["one member", "three shards"])
async def test_the_evaluation_reads_the_latest_entries_of_the_stretch(
        api: Api, service: ExperimentService, count: int) -> None:
    """service.read_latest_log: the newest entries within the limit and the byte budget,
    oldest first, the same as the tail of the whole log read forward; from a start;
    and whether earlier ones were left out (a sharded experiment's members merged)."""
    key = await api.create({**COVARIATES, "shards": count})
    for _ in range(12):
        decision = await api.decide(key, {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]})
        await api.reward(key, {"experiment_id": "cov", "decision_id": decision, "reward": 1.0})
    whole, after = [], None
    while True:
        page, after = await service.read_log("cov", after, 1000)
        whole += page
        if after is None:
            break
    assert len(whole) == 24
    latest, more = await service.read_latest_log("cov", 0.0, 7, 2**20)
    assert [e.entry_id for e in latest] == [e.entry_id for e in whole[-7:]] and more
    everything, more = await service.read_latest_log("cov", 0.0, 100, 2**20)
    assert [e.entry_id for e in everything] == [e.entry_id for e in whole] and not more
    since = whole[10].time  # (ms: entries of the same ms as whole[10] may come before it)
    from_there, more = await service.read_latest_log("cov", since, 100, 2**20)
    assert {e.entry_id for e in whole[10:]} <= {e.entry_id for e in from_there}
    assert all(e.time >= since - 0.001 for e in from_there) and not more
    one, more = await service.read_latest_log("cov", 0.0, 100, 1)  # the budget: one entry
    assert [e.entry_id for e in one] == [whole[-1].entry_id] and more


async def test_the_evaluation_of_a_log_without_outcomes_says_so(api: Api) -> None:
    """No decision with an outcome yet: said as such, not as a missing setting."""
    key = await api.create({**CONTEXTUAL, "log_all_contexts": True})
    await api.decide(key, {"experiment_id": "ctx",
                           "arm_contexts": {"a": [0.1, 0.2], "b": [0.2, 0.1], "c": [0.0, 0.3]}})
    await _sign_in(api)
    answer = await api.http.get("/ui/experiments/ctx/evaluate", params={"policy": "greedy"})
    assert answer.status_code == 400 and "0 rounds with an outcome" in answer.text, answer.text


def test_a_short_token_added_to_the_file_later_is_refused_off_loopback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The token file is read again when it changes: off loopback a short line then is
    refused as at start (a warning, and the tokens it held last still serve)."""
    file = tmp_path / "tokens"
    file.write_text("first-token-0123456789\n")
    tokens = AdminTokens(Settings(admin_token=SecretStr("change-me"), admin_token_file=file,
                                  host="0.0.0.0"))
    assert tokens.valid("first-token-0123456789")
    file.write_text("first-token-0123456789\nhunter2\n")
    assert not tokens.valid("hunter2") and tokens.valid("first-token-0123456789")
    assert "shorter than 16 characters" in caplog.text
    on_loopback = AdminTokens(Settings(admin_token=SecretStr("change-me"), admin_token_file=file))
    assert on_loopback.valid("hunter2")  # (loopback: any length, as the tests' own tokens)


async def test_the_pages_say_when_redis_does_not_answer(app_settings: Settings,
                                                         redis_db: str) -> None:
    """Redis paused past the store's deadline: the list, an experiment's page and the
    evaluation answer an HTML 503 that says why, not JSON; each after one deadline (the
    list does not wait out a second one for the experiments once readiness timed out)."""
    import asyncio

    import httpx
    import redis

    from app.main import create_app

    # A deadline short enough for a quick test, long enough that the app's start-up
    # (a few dozen calls) meets it on a busy host: 0.3 s once did not, with a
    # benchmark beside the test run.
    application = create_app(app_settings.model_copy(update={"redis_timeout_seconds": 1.0}))
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            api = Api(http)
            await api.create(COVARIATES)
            await _sign_in(api)
            service = application.state.service
            listed = service.list
            listings: list[object] = []

            async def counted_list(*args: Any, **kwargs: Any) -> Any:
                listings.append(args)
                return await listed(*args, **kwargs)

            service.list = counted_list
            client = redis.Redis.from_url(redis_db)
            try:
                # Longer than the three pages' deadlines (about 3 s), with room for a
                # busy host; the test lasts the whole pause.
                client.execute_command("CLIENT", "PAUSE", "6000", "ALL")
                pages = [await http.get(path) for path in (
                    "/ui", "/ui/experiments/cov", "/ui/experiments/cov/evaluate?policy=greedy")]
            finally:
                client.execute_command("CLIENT", "UNPAUSE")
                client.close()
            await asyncio.sleep(0.1)
    for page in pages:
        assert page.status_code == 503, (page.url, page.text)
        assert page.headers["content-type"].startswith("text/html"), page.url
        assert 'id="readiness" class="error"' in page.text, page.url
    assert listings == []
