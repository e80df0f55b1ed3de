"""The console in a real browser: Debian's headless Chromium driven by Playwright, against a real
uvicorn server on 127.0.0.1 over the test database (SQLite file or PostgreSQL).

Skipped when Chromium or Playwright is missing, except with ``CI=true`` (then a failure). Each
page's screenshot at 1280×800 goes to ``artifacts/screenshots/`` (``BILLING_SCREENSHOTS`` to
change it), which ``.ci/run`` keeps. Source: CONTRACT "Console (v2)".
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fastapi import FastAPI

from tests.conftest import LiveServer
from tests.console.conftest import (
    BULK_CALLS,
    BULK_KEY,
    KOLKATA_USAGE,
    XSS_KEY,
    make_tokens,
    seed,
    usage_as_table,
)

CHROMIUM = os.environ.get("BILLING_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("BILLING_SCREENSHOTS", ROOT / "artifacts" / "screenshots"))
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _browser_or_skip() -> Any:
    """Playwright's sync API when it and Chromium are there; skip (fail in CI) otherwise."""
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "playwright is not installed (pip install playwright)"
    if why is None and not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        why = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if why is not None:
        if IN_CI:
            pytest.fail(f"browser tests cannot run in CI: {why}")
        pytest.skip(why)
    return sync_playwright


@pytest.fixture
def served(app: FastAPI) -> Iterator[tuple[str, dict[str, str]]]:
    """A live server with the console's data, and the tokens of every role."""
    made = make_tokens(app)
    with LiveServer(app) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            seed(http, made["admin"])
        yield server.url, made


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_playwright = _browser_or_skip()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def _shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def _sign_in(page: Any, url: str, token: str) -> None:
    page.goto(f"{url}/console/calls")
    assert page.url == f"{url}/console/sign-in"
    page.get_by_label("API token", exact=True).fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def _table(page: Any, selector: str) -> list[list[str]]:
    rows: list[list[str]] = page.eval_on_selector_all(
        f"{selector} tbody tr",
        "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent.trim()))",
    )
    return rows


