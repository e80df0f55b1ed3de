"""(v3) The console's Overview in a real browser (CONTRACT "Observability and standard exports
(v3)"): its figures are ``/v1/usage``'s for the same range, its uPlot chart (shipped in the
package) has a point per day and model with a cost, nothing is fetched from elsewhere, and no
element is wider than a 1,400 px viewport. Reuses the console browser tests' fixtures."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from urllib.parse import quote

import httpx

from tests.console.test_console_browser import _shot, _sign_in, browser, served  # noqa: F401

OCTOBER = {"since": "2026-10-01T00:00:00Z", "until": "2026-11-01T00:00:00Z"}
#: The widest any element may reach at a 1,400 px viewport.
VIEWPORT = 1400
_WIDEST = """() => {
  let widest = 0, what = '';
  for (const el of document.querySelectorAll('body *')) {
    const right = el.getBoundingClientRect().right;
    if (right > widest) { widest = right; what = el.tagName + '#' + el.id + '.' + el.className; }
  }
  return [Math.max(widest, document.documentElement.scrollWidth), what];
}"""


def _usage(url: str, token: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{url}/v1/usage", params={**OCTOBER, **params},
        headers={"Authorization": f"Bearer {token}"},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_the_overview_shows_v1_usage_and_a_chart_with_points(
    browser: Any,  # noqa: F811
    served: tuple[str, dict[str, str]],  # noqa: F811
) -> None:
    url, tokens = served
    context = browser.new_context(viewport={"width": VIEWPORT, "height": 900})
    page = context.new_page()
    external: list[str] = []
    page.on(
        "request",
        lambda request: None if request.url.startswith(url) else external.append(request.url),
    )
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    _sign_in(page, url, tokens["read"])
    assert page.url == f"{url}/console/overview"  # the console opens on the Overview
    page.goto(f"{url}/console/overview?since={OCTOBER['since']}&until={OCTOBER['until']}")
    page.wait_for_load_state("load")
    page.wait_for_selector("#spend-chart[data-points]")

    (total,) = _usage(url, tokens["read"])
    # An unpriced call (the HTML one) makes October's total unknown, as /v1/usage says it.
    assert total["cost_usd"] is None and total["charge_usd"] is None
    assert page.locator("#fig-cost").get_attribute("data-exact") == ""
    assert page.locator("#fig-cost").inner_text() == "unknown"
    assert page.locator("#fig-unpriced").get_attribute("data-exact") == "1"
    assert page.locator("#fig-calls").get_attribute("data-exact") == str(total["calls"])
    billed, undelivered = total["output_tokens_billed"], total["output_tokens_undelivered"]
    assert page.locator("#fig-undelivered").get_attribute("data-exact") == (
        f"{undelivered}/{billed}"
    )
    assert billed > 0 and undelivered == 370  # the seed call's
    # Written for people: a percentage of the billed output.
    share = page.locator("#fig-undelivered").inner_text()
    assert share == f"{round(100 * undelivered / billed, 1)} %"
    # The top models are /v1/usage by model, by cost.
    by_model = sorted(
        _usage(url, tokens["read"], group_by="model"),
        key=lambda r: -float(r["cost_usd"] or 0),
    )
    cells = page.eval_on_selector_all(
        "#top-models tbody tr",
        "rows => rows.map(r => [r.cells[0].textContent.trim(), r.cells[2].dataset.exact])",
    )
    # (an unknown cost has no data-exact: no attribute says "None")
    assert cells == [[r["model"], r["cost_usd"]] for r in by_model[:5]]

    # The chart: uPlot drew it (a canvas), with a point per (day, model) that has a cost.
    per_day = _usage(url, tokens["read"], group_by="day,model")
    with_cost = [r for r in per_day if r["cost_usd"] is not None]
    assert len(with_cost) >= 1
    assert page.locator("#spend-chart").get_attribute("data-points") == str(len(with_cost))
    assert page.locator("#spend-chart canvas").count() == 1
    assert page.locator("#spend-chart .u-legend").inner_text().count("claude") >= 1

    # The seed day alone (no unpriced call): the totals are known, written as dollars.
    seed_day = {"since": "2026-10-15T00:00:00Z", "until": "2026-10-16T00:00:00Z"}
    page.goto(f"{url}/console/overview?since={seed_day['since']}&until={seed_day['until']}")
    page.wait_for_selector("#spend-chart[data-points]")
    (day,) = _usage(url, tokens["read"], **seed_day)
    assert day["cost_usd"] is not None
    assert page.locator("#fig-cost").get_attribute("data-exact") == day["cost_usd"]
    assert page.locator("#fig-charge").get_attribute("data-exact") == day["charge_usd"]
    assert page.locator("#fig-cost").inner_text().startswith("$")

    widest, what = page.evaluate(_WIDEST)
    assert widest <= VIEWPORT, what
    assert external == [] and errors == []
    _shot(page, "20-overview")
    context.close()


def test_customers_keys_and_alerts_pages(
    browser: Any,  # noqa: F811
    served: tuple[str, dict[str, str]],  # noqa: F811
) -> None:
    url, tokens = served
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    plan = {"plan_id": "pro", "effective_from": "2026-01-01T00:00:00Z", "markup_pct": "20"}
    assert httpx.post(f"{url}/v1/plans", json=plan, headers=admin).status_code == 201
    key = {"customer_id": "acme", "plan_id": "pro", "effective_from": "2026-01-01T00:00:00Z"}
    assert httpx.put(f"{url}/v1/keys/key_bulk", json=key, headers=admin).status_code == 201
    budget = {"budget_id": "b-acme", "scope": {"customer_id": "acme"}, "limit_usd": "100",
              "period": "total"}  # fmt: skip
    assert httpx.post(f"{url}/v1/budgets", json=budget, headers=admin).status_code == 201
    context = browser.new_context(viewport={"width": VIEWPORT, "height": 900})
    page = context.new_page()
    _sign_in(page, url, tokens["read"])
    since = f"since={OCTOBER['since']}&until={OCTOBER['until']}"

    page.goto(f"{url}/console/keys?{since}")
    rows = page.eval_on_selector_all(
        "#keys tbody tr",
        "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent.trim()))",
    )
    listed = {r[0]: r for r in rows}
    assert listed["key_bulk"][2:4] == ["acme", "pro"]
    (bulk,) = _usage(url, tokens["read"], api_key_id="key_bulk")
    assert listed["key_bulk"][4] == f"{bulk['calls']:,}"
    exact = page.locator("#keys tbody tr", has_text="key_bulk").locator("td[data-exact]").first
    assert exact.get_attribute("data-exact") == bulk["cost_usd"]
    assert page.evaluate(_WIDEST)[0] <= VIEWPORT
    _shot(page, "21-keys")

    page.goto(f"{url}/console/customers?{since}")
    row = page.locator("#customers tbody tr", has_text="acme").inner_text()
    assert "pro" in row and "b-acme: ok" in row and "$100.00" in row
    assert page.evaluate(_WIDEST)[0] <= VIEWPORT
    _shot(page, "22-customers")

    page.goto(f"{url}/console/alerts")
    assert page.locator("h1").inner_text() == "Alerts"
    assert page.evaluate(_WIDEST)[0] <= VIEWPORT
    _shot(page, "23-alerts")
    context.close()


#: A key id of 124 characters, and names a page must show as text (#43).
LONG_KEY = ("key_<b>" + "0123456789abcdef" * 8)[:124]
HOSTILE_CUSTOMER = "<i>acme</i> & sons " + "c" * 90
HOSTILE_BUDGET = "b-<script>x</script>-" + "z" * 90
LONG_REQUEST = "req-<u>long</u>-" + "r" * 100


def test_every_column_is_visible_at_1400_px_with_long_and_hostile_ids(
    browser: Any,  # noqa: F811
    served: tuple[str, dict[str, str]],  # noqa: F811
) -> None:
    """A 124-character key id, a customer, budget and request named with markup: every page
    that shows them fits 1,400 px (no column behind a scrollbar), a cut id keeps its whole
    value in its title, shares read as percentages and the chart's axis as dollars."""
    url, tokens = served
    admin = {"Authorization": f"Bearer {tokens['admin']}"}

    def ok(response: httpx.Response) -> None:
        assert response.status_code in (200, 201), response.text

    at = "2026-10-15T12:00:00Z"
    started = {"event_id": "long-s", "request_id": LONG_REQUEST, "type": "stream.started",
               "occurred_at": at, "api_key_id": LONG_KEY, "model": "claude-sonnet-5-5",
               "protocol": "anthropic.messages", "input_tokens": 104_260}  # fmt: skip
    usage = {"event_id": "long-u", "request_id": LONG_REQUEST, "type": "stream.usage",
             "occurred_at": "2026-10-15T12:00:05Z", "input_tokens": 104_260,
             "output_tokens": 4_100, "source": "upstream"}  # fmt: skip
    ok(httpx.post(f"{url}/v1/events", json={"events": [started, usage]}, headers=admin))
    ok(httpx.post(f"{url}/v1/reconcile", json={}, headers=admin))
    plan = {"plan_id": "pro", "effective_from": "2026-01-01T00:00:00Z", "markup_pct": "20"}
    ok(httpx.post(f"{url}/v1/plans", json=plan, headers=admin))
    key = {"customer_id": HOSTILE_CUSTOMER, "plan_id": "pro", "name": "<b>Key</b> " + "n" * 60,
           "effective_from": "2026-01-01T00:00:00Z"}  # fmt: skip
    ok(httpx.put(f"{url}/v1/keys/{quote(LONG_KEY, safe='')}", json=key, headers=admin))
    spent = httpx.get(f"{url}/v1/usage", params={**OCTOBER, "api_key_id": LONG_KEY}, headers=admin)
    (key_usage,) = spent.json()["data"]
    # a limit the key has used 90 % of (its cost / 0.9, to the pico-dollar)
    limit = (Decimal(key_usage["cost_usd"]) / Decimal("0.9")).quantize(Decimal("0.000001"))
    budget = {"budget_id": HOSTILE_BUDGET, "scope": {"api_key_id": LONG_KEY},
              "limit_usd": str(limit), "period": "total"}  # fmt: skip
    ok(httpx.post(f"{url}/v1/budgets", json=budget, headers=admin))
    grant = {"grant_id": "g-<b>" + "g" * 100, "customer_id": HOSTILE_CUSTOMER,
             "amount_usd": "1234.5", "kind": "purchased"}  # fmt: skip
    ok(httpx.post(f"{url}/v1/credits/grants", json=grant, headers=admin))

    context = browser.new_context(viewport={"width": VIEWPORT, "height": 900})
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    _sign_in(page, url, tokens["admin"])
    since = f"since={OCTOBER['since']}&until={OCTOBER['until']}"
    customer = quote(HOSTILE_CUSTOMER, safe="")
    pages = {
        "30-keys": f"/console/keys?{since}",
        "31-budgets": "/console/budgets",
        "32-alerts": "/console/alerts",
        "33-call": f"/console/calls/{quote(LONG_REQUEST, safe='')}",
        "34-credits": f"/console/credits?customer_id={customer}",
        "35-overview": f"/console/overview?{since}",
        "36-usage": f"/console/usage?api_key_id={quote(LONG_KEY, safe='')}&{since}",
        "37-calls": f"/console/calls?{since}",
        "38-customers": f"/console/customers?{since}",
    }
    for name, path in pages.items():
        response = page.goto(f"{url}{path}")
        assert response is not None and response.status == 200, path
        page.wait_for_load_state("load")
        _shot(page, name)
        widest, what = page.evaluate(_WIDEST)
        assert widest <= VIEWPORT, (path, what)
        assert page.locator("main script, main b, main i, main u").count() == 0, path

        if name == "30-keys":
            row = page.locator("#keys tbody tr", has_text=LONG_KEY[:20])
            cut = row.locator("th .ident")
            assert cut.get_attribute("title") == LONG_KEY and cut.text_content() == LONG_KEY
            customer_cell = row.locator("td").nth(1)
            assert customer_cell.is_visible()
            box = customer_cell.bounding_box()
            assert box is not None and box["x"] + box["width"] <= VIEWPORT
        elif name == "31-budgets":
            row = page.locator("#budgets tbody tr", has_text="warning")
            state = row.locator("td strong")
            assert state.inner_text() == "warning" and state.is_visible()
            status = httpx.get(
                f"{url}/v1/budgets/{quote(HOSTILE_BUDGET, safe='')}", headers=admin
            ).json()
            assert Decimal(status["fraction_used"]).quantize(Decimal("0.001")) == Decimal("0.9")
            assert row.locator("progress").get_attribute("value") == status["fraction_used"]
            assert row.locator("progress + span").inner_text() == "90 %"
        elif name == "32-alerts":
            threshold = page.locator("#alerts tbody tr").first.locator("td.num").first
            assert threshold.inner_text() == "80 %"
        elif name == "33-call":
            ledger = page.locator("table.ledger")
            box = ledger.bounding_box()
            assert box is not None and box["x"] + box["width"] <= VIEWPORT
            assert ledger.locator("thead th").last.is_visible()
        elif name == "34-credits":
            pairs = page.eval_on_selector_all(
                ".figures.balance > div",
                """divs => divs.map(d => {
                  const t = d.querySelector('dt').getBoundingClientRect();
                  const v = d.querySelector('dd').getBoundingClientRect();
                  return [d.querySelector('dt').textContent, t.left, v.left, t.bottom <= v.top + 1];
                })""",
            )
            assert [p[0] for p in pairs][:5] == [
                "balance", "held", "pending (open calls)", "available", "overdraft",
            ]  # fmt: skip
            assert all(p[1] == p[2] and p[3] for p in pairs), pairs  # each value under its label
            assert page.locator("#balance-balance").inner_text() == "$1,234.50"
            amount = page.locator("table.grants tbody td.num").first
            assert (amount.inner_text(), amount.get_attribute("title")) == ("$1,234.50", "1234.5")
        elif name == "35-overview":
            page.wait_for_selector("#spend-chart[data-y-ticks]")
            ticks = page.locator("#spend-chart").get_attribute("data-y-ticks") or ""
            assert ticks and all(t.startswith("$") for t in ticks.split("|")), ticks
            assert "e+" not in ticks.lower() and "e-" not in ticks.lower()
            near = page.locator("#near-budgets tbody tr", has_text="warning")
            assert near.locator("td").last.inner_text() == "90 %"
        elif name == "36-usage":
            labels = page.locator("svg.chart-svg text.axis-top").all_text_contents()
            # under a dollar: 4 significant digits (the exact cost is in the bar's title)
            assert key_usage["cost_usd"] == "0.37428"
            assert labels == ["$0.3743", "104,260"]
    assert dialogs == [] and errors == []
    context.close()


