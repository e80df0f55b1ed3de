"""Draws with exact figures: grant order, expiry, re-rating, overdraft, voids (CONTRACT
"Prepaid credits (v3)"). Real SQLite or PostgreSQL (``BILLING_TEST_DATABASE_URL``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from billing.settings import Settings
from billing.storage.db import read_transaction
from tests.credits.helpers import (
    JAN,
    PRICE,
    balance,
    call,
    entries,
    grant,
    kept_sums,
    ok,
    reconcile,
    remaining,
)


@pytest.fixture
def acme(client: TestClient) -> TestClient:
    """A priced model and key_a assigned to customer acme (no plan: charged at cost)."""
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    return client


def test_grants_are_drawn_by_priority_then_earliest_expiry_across_three_calls(
    acme: TestClient, app: FastAPI, settings: Settings
) -> None:
    grant(acme, "late", "0.02", priority=10, expires_at="2026-06-01T00:00:00Z")
    grant(acme, "soon", "0.01", priority=10, expires_at="2026-04-01T00:00:00Z")
    grant(acme, "base", "0.05")  # priority 100, no expiry: last
    for n, minute in enumerate(("00", "10", "20"), start=1):
        call(acme, f"r{n}", f"2026-03-01T10:{minute}:00Z", 1500)  # 0.015 each
        reconcile(app, settings, f"2026-03-01T10:{minute[0]}5:00Z")
    assert entries(app)[3:] == [
        ("draw", "soon", "0.01", "r1"),
        ("draw", "late", "0.005", "r1"),
        ("draw", "late", "0.015", "r2"),
        ("draw", "base", "0.015", "r3"),
    ]
    assert remaining(acme) == {"soon": "0", "late": "0", "base": "0.035"}
    found = balance(acme)
    assert (found["balance_usd"], found["available_usd"], found["overdraft_usd"]) == (
        "0.035",
        "0.035",
        "0",
    )
    assert (found["held_usd"], found["pending_usd"]) == ("0", "0")
    # Asked by key (as a gateway knows it), the answer is its customer's.
    by_key = balance(acme, api_key_id="key_a")
    assert (by_key["customer_id"], by_key["api_key_id"], by_key["balance_usd"]) == (
        "acme",
        None,
        "0.035",
    )
    # In draw order: priority, earliest expiry (none last).
    assert [g["grant_id"] for g in found["grants"]] == ["soon", "late", "base"]


def test_a_grant_expiring_mid_period_books_its_remainder_at_expires_at(
    acme: TestClient, app: FastAPI, settings: Settings
) -> None:
    grant(acme, "short", "0.05", JAN, priority=1, expires_at="2026-03-15T12:00:00Z")
    grant(acme, "long", "1", JAN)
    call(acme, "before", "2026-03-01T10:00:00Z", 1000)  # 0.01
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    call(acme, "after", "2026-03-20T10:00:00Z", 1000)
    reconcile(app, settings, "2026-03-20T10:05:00Z")
    assert entries(app)[2:] == [
        ("draw", "short", "0.01", "before"),
        ("expiry", "short", "0.04", None),
        ("draw", "long", "0.01", "after"),
    ]
    found = balance(acme)
    assert found["balance_usd"] == "0.99"
    (short,) = [g for g in found["grants"] if g["grant_id"] == "short"]
    assert (short["state"], short["remaining_usd"]) == ("expired", "0")
    from billing.storage.db import read_transaction
    from billing.storage.models import CreditEntry

    with read_transaction(app.state.billing.sessions) as session:
        (expiry,) = session.query(CreditEntry).filter_by(kind="expiry").all()
        assert expiry.booked_at.isoformat() == "2026-03-15T12:00:00+00:00"


def test_a_re_rated_call_redraws_exactly_and_the_balance_moves_by_the_difference(
    acme: TestClient, app: FastAPI, settings: Settings
) -> None:
    grant(acme, "g", "1")
    call(acme, "r1", "2026-03-01T10:00:00Z", 1000)  # 0.01 at cost
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    assert balance(acme)["balance_usd"] == "0.99"
    # A plan of 50 % over cost from before the call: re-rated to 0.015.
    plan = {"plan_id": "gold", "effective_from": JAN, "markup_pct": "50"}
    ok(acme.post("/v1/plans", json=plan), 201)
    key = {"customer_id": "acme", "plan_id": "gold", "effective_from": "2026-02-01T00:00:00Z"}
    ok(acme.put("/v1/keys/key_a", json=key), 201)
    reconcile(app, settings, "2026-03-02T10:00:00Z")
    assert entries(app)[1:] == [
        ("draw", "g", "0.01", "r1"),
        ("reversal", "g", "-0.01", "r1"),
        ("draw", "g", "0.015", "r1"),
    ]
    assert balance(acme)["balance_usd"] == "0.985"


def test_a_charge_larger_than_the_balance_books_the_rest_as_overdraft(
    acme: TestClient, app: FastAPI, settings: Settings
) -> None:
    grant(acme, "g", "0.004")
    call(acme, "big", "2026-03-01T10:00:00Z", 1000)  # 0.01
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    assert entries(app)[1:] == [("draw", "g", "0.004", "big"), ("overdraft", None, "0.006", "big")]
    found = balance(acme)
    assert (found["balance_usd"], found["available_usd"], found["overdraft_usd"]) == (
        "0",
        "0",
        "0.006",
    )


def test_a_void_stops_further_draws(acme: TestClient, app: FastAPI, settings: Settings) -> None:
    grant(acme, "g", "1")
    call(acme, "r1", "2026-03-01T10:00:00Z", 1000)
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    voided = ok(acme.post("/v1/credits/grants/g/void", json={}), 200)
    assert (voided["state"], voided["remaining_usd"]) == ("voided", "0")
    assert ok(acme.post("/v1/credits/grants/g/void", json={}), 200) == voided  # once
    call(acme, "r2", "2026-03-02T10:00:00Z", 1000)
    reconcile(app, settings, "2026-03-02T10:05:00Z")
    assert entries(app)[1:] == [
        ("draw", "g", "0.01", "r1"),
        ("void", "g", "0.99", None),
        ("overdraft", None, "0.01", "r2"),
    ]
    assert balance(acme)["balance_usd"] == "0"


def test_a_key_without_a_customer_draws_its_own_grants_from_the_fast_path(
    client: TestClient, app: FastAPI, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key with grants is settled by the SQL fast path, and its charge draws in that step."""
    from billing.reconcile import service

    by_sql: list[str] = []
    real = service.settle_common

    def spy(*args: Any) -> list[str]:
        settled = real(*args)
        by_sql.extend(settled)
        return settled

    monkeypatch.setattr(service, "settle_common", spy)
    ok(client.post("/v1/prices", json=PRICE), 201)
    grant(client, "k", "0.5", api_key_id="key_solo")
    call(client, "solo", "2026-03-01T10:00:00Z", 1000, key="key_solo")
    call(client, "other", "2026-03-01T10:00:00Z", 1000, key="key_free")
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    assert sorted(by_sql) == ["other", "solo"]
    assert entries(app)[1:] == [("draw", "k", "0.01", "solo")]
    assert balance(client, api_key_id="key_solo")["balance_usd"] == "0.49"
    assert balance(client, api_key_id="key_free")["grants"] == []


