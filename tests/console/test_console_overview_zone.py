"""(#43) The Overview over a chosen range and time zone (CONTRACT "Observability and standard
exports (v3)", "Console (v2)"): with ``tz`` its chart's days and each day's figures are
``/v1/usage?group_by=day&tz=`` for the same range, to the exact string; the default range is the
zone's last 30 whole days; a bad or unknown parameter is named on the 422 page, as the Usage page
names it. Runs on SQLite, or on PostgreSQL with ``BILLING_TEST_DATABASE_URL``."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from fastapi.testclient import TestClient

from billing.console.overview import overview_defaults
from tests.console.conftest import table
from tests.console.test_console_http import sign_in

KOLKATA = {
    "since": "2026-10-14T00:00:00+05:30",
    "until": "2026-10-17T00:00:00+05:30",
    "tz": "Asia/Kolkata",
}


def _usage(client: TestClient, token: str, **params: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"}
    response = client.get("/v1/usage", params=params, headers=headers)
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()["data"]
    return rows


def _spend(body: str) -> dict[str, Any]:
    found = re.search(r'data-spend="([^"]*)"', body)
    assert found is not None
    data: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return data


def _exact(body: str, table_id: str) -> list[list[str | None]]:
    """Each row of the table ``table_id``: its header cell, then the cells' ``data-exact``
    (None where a cell has none: an unknown amount)."""
    part = body.split(f'id="{table_id}"')[1].split("</table>")[0]
    rows = []
    for row in re.findall(r"<tr><th scope=\"row\">(.*?)</tr>", part):
        day = re.match(r"([^<]*)</th>", row)
        assert day is not None
        cells = re.findall(r"<td class=\"num\"([^>]*)>", row)
        exact = [re.search(r'data-exact="([^"]*)"', c) for c in cells]
        rows.append([day.group(1), *[m.group(1) if m else None for m in exact]])
    return rows


def test_the_overview_in_kolkata_shows_the_days_and_totals_of_v1_usage(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(seeded, tokens["read"])
    response = seeded.get("/console/overview", params=KOLKATA)
    assert response.status_code == 200, response.text
    body = response.text
    by_day = _usage(seeded, tokens["read"], **KOLKATA, group_by="day")
    # The bulk calls (2026-10-15 UTC, from 00:00 for 20h50) fall on two Kolkata days.
    assert [r["day"] for r in by_day] == ["2026-10-14", "2026-10-15", "2026-10-16"]
    days = table(body, "spend-days")
    assert [row[0] for row in days.rows] == [r["day"] for r in by_day]
    assert [row[1] for row in days.rows] == [f"{r['calls']:,}" for r in by_day]
    assert _exact(body, "spend-days") == [
        [r["day"], None, r["cost_usd"], r["charge_usd"]] for r in by_day
    ]
    # The chart: the zone's days, starting at the local midnights, each model's cost that day.
    spend = _spend(body)
    zone = ZoneInfo("Asia/Kolkata")
    assert spend["tz"] == "Asia/Kolkata"
    assert spend["days"] == ["2026-10-14", "2026-10-15", "2026-10-16"]
    assert spend["x"] == [int(datetime(2026, 10, d, tzinfo=zone).timestamp()) for d in (14, 15, 16)]
    assert spend["until"] == int(datetime(2026, 10, 17, tzinfo=zone).timestamp())
    by_model = _usage(seeded, tokens["read"], **KOLKATA, group_by="day,model")
    points = {
        (name, day): value
        for s in spend["series"]
        for name, day, value in zip([s["name"]] * 3, spend["days"], s["values"], strict=True)
        if value is not None
    }
    assert points == {
        (r["model"], r["day"]): r["cost_usd"] for r in by_model if r["cost_usd"] is not None
    }
    # The period's totals: /v1/usage's one row (an unpriced call makes its cost unknown).
    (total,) = _usage(seeded, tokens["read"], **KOLKATA)
    assert f'id="fig-calls" data-exact="{total["calls"]}"' in body
    assert f'id="fig-cost" data-exact="{total["cost_usd"] or ""}"' in body
    # The form keeps the zone.
    assert 'id="tz" name="tz" list="zones" value="Asia/Kolkata"' in body
    assert "(Asia/Kolkata days)" in body

    # The seed day in Kolkata, every call priced: the known totals are /v1/usage's too.
    day = {**KOLKATA, "since": "2026-10-15T00:00:00+05:30", "until": "2026-10-16T00:00:00+05:30"}
    body = seeded.get("/console/overview", params=day).text
    (total,) = _usage(seeded, tokens["read"], **day)
    assert total["cost_usd"] is not None
    assert f'id="fig-cost" data-exact="{total["cost_usd"]}"' in body
    assert f'id="fig-charge" data-exact="{total["charge_usd"] or ""}"' in body
    (only,) = _usage(seeded, tokens["read"], **day, group_by="day")
    assert _exact(body, "spend-days") == [[only["day"], None, only["cost_usd"], only["charge_usd"]]]


def test_the_default_range_is_the_zones_last_30_whole_days() -> None:
    # 20:00 UTC is 01:30 the next day in Kolkata: that day is "today" there.
    now = datetime(2026, 10, 31, 20, 0, tzinfo=UTC)
    filled = dict(overview_defaults([("tz", "Asia/Kolkata")], now))
    assert filled == {
        "tz": "Asia/Kolkata",
        "since": "2026-10-03T00:00:00+05:30",
        "until": "2026-11-02T00:00:00+05:30",
    }
    assert dict(overview_defaults([], now)) == {
        "since": "2026-10-02T00:00:00+00:00",
        "until": "2026-11-01T00:00:00+00:00",
    }
    # Across a change of offset: whole local days, each bound with its own offset.
    berlin = dict(overview_defaults([("tz", "Europe/Berlin")], now))
    assert berlin["since"] == "2026-10-02T00:00:00+02:00"
    assert berlin["until"] == "2026-11-01T00:00:00+01:00"
    # A bound given is kept, never replaced (a bad one is then named by the page).
    assert dict(overview_defaults([("since", "x")], now))["since"] == "x"


def test_the_default_range_of_the_page_is_in_the_zone(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/overview", params={"tz": "Asia/Kolkata"}).text
    spend = _spend(body)
    zone = ZoneInfo("Asia/Kolkata")
    today = datetime.now(zone).date()
    # 30 whole Kolkata days, today included (the clock may just have crossed a midnight).
    assert len(spend["days"]) == 30
    assert spend["days"][-1] in (str(today), str(today - timedelta(days=1)))
    last = datetime.fromisoformat(spend["days"][-1]).replace(tzinfo=zone)
    assert spend["until"] == int((last + timedelta(days=1)).timestamp())
    assert spend["x"][0] == int((last - timedelta(days=29)).timestamp())
    since = html.unescape(re.search(r'id="since" name="since" value="([^"]*)"', body).group(1))  # type: ignore[union-attr]
    assert since.endswith("T00:00:00+05:30")


def test_bad_parameters_are_named_on_the_422_page_as_the_usage_page_names_them(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(seeded, tokens["read"])
    cases = [
        ({"since": "x"}, "<code>since</code>: &#39;x&#39; is not an RFC 3339 timestamp"),
        ({"tz": "Mars/Olympus"}, "<code>tz</code>: unknown time zone &#39;Mars/Olympus&#39;"),
        (
            {"since": "2026-10-15T00:00:00Z", "until": "2026-10-14T00:00:00Z"},
            "<code>until</code>: must be after since",
        ),
        ({"group_by": "day"}, "<code>group_by</code>: is not a known query parameter"),
    ]
    for params, message in cases:
        response = seeded.get("/console/overview", params=params)
        assert response.status_code == 422, params
        assert "The query has problems" in response.text
        assert message in response.text, params
        assert 'id="fig-cost"' not in response.text  # no figures of another period
        # The form keeps what was sent.
        for name, value in params.items():
            if name in ("since", "until", "tz"):
                assert f'name="{name}"' in response.text
                assert f'value="{html.escape(value)}"' in response.text
    # The Usage page words the same problems alike.
    usage = seeded.get("/console/usage", params={"tz": "Mars/Olympus"})
    overview = seeded.get("/console/overview", params={"tz": "Mars/Olympus"})
    assert usage.status_code == overview.status_code == 422
    said = re.compile(r"<li><code>tz</code>: [^<]*</li>")
    assert said.findall(usage.text) == said.findall(overview.text) != []
    usage = seeded.get("/console/usage", params={"since": "x"})
    overview = seeded.get("/console/overview", params={"since": "x"})
    said = re.compile(r"<li><code>since</code>: [^<]*</li>")
    assert said.findall(usage.text) == said.findall(overview.text) != []


def test_a_period_whose_previous_one_is_before_year_1_is_a_422_not_a_500(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    # The period of the same length before 1900-01-01 → 4000-01-01 starts before year 1: the
    # page answered 500 (OverflowError) instead of naming the problem.
    sign_in(seeded, tokens["read"])
    params = {"since": "1900-01-01T00:00:00Z", "until": "4000-01-01T00:00:00Z"}
    response = seeded.get("/console/overview", params=params)
    assert response.status_code == 422, response.text
    assert "The query has problems" in response.text
    # Named on the form's own field (the Overview has no group_by, which it named).
    assert "<code>until</code>: the Overview charts the period by day: at most 20000 days" in (
        response.text
    )
    assert "<code>group_by</code>" not in response.text
    # A period that starts at the earliest instant has no period before it: zeros, not a 500.
    first = {"since": "1900-01-01T00:00:00Z", "until": "1900-01-15T00:00:00Z"}
    assert seeded.get("/console/overview", params=first).status_code == 200
