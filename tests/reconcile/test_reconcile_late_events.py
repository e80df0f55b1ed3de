"""Settlement and late events through HTTP and the database: the public reports of gateways that
billed streaming calls wrongly, and events that arrive after a call has settled.

Source: CONTRACT "Reconciliation" (settle, adjust, never update the ledger) and "Cost".
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from billing.dimensions import TOKEN_FIELDS
from tests.builders import disconnect, failed, started, tokens, usage
from tests.reconcile.test_reconcile_scenarios import ledger_sum, settle_due

SONNET = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "3",
    "output_usd_per_mtok": "15",
    "cache_read_usd_per_mtok": "0.30",
    "cache_creation_usd_per_mtok": "3.75",
}

Client = TestClient | httpx.Client


def post(client: Client, *events: dict[str, Any]) -> dict[str, int]:
    response = client.post("/v1/events", json={"events": list(events)})
    assert response.status_code == 200, response.text
    return dict(response.json())


def reconcile(client: Client) -> dict[str, int]:
    response = client.post("/v1/reconcile", json={})
    assert response.status_code == 200, response.text
    return dict(response.json())


def get(client: Client, request_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/calls/{request_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def figures(call: dict[str, Any]) -> dict[str, Any]:
    return {name: call[name] for name in TOKEN_FIELDS}


def assert_ledger_is_the_call(call: dict[str, Any]) -> None:
    assert call["settled"] is True
    booked = ledger_sum(call["ledger_entries"])
    # v3: the call's token figures are those billed at its own model; the lines of its other
    # models (an advisor) count in its cost only.
    others = {o["model"] for o in call.get("other_models") or ()} - {call["model"]}
    own = ledger_sum([e for e in call["ledger_entries"] if e["model"] not in others])
    assert {name: own[name] for name in TOKEN_FIELDS} == figures(call)
    if call["cost_usd"] is None:  # unpriced: some line is booked without a cost
        assert any(e["cost_usd"] is None for e in call["ledger_entries"])
    else:
        assert booked["cost_usd"] == Decimal(call["cost_usd"])


@pytest.fixture
def priced(client: TestClient) -> TestClient:
    assert client.post("/v1/prices", json=SONNET).status_code == 201
    return client


# -- public reports ---------------------------------------------------------------------------


def test_report_1_disconnect_at_zero_delivered_bills_generated(priced: TestClient) -> None:
    post(
        priced,
        started("e1", "rep-1"),
        disconnect("e2", 0, rid="rep-1", at=0.4),
        usage("e3", 40, 300, rid="rep-1", at=8, stop_reason="end_turn"),
    )
    assert reconcile(priced)["settled"] == 1  # upstream usage for its only attempt
    call = get(priced, "rep-1")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (40, 300)
    assert (call["output_tokens_delivered"], call["output_tokens_undelivered"]) == (0, 300)
    assert call["status"] == "client_disconnected"
    assert call["usage_source"] == "upstream"
    assert call["cost_usd"] == "0.00462"  # 40 × 3 + 300 × 15 µ$
    assert call["anomalies"] == []
    assert_ledger_is_the_call(call)
    assert [e["kind"] for e in call["ledger_entries"]] == ["settlement"]


def test_report_1_usage_after_settling_at_zero_is_one_adjustment(priced: TestClient) -> None:
    post(priced, started("e1", "rep-1b"), disconnect("e2", 0, rid="rep-1b", at=0.4))
    assert settle_due(priced) == {"settled": 1, "adjusted": 0}
    call = get(priced, "rep-1b")
    assert (call["output_tokens_billed"], call["cost_usd"]) == (0, "0")
    assert sorted(call["anomalies"]) == ["input_unknown", "usage_missing"]
    post(priced, usage("e3", 40, 300, rid="rep-1b", at=400))
    assert reconcile(priced) == {"examined": 1, "settled": 0, "adjusted": 1}
    call = get(priced, "rep-1b")
    assert [e["kind"] for e in call["ledger_entries"]] == ["settlement", "adjustment"]
    assert (call["output_tokens_billed"], call["output_tokens_undelivered"]) == (300, 300)
    assert call["cost_usd"] == "0.00462"
    assert call["anomalies"] == []
    assert_ledger_is_the_call(call)


def test_report_2_same_final_usage_under_two_event_ids_billed_once(priced: TestClient) -> None:
    final = usage("u1", 40, 300, rid="rep-2", at=5, stop_reason="end_turn")
    assert post(priced, started("e1", "rep-2", input_tokens=40), final) == {
        "accepted": 2,
        "duplicates": 0,
    }
    assert post(priced, dict(final, event_id="u2")) == {"accepted": 1, "duplicates": 0}
    assert post(priced, final) == {"accepted": 0, "duplicates": 1}
    assert reconcile(priced)["settled"] == 1
    # And once more after settlement, under a third id.
    post(priced, dict(final, event_id="u3"))
    assert reconcile(priced) == {"examined": 1, "settled": 0, "adjusted": 0}
    call = get(priced, "rep-2")
    assert call["output_tokens_billed"] == 300
    assert call["cost_usd"] == "0.00462"
    assert [e["kind"] for e in call["ledger_entries"]] == ["settlement"]
    assert len(call["events"]) == 4
    assert_ledger_is_the_call(call)


def test_report_3_settled_on_estimates_then_upstream_usage_adjusts(priced: TestClient) -> None:
    post(
        priced,
        started("e1", "rep-3", input_tokens=50),
        tokens("e2", 200, 120, rid="rep-3", at=2),
        disconnect("e3", 120, rid="rep-3", at=2),
    )
    assert reconcile(priced)["settled"] == 0  # no upstream usage yet: waits for settle_after
    assert get(priced, "rep-3")["status"] == "open"
    assert settle_due(priced) == {"settled": 1, "adjusted": 0}
    call = get(priced, "rep-3")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (50, 200)
    assert (call["output_tokens_delivered"], call["output_tokens_undelivered"]) == (120, 80)
    assert (call["usage_source"], call["status"]) == ("estimate", "client_disconnected")
    assert call["anomalies"] == ["usage_missing"]
    assert call["cost_usd"] == "0.00315"
    (settlement,) = call["ledger_entries"]

    post(priced, usage("e4", 52, 400, rid="rep-3", at=30, stop_reason="end_turn"))
    # Until a pass books it, the settled call still shows what its ledger holds.
    assert figures(get(priced, "rep-3")) == figures(call)
    assert reconcile(priced) == {"examined": 1, "settled": 0, "adjusted": 1}
    call = get(priced, "rep-3")
    first, adjustment = call["ledger_entries"]
    assert first == settlement  # never updated
    assert adjustment["kind"] == "adjustment"
    assert adjustment["reason"]
    assert figures(adjustment) == {
        "input_tokens": 2,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
        "output_tokens_billed": 200,
        "output_tokens_delivered": 0,
        "output_tokens_undelivered": 200,
        "reasoning_tokens": 0,
    }
    assert adjustment["cost_usd"] == "0.003006"
    assert (adjustment["input_usd_per_mtok"], adjustment["output_usd_per_mtok"]) == ("3", "15")
    assert adjustment["entry_id"] > settlement["entry_id"]
    assert (call["input_tokens"], call["output_tokens_billed"]) == (52, 400)
    assert (call["output_tokens_delivered"], call["output_tokens_undelivered"]) == (120, 280)
    assert call["usage_source"] == "upstream"
    assert call["status"] == "client_disconnected"
    assert call["stop_reason"] == "end_turn"
    assert call["anomalies"] == []
    assert call["cost_usd"] == "0.006156"
    assert_ledger_is_the_call(call)
    # Nothing more to book.
    assert reconcile(priced) == {"examined": 0, "settled": 0, "adjusted": 0}


def test_report_4_two_request_ids_are_two_calls_billed_twice(http: httpx.Client) -> None:
    assert http.post("/v1/prices", json=SONNET).status_code == 201
    for n in (1, 2):
        post(
            http,
            started(f"a{n}", f"rep-4-{n}", input_tokens=40),
            tokens(f"b{n}", 300, 300, rid=f"rep-4-{n}", at=1),
            usage(f"c{n}", 40, 300, rid=f"rep-4-{n}", at=2),
        )
    assert reconcile(http)["settled"] == 2
    calls = [get(http, f"rep-4-{n}") for n in (1, 2)]
    for call in calls:
        assert (call["input_tokens"], call["output_tokens_billed"]) == (40, 300)
        assert call["cost_usd"] == "0.00462"
        assert [e["kind"] for e in call["ledger_entries"]] == ["settlement"]
        assert_ledger_is_the_call(call)
    assert calls[0]["ledger_entries"][0]["entry_id"] != calls[1]["ledger_entries"][0]["entry_id"]


def test_report_5_a_tiny_call_costs_its_exact_amount(client: TestClient) -> None:
    price = dict(SONNET, model="tiny", input_usd_per_mtok="0.30", output_usd_per_mtok="0")
    assert client.post("/v1/prices", json=price).status_code == 201
    post(client, started("e1", "rep-5", model="tiny"), usage("e2", 25, 0, rid="rep-5", at=1))
    reconcile(client)
    call = get(client, "rep-5")
    assert call["cost_usd"] == "0.0000075"
    assert call["ledger_entries"][0]["cost_usd"] == "0.0000075"
    assert call["ledger_entries"][0]["input_usd_per_mtok"] == "0.3"


# -- other late events ------------------------------------------------------------------------


def test_late_stream_started_reverses_and_settles_under_the_key(priced: TestClient) -> None:
    post(
        priced,
        usage("e2", 10, 20, rid="late-key", at=3),
        tokens("e3", 20, 20, rid="late-key", at=2),
    )
    assert reconcile(priced)["settled"] == 0  # no stream.started: waits for settle_after
    assert settle_due(priced)["settled"] == 1
    call = get(priced, "late-key")
    assert call["api_key_id"] is None
    assert "started_missing" in call["anomalies"]
    assert call["cost_usd"] is None  # no model: no price
    post(priced, started("e1", "late-key", key="key_late", input_tokens=10))
    assert reconcile(priced) == {"examined": 1, "settled": 0, "adjusted": 1}
    call = get(priced, "late-key")
    assert call["api_key_id"] == "key_late"
    assert "started_missing" not in call["anomalies"]
    entries = call["ledger_entries"]
    assert [(e["kind"], e["api_key_id"]) for e in entries] == [
        ("settlement", None),
        ("adjustment", None),
        ("settlement", "key_late"),
    ]
    assert entries[1]["output_tokens_billed"] == -20
    assert entries[1]["reason"].startswith("reversal")
    assert call["cost_usd"] == "0.00033"
    assert_ledger_is_the_call(call)


def test_late_smaller_counters_change_nothing(priced: TestClient) -> None:
    post(
        priced,
        started("e1", "late-small", input_tokens=5),
        tokens("e2", 100, 90, rid="late-small", at=2),
        failed("e3", "api_error", rid="late-small", at=3),
    )
    settle_due(priced)
    before = get(priced, "late-small")
    post(
        priced,
        tokens("e4", 50, 40, rid="late-small", at=9),
        disconnect("e5", 60, 70, rid="late-small", at=9),
    )
    assert reconcile(priced) == {"examined": 1, "settled": 0, "adjusted": 0}
    after = get(priced, "late-small")
    assert figures(after) == figures(before)
    assert after["ledger_entries"] == before["ledger_entries"]
    assert after["status"] == "failed"  # the status follows the events; the ledger is unchanged


def test_late_retry_attempt_is_added_to_the_settled_call(priced: TestClient) -> None:
    post(
        priced,
        started("a1", "late-att", input_tokens=100),
        tokens("a2", 40, 30, rid="late-att", at=5),
        failed("a3", "stalled", rid="late-att", at=30),
    )
    settle_due(priced)
    post(
        priced,
        started("b1", "late-att", at=31, attempt=2, input_tokens=100),
        usage("b2", 98, 210, rid="late-att", at=40, attempt=2, stop_reason="end_turn"),
    )
    assert reconcile(priced)["adjusted"] == 1
    call = get(priced, "late-att")
    assert call["attempts"] == 2
    assert (call["input_tokens"], call["output_tokens_billed"]) == (198, 250)
    assert (call["status"], call["error_type"], call["stop_reason"]) == (
        "completed",
        None,
        "end_turn",
    )
    assert call["usage_source"] == "estimate"
    assert [e["kind"] for e in call["ledger_entries"]] == ["settlement", "adjustment"]
    assert call["cost_usd"] == format((Decimal(198 * 3 + 250 * 15) / 10**6).normalize(), "f")
    assert_ledger_is_the_call(call)


def test_a_call_settles_once_with_upstream_usage_then_waits_no_longer(priced: TestClient) -> None:
    post(priced, started("e1", "once", input_tokens=1), usage("e2", 1, 1, rid="once", at=1))
    assert reconcile(priced) == {"examined": 1, "settled": 1, "adjusted": 0}
    assert reconcile(priced) == {"examined": 0, "settled": 0, "adjusted": 0}
    assert settle_due(priced) == {"settled": 0, "adjusted": 0}
    call = get(priced, "once")
    assert len(call["ledger_entries"]) == 1
