"""Alerts of the v3 budgets that no counter keeps (CONTRACT "Budgets and alerts (v2)" for the
alerts, "Authorizations and holds (v3)" for the budgets): a tag, every call, a model prefix, a
rolling window; once per crossing, a hold alone alerting nothing, and a step without such a
budget running no statement more; on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from standardwebhooks import Webhook

from billing import destinations
from billing.budgets import summed
from billing.budgets.repository import repository
from billing.reconcile.service import reconcile_calls
from billing.settings import Settings
from billing.storage.db import write_transaction
from tests.budgets.helpers import (
    alerts,
    create,
    deliver,
    price,
    read,
    receiving,
    reconcile,
    state,
    status,
    update,
)
from tests.budgets.test_budgets_v3 import settled_call
from tests.budgets.test_holds import KEY, auth_at

T0 = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
DAY = "2026-11-10T00:00:00Z"


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The receiver listens on 127.0.0.1: private destinations allowed."""
    return Settings(database_url=db_url, webhook_allow_private=True)


def made(client: TestClient, budget_id: str) -> list[tuple[str, str, str, str]]:
    """(type, threshold, period_start, spent_usd of its payload) of the budget's alerts."""
    return [
        (
            a["type"].removeprefix("budget.threshold_"),
            a["threshold"],
            a["period_start"],
            a["payload"]["data"]["spent_usd"],
        )
        for a in alerts(client, budget_id)
    ]


def version_row(client: TestClient, budget_id: str) -> int:
    """The row id of the budget's version in force."""
    row: int = read(client, lambda s: repository(s).versions(s, budget_id)[-1].id)
    return row


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_tag_budget_alerts_its_webhook_once_per_threshold_crossed(client: TestClient) -> None:
    price(client)
    with receiving() as receiver:
        with destinations.allowing_private(True):  # (what the app does per request)
            created = create(
                client,
                T0,
                budget_id="team-a",
                scope={"tag": "team-a"},
                limit_usd="1",
                period="day",
                thresholds=["0.5", "0.8"],
                webhook_url=receiver.url,
            )
        settled_call(client, "a1", at(60), 300_000, tags="team-a")  # $0.30
        settled_call(client, "x1", at(60), 500_000, tags="team-b")  # $0.50, not team-a's
        reconcile(client, at(120))
        assert made(client, "team-a") == []
        settled_call(client, "a2", at(180), 250_000, tags="team-c, team-a")  # $0.25: 55 %
        reconcile(client, at(240))
        assert made(client, "team-a") == [("crossed", "0.5", DAY, "0.55")]
        settled_call(client, "a3", at(300), 200_000, tags="team-a")  # $0.20: 75 %
        settled_call(client, "x2", at(300), 900_000)  # no tag
        reconcile(client, at(360))
        reconcile(client, at(420))
        assert made(client, "team-a") == [("crossed", "0.5", DAY, "0.55")]
        assert status(client, "team-a", at(420))["spent_usd"] == "0.75"
        assert deliver(client) == 1
        assert deliver(client) == 0
    [(headers, body)] = receiver.received
    [alert] = alerts(client, "team-a")
    assert headers["webhook-id"] == alert["alert_id"]
    payload = Webhook(created["webhook_secret"]).verify(body, headers)
    assert payload == alert["payload"]
    assert payload["type"] == "budget.threshold_crossed"
    assert payload["timestamp"] == "2026-11-10T12:04:00Z"
    assert payload["data"] == {
        "budget_id": "team-a",
        "scope": {"tag": "team-a"},
        "limit_usd": "1",
        "measure": "charge",
        "period": "day",
        "period_start": DAY,
        "period_end": "2026-11-11T00:00:00Z",
        "spent_usd": "0.55",
        "settled_usd": "0.55",
        "provisional_usd": "0",
        "held_usd": "0",
        "remaining_usd": "0.45",
        "fraction_used": "0.55",
        "state": "warning",
        "thresholds_crossed": ["0.5"],
        "as_of": "2026-11-10T12:04:00Z",
        "threshold": "0.5",
    }
    assert alert["delivery"]["state"] == "delivered"


