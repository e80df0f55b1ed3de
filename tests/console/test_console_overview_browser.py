"""(v3) The console's Overview in a real browser (CONTRACT "Observability and standard exports
(v3)"): its figures are ``/v1/usage``'s for the same range, its uPlot chart (shipped in the
package) has a point per day and model with a cost, nothing is fetched from elsewhere, and no
element is wider than a 1,400 px viewport. Reuses the console browser tests' fixtures."""

from __future__ import annotations

from typing import Any

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
