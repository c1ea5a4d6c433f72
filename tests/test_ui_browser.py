"""``/ui`` in a real browser (issue 30 item 2): Debian's Chromium, driven by Playwright,
against ``linreboot serve`` on an embedded Redis. It signs in, opens an experiment
while decisions and rewards arrive, sees its counts move as the page reloads
itself, and evaluates another policy on the log with the page's form (which the
reload waits for); the screenshots stay in results/test-artifacts/ui/. ``./dev test`` installs
Chromium (as root, with apt-get); elsewhere the test skips, naming the package."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from loadtest.server import server_process

TOKEN = "ui-browser-token-0123456789"
ARTIFACTS = Path(__file__).resolve().parents[1] / "results" / "test-artifacts" / "ui"
CHROMIUM = shutil.which("chromium")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install "
                       "chromium; ./dev test installs it as root)"),
    pytest.mark.timeout(120),
]


@pytest.fixture(scope="module")
def url(redis_url: str) -> Iterator[str]:
    env = {"LINREBOOT_REDIS_URL": redis_url, "LINREBOOT_ADMIN_TOKEN": TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    with server_process(env) as base:
        yield base


CLICKS = {"news": 0.6, "sport": 0.45, "weather": 0.3}  # each arm's click probability


def _traffic(url: str, key: str, stop: threading.Event) -> None:
    """Decisions, each rewarded with a click (1) or not (0), until told to stop."""
    rng = np.random.default_rng(0)
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=10) as http:
        while not stop.is_set():
            context = rng.normal(size=3).round(3).tolist()
            decision = http.post("/choose", json={"experiment_id": "homepage",
                                                  "context": context}).json()
            clicked = rng.random() < CLICKS[decision["arm_id"]]
            http.post("/reward", json={"experiment_id": "homepage",
                                       "decision_id": decision["decision_id"],
                                       "reward": float(clicked)})


def _count(page: object, name: str) -> int:
    card = page.locator(".card", has_text=name).locator("b")  # type: ignore[attr-defined]
    return int(card.inner_text())


def test_sign_in_and_watch_an_experiment_learn(redis_db: str, url: str) -> None:
    from playwright.sync_api import sync_playwright

    admin = {"Authorization": f"Bearer {TOKEN}"}
    created = httpx.post(f"{url}/experiments", headers=admin, json={
        "id": "homepage", "setting": "covariates", "dim": 3,
        "arms": [{"id": "news"}, {"id": "sport"}, {"id": "weather"}]})
    assert created.status_code == 201, created.text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    worker = threading.Thread(target=_traffic, args=(url, created.json()["api_key"], stop))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 720})
            page.goto(f"{url}/ui")
            page.fill("#token", "not-the-token")
            page.click("#login button")
            page.wait_for_selector("#error:has-text('not valid')")
            page.fill("#token", TOKEN)
            page.click("#login button")
            page.wait_for_selector("a:has-text('homepage')")
            assert TOKEN not in page.url
            worker.start()
            page.click("a:has-text('homepage')")
            page.wait_for_selector("h1:has-text('homepage')")
            before = _count(page, "decisions")
            # The page reloads itself every 5 s: the counts move without a click.
            page.wait_for_function(
                "n => Number(document.querySelector('.card b').textContent) > n",
                arg=before, timeout=15_000)
            assert _count(page, "decisions") > before
            assert page.locator("td", has_text="news").count() >= 1
            page.screenshot(path=str(ARTIFACTS / "experiment.png"), full_page=True)
            # Another policy evaluated on the log so far; the page holds still while the
            # form is being filled in (it reloads itself otherwise).
            page.select_option("#evaluate select[name=policy]", "linucb-const")
            page.fill("#evaluate input[name=hyperparameters]", "ucb_alpha=0.5")
            page.wait_for_timeout(6_000)  # longer than the page's refresh
            assert page.input_value("#evaluate input[name=hyperparameters]") == "ucb_alpha=0.5"
            page.click("#evaluate button")
            page.wait_for_selector("#estimates", timeout=30_000)
            estimators = page.locator("#estimates tbody td:first-child").all_inner_texts()
            assert estimators == ["logged policy (on-policy)", "IPS", "SNIPS", "DR"]
            assert "linucb-const (ucb_alpha=0.5)" in page.inner_text("main")
            page.screenshot(path=str(ARTIFACTS / "evaluation.png"), full_page=True)
            page.click("a:has-text('Back to homepage')")
            page.wait_for_selector("h1:has-text('homepage')")
            # The list: the last hour's decisions and rewards, counted as they came.
            page.click("header a:has-text('linreboot')")
            page.wait_for_selector("#experiments")
            hour = page.locator("#experiments tbody tr").first.locator("td").nth(5)
            assert int(hour.inner_text()) > 0
            assert page.locator("#readiness").inner_text().startswith("Ready")
            page.screenshot(path=str(ARTIFACTS / "experiments.png"))
            page.click("#logout button")
            page.wait_for_selector("#login")
        finally:
            stop.set()
            if worker.is_alive():
                worker.join()
            browser.close()
    assert (ARTIFACTS / "experiment.png").stat().st_size > 20_000