def test_a_model_budget_is_not_moved_by_another_model_and_an_all_budget_by_every_call(
    client: TestClient,
) -> None:
    price(client)
    price(client, model="claude-x")
    price(client, model="gpt-4o")
    create(
        client,
        T0,
        budget_id="claude",
        scope={"all": True},
        model="claude-*",
        limit_usd="1",
        period="month",
    )
    create(client, T0, budget_id="every", scope={"all": True}, limit_usd="2", period="total")
    create(
        client,
        T0,
        budget_id="key-gpt",
        scope={"api_key_id": KEY},
        model="gpt-4o",
        limit_usd="1",
        period="week",
        thresholds=["0.5"],
    )
    settled_call(client, "g1", at(60), 900_000, model="gpt-4o")  # $0.90
    reconcile(client, at(120))
    assert made(client, "claude") == []
    assert status(client, "claude", at(120))["spent_usd"] == "0"
    assert made(client, "every") == []  # 45 %
    assert made(client, "key-gpt") == [("crossed", "0.5", "2026-11-09T00:00:00Z", "0.9")]
    settled_call(client, "c1", at(180), 850_000, model="claude-x", key="key_other")  # $0.85
    reconcile(client, at(240))
    assert made(client, "claude") == [("crossed", "0.8", "2026-11-01T00:00:00Z", "0.85")]
    assert made(client, "every") == [("crossed", "0.8", "1970-01-01T00:00:00Z", "1.75")]
    settled_call(client, "c2", at(300), 150_000, model="claude-x")  # $0.15: claude at 100 %
    reconcile(client, at(360))
    assert made(client, "claude") == [
        ("crossed", "0.8", "2026-11-01T00:00:00Z", "0.85"),
        ("crossed", "1", "2026-11-01T00:00:00Z", "1"),
    ]
    assert made(client, "every") == [("crossed", "0.8", "1970-01-01T00:00:00Z", "1.75")]
    assert made(client, "key-gpt") == [("crossed", "0.5", "2026-11-09T00:00:00Z", "0.9")]


def test_a_tag_budget_resolves_on_an_adjustment_once_per_period_in_its_zone(
    client: TestClient,
) -> None:
    price(client)
    create(
        client,
        T0,
        budget_id="ops",
        scope={"tag": "ops"},
        limit_usd="1",
        period="day",
        tz="America/New_York",
    )
    ny_day = "2026-11-10T05:00:00Z"
    settled_call(client, "o1", at(60), 500_000, tags="ops")
    settled_call(client, "o2", at(60), 550_000, tags="ops")
    reconcile(client, at(120))
    up = [("crossed", "0.8", ny_day, "1.05"), ("crossed", "1", ny_day, "1.05")]
    assert made(client, "ops") == up
    # A new price from before the calls halves their cost: the reconciler books adjustments.
    price(client, effective_from="2026-11-01T00:00:00Z", input_usd_per_mtok="0.5")
    reconcile(client, at(3600))
    down = [("resolved", "1", ny_day, "0.525"), ("resolved", "0.8", ny_day, "0.525")]
    assert made(client, "ops") == up + down
    settled_call(client, "o3", at(3660), 600_000, tags="ops")  # $0.30: 82.5 %, the same day
    reconcile(client, at(3720))
    assert status(client, "ops", at(3720))["spent_usd"] == "0.825"
    assert made(client, "ops") == up + down


