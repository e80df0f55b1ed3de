"""Every scenario in tests/fixtures/scenarios gives exactly its expected figures through HTTP.

Prices by ``POST /v1/prices``, events by ``POST /v1/events``, reconciliation by ``POST
/v1/reconcile`` (and, for calls that must wait for ``settle_after``, a pass with a later clock);
the call log then shows one settlement entry equal to the call. Runs on SQLite, or on PostgreSQL
with ``BILLING_TEST_DATABASE_URL``. Source: CONTRACT "Reconciliation", "Cost", "Call log".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from billing.dimensions import TOKEN_FIELDS
from billing.reconcile.runner import run_pass
from tests.builders import started, tokens, usage

SCENARIOS = sorted((Path(__file__).parent.parent / "fixtures" / "scenarios").glob("*.json"))


def test_the_scenarios_are_there() -> None:
    assert len(SCENARIOS) >= 6


def settle_due(client: TestClient) -> dict[str, int]:
    """A pass with a clock past ``settle_after``: every open call settles on what it has."""
    state = client.app.state.billing  # type: ignore[attr-defined]
    later = datetime.now(UTC) + timedelta(seconds=state.settings.settle_after_s + 1)
    result = run_pass(state.sessions, state.settings, now=later)
    return {"settled": result.settled, "adjusted": result.adjusted}


def ledger_sum(entries: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {name: sum(e[name] for e in entries) for name in TOKEN_FIELDS}
    # An unpriced entry has no cost; entries reversed when the call was priced later sum to 0.
    costs = [Decimal(e["cost_usd"]) for e in entries if e["cost_usd"] is not None]
    totals["cost_usd"] = sum(costs, Decimal(0)) if costs else None
    return totals


def needs_settle_after(events: list[dict[str, Any]], request_id: str) -> bool:
    """Whether the call cannot settle before ``settle_after``: no stream.started, or an attempt
    without upstream usage (CONTRACT "Reconciliation")."""
    own = [e for e in events if e["request_id"] == request_id]
    attempts = {e.get("attempt", 1) for e in own}
    upstream = {
        e.get("attempt", 1)
        for e in own
        if e["type"] == "stream.usage" and e["source"] == "upstream"
    }
    return upstream != attempts or not any(e["type"] == "stream.started" for e in own)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(client: TestClient, path: Path) -> None:
    scenario = json.loads(path.read_text())
    for price in scenario.get("prices", []):
        response = client.post("/v1/prices", json=price)
        assert response.status_code == 201, response.text
    events = scenario["events"]
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 200, response.text
    reply = response.json()
    expect = scenario["expect"]
    unique = {e["event_id"] for e in events}
    assert reply == {"accepted": len(unique), "duplicates": len(events) - len(unique)}
    if "duplicates" in expect:
        assert reply["duplicates"] == expect["duplicates"]

    waiting = {rid for rid in expect["calls"] if needs_settle_after(events, rid)}
    response = client.post("/v1/reconcile", json={})
    assert response.status_code == 200, response.text
    assert response.json()["settled"] == len(expect["calls"]) - len(waiting)
    for rid in waiting:
        call = client.get(f"/v1/calls/{rid}").json()
        assert (call["settled"], call["status"]) == (False, "open")
        assert call["ledger_entries"] == []
    if waiting:
        assert settle_due(client) == {"settled": len(waiting), "adjusted": 0}
    # Nothing left to do: another pass books nothing.
    assert client.post("/v1/reconcile", json={}).json() == {
        "examined": 0,
        "settled": 0,
        "adjusted": 0,
    }

    for rid, expected in expect["calls"].items():
        response = client.get(f"/v1/calls/{rid}")
        assert response.status_code == 200, response.text
        call = response.json()
        assert call["request_id"] == rid
        assert call["settled"] is True
        for name, value in expected.items():
            assert call[name] == value, name
        own = [e for e in events if e["request_id"] == rid]
        assert call["attempts"] == len({e.get("attempt", 1) for e in own})
        # One settlement whose tokens and cost are the call's.
        entries = call["ledger_entries"]
        assert [e["kind"] for e in entries] == ["settlement"]
        assert ledger_sum(entries) == {
            **{name: call[name] for name in TOKEN_FIELDS},
            "cost_usd": None if call["cost_usd"] is None else Decimal(call["cost_usd"]),
        }
        assert entries[0]["request_id"] == rid
        # Events as stored, each once, by occurred_at (UTC).
        got = call["events"]
        assert sorted(e["event_id"] for e in got) == sorted({e["event_id"] for e in own})
        times = [e["occurred_at"] for e in got]
        assert times == sorted(times)
        assert all(t.endswith("Z") for t in times)


def test_unknown_call_is_404(client: TestClient) -> None:
    response = client.get("/v1/calls/no-such-call")
    assert response.status_code == 404
    assert "no-such-call" in response.json()["error"]


def test_events_are_listed_by_occurred_at_then_arrival(client: TestClient) -> None:
    # Three events at the same instant, posted one by one in an order unlike their ids.
    same = [
        tokens("z-late", 5, 5, rid="order-1", at=2),
        tokens("a-mid", 9, 9, rid="order-1", at=2),
        usage("m-last", 3, 9, rid="order-1", at=2),
    ]
    first = started("q-first", "order-1", at=0, input_tokens=3)
    # An event posted last but with the earliest time, in another offset.
    early = dict(started("k-early", "order-1", at=-1, input_tokens=3, attempt=2))
    early["occurred_at"] = "2026-10-15T09:59:59+02:00"
    for event in [first, *same, early]:
        assert client.post("/v1/events", json={"events": [event]}).status_code == 200
    call = client.get("/v1/calls/order-1").json()
    assert [e["event_id"] for e in call["events"]] == [
        "k-early",
        "q-first",
        "z-late",
        "a-mid",
        "m-last",
    ]
    assert call["events"][0]["occurred_at"] == "2026-10-15T07:59:59Z"


def test_open_call_shows_provisional_figures(client: TestClient) -> None:
    events = [started("p1", "prov-1", input_tokens=7), tokens("p2", 30, 20, rid="prov-1", at=1)]
    client.post("/v1/events", json={"events": events})
    call = client.get("/v1/calls/prov-1").json()
    assert (call["settled"], call["status"]) == (False, "open")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (7, 30)
    assert call["output_tokens_undelivered"] == 10
    assert call["ledger_entries"] == []
