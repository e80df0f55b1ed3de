"""A ``credit_required`` customer is admitted at authorization only as far as its available
credit covers the hold (CONTRACT "Prepaid credits (v3)", "Authorizations and holds (v3)"); a
customer without the flag is never refused for credit; a live hold takes from the balance's
``held_usd``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.reconcile.runner import run_pass
from billing.settings import Settings
from tests.conftest import LiveServer
from tests.credits.helpers import JAN, PRICE, balance, grant, ok


@pytest.fixture
def acme(client: TestClient) -> TestClient:
    """A priced model and key_a assigned to customer acme, which must hold credit."""
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    ok(client.put("/v1/customers/acme", json={"credit_required": True}))
    return client


def _authorize(client: TestClient, rid: str, amount: str) -> dict[str, object]:
    body = {"request_id": rid, "api_key_id": "key_a", "model": "m-credit",
            "estimate": {"amount_usd": amount}}  # fmt: skip
    return ok(client.post("/v1/authorizations", json=body), 200)


def test_a_hold_beyond_the_available_credit_is_refused_and_one_within_it_admitted(
    acme: TestClient,
) -> None:
    grant(acme, "g1", "0.05")
    assert balance(acme)["available_usd"] == "0.05"

    denied = _authorize(acme, "r-big", "0.10")
    assert (denied["decision"], denied["reason"], denied["retryable"]) == (
        "deny",
        "insufficient_credit",
        False,
    )
    assert (denied["hold_usd"], denied["expires_at"]) == ("0", None)
    assert balance(acme)["held_usd"] == "0"  # a refusal holds nothing

    allowed = _authorize(acme, "r-small", "0.04")
    assert (allowed["decision"], allowed["reason"], allowed["hold_usd"]) == ("allow", None, "0.04")
    figures = balance(acme)
    assert (figures["balance_usd"], figures["held_usd"], figures["available_usd"]) == (
        "0.05",
        "0.04",
        "0.01",
    )
    # The live hold takes its place: another 0.02 no longer fits, 0.01 does.
    assert _authorize(acme, "r-next", "0.02")["reason"] == "insufficient_credit"
    assert _authorize(acme, "r-last", "0.01")["decision"] == "allow"
    # A released hold gives its credit back at once.
    ok(acme.delete("/v1/authorizations/r-small"), 200)
    assert balance(acme)["held_usd"] == "0.01"


def test_a_customer_without_credit_required_is_not_refused_for_credit(client: TestClient) -> None:
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    ok(client.put("/v1/customers/acme", json={"credit_required": False}))
    answer = _authorize(client, "r-free", "0.10")
    assert (answer["decision"], answer["reason"]) == ("allow", None)
    assert balance(client)["held_usd"] == "0.1"


def test_thirty_concurrent_tenths_against_a_dollar_of_credit_admit_exactly_ten(
    live_server: LiveServer,
) -> None:
    """No budget serializes these: only the owner's authorization lock does (PostgreSQL: an
    advisory lock per owner; the grants are read without row locks)."""
    with httpx.Client(base_url=live_server.url, timeout=60) as admin:
        ok(admin.post("/v1/prices", json=PRICE), 201)
        ok(admin.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
        ok(admin.put("/v1/customers/acme", json={"credit_required": True}))
        ok(admin.post("/v1/credits/grants", json={"grant_id": "g-dollar", "customer_id": "acme",
           "amount_usd": "1", "kind": "purchased", "effective_at": JAN}), 201)  # fmt: skip
    start = threading.Barrier(30)

    def one(rid: str) -> dict[str, Any]:
        with httpx.Client(base_url=live_server.url, timeout=60) as gateway:
            start.wait()
            return ok(gateway.post("/v1/authorizations", json={"request_id": rid,
                      "api_key_id": "key_a", "model": "m-credit",
                      "estimate": {"amount_usd": "0.10"}}), 200)  # fmt: skip

    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(one, [f"c-{i}" for i in range(30)]))
    allowed = [a for a in answers if a["decision"] == "allow"]
    assert len(allowed) == 10
    assert {a["hold_usd"] for a in allowed} == {"0.1"}
    assert {(a["reason"], a["retryable"]) for a in answers if a["decision"] == "deny"} == {
        ("insufficient_credit", False)
    }
    with httpx.Client(base_url=live_server.url, timeout=60) as reader:
        figures = ok(reader.get("/v1/credits/balance", params={"customer_id": "acme"}), 200)
    assert (figures["balance_usd"], figures["held_usd"], figures["available_usd"]) == (
        "1",
        "1",
        "0",
    )


def test_a_markup_plan_holds_the_charge_against_the_credit(client: TestClient) -> None:
    """Credit draws the charge (issue #39): under a 20 % markup a token estimate costing $0.10
    (50,000 input tokens at $1/M, 5,000 output at $10/M) holds its charge, $0.12, so $0.30 of
    credit admits two such holds, not three."""
    ok(client.post("/v1/prices", json=PRICE), 201)
    plan = {"plan_id": "plus20", "effective_from": JAN, "markup_pct": "20"}
    ok(client.post("/v1/plans", json=plan), 201)
    assign = {"customer_id": "acme", "plan_id": "plus20", "effective_from": JAN}
    ok(client.put("/v1/keys/key_a", json=assign), 201)
    ok(client.put("/v1/customers/acme", json={"credit_required": True}))
    grant(client, "g1", "0.30")
    estimate = {"input_tokens": 50_000, "max_output_tokens": 5_000}
    body = {"api_key_id": "key_a", "model": "m-credit", "estimate": estimate}
    answers = [
        ok(client.post("/v1/authorizations", json={"request_id": f"r{i}", **body}), 200)
        for i in range(3)
    ]
    assert [(a["decision"], a["reason"], a["hold_usd"]) for a in answers] == [
        ("allow", None, "0.12"),
        ("allow", None, "0.12"),
        ("deny", "insufficient_credit", "0"),
    ]
    figures = balance(client)
    assert (figures["held_usd"], figures["available_usd"]) == ("0.24", "0.06")


def _open_call(client: TestClient, rid: str, key: str, input_tokens: int) -> None:
    """A call's ``stream.started`` only (now, with the gateway's input count): open, and read
    by no reconciliation step (the test app runs no background pass)."""
    started = datetime.now(UTC) - timedelta(seconds=5)
    event = {"event_id": f"{rid}-s", "request_id": rid, "type": "stream.started",
             "occurred_at": started.isoformat(), "api_key_id": key, "model": "m-credit",
             "protocol": "anthropic.messages", "input_tokens": input_tokens}  # fmt: skip
    ok(client.post("/v1/events", json={"events": [event]}), 200)


def test_an_open_call_is_pending_from_its_ingest_without_waiting_for_a_step(
    acme: TestClient, app: FastAPI, settings: Settings
) -> None:
    """A call of 0.3 (300,000 input tokens at 1 USD per million) posted but not yet read by a
    reconciliation step took nothing from the available credit: an authorization of 0.4 right
    after it was admitted against 0.5 of credit, the owner then 0.2 overdrawn."""
    grant(acme, "g1", "0.5")
    ok(acme.put("/v1/keys/key_b", json={"customer_id": None, "effective_from": JAN}), 201)
    grant(acme, "gb", "1", api_key_id="key_b")
    _open_call(acme, "open-1", "key_a", 300_000)
    _open_call(acme, "open-b", "key_b", 100_000)  # another owner's: 0.1 pending of key_b
    figures = balance(acme)
    assert (figures["pending_usd"], figures["available_usd"]) == ("0.3", "0.2")
    assert balance(acme, api_key_id="key_b")["pending_usd"] == "0.1"
    assert ok(acme.get("/v1/customers/acme"))["balance"]["pending_usd"] == "0.3"
    assert [c["balance"]["pending_usd"] for c in ok(acme.get("/v1/customers"))["data"]] == ["0.3"]
    assert _authorize(acme, "r-big", "0.4")["reason"] == "insufficient_credit"
    # A hold whose call is posted stands for it until a step reads it: counted once, as held.
    assert _authorize(acme, "r-held", "0.15")["decision"] == "allow"
    _open_call(acme, "r-held", "key_a", 100_000)
    figures = balance(acme)
    assert (figures["held_usd"], figures["pending_usd"], figures["available_usd"]) == (
        "0.15",
        "0.3",
        "0.05",
    )
    # Once a step read the calls, their own figures count: the same amounts, once.
    run_pass(app.state.billing.sessions, settings, now=datetime.now(UTC))
    figures = balance(acme)
    assert (figures["held_usd"], figures["pending_usd"], figures["available_usd"]) == (
        "0.05",
        "0.4",
        "0.05",
    )