def test_a_budget_created_over_a_threshold_alerts_at_once_and_a_new_version_not_again(
    client: TestClient,
) -> None:
    price(client)
    settled_call(client, "p1", at(10), 600_000, tags="ops")  # $0.60
    reconcile(client, at(20))
    create(client, at(30), budget_id="ops", scope={"tag": "ops"}, limit_usd="1", period="day")
    assert made(client, "ops") == []  # 60 %: below 0.8
    update(
        client,
        "ops",
        at(40),
        scope={"tag": "ops"},
        limit_usd="1",
        period="day",
        thresholds=["0.5", "1"],
    )
    assert made(client, "ops") == [("crossed", "0.5", DAY, "0.6")]
    update(client, "ops", at(50), scope={"tag": "ops"}, limit_usd="0.9", period="day")
    settled_call(client, "p2", at(60), 10_000, tags="ops")  # $0.01
    reconcile(client, at(70))
    assert made(client, "ops") == [("crossed", "0.5", DAY, "0.6")]  # 0.61 / 0.9: below 0.8


def test_a_rolling_window_crosses_then_resolves_when_it_slides_past_and_crosses_again(
    client: TestClient,
) -> None:
    price(client)
    create(
        client,
        T0,
        budget_id="per-minute",
        scope={"api_key_id": KEY},
        limit_usd="0.25",
        period="rolling",
        window_s=60,
        thresholds=["0.5", "1"],
    )
    settled_call(client, "w1", at(0), 200_000)  # $0.20: 80 %
    reconcile(client, at(2))
    first = [("crossed", "0.5", "2026-11-10T11:59:02Z", "0.2")]
    assert made(client, "per-minute") == first
    reconcile(client, at(30))
    reconcile(client, at(59))  # w1 (started at 0) is still in (−1, 59]
    assert made(client, "per-minute") == first
    reconcile(client, at(61))  # the window (1, 61] has nothing: resolved, under its crossing
    resolved = [("resolved", "0.5", "2026-11-10T11:59:02Z", "0")]
    assert made(client, "per-minute") == first + resolved
    reconcile(client, at(65))
    assert made(client, "per-minute") == first + resolved
    settled_call(client, "w2", at(70), 200_000)  # crossed again: a new crossing
    reconcile(client, at(72))
    again = [("crossed", "0.5", "2026-11-10T12:00:12Z", "0.2")]
    assert made(client, "per-minute") == first + resolved + again
    settled_call(client, "w3", at(80), 100_000)  # $0.30 in the window: 120 %
    reconcile(client, at(82))
    over = [("crossed", "1", "2026-11-10T12:00:22Z", "0.3")]
    assert made(client, "per-minute") == first + resolved + again + over
    reconcile(client, at(135))  # (75, 135]: w3 alone, 40 %: both resolved, the highest first
    assert made(client, "per-minute") == first + resolved + again + over + [
        ("resolved", "1", "2026-11-10T12:00:22Z", "0.1"),
        ("resolved", "0.5", "2026-11-10T12:00:12Z", "0.1"),
    ]
    reconcile(client, at(200))
    assert len(alerts(client, "per-minute")) == 6
    [*_, last] = alerts(client, "per-minute")
    assert last["payload"]["data"]["period_start"] == "2026-11-10T12:01:15Z"
    assert last["payload"]["data"]["period_end"] == "2026-11-10T12:02:15Z"


def test_a_hold_alone_makes_no_alert_its_call_does(client: TestClient) -> None:
    """Alerts count what steps wrote (settled and provisional), as the v2 counters do: a hold
    counts in ``spent_usd`` but alerts nothing (it may be released); its call alerts when a
    step writes it, its tags from the authorization."""
    price(client)
    create(client, T0, budget_id="team-a", scope={"tag": "team-a"}, limit_usd="1", period="day")
    hold = auth_at(client, at(1), rid="h1", tags=["team-a"], estimate={"amount_usd": "0.9"})
    assert hold["decision"] == "allow"
    reconcile(client, at(2))
    s = status(client, "team-a", at(2))
    assert (s["held_usd"], s["spent_usd"], s["thresholds_crossed"]) == ("0.9", "0.9", ["0.8"])
    assert made(client, "team-a") == []
    settled_call(client, "h1", at(3), 850_000)  # no metadata tag: the hold's
    reconcile(client, at(5))
    assert made(client, "team-a") == [("crossed", "0.8", DAY, "0.85")]


