"""The console's long lists a page at a time, their figures read for the page only: Keys,
Customers and Budgets follow their "Next page" links to the end; the Overview's budgets near
their limit are ranked by the counters, its top keys and customers by the rollups, its unpriced
calls counted from the rollups. Runs on SQLite, or on PostgreSQL with
``BILLING_TEST_DATABASE_URL``. Source: CONTRACT "Observability and standard exports (v3)",
issue #43 (every page fast at 1,000,000 calls)."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from billing.console import overview, pages, views
from billing.plans.service import keys_in_force_of
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker, read_transaction, write_transaction
from billing.storage.models import KeyAssignment
from tests.console.conftest import BULK_CALLS, BULK_KEY, XSS_KEY, table
from tests.console.test_console_http import DAY, sign_in

_NEXT = re.compile(r'<p class="pager"><a href="([^"]+)">Next page</a></p>')


def _walk(client: TestClient, path: str, table_id: str) -> list[list[list[str]]]:
    """Each page's table rows, from ``path`` along its "Next page" links."""
    found = []
    while True:
        body = client.get(path).text
        found.append(table(body, table_id).rows if f'id="{table_id}"' in body else [])
        link = _NEXT.search(body)
        if link is None:
            return found
        path = html.unescape(link.group(1))


def _usage(client: TestClient, admin: dict[str, str], **params: str) -> list[dict[str, Any]]:
    response = client.get("/v1/usage", params={**DAY, **params}, headers=admin)
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()["data"]
    return rows


def _put_key(client: TestClient, admin: dict[str, str], key: str, customer: str) -> None:
    body = {"customer_id": customer, "effective_from": "2026-01-01T00:00:00Z"}
    assert client.put(f"/v1/keys/{key}", json=body, headers=admin).status_code == 201
    # The key's calls are charged to the customer again.
    assert client.post("/v1/reconcile", json={}, headers=admin).status_code == 200


def _budget(client: TestClient, admin: dict[str, str], budget_id: str, scope: dict[str, str],
            limit: Decimal) -> None:  # fmt: skip
    body = {"budget_id": budget_id, "scope": scope, "limit_usd": str(limit), "period": "total",
            "thresholds": ["0.5", "0.8"]}  # fmt: skip
    made = client.post("/v1/budgets", json=body, headers=admin)
    assert made.status_code == 201, made.text