def test_the_console_in_a_browser(browser: Any, served: tuple[str, dict[str, str]]) -> None:
    url, tokens = served
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    external: list[str] = []
    page.on(
        "request",
        lambda request: None if request.url.startswith(url) else external.append(request.url),
    )

    page.goto(f"{url}/console/sign-in")
    _shot(page, "01-sign-in")
    _sign_in(page, url, tokens["admin"])
    assert page.url == f"{url}/console/overview"  # (v3) the console opens on the Overview
    page.goto(f"{url}/console/calls")
    cookies = {c["name"]: c for c in context.cookies()}
    assert cookies["billing_console"]["httpOnly"] is True
    assert cookies["billing_console"]["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script can read it
    assert tokens["admin"] not in page.content()
    _shot(page, "02-calls")

    # filter the call log by key (through the form, with the keyboard)
    page.get_by_label("Key", exact=True).fill(BULK_KEY)
    page.get_by_label("Key", exact=True).press("Enter")
    page.wait_for_load_state()
    empty = "&customer_id=&model=&status=&since=&until=&limit="  # the form's empty fields: "any"
    assert page.url == f"{url}/console/calls?api_key_id={BULK_KEY}{empty}"
    seen: list[str] = []
    for page_no in range(3):
        rows = _table(page, "table.calls")
        assert {r[2] for r in rows} == {BULK_KEY}
        seen += [r[1] for r in rows]
        if page_no == 0:
            _shot(page, "03-calls-filtered")
        following = page.get_by_role("link", name="Next page")
        if page_no < 2:
            following.click()
            page.wait_for_load_state()
        else:
            assert following.count() == 0
            assert page.get_by_text("No more calls.").is_visible()
    assert seen == [f"bulk-{i:03d}" for i in reversed(range(BULK_CALLS))]

    # open the seed call
    page.goto(f"{url}/console/calls?api_key_id=key_demo")
    page.get_by_role("link", name="req-seed-1").click()
    page.wait_for_load_state()
    assert page.url == f"{url}/console/calls/req-seed-1"
    assert page.locator("#billed").text_content() == "750"
    assert page.locator("#delivered").text_content() == "380"
    assert page.locator("#undelivered").text_content() == "370"
    summary = page.locator("#output-summary").inner_text()
    assert " ".join(summary.split()) == "750 billed · 380 delivered · 370 undelivered"
    bar = page.locator("svg.output-bar rect.seg-delivered").bounding_box()
    whole = page.locator("svg.output-bar").bounding_box()
    assert bar is not None and whole is not None
    assert abs(bar["width"] / whole["width"] - 380 / 750) < 0.02
    events = page.locator("ol.timeline li strong.what").all_text_contents()
    assert events == [
        "Started",
        "Progress",
        "Progress",
        "Progress",
        "Client disconnected",
        "Usage reported",
    ]
    _shot(page, "04-call")

    # the usage chart for a key in Kolkata: the table's numbers are /v1/usage's
    page.goto(f"{url}/console/usage")
    page.get_by_label("Key", exact=True).fill(BULK_KEY)
    page.get_by_label("Since", exact=True).fill(KOLKATA_USAGE["since"])
    page.get_by_label("Until", exact=True).fill(KOLKATA_USAGE["until"])
    page.get_by_label("Per", exact=True).select_option("hour")
    page.get_by_label("Time zone", exact=True).fill("Asia/Kolkata")
    page.get_by_role("button", name="Show").click()
    page.wait_for_load_state()
    assert "tz=Asia%2FKolkata" in page.url and "group_by=hour" in page.url
    api = httpx.get(
        f"{url}/v1/usage",
        params=KOLKATA_USAGE,
        headers={"Authorization": f"Bearer {tokens['read']}"},
    ).json()["data"]
    assert len(api) > 10
    assert _table(page, "#usage-table") == usage_as_table(api, "hour")
    assert page.locator("rect.bar-cost_usd").count() == len(api)
    values = page.eval_on_selector_all(
        "rect.bar-cost_usd", "bars => bars.map(b => b.dataset.value)"
    )
    assert values == [row["cost_usd"] for row in api]
    assert page.locator("figure.chart svg").first.is_visible()
    _shot(page, "05-usage-kolkata")

    # an XSS-named key shows as text, and nothing ran
    page.goto(f"{url}/console/calls?{urlencode({'api_key_id': XSS_KEY})}")
    cells = _table(page, "table.calls")
    assert cells[0][2] == XSS_KEY
    assert page.locator("table.calls script").count() == 0
    assert page.locator("table.calls img").count() == 0
    _shot(page, "06-calls-xss")
    page.get_by_role("link", name="req-<b>xss</b>").click()
    page.wait_for_load_state()
    assert page.get_by_text("has no price, so the cost is unknown, not zero.").is_visible()
    assert dialogs == []

    for name in ("budgets", "drift", "exports"):
        response = page.goto(f"{url}/console/{name}")
        assert response is not None and response.status == 200
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        _shot(page, f"07-{name}")
    assert page.get_by_role("link", name="usage.csv").is_visible()

    # keyboard: the skip link is the first stop and lands on the content
    page.goto(f"{url}/console/calls")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"

    # /docs works from the server's own files
    page.goto(f"{url}/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=15_000)
    assert "billing" in page.locator(".swagger-ui .info .title").inner_text()
    _shot(page, "08-docs")

    # sign out: the cookie is gone and the pages want a token again
    page.goto(f"{url}/console/calls")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_load_state()
    assert page.url == f"{url}/console/sign-in"
    assert [c for c in context.cookies() if c["name"] == "billing_console"] == []
    page.goto(f"{url}/console/usage")
    assert page.url == f"{url}/console/sign-in"
    assert external == []
    context.close()


def test_pages_follow_the_role_in_a_browser(
    browser: Any, served: tuple[str, dict[str, str]]
) -> None:
    url, tokens = served
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    _sign_in(page, url, tokens["export"])
    assert page.url == f"{url}/console/overview"
    nav = page.get_by_role("navigation", name="Pages")
    assert nav.get_by_role("link").all_text_contents() == [
        "Overview",
        "Usage",
        "Drift",
        "Exports",
        "API docs",
    ]
    response = page.goto(f"{url}/console/calls/req-seed-1")
    assert response is not None and response.status == 403
    assert page.get_by_role("heading", name="Not allowed").is_visible()
    assert "750" not in page.content()
    _shot(page, "09-forbidden")
    context.close()

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(f"{url}/console/sign-in")
    page.get_by_label("API token", exact=True).fill("bt_not-a-token")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()
    assert page.get_by_role("alert").inner_text().startswith("That token is unknown or revoked")
    assert context.cookies() == []
    context.close()