@contextmanager
def counting(client: TestClient) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    engine = state(client).engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_step_without_a_v3_budget_runs_no_statement_more(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    price(client)
    create(client, T0, budget_id="v2", scope={"api_key_id": KEY}, limit_usd="100", period="day")

    def measured(rid: str, seconds: int) -> int:
        settled_call(client, rid, at(seconds), 100_000)
        with counting(client) as seen:
            reconcile(client, at(seconds + 30))
        return len(seen)

    measured("warm", 0)
    with_v3_path = measured("a", 60)
    with monkeypatch.context() as m:
        m.setattr(summed, "after_step", lambda *args: 0)
        m.setattr(summed, "on_pass", lambda *args: 0)
        without = measured("b", 120)
    assert with_v3_path == without
    # The measure sees the v3 path: a tag budget in force adds the step's calls' read.
    create(client, at(150), budget_id="tag", scope={"tag": "t"}, limit_usd="1", period="day")
    measured("warm2", 180)
    assert measured("c", 240) == without + 1
    assert status(client, "v2", at(300))["spent_usd"] == "0.5"  # five calls of $0.10
    assert made(client, "v2") == []


def test_two_steps_at_once_over_one_rolling_budget_make_one_crossing(client: TestClient) -> None:
    """Each step's call alone crosses 50 %: the second step waits for the first one's commit
    (the budget's lock), then sees its crossing, and makes none. Different keys, models and
    quarter hours: the steps share no other row that would order them."""
    price(client)
    price(client, model="claude-x")
    create(
        client,
        T0,
        budget_id="hourly",
        scope={"all": True},
        limit_usd="1",
        period="rolling",
        window_s=3600,
        thresholds=["0.5"],
    )
    settled_call(client, "s-a", at(0), 600_000, key="key_a")  # $0.60
    settled_call(client, "s-b", at(1200), 600_000, key="key_b", model="claude-x")  # $0.60
    st = state(client)
    first_done = threading.Event()
    second_done = threading.Event()

    def second() -> None:
        with write_transaction(st.sessions) as session:
            reconcile_calls(session, ["s-b"], at(1860), st.settings.settle_after_s)
        second_done.set()

    with write_transaction(st.sessions) as session:
        reconcile_calls(session, ["s-a"], at(1800), st.settings.settle_after_s)
        other = threading.Thread(target=second)
        other.start()
        first_done.wait(0.5)
        assert not second_done.is_set()
    other.join(30)
    assert second_done.is_set()
    assert made(client, "hourly") == [("crossed", "0.5", "2026-11-10T11:30:00Z", "0.6")]
    assert status(client, "hourly", at(1860))["spent_usd"] == "1.2"


def test_a_step_records_alerts_while_an_authorization_holds_the_budget(
    client: TestClient, is_postgres: bool
) -> None:
    """The alerts' lock is not the admission lock: an authorization holds its budgets' while
    it locks the owner's credit grants, which a step holds while it records alerts (the same
    lock would deadlock them). (SQLite: one writer at a time, nothing to show.)"""
    if not is_postgres:
        pytest.skip("SQLite runs one write transaction at a time")
    price(client)
    create(
        client,
        T0,
        budget_id="team-a",
        scope={"tag": "team-a"},
        limit_usd="1",
        period="day",
        thresholds=["0.5"],
    )
    settled_call(client, "l1", at(10), 600_000, tags="team-a")
    st = state(client)
    row = version_row(client, "team-a")
    done = threading.Event()

    def step() -> None:
        with write_transaction(st.sessions) as session:
            reconcile_calls(session, ["l1"], at(20), st.settings.settle_after_s)
        done.set()

    with write_transaction(st.sessions) as session:
        repository(session).lock_budgets(session, [row])
        other = threading.Thread(target=step)
        other.start()
        assert done.wait(30)
    other.join(30)
    assert made(client, "team-a") == [("crossed", "0.5", DAY, "0.6")]