def test_the_overview_in_a_time_zone_draws_that_zones_days(
    browser: Any,  # noqa: F811
    served: tuple[str, dict[str, str]],  # noqa: F811
) -> None:
    """(#43) ``tz=Asia/Kolkata``: the chart has a point per Kolkata (day, model) with a cost,
    its axis reads the zone's days (uPlot's ``tzDate``), and the form keeps the zone."""
    url, tokens = served
    context = browser.new_context(viewport={"width": VIEWPORT, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    _sign_in(page, url, tokens["read"])
    kolkata = {
        "since": "2026-10-14T00:00:00+05:30",
        "until": "2026-10-17T00:00:00+05:30",
        "tz": "Asia/Kolkata",
    }
    page.goto(f"{url}/console/overview?" + "&".join(f"{k}={quote(v)}" for k, v in kolkata.items()))
    page.wait_for_selector("#spend-chart[data-points]")
    per_day = _usage(url, tokens["read"], **kolkata, group_by="day,model")
    with_cost = [r for r in per_day if r["cost_usd"] is not None]
    assert len(with_cost) >= 2
    assert page.locator("#spend-chart").get_attribute("data-points") == str(len(with_cost))
    assert page.locator("#tz").input_value() == "Asia/Kolkata"
    # The day table, opened: /v1/usage's days in Kolkata.
    page.locator("details summary").click()
    days = page.eval_on_selector_all(
        "#spend-days tbody tr", "rows => rows.map(r => r.cells[0].textContent.trim())"
    )
    assert days == sorted({r["day"] for r in per_day})
    # The x axis is drawn through uPlot's tzDate in the page's zone: each day's point is
    # that zone's midnight (whatever the browser's own zone).
    ticks = page.evaluate(
        """() => { const s = JSON.parse(document.getElementById('spend-chart').dataset.spend);
        return s.x.map(t => { const d = uPlot.tzDate(new Date(t * 1e3), s.tz);
          return [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(),
                  d.getMinutes()]; }); }"""
    )
    assert ticks == [[2026, 10, day, 0, 0] for day in (14, 15, 16)]
    widest, what = page.evaluate(_WIDEST)
    assert widest <= VIEWPORT, what
    assert errors == []
    _shot(page, "21-overview-kolkata")
    context.close()
