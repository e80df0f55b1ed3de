"""A ``credit_required`` customer is admitted at authorization only as far as its available
credit covers the hold (CONTRACT "Prepaid credits (v3)", "Authorizations and holds (v3)"); a
customer without the flag is never refused for credit; a live hold takes from the balance's
``held_usd``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

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
