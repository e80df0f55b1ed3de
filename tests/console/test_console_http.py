"""The console through a real HTTP client (TestClient): escaping, CSP, roles, the session cookie,
the figures of the seed scenario, paging, usage equal to /v1/usage, exports equal to the API's.
Runs on SQLite, or on PostgreSQL with ``BILLING_TEST_DATABASE_URL``. Source: CONTRACT "Console
(v2)", "Call log and usage queries", "Export", "Who may do what"."""

from __future__ import annotations

import re
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.console.render import page
from billing.console.views import drift_view
from billing.dimensions import TOKEN_FIELDS
from tests.console.conftest import (
    BULK_CALLS,
    BULK_KEY,
    KOLKATA_USAGE,
    XSS_KEY,
    XSS_MODEL,
    XSS_REQUEST,
    escaped,
    seed,
    table,
    usage_as_table,
)

PAGES = [
    "/console/overview",
    "/console/customers",
    "/console/keys",
    "/console/alerts",
    "/console/calls",
    "/console/calls/req-seed-1",
    "/console/usage",
    "/console/budgets",
    "/console/drift",
    "/console/exports",
    "/console/sign-in",
]
DAY = {"since": "2026-10-14T00:00:00Z", "until": "2026-10-17T00:00:00Z"}


#: What a browser sends with a form without fields.
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def sign_in(client: TestClient, token: str) -> None:
    response = client.post("/console/sign-in", data={"token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    assert client.cookies.get("billing_console") == token


def test_sign_in_sets_a_strict_http_only_cookie_and_never_shows_the_token(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    response = seeded.post(
        "/console/sign-in", data={"token": tokens["read"]}, follow_redirects=False
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/console/overview"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"billing_console={tokens['read']};")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert "Path=/console" in cookie
    assert "Secure" not in cookie  # plain HTTP here
    assert tokens["read"] not in response.headers["location"]
    for path in ["/console/calls", "/console/calls/req-seed-1", "/console/usage"]:
        body = seeded.get(path).text
        assert tokens["read"] not in body, path


def test_the_cookie_is_secure_behind_https(app: FastAPI, tokens: dict[str, str]) -> None:
    with TestClient(app, base_url="https://testserver") as client:
        response = client.post(
            "/console/sign-in", data={"token": tokens["admin"]}, follow_redirects=False
        )
    assert response.status_code == 303
    assert "Secure" in response.headers["set-cookie"]


def test_sign_out_clears_the_cookie(seeded: TestClient, tokens: dict[str, str]) -> None:
    sign_in(seeded, tokens["admin"])
    assert seeded.get("/console/calls", follow_redirects=False).status_code == 200
    response = seeded.post("/console/sign-out", headers=FORM, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/console/sign-in"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith('billing_console="";') or cookie.startswith("billing_console=;")
    assert "Max-Age=0" in cookie and "Path=/console" in cookie
    assert seeded.cookies.get("billing_console") is None
    after = seeded.get("/console/calls", follow_redirects=False)
    assert after.status_code == 303 and after.headers["location"] == "/console/sign-in"


def test_unknown_revoked_or_empty_tokens_are_refused(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    for token, words in (
        ("bt_nope", "unknown or revoked"),
        (tokens["revoked"], "unknown or revoked"),
        ("", "Paste a token"),
    ):
        response = seeded.post("/console/sign-in", data={"token": token}, follow_redirects=False)
        assert response.status_code == 401
        assert words in response.text
        assert "set-cookie" not in response.headers
        if token:
            assert token not in response.text
    # a cookie holding a revoked token is no session
    seeded.cookies.set("billing_console", tokens["revoked"], path="/console")
    assert seeded.get("/console/calls", follow_redirects=False).status_code == 303


def test_a_form_posted_from_another_site_is_refused(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    for origin in ("https://evil.example", "null"):
        response = seeded.post(
            "/console/sign-in",
            data={"token": tokens["admin"]},
            headers={"Origin": origin},
            follow_redirects=False,
        )
        assert response.status_code == 403
        assert "set-cookie" not in response.headers
    sign_in(seeded, tokens["admin"])
    response = seeded.post(
        "/console/sign-out",
        headers={**FORM, "Origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert response.status_code == 403
    assert seeded.cookies.get("billing_console") == tokens["admin"]
    # the same site's own form passes
    response = seeded.post(
        "/console/sign-out",
        headers={**FORM, "Origin": "http://127.0.0.1"},
        follow_redirects=False,
    )
    assert response.status_code == 303


def test_pages_need_the_roles_of_the_api_they_show(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    expected = {
        # page: roles that may see it (admin too)
        "/console/overview": {"read", "export"},
        "/console/customers": {"read"},
        "/console/keys": {"read"},
        "/console/alerts": {"read"},
        "/console/calls": {"read"},
        "/console/calls/req-seed-1": {"read"},
        "/console/usage": {"read", "export"},
        "/console/budgets": {"read"},
        "/console/drift": {"read", "export"},
        "/console/exports": {"export"},
        "/console/exports/calls.csv?since=2026-10-14T00:00:00Z&until=2026-10-17T00:00:00Z": {
            "export"
        },
    }
    for role in ("ingest", "read", "export", "admin"):
        seeded.cookies.clear()
        sign_in(seeded, tokens[role])
        for path, roles in expected.items():
            status = seeded.get(path, follow_redirects=False).status_code
            assert status == (200 if role in roles | {"admin"} else 403), (role, path, status)
    seeded.cookies.clear()
    sign_in(seeded, tokens["ingest"])
    assert "which may post events\nonly: no console page" in seeded.get("/console/sign-in").text
    seeded.cookies.clear()
    for path in expected:
        response = seeded.get(path, follow_redirects=False)
        assert response.status_code == 303, path
        assert response.headers["location"] == "/console/sign-in"


def test_the_navigation_follows_the_role(seeded: TestClient, tokens: dict[str, str]) -> None:
    sign_in(seeded, tokens["export"])
    body = seeded.get("/console/usage").text
    nav = body[body.index('<nav aria-label="Pages">') : body.index("</nav>")]
    assert 'href="/console/usage"' in nav and 'href="/console/exports"' in nav
    assert 'href="/console/calls"' not in nav and 'href="/console/budgets"' not in nav
    forbidden = seeded.get("/console/calls")
    assert forbidden.status_code == 403
    assert "role <strong>export</strong> may not see this page" in forbidden.text
    assert "admin, read" in forbidden.text


def test_without_any_token_the_console_is_open(client: TestClient) -> None:
    seed(client)
    response = client.get("/console/calls", follow_redirects=False)
    assert response.status_code == 200
    assert "Open console: no token exists yet" in response.text
    location = client.get("/console", follow_redirects=False).headers["location"]
    assert location == "/console/overview"


def test_every_page_has_the_csp_and_loads_nothing_from_elsewhere(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(seeded, tokens["admin"])
    for path in PAGES:
        response = seeded.get(path)
        assert response.status_code == 200, path
        csp = response.headers["content-security-policy"]
        assert csp.split(";")[0] == "default-src 'self'", path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["content-type"].startswith("text/html")
        assert not re.search(r"(src|href)=\"(https?:)?//", response.text), path
        # No inline script: only the Overview loads scripts, the package's own (v3: its chart,
        # uPlot, shipped in billing/console/static), each an empty element with a src.
        scripts = re.findall(r"<script[^>]*>[^<]*</script>", response.text)
        assert len(scripts) == response.text.count("<script"), path
        if path == "/console/overview":
            assert scripts == [
                '<script src="/console/static/uplot/uPlot.iife.min.js" defer></script>',
                '<script src="/console/static/overview.js" defer></script>',
            ]
        else:
            assert scripts == [], path
        assert " style=" not in response.text, path  # nor inline styles (the CSP refuses them)
    # the refused and missing pages carry it too
    seeded.cookies.clear()
    sign_in(seeded, tokens["ingest"])
    assert "default-src 'self'" in seeded.get("/console/calls").headers["content-security-policy"]


def test_html_in_keys_models_and_ids_is_shown_as_text(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(seeded, tokens["admin"])
    listing = seeded.get("/console/calls", params={"api_key_id": XSS_KEY})
    assert listing.status_code == 200
    detail = seeded.get(f"/console/calls/{quote(XSS_REQUEST, safe='')}")
    assert detail.status_code == 200
    usage = seeded.get("/console/usage", params={**DAY, "api_key_id": XSS_KEY})
    for body in (listing.text, detail.text, usage.text):
        assert "<script>alert(1)" not in body
        assert "<img src=x" not in body
        assert "<b>xss" not in body
    assert escaped(XSS_KEY) in listing.text and escaped(XSS_MODEL) in listing.text
    assert escaped(XSS_KEY) in detail.text and escaped(XSS_REQUEST) in detail.text
    assert f'value="{escaped(XSS_KEY)}"' in usage.text  # refilled into the form, escaped
    # the link to the call carries the id percent-encoded
    assert f'href="/console/calls/{quote(XSS_REQUEST, safe="")}"' in listing.text


def test_the_call_page_tells_the_story_of_the_seed_stream(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/calls/req-seed-1").text
    assert '<span id="billed">750</span> billed' in body
    assert '<span id="delivered">380</span> delivered' in body
    assert '<span id="undelivered">370</span> undelivered' in body
    assert '<dd id="cost">0.011316</dd>' in body
    # the bar: 380 of 750 delivered
    assert 'width="50.67" height="10" class="seg-delivered"><title>380 delivered' in body
    assert 'x="50.67" y="0" width="49.33" height="10" class="seg-undelivered"' in body
    # the events in order, in words
    titles = re.findall(r'<strong class="what">([^<]+)</strong> <code>([^<]+)</code>', body)
    assert titles == [
        ("Started", "stream.started"),
        ("Progress", "stream.tokens"),
        ("Progress", "stream.tokens"),
        ("Progress", "stream.tokens"),
        ("Client disconnected", "stream.client_disconnected"),
        ("Usage reported", "stream.usage"),
    ]
    assert re.findall(r'<span class="offset">([^<]+)</span>', body) == [
        "+0.000 s",
        "+1.000 s",
        "+2.000 s",
        "+4.000 s",
        "+4.000 s",
        "+9.000 s",
    ]
    ledger = table(body.replace('<table class="ledger">', '<table id="ledger">'), "ledger")
    assert ledger.head[:4] == ["Entry", "Kind", "Reason", "Booked"]
    assert len(ledger.rows) == 1
    assert ledger.rows[0][1] == "settlement"
    booked = dict(zip(ledger.head[4:], ledger.rows[0][4:], strict=True))
    assert booked == {
        **dict.fromkeys(TOKEN_FIELDS, "0"),
        "input_tokens": "22",
        "output_tokens_billed": "750",
        "output_tokens_delivered": "380",
        "output_tokens_undelivered": "370",
        "Cost (USD)": "0.011316",
        # v3: no plan, so charged at cost; no failure policy, nothing left uncharged.
        "Charge (USD)": "0.011316",
        "Failure policy": "bill",
        "Leakage (USD)": "0",
    }
    assert '<dd id="leakage">0</dd>' in body
    assert "None: the figures agree with each other." in body


def test_anomalies_are_said_in_words(seeded: TestClient, tokens: dict[str, str]) -> None:
    sign_in(seeded, tokens["read"])
    body = seeded.get(f"/console/calls/{quote(XSS_REQUEST, safe='')}").text
    assert "has no price, so the cost is unknown, not zero." in body
    assert "<code>unpriced</code>" in body
    assert '<dd id="cost">unpriced</dd>' in body


def test_the_call_log_filters_by_key_and_pages_through_250_calls(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(seeded, tokens["read"])
    seen: list[str] = []
    url = f"/console/calls?api_key_id={BULK_KEY}"
    pages = 0
    while url:
        body = seeded.get(url).text
        pages += 1
        calls = table(body.replace('<table class="calls">', '<table id="calls">'), "calls")
        assert {row[2] for row in calls.rows} == {BULK_KEY}
        seen += [row[1] for row in calls.rows]
        found = re.search(r'<a href="([^"]+)" rel="next">Next page</a>', body)
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert pages == 3
    assert seen == [f"bulk-{i:03d}" for i in reversed(range(BULK_CALLS))]
    # the console's pages are the API's pages
    headers = {"Authorization": f"Bearer {tokens['read']}"}
    api: list[str] = []
    params = {"api_key_id": BULK_KEY}
    while True:
        answer = seeded.get("/v1/calls", params=params, headers=headers).json()
        api += [call["request_id"] for call in answer["data"]]
        if answer["next_cursor"] is None:
            break
        params = {"api_key_id": BULK_KEY, "cursor": answer["next_cursor"]}
    assert api == seen


def test_bad_filters_are_named_on_the_page(seeded: TestClient, tokens: dict[str, str]) -> None:
    sign_in(seeded, tokens["admin"])
    response = seeded.get("/console/calls", params={"status": "done", "since": "yesterday"})
    assert response.status_code == 422
    assert "<code>status</code>: must be one of open, completed" in response.text
    assert "<code>since</code>: &#39;yesterday&#39; is not an RFC 3339 timestamp" in response.text
    response = seeded.get("/console/usage", params={**DAY, "tz": "Mars/Olympus"})
    assert response.status_code == 422
    assert "<code>tz</code>: unknown time zone" in response.text
    response = seeded.get("/console/calls/no-such-call")
    assert response.status_code == 404
    assert "no call with request_id &#39;no-such-call&#39;" in response.text


def test_a_bad_budgets_cursor_is_named_on_the_page(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    """Any cursor the budgets page did not hand out is a 422 naming it, never a 500."""
    sign_in(seeded, tokens["admin"])
    for cursor in ("x", "0", "2026-12-01", "<script>"):
        response = seeded.get("/console/budgets", params={"cursor": cursor})
        assert response.status_code == 422, response.text
        assert "<code>cursor</code>: is not a cursor from this endpoint" in response.text
        assert "<script>" not in response.text.split("</head>")[1]


def test_the_usage_table_holds_exactly_the_numbers_of_v1_usage(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    api = seeded.get(
        "/v1/usage", params=KOLKATA_USAGE, headers={"Authorization": f"Bearer {tokens['read']}"}
    )
    assert api.status_code == 200
    rows = api.json()["data"]
    assert sum(r["calls"] for r in rows) == BULK_CALLS
    assert rows[0]["hour"] == "2026-10-15T05:00:00+05:30"  # 00:00Z falls in Kolkata's 05:00
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/usage", params=KOLKATA_USAGE).text
    shown = table(body, "usage-table")
    assert shown.head[0] == "hour"
    assert shown.rows == usage_as_table(rows, "hour")
    # every cost bar says the row's exact cost
    bars = re.findall(r'class="bar bar-cost_usd" data-period="([^"]+)" data-value="([^"]+)"', body)
    assert bars == [(r["hour"], r["cost_usd"]) for r in rows]
    assert 'data-value="' + str(rows[-1]["output_tokens_billed"]) + '"' in body
    # the time axis holds the local hours without calls too (48 hours, labelled every 4th)
    ticks = re.findall(r'class="label">(\d\d-\d\d \d\d:\d\d)</text>', body)
    assert ticks[:2] == ["10-15 00:00", "10-15 04:00"] and ticks[-1] == "10-16 20:00"


def test_the_console_exports_are_the_api_exports(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    headers = {"Authorization": f"Bearer {tokens['export']}"}
    sign_in(seeded, tokens["export"])
    page_body = seeded.get("/console/exports", params=DAY).text
    assert '<strong id="period">closed</strong>' in page_body
    links = re.findall(r'<a href="(/console/exports/[^"]+)" download>', page_body)
    assert len(links) == 2
    for link in links:
        link = link.replace("&amp;", "&")
        mine = seeded.get(link)
        api = seeded.get(link.replace("/console/exports/", "/v1/exports/"), headers=headers)
        assert mine.status_code == api.status_code == 200, link
        assert mine.content == api.content and len(mine.content) > 100
        assert mine.headers["x-billing-period"] == "closed"


def test_budgets_list_their_progress_and_state(seeded: TestClient, tokens: dict[str, str]) -> None:
    sign_in(seeded, tokens["admin"])
    assert "No budget in force." in seeded.get("/console/budgets").text
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    body = {"scope": {"api_key_id": "key_<b>x</b>"}, "limit_usd": "2", "period": "total"}
    made = seeded.post("/v1/budgets", json={"budget_id": "b-console", **body}, headers=admin)
    assert made.status_code == 201, made.text
    html = seeded.get("/console/budgets").text
    assert "b-console" in html and "key_&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert '<progress max="1" value="0">0 %</progress>' in html and "<strong>ok</strong>" in html
    assert "No hold: no authorization waits for its call." in html
    held = seeded.post(
        "/v1/authorizations",
        json={
            "request_id": "req-<i>h</i>",
            "api_key_id": "key_<b>x</b>",
            "model": "m-console",
            "tags": ["team-a", "team-b"],
            "estimate": {"amount_usd": "0.5"},
        },
        headers=admin,
    )
    assert held.json()["decision"] == "allow", held.text
    html = seeded.get("/console/budgets").text
    # Money and shares written for people (#43), the exact figures in the titles.
    assert (
        '<td class="num wrap" title="0.5 USD: 0 settled, 0 provisional, 0.5 held">$0.50 '
        '<span class="parts">($0.00 settled, $0.00 provisional, $0.50 held)</span></td>'
    ) in html
    assert '<td class="num" title="2 USD">$2.00</td>' in html
    assert '<progress max="1" value="0.25">25 %</progress> <span title="0.25">25 %</span>' in html
    assert "req-&lt;i&gt;h&lt;/i&gt;" in html and "team-a, team-b" in html
    held_cells = r'<td class="num" title="0.5">\$0\.50</td>\s*<td class="num">[0-9]+ s</td>'
    assert re.search(held_cells, html), html
    calls = seeded.get("/console/calls").text
    # (issue #43: the Calls page filters by customer and shows the charges)
    assert "this page does not show them yet" not in calls and 'name="customer_id"' in calls


def test_the_drift_template_puts_mismatches_first() -> None:
    """Rows in the shape of CONTRACT "Provider reports and drift" (``delta_pct`` per field, as
    the drift room answers it)."""

    def row(day: str, status: str, ours: int, theirs: int) -> dict[str, object]:
        figures = {
            "requests": 1,
            "input_tokens": ours,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": 0,
            "cost_usd": "0.5",
        }
        delta = {k: 0 for k in figures} | {"input_tokens": theirs - ours, "cost_usd": "0"}
        pct = {k: "0" for k in figures} | {"input_tokens": str(100 * (theirs - ours) // ours)}
        return {
            "provider": "anthropic",
            "day": day,
            "model": "<m>",
            "ours": figures,
            "theirs": {**figures, "input_tokens": theirs},
            "delta": delta,
            "delta_pct": pct,
            "status": status,
        }

    rows = [row("2026-10-01", "match", 10, 10), row("2026-10-02", "drift", 10, 11)]
    context = {"viewer": None, "current": "drift", **drift_view(rows)}
    body = page("drift.html", context).replace('<table class="drift">', '<table id="d">')
    shown = table(body, "d")
    assert [r[:4] for r in shown.rows] == [
        ["anthropic", "2026-10-02", "<m>", "drift"],
        ["anthropic", "2026-10-01", "<m>", "match"],
    ]
    assert "&lt;m&gt;" in body and "<m>" not in body
    # requests: ours, theirs, delta; then input_tokens with its percentage
    assert shown.rows[0][4:10] == ["1", "1", "0 (0 %)", "10", "11", "1 (10 %)"]


def test_docs_serve_swagger_ui_from_the_package(client: TestClient) -> None:
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "/console/static/swagger/swagger-ui-bundle.js" in docs.text
    assert "/console/static/swagger/swagger-ui.css" in docs.text
    assert "cdn" not in docs.text and "https://" not in docs.text
    js = client.get("/console/static/swagger/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 500_000
    assert "SwaggerUIBundle" in js.text[:2_000_000]
    assert client.get("/console/static/swagger/swagger-ui.css").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/redoc").status_code == 404  # it would load from a CDN


def test_the_drift_page_shows_the_drift_rows_of_the_api(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    """A provider bucket for a model we never saw: the page's row is ``/v1/drift``'s row, its
    model name escaped."""
    from datetime import UTC, datetime

    from tests.providers.pages import openai_page, openai_usage_result

    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    day = datetime(2026, 11, 10, tzinfo=UTC)
    period = {"since": "2026-11-10T00:00:00Z", "until": "2026-11-11T00:00:00Z"}
    ghost = openai_usage_result("<b>o3-ghost</b>", 1000, 0, 20, 3)
    body = {"provider": "openai", "kind": "usage", "report": openai_page([(day, [ghost])])}
    assert seeded.post("/v1/provider-reports", json=body, headers=admin).status_code == 200
    api = seeded.get("/v1/drift", params=period, headers=admin).json()["data"]
    assert [(row["model"], row["status"]) for row in api] == [("<b>o3-ghost</b>", "missing_ours")]

    sign_in(seeded, tokens["read"])
    html = seeded.get("/console/drift", params=period).text
    assert "Not built yet." not in html
    assert "&lt;b&gt;o3-ghost&lt;/b&gt;" in html and "<b>o3-ghost</b>" not in html
    assert "<strong>missing_ours</strong>" in html