def test_keys_customers_and_budgets_are_paged_with_the_figures_of_each_page(
    seeded: TestClient, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    _put_key(seeded, admin, BULK_KEY, "acme")
    _put_key(seeded, admin, "key_idle", "beta")
    for n in (1, 2, 3):
        _budget(seeded, admin, f"b-{n}", {"customer_id": "acme"}, Decimal(1000 * n))
    monkeypatch.setattr(pages, "KEYS_PER_PAGE", 1)
    monkeypatch.setattr(pages, "CUSTOMERS_PER_PAGE", 1)
    monkeypatch.setattr(views, "BUDGETS_PER_PAGE", 2)
    sign_in(seeded, tokens["admin"])
    query = f"since={DAY['since']}&until={DAY['until']}"

    keys = _walk(seeded, f"/console/keys?{query}", "keys")
    listed = seeded.get("/v1/keys", headers=admin).json()["data"]
    assert [len(rows) for rows in keys] == [1] * len(listed)
    assert [rows[0][0] for rows in keys] == [k["api_key_id"] for k in listed]
    by_key = {rows[0][0]: rows[0] for rows in keys}
    (bulk,) = _usage(seeded, admin, api_key_id=BULK_KEY)
    assert bulk["calls"] == BULK_CALLS
    assert by_key[BULK_KEY][2] == "acme" and by_key[BULK_KEY][4] == f"{BULK_CALLS:,}"
    (xss,) = _usage(seeded, admin, api_key_id=XSS_KEY)
    assert by_key[XSS_KEY][4] == f"{xss['calls']:,}"
    assert by_key["key_idle"][2] == "beta" and by_key["key_idle"][4] == "0"

    customers = _walk(seeded, f"/console/customers?{query}", "customers")
    assert [[row[0] for row in rows] for rows in customers] == [["acme"], ["beta"]]
    acme, beta = customers[0][0], customers[1][0]
    assert acme[1:3] == ["", "1"] and acme[4] == f"{BULK_CALLS:,}"
    assert [part.split(":")[0] for part in acme[3].split("; ")] == ["b-1", "b-2", "b-3"]
    assert beta[1:5] == ["", "1", "", "0"]

    budgets = _walk(seeded, "/console/budgets", "budgets")
    assert [[row[0] for row in rows] for rows in budgets] == [["b-1", "b-2"], ["b-3"]]


def test_the_overview_ranks_budgets_keys_and_customers_without_reading_them_all(
    seeded: TestClient, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    _put_key(seeded, admin, BULK_KEY, "acme")
    (bulk,) = _usage(seeded, admin, api_key_id=BULK_KEY)
    cost = Decimal(bulk["cost_usd"])
    # spent / limit: 2 (exceeded), 0.9 (warning), 0.6 (warning), 0.01 (ok)
    limits = {"b-over": cost / 2, "b-90": cost / Decimal("0.9"), "b-60": cost / Decimal("0.6"),
              "b-ok": cost * 100}  # fmt: skip
    for budget_id, limit in limits.items():
        _budget(seeded, admin, budget_id, {"api_key_id": BULK_KEY}, limit.quantize(Decimal("1e-9")))
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/overview", params=DAY).text
    near = [row[0] for row in table(body, "near-budgets").rows]
    assert near == ["b-over", "b-90", "b-60"]
    # Only the fullest two are read: the third near its limit is not shown.
    monkeypatch.setattr(overview, "BUDGETS_READ", 2)
    body = seeded.get("/console/overview", params=DAY).text
    assert [row[0] for row in table(body, "near-budgets").rows] == ["b-over", "b-90"]

    # The top keys: /v1/usage by key, by cost (an unknown cost as 0), then name.
    rows = _usage(seeded, admin, group_by="api_key_id")
    ranked = sorted(rows, key=lambda r: (-Decimal(r["cost_usd"] or 0), str(r["api_key_id"])))
    shown = [row[0] for row in table(body, "top-keys").rows]
    assert shown == [r["api_key_id"] or "(none)" for r in ranked][: overview.TOP]
    customers = [row[0] for row in table(body, "top-customers").rows]
    assert customers[0] == "acme"
    # The unpriced calls: the XSS call's model has no price.
    unpriced = sum(1 for r in rows if r["cost_usd"] is None)
    assert unpriced == 1
    assert 'id="fig-unpriced" data-exact="1"' in body


def test_the_top_keys_of_a_period_off_the_quarter_hours_are_those_of_v1_usage(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    """The minutes outside the rollups' buckets (7 at the start, 8 at the end) count in the
    figures of the keys shown, read from the calls."""
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    period = {"since": "2026-10-15T00:07:00Z", "until": "2026-10-15T20:52:00Z"}
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/overview", params=period).text
    response = seeded.get("/v1/usage", params={**period, "group_by": "api_key_id"}, headers=admin)
    rows = response.json()["data"]
    ranked = sorted(rows, key=lambda r: (-Decimal(r["cost_usd"] or 0), str(r["api_key_id"])))
    expected = [[r["api_key_id"] or "(none)", f"{r['calls']:,}"] for r in ranked][: overview.TOP]
    assert [row[:2] for row in table(body, "top-keys").rows] == expected
    bulk = next(r for r in rows if r["api_key_id"] == BULK_KEY)
    # one call every 5 minutes from 00:00
    assert bulk["calls"] == sum(1 for k in range(BULK_CALLS) if 7 <= 5 * k < 20 * 60 + 52)
    cells = re.findall(r'<td class="num" data-exact="([^"]*)"', body.split('id="top-keys"')[1])
    assert cells[:2] == [bulk["cost_usd"], bulk["charge_usd"] or "None"]


def _edge_call(client: TestClient, admin: dict[str, str], key: str, at: str, output: int) -> None:
    events = [
        {"event_id": f"{key}-s", "request_id": f"{key}-r", "type": "stream.started",
         "occurred_at": at, "api_key_id": key, "model": "claude-sonnet-5-5",
         "protocol": "anthropic.messages", "input_tokens": 10},
        {"event_id": f"{key}-u", "request_id": f"{key}-r", "type": "stream.usage",
         "occurred_at": at, "input_tokens": 10, "output_tokens": output, "source": "upstream"},
    ]  # fmt: skip
    response = client.post("/v1/events", json={"events": events}, headers=admin)
    assert response.status_code == 200, response.text
    assert client.post("/v1/reconcile", json={}, headers=admin).status_code == 200


def _top_keys_expected(client: TestClient, admin: dict[str, str], period: dict[str, str]) -> Any:
    rows = _usage(client, admin, group_by="api_key_id", **period)
    ranked = sorted(rows, key=lambda r: (-Decimal(r["cost_usd"] or 0), str(r["api_key_id"])))
    return [[r["api_key_id"] or "(none)", f"{r['calls']:,}"] for r in ranked][: overview.TOP]


def test_keys_whose_calls_are_all_off_the_quarter_hours_are_ranked_with_them(
    seeded: TestClient, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A period inside one quarter hour has no rollup bucket at all, and a key whose calls
    fall only in a period's minutes off the grid is not in the rollups' ranking: both are
    ranked by their exact figures, as ``/v1/usage`` gives them."""
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    sign_in(seeded, tokens["read"])
    inside = {"since": "2026-10-15T00:01:00Z", "until": "2026-10-15T00:14:00Z"}
    body = seeded.get("/console/overview", params=inside).text
    assert [row[:2] for row in table(body, "top-keys").rows] == [[BULK_KEY, "2"]]
    assert _top_keys_expected(seeded, admin, inside) == [[BULK_KEY, "2"]]
    # One large call at 00:03, before the first whole quarter hour of a period from 00:01;
    # the rollups rank only key_bulk (RANKED = 1), whose calls from 00:15 cost less.
    _edge_call(seeded, admin, "key_edge", "2026-10-15T00:03:00Z", 100_000)
    monkeypatch.setattr(overview, "RANKED", 1)
    period = {"since": "2026-10-15T00:01:00Z", "until": "2026-10-15T02:00:00Z"}
    body = seeded.get("/console/overview", params=period).text
    expected = _top_keys_expected(seeded, admin, period)
    assert expected == [["key_edge", "1"], [BULK_KEY, "23"]]
    assert [row[:2] for row in table(body, "top-keys").rows] == expected


def test_the_customers_keys_and_plans_are_those_of_each_keys_assignment_in_force(
    settings: Settings,
) -> None:
    """``keys_in_force_of`` (counted in SQL): a key counts for the customer of its latest
    assignment at or before ``now`` only; a later one replaces it, a future one does not yet;
    a key without a plan counts but names none; customers outside the page are not read."""
    sessions = make_sessionmaker(make_engine(settings))
    jan, feb, mar, apr = (datetime(2026, m, 1, tzinfo=UTC) for m in (1, 2, 3, 4))
    versions = [
        ("k1", jan, "acme", "pro"),
        ("k2", jan, "acme", None),
        ("k3", jan, "acme", "gold"),
        ("k3", feb, "beta", "gold"),  # k3 moved to beta in February
        ("k4", jan, "beta", "pro"),
        ("k4", apr, "acme", "pro"),  # not yet in force on March 1
        ("k5", feb, "acme", "pro"),
        ("k6", jan, "gamma", "pro"),  # not on the page
        ("k7", jan, None, "pro"),  # no customer
        ("k8", apr, "acme", "gold"),  # no assignment in force yet
    ]
    with write_transaction(sessions) as session:
        session.add_all(
            KeyAssignment(api_key_id=k, effective_from=at, customer_id=c, plan_id=p, created_at=jan)
            for k, at, c, p in versions
        )
    with read_transaction(sessions) as session:
        assert keys_in_force_of(session, ["acme", "beta", "delta"], mar) == {
            "acme": (3, ["pro"]),
            "beta": (2, ["gold", "pro"]),
        }
        assert keys_in_force_of(session, ["acme", "beta"], apr) == {
            "acme": (5, ["gold", "pro"]),
            "beta": (1, ["gold"]),
        }
        assert keys_in_force_of(session, ["acme"], jan - timedelta(seconds=1)) == {}
        assert keys_in_force_of(session, [], mar) == {}
