"""Budgets over a key: exact spend per period, alerts once per threshold, the spend check
(CONTRACT "Budgets and alerts (v2)"), on the test database (SQLite, or PostgreSQL with
``BILLING_TEST_DATABASE_URL``). Periods are fixed: the service runs at chosen instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select

from billing.budgets import service
from billing.storage.models import BudgetAlert, BudgetSpend
from tests.budgets.helpers import (
    alerts,
    call,
    create,
    price,
    read,
    reconcile,
    status,
    update,
    usage,
)

NOV = datetime(2026, 11, 10, tzinfo=UTC)
KEY = {"api_key_id": "key_b1"}
PICO = 10**12


def _types(budget_id: str, client: TestClient) -> list[tuple[str, str]]:
    return [(a["type"], a["threshold"]) for a in alerts(client, budget_id)]


def test_a_monthly_dollar_crossing_80_and_100_percent_gives_two_alerts_then_not_allowed(
    client: TestClient,
) -> None:
    price(client)
    created = create(client, NOV, budget_id="b1", scope=KEY, limit_usd="1", period="month")
    assert created["webhook_secret"].startswith("whsec_")
    assert created["thresholds"] == ["0.8", "1"] and created["measure"] == "charge"
    call(client, "c1", NOV + timedelta(hours=1), 500_000)  # $0.50
    reconcile(client, NOV + timedelta(hours=2))
    s = status(client, "b1", NOV + timedelta(hours=2))
    assert s == {
        "budget_id": "b1",
        "scope": KEY,
        "limit_usd": "1",
        "measure": "charge",
        "period": "month",
        "period_start": "2026-11-01T00:00:00Z",
        "period_end": "2026-12-01T00:00:00Z",
        "spent_usd": "0.5",
        "settled_usd": "0.5",
        "provisional_usd": "0",
        "held_usd": "0",
        "remaining_usd": "0.5",
        "fraction_used": "0.5",
        "state": "ok",
        "thresholds_crossed": [],
        "as_of": "2026-11-10T02:00:00Z",
    }
    assert alerts(client, "b1") == []
    call(client, "c2", NOV + timedelta(hours=3), 350_000)  # $0.35: 85 %
    reconcile(client, NOV + timedelta(hours=4))
    s = status(client, "b1", NOV + timedelta(hours=4))
    assert (s["spent_usd"], s["state"], s["thresholds_crossed"]) == ("0.85", "warning", ["0.8"])
    assert _types("b1", client) == [("budget.threshold_crossed", "0.8")]
    call(client, "c3", NOV + timedelta(hours=5), 200_000)  # $0.20: 105 %
    call(client, "c4", NOV + timedelta(hours=5), 10_000)  # $0.01: 106 %, nothing new crossed
    reconcile(client, NOV + timedelta(hours=6))
    s = status(client, "b1", NOV + timedelta(hours=6))
    assert (s["spent_usd"], s["remaining_usd"], s["fraction_used"]) == ("1.06", "0", "1.06")
    assert (s["state"], s["thresholds_crossed"]) == ("exceeded", ["0.8", "1"])
    assert _types("b1", client) == [
        ("budget.threshold_crossed", "0.8"),
        ("budget.threshold_crossed", "1"),
    ]
    check = read(client, lambda ses: service.spend_check(ses, "key_b1", NOV + timedelta(hours=6)))
    assert check["allowed"] is False and check["api_key_id"] == "key_b1"
    assert [b["budget_id"] for b in check["budgets"]] == ["b1"]
    other = read(client, lambda ses: service.spend_check(ses, "key_other", NOV))
    assert other["allowed"] is True and other["budgets"] == []
    # The crossing alert's payload is the webhook body: type, timestamp, data (threshold, status).
    crossed = alerts(client, "b1")[1]
    assert crossed["payload"]["type"] == "budget.threshold_crossed"
    assert crossed["payload"]["data"]["threshold"] == "1"
    assert crossed["payload"]["data"]["spent_usd"] == "1.06"  # c3 and c4 in one step
    assert crossed["delivery"]["state"] == "none"


def test_several_thresholds_crossed_by_one_call_give_one_alert_each(client: TestClient) -> None:
    price(client)
    create(
        client,
        NOV,
        budget_id="b2",
        scope=KEY,
        limit_usd="1",
        period="month",
        thresholds=["0.5", "0.75", "0.9", "1"],
    )
    call(client, "c1", NOV + timedelta(hours=1), 950_000)  # $0.95
    reconcile(client, NOV + timedelta(hours=2))
    assert _types("b2", client) == [
        ("budget.threshold_crossed", "0.5"),
        ("budget.threshold_crossed", "0.75"),
        ("budget.threshold_crossed", "0.9"),
    ]


def test_an_adjustment_bringing_spend_back_gives_resolved_alerts(client: TestClient) -> None:
    price(client)
    create(client, NOV, budget_id="b1", scope=KEY, limit_usd="1", period="month")
    call(client, "c1", NOV + timedelta(hours=1), 500_000)
    call(client, "c2", NOV + timedelta(hours=1), 550_000)
    reconcile(client, NOV + timedelta(hours=2))
    assert status(client, "b1", NOV + timedelta(hours=2))["spent_usd"] == "1.05"
    # A new price from before the calls halves their cost: the reconciler books adjustments.
    price(client, effective_from="2026-11-01T00:00:00Z", input_usd_per_mtok="0.5")
    reconcile(client, NOV + timedelta(hours=3))
    s = status(client, "b1", NOV + timedelta(hours=3))
    assert (s["spent_usd"], s["state"], s["thresholds_crossed"]) == ("0.525", "ok", [])
    assert _types("b1", client) == [
        ("budget.threshold_crossed", "0.8"),
        ("budget.threshold_crossed", "1"),
        ("budget.threshold_resolved", "1"),
        ("budget.threshold_resolved", "0.8"),
    ]


def test_a_new_york_budget_counts_a_call_at_0330z_on_the_1st_in_the_previous_month(
    client: TestClient,
) -> None:
    price(client)
    nov15 = datetime(2026, 11, 15, 12, tzinfo=UTC)
    ny = dict(scope=KEY, limit_usd="10", period="month")
    create(client, nov15, budget_id="ny", tz="America/New_York", **ny)
    create(client, nov15, budget_id="utc", **ny)
    at = datetime(2026, 12, 1, 3, 30, tzinfo=UTC)  # 22:30 on 30 November in New York
    call(client, "c1", at, 100_000)  # $0.10
    reconcile(client, at + timedelta(minutes=10))
    before_ny_midnight = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
    s = status(client, "ny", before_ny_midnight)
    assert (s["period_start"], s["period_end"]) == ("2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z")
    assert s["spent_usd"] == "0.1"
    after = status(client, "ny", datetime(2026, 12, 1, 6, 0, tzinfo=UTC))
    assert (after["period_start"], after["spent_usd"]) == ("2026-12-01T05:00:00Z", "0")
    # In UTC the same call is December's.
    u = status(client, "utc", before_ny_midnight)
    assert (u["period_start"], u["spent_usd"]) == ("2026-12-01T00:00:00Z", "0.1")
    assert status(client, "utc", datetime(2026, 11, 30, 12, tzinfo=UTC))["spent_usd"] == "0"


def test_a_new_month_starts_at_zero_with_nothing_reset_in_storage(client: TestClient) -> None:
    price(client)
    created = create(client, NOV, budget_id="b1", scope=KEY, limit_usd="1", period="month")
    call(client, "c1", NOV + timedelta(hours=1), 900_000)  # $0.90
    reconcile(client, NOV + timedelta(hours=2))
    dec1 = datetime(2026, 12, 1, tzinfo=UTC)
    s = status(client, "b1", dec1)
    assert (s["period_start"], s["spent_usd"], s["state"]) == ("2026-12-01T00:00:00Z", "0", "ok")
    call(client, "c2", dec1 + timedelta(hours=1), 850_000)  # $0.85 in December
    reconcile(client, dec1 + timedelta(hours=2))
    s = status(client, "b1", dec1 + timedelta(hours=2))
    assert (s["spent_usd"], s["thresholds_crossed"]) == ("0.85", ["0.8"])
    rows = read(
        client,
        lambda ses: [
            (r.period_start, r.settled_pusd, r.provisional_pusd)
            for r in ses.scalars(select(BudgetSpend).order_by(BudgetSpend.period_start))
        ],
    )
    assert rows == [
        (datetime(2026, 11, 1, tzinfo=UTC), 900_000 * 10**6, 0),
        (dec1, 850_000 * 10**6, 0),
    ]
    # One crossing of 0.8 per period: November's and December's.
    periods = read(
        client,
        lambda ses: [
            (a.period_start, a.threshold)
            for a in ses.scalars(select(BudgetAlert).order_by(BudgetAlert.period_start))
        ],
    )
    assert periods == [(datetime(2026, 11, 1, tzinfo=UTC), "0.8"), (dec1, "0.8")]
    assert created["version"] == 1


def test_an_open_call_counts_provisionally_and_is_replaced_by_settled(client: TestClient) -> None:
    price(client)
    create(client, NOV, budget_id="b1", scope=KEY, limit_usd="1", period="month")
    # 100,000 input tokens on the start and 50,000 generated so far: $0.10 + $0.10.
    call(client, "c1", NOV + timedelta(hours=1), 100_000, settled=False, generated=50_000)
    reconcile(client, NOV + timedelta(hours=1, seconds=5))
    s = status(client, "b1", NOV + timedelta(hours=1, seconds=5))
    assert (s["settled_usd"], s["provisional_usd"], s["spent_usd"]) == ("0", "0.2", "0.2")
    # More generated: the provisional figure is replaced, not added to.
    call(client, "c1", NOV + timedelta(hours=1), 100_000, settled=False, generated=150_000)
    reconcile(client, NOV + timedelta(hours=1, seconds=10))
    s = status(client, "b1", NOV + timedelta(hours=1, seconds=10))
    assert (s["settled_usd"], s["provisional_usd"]) == ("0", "0.4")
    usage(client, "c1", NOV + timedelta(hours=1, seconds=20), 100_000, 160_000)
    reconcile(client, NOV + timedelta(hours=1, seconds=30))
    s = status(client, "b1", NOV + timedelta(hours=1, seconds=30))
    assert (s["settled_usd"], s["provisional_usd"], s["spent_usd"]) == ("0.42", "0", "0.42")


def test_a_budget_created_later_starts_from_the_ledger_and_open_calls(client: TestClient) -> None:
    price(client)
    call(client, "c1", NOV + timedelta(hours=1), 300_000)  # $0.30, settled
    call(client, "c2", NOV + timedelta(hours=1), 100_000, settled=False, generated=0)  # $0.10
    call(client, "c0", NOV - timedelta(days=20), 700_000)  # October: another period
    reconcile(client, NOV + timedelta(hours=2))
    create(
        client,
        NOV + timedelta(hours=3),
        budget_id="late",
        scope=KEY,
        limit_usd="0.5",
        period="month",
    )
    s = status(client, "late", NOV + timedelta(hours=3))
    assert (s["settled_usd"], s["provisional_usd"], s["spent_usd"]) == ("0.3", "0.1", "0.4")
    assert _types("late", client) == [("budget.threshold_crossed", "0.8")]
    # Then kept incrementally: c2 settles at $0.25.
    usage(client, "c2", NOV + timedelta(hours=3, seconds=1), 100_000, 75_000)
    reconcile(client, NOV + timedelta(hours=4))
    s = status(client, "late", NOV + timedelta(hours=4))
    assert (s["settled_usd"], s["provisional_usd"], s["state"]) == ("0.55", "0", "exceeded")


def test_day_week_and_total_periods_and_a_changed_budget(client: TestClient) -> None:
    price(client)
    wed = datetime(2026, 11, 11, 9, tzinfo=UTC)  # a Wednesday
    for period in ("day", "week", "total"):
        create(client, wed, budget_id=period, scope=KEY, limit_usd="1", period=period)
    call(client, "c1", wed + timedelta(hours=1), 200_000)  # $0.20
    reconcile(client, wed + timedelta(hours=2))
    day = status(client, "day", wed + timedelta(hours=2))
    week = status(client, "week", wed + timedelta(hours=2))
    total = status(client, "total", wed + timedelta(hours=2))
    assert (day["period_start"], day["period_end"]) == (
        "2026-11-11T00:00:00Z",
        "2026-11-12T00:00:00Z",
    )
    assert (week["period_start"], week["period_end"]) == (
        "2026-11-09T00:00:00Z",
        "2026-11-16T00:00:00Z",
    )
    assert (total["period_start"], total["period_end"]) == ("1970-01-01T00:00:00Z", None)
    assert {day["spent_usd"], week["spent_usd"], total["spent_usd"]} == {"0.2"}
    assert status(client, "day", wed + timedelta(days=1))["spent_usd"] == "0"
    assert status(client, "week", wed + timedelta(days=4))["spent_usd"] == "0.2"
    # A changed limit is a new version; its counter starts from the ledger again.
    changed = update(
        client, "total", wed + timedelta(hours=3), scope=KEY, limit_usd="0.25", period="total"
    )
    assert changed["version"] == 2 and "webhook_secret" not in changed
    t = status(client, "total", wed + timedelta(hours=3))
    assert (t["limit_usd"], t["spent_usd"], t["fraction_used"], t["state"]) == (
        "0.25",
        "0.2",
        "0.8",
        "warning",
    )
    assert _types("total", client) == [("budget.threshold_crossed", "0.8")]


def test_cost_measure_and_a_customer_budget_are_stored(client: TestClient) -> None:
    price(client)
    create(client, NOV, budget_id="cost", scope=KEY, limit_usd="1", period="month", measure="cost")
    cust = create(
        client, NOV, budget_id="cust", scope={"customer_id": "cus_1"}, limit_usd="1", period="month"
    )
    assert cust["scope"] == {"customer_id": "cus_1"}
    call(client, "c1", NOV + timedelta(hours=1), 100_000)
    reconcile(client, NOV + timedelta(hours=2))
    assert status(client, "cost", NOV + timedelta(hours=2))["spent_usd"] == "0.1"
    # No key is assigned to cus_1: its budget sums no key.
    c = status(client, "cust", NOV + timedelta(hours=2))
    assert (c["scope"], c["spent_usd"], c["state"]) == ({"customer_id": "cus_1"}, "0", "ok")