def test_a_fast_path_draw_is_redrawn_exactly_when_its_call_is_re_rated(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    """A call drawn by the fast path, re-rated later by the rule (its key given a plan): the
    redraw finds what it drew by the call's number, which each of the call's entries carries,
    whichever path booked it."""
    ok(client.post("/v1/prices", json=PRICE), 201)
    grant(client, "k", "0.5", api_key_id="key_solo")
    call(client, "solo", "2026-03-01T10:00:00Z", 1000, key="key_solo")  # 0.01 at cost
    call(client, "solo2", "2026-03-01T10:00:00Z", 2000, key="key_solo")  # 0.02
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    assert balance(client, api_key_id="key_solo")["balance_usd"] == "0.47"
    plan = {"plan_id": "gold", "effective_from": JAN, "markup_pct": "50"}
    ok(client.post("/v1/plans", json=plan), 201)
    key = {"plan_id": "gold", "effective_from": "2026-02-01T00:00:00Z"}
    ok(client.put("/v1/keys/key_solo", json=key), 201)
    reconcile(app, settings, "2026-03-02T10:00:00Z")
    assert entries(app)[1:] == [
        ("draw", "k", "0.01", "solo"),
        ("draw", "k", "0.02", "solo2"),
        ("reversal", "k", "-0.01", "solo"),
        ("draw", "k", "0.015", "solo"),
        ("reversal", "k", "-0.02", "solo2"),
        ("draw", "k", "0.03", "solo2"),
    ]
    assert balance(client, api_key_id="key_solo")["balance_usd"] == "0.455"
    with read_transaction(app.state.billing.sessions) as session:
        numbered = session.execute(
            text(
                "SELECT e.kind, e.call_no, c.call_no FROM credit_entries e "
                "LEFT JOIN calls c ON c.request_id = e.request_id ORDER BY e.entry_id"
            )
        ).all()
    assert [kind for kind, _, _ in numbered] == ["grant", "draw", "draw", *["reversal", "draw"] * 2]
    assert numbered[0][1:] == (None, None)
    assert all(mine == calls and mine is not None for _, mine, calls in numbered[1:])


def test_one_step_books_each_calls_draws_in_call_order_whoever_draws_them(
    acme: TestClient, app: FastAPI, settings: Settings
) -> None:
    """In one step, calls of a key whose grant covers all of them (the fast path's, drawn by
    key), of a key whose grant runs out (drawn one by one: a split and an overdraft) and of a
    customer (the rule's): the entries are booked call by call, in request_id order."""
    grant(acme, "acme-g", "1")
    grant(acme, "solo-g", "1", api_key_id="key_solo")
    grant(acme, "short-g", "0.015", api_key_id="key_short")
    calls = (("a", "key_solo"), ("b", "key_short"), ("c", "key_a"), ("d", "key_solo"),
             ("e", "key_short"), ("f", "key_free"))  # fmt: skip
    for rid, key in calls:
        call(acme, rid, "2026-03-01T10:00:00Z", 1000, key=key)  # 0.01 each
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    assert entries(app)[3:] == [
        ("draw", "solo-g", "0.01", "a"),
        ("draw", "short-g", "0.01", "b"),
        ("draw", "acme-g", "0.01", "c"),
        ("draw", "solo-g", "0.01", "d"),
        ("draw", "short-g", "0.005", "e"),
        ("overdraft", None, "0.005", "e"),
    ]
    assert remaining(acme, api_key_id="key_solo") == {"solo-g": "0.98"}
    assert balance(acme, api_key_id="key_short")["overdraft_usd"] == "0.005"
    assert remaining(acme) == {"acme-g": "0.99"}


def test_an_open_call_counts_as_pending_until_it_settles_and_draws(
    acme: TestClient, app: FastAPI, settings: Settings
) -> None:
    grant(acme, "g", "1")
    events = [
        {"event_id": "o-s", "request_id": "open", "type": "stream.started",
         "occurred_at": "2026-03-01T10:00:00Z", "api_key_id": "key_a", "model": "m-credit",
         "protocol": "anthropic.messages", "input_tokens": 0},
        {"event_id": "o-t", "request_id": "open", "type": "stream.tokens",
         "occurred_at": "2026-03-01T10:00:01Z", "output_tokens_generated": 2000,
         "output_tokens_delivered": 2000},
    ]  # fmt: skip
    ok(acme.post("/v1/events", json={"events": events}), 200)
    reconcile(app, settings, "2026-03-01T10:00:02Z")  # reconciled open: 0.02 provisional
    found = balance(acme)
    assert (found["balance_usd"], found["pending_usd"], found["available_usd"]) == (
        "1",
        "0.02",
        "0.98",
    )
    assert entries(app)[1:] == []
    # Settled on the clock (its events arrived now, by the wall clock): drawn.
    later = datetime.now(UTC) + timedelta(seconds=settings.settle_after_s + 1)
    reconcile(app, settings, later.isoformat())
    found = balance(acme)
    assert (found["balance_usd"], found["pending_usd"], found["available_usd"]) == (
        "0.98",
        "0",
        "0.98",
    )
    assert entries(app)[1:] == [("draw", "g", "0.02", "open")]


def test_kept_remainders_equal_the_entries_after_draws_re_rating_expiry_void_and_overdraft(
    acme: TestClient, app: FastAPI, settings: Settings, db_url: str
) -> None:
    """The remainder a grant keeps (and an owner's overdraft) is the sum of its entries after
    each kind of booking; the balance reads the kept figures."""
    grant(acme, "a", "0.02", JAN, priority=1, expires_at="2026-03-15T00:00:00Z")
    grant(acme, "c", "0.03", JAN, priority=50)
    grant(acme, "b", "0.05", JAN)
    assert kept_sums(db_url) == ({"a": 20 * 10**9, "b": 50 * 10**9, "c": 30 * 10**9}, {})
    call(acme, "r1", "2026-03-01T10:00:00Z", 1500)  # 0.015 at cost
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    assert kept_sums(db_url) == ({"a": 5 * 10**9, "b": 50 * 10**9, "c": 30 * 10**9}, {})
    # Re-rated at 50 % over cost: 0.0225, redrawn from a (0.02) then c (0.0025).
    ok(
        acme.post("/v1/plans", json={"plan_id": "gold", "effective_from": JAN, "markup_pct": "50"}),
        201,
    )
    key = {"customer_id": "acme", "plan_id": "gold", "effective_from": "2026-02-01T00:00:00Z"}
    ok(acme.put("/v1/keys/key_a", json=key), 201)
    reconcile(app, settings, "2026-03-02T10:00:00Z")
    assert kept_sums(db_url) == ({"a": 0, "b": 50 * 10**9, "c": 27_500_000_000}, {})
    # After a's expiry (nothing left of it), 0.06 takes c's 0.0275 and b's 0.05: 0.0775 > 0.06.
    call(acme, "r2", "2026-03-20T10:00:00Z", 4000)  # 0.04 × 1.5 = 0.06
    reconcile(app, settings, "2026-03-20T10:05:00Z")
    assert kept_sums(db_url) == ({"a": 0, "b": 17_500_000_000, "c": 0}, {})
    ok(acme.post("/v1/credits/grants/b/void", json={}), 200)
    call(acme, "r3", "2026-03-21T10:00:00Z", 1000)  # 0.015: no grant left, all overdraft
    reconcile(app, settings, "2026-03-21T10:05:00Z")
    assert kept_sums(db_url) == ({"a": 0, "b": 0, "c": 0}, {"customer:acme": 15 * 10**9})
    found = balance(acme)
    assert (found["balance_usd"], found["overdraft_usd"]) == ("0", "0.015")
    assert [k for k, *_ in entries(app)[3:]] == [
        "draw", "reversal", "draw", "draw", "expiry", "draw", "draw", "void", "overdraft",
    ]  # fmt: skip


def test_overdrafts_past_a_64_bit_sum_of_picodollars_are_kept_exactly(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    """Two calls of 5,000,000 USD each (50,000,000 output tokens at 100,000 USD per million,
    the price limit) and one of 0.00018 drawn by a key
    with 1 USD of credit: an overdraft of 10,000,000.00018 USD, past 2**63 picodollars, where
    the one kept sum turned into a binary float on SQLite (9999999.000180000768) and
    PostgreSQL refused the step (the second call never settled)."""
    ok(client.post("/v1/prices", json=PRICE), 201)
    dear = {**PRICE, "model": "m-dear", "input_usd_per_mtok": "100000",
            "output_usd_per_mtok": "100000"}  # fmt: skip
    ok(client.post("/v1/prices", json=dear), 201)
    grant(client, "g1", "1", api_key_id="key_d")
    for n, at in enumerate(("2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z")):
        rid = f"dear-{n}"
        events = [
            {"event_id": f"{rid}-s", "request_id": rid, "type": "stream.started",
             "occurred_at": at, "api_key_id": "key_d", "model": "m-dear",
             "protocol": "anthropic.messages"},
            {"event_id": f"{rid}-u", "request_id": rid, "type": "stream.usage",
             "occurred_at": at.replace(":00Z", ":01Z"), "input_tokens": 0,
             "output_tokens": 50_000_000, "source": "upstream"},
        ]  # fmt: skip
        ok(client.post("/v1/events", json={"events": events}), 200)
        reconcile(app, settings, at.replace(":00:00Z", ":05:00Z"))
        assert ok(client.get(f"/v1/calls/{rid}"))["settled"] is True
    call(client, "small", "2026-03-02T12:00:00Z", 18, key="key_d")  # 0.00018
    reconcile(app, settings, "2026-03-02T12:05:00Z")
    figures = balance(client, api_key_id="key_d")
    assert (figures["balance_usd"], figures["overdraft_usd"]) == ("0", "9999999.00018")
    # A late usage of the first call at a tenth of its output: its overdraft given back
    # (4,999,999 USD, a reversal past the kept fraction), 500,000 USD overdrawn again.
    late = {"event_id": "dear-0-late", "request_id": "dear-0", "type": "stream.usage",
            "occurred_at": "2026-03-02T10:00:02Z", "input_tokens": 0,
            "output_tokens": 5_000_000, "source": "upstream"}  # fmt: skip
    ok(client.post("/v1/events", json={"events": [late]}), 200)
    reconcile(app, settings, "2026-03-02T13:05:00Z")
    figures = balance(client, api_key_id="key_d")
    assert (figures["balance_usd"], figures["overdraft_usd"]) == ("0", "5499999.00018")
