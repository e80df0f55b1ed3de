"""Grants and customers over HTTP: idempotency, 409s, clear 422s that store nothing, customers
as a resource with their balance (CONTRACT "Prepaid credits (v3)")."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from billing.storage.db import read_transaction
from billing.storage.models import CreditEntry, CreditGrant, Customer
from tests.credits.helpers import JAN, ok

GRANT = {"grant_id": "g1", "customer_id": "acme", "amount_usd": "25.5", "kind": "purchased",
         "effective_at": JAN, "expires_at": "2027-01-01T00:00:00Z", "priority": 5,
         "note": "invoice 42"}  # fmt: skip


def stored(app: FastAPI) -> tuple[int, int, int]:
    with read_transaction(app.state.billing.sessions) as session:
        return tuple(  # type: ignore[return-value]
            session.scalar(select(func.count()).select_from(t)) or 0
            for t in (Customer, CreditGrant, CreditEntry)
        )


@pytest.fixture
def acme(client: TestClient) -> TestClient:
    ok(client.put("/v1/customers/acme", json={"name": "Acme"}), 201)
    return client


def test_a_repeated_grant_is_a_no_op_and_a_changed_body_a_409(
    acme: TestClient, app: FastAPI
) -> None:
    first = ok(acme.post("/v1/credits/grants", json=GRANT), 201)
    assert first == {
        "grant_id": "g1", "customer_id": "acme", "api_key_id": None, "kind": "purchased",
        "amount_usd": "25.5", "remaining_usd": "25.5", "effective_at": "2026-01-01T00:00:00Z",
        "expires_at": "2027-01-01T00:00:00Z", "priority": 5, "note": "invoice 42",
        "state": "active",
    }  # fmt: skip
    assert ok(acme.post("/v1/credits/grants", json=GRANT), 200) == first
    assert stored(app) == (1, 1, 1)
    changed = acme.post("/v1/credits/grants", json={**GRANT, "amount_usd": "26"})
    assert changed.status_code == 409, changed.text
    assert "g1" in changed.json()["error"]
    assert stored(app) == (1, 1, 1)
    assert (
        ok(acme.get("/v1/credits/balance", params={"customer_id": "acme"}), 200)["balance_usd"]
        == "25.5"
    )


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"amount_usd": "-1"}, "body.amount_usd", "must not be negative"),
        ({"amount_usd": "0"}, "body.amount_usd", "must be more than 0"),
        ({"amount_usd": "1.0000001"}, "body.amount_usd", "more than 6 decimal places"),
        ({"amount_usd": 1.5}, "body.amount_usd", "decimal string"),
        ({"expires_at": "2025-12-31T00:00:00Z"}, "body", "expires_at must be after effective_at"),
        ({"customer_id": "nobody"}, "body.customer_id", "no customer 'nobody'"),
        ({"api_key_id": "key_a"}, "body", "exactly one owner"),
        ({"customer_id": None}, "body", "exactly one owner"),
        ({"kind": "free"}, "body.kind", "purchased"),
        ({"priority": "1"}, "body.priority", "integer"),
        ({"note": "a\u0000b"}, "body.note", "printable"),
        ({"grant_id": "sk-ant-api03-" + "a" * 40}, "body.grant_id", "secret"),
    ],
)
def test_bad_grants_get_a_clear_422_and_nothing_is_stored(
    acme: TestClient, app: FastAPI, change: dict[str, Any], path: str, words: str
) -> None:
    before = stored(app)
    response = acme.post("/v1/credits/grants", json={**GRANT, **change})
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert [e["path"] for e in errors] == [path], errors
    assert words in errors[0]["message"], errors
    assert stored(app) == before


def test_a_default_effective_at_in_the_past_of_expires_at_is_a_422(
    acme: TestClient, app: FastAPI
) -> None:
    body = {**GRANT, "expires_at": "2026-01-02T00:00:00Z"}
    del body["effective_at"]  # now (December 2026) is after expires_at
    response = acme.post("/v1/credits/grants", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["path"] == "body.expires_at"
    assert stored(app) == (1, 0, 0)


def test_a_grant_for_a_key_with_a_customer_is_a_422(acme: TestClient, app: FastAPI) -> None:
    ok(acme.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    body = {**GRANT, "customer_id": None, "api_key_id": "key_a"}
    response = acme.post("/v1/credits/grants", json=body)
    assert response.status_code == 422, response.text
    assert "assigned to customer 'acme'" in response.json()["errors"][0]["message"]
    assert stored(app) == (1, 0, 0)


def test_customers_are_a_resource_with_their_balance(acme: TestClient, app: FastAPI) -> None:
    ok(acme.put("/v1/keys/key_b", json={"customer_id": "beta", "effective_from": JAN}), 201)
    ok(acme.post("/v1/credits/grants", json=GRANT), 201)
    changed = ok(
        acme.put("/v1/customers/acme", json={"credit_required": True, "low_balance_usd": "5"}),
        200,
    )
    assert (changed["name"], changed["credit_required"], changed["low_balance_usd"]) == (
        None,
        True,
        "5",
    )
    assert changed["balance"]["balance_usd"] == "25.5"
    # beta exists implicitly (named by a key) with the defaults.
    beta = ok(acme.get("/v1/customers/beta"), 200)
    assert (beta["credit_required"], beta["low_balance_usd"], beta["balance"]["balance_usd"]) == (
        False,
        None,
        "0",
    )
    assert acme.get("/v1/customers/nobody").status_code == 404
    page = ok(acme.get("/v1/customers", params={"limit": 1}), 200)
    assert [c["customer_id"] for c in page["data"]] == ["acme"]
    rest = ok(acme.get("/v1/customers", params={"cursor": page["next_cursor"]}), 200)
    assert ([c["customer_id"] for c in rest["data"]], rest["next_cursor"]) == (["beta"], None)
    bad = acme.put("/v1/customers/acme", json={"low_balance_usd": "-1"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "body.low_balance_usd"
    assert ok(acme.get("/v1/customers/acme"), 200)["low_balance_usd"] == "5"
    secret = acme.put("/v1/customers/sk-ant-api03-" + "a" * 40, json={})
    assert secret.status_code == 422 and secret.json()["errors"][0]["path"] == "path.customer_id"


def test_the_balance_needs_exactly_one_owner(acme: TestClient) -> None:
    for params in ({}, {"customer_id": "acme", "api_key_id": "key_a"}):
        response = acme.get("/v1/credits/balance", params=params)
        assert response.status_code == 422, response.text
    assert acme.post("/v1/credits/grants/nope/void", json={}).status_code == 404


def test_a_grant_stored_meanwhile_is_not_inserted_twice(acme: TestClient, app: FastAPI) -> None:
    """Two first posts of one grant_id at once: the later insert finds the grant (its savepoint
    fails alone) and the transaction goes on."""
    from billing.credits.repository import repository
    from billing.credits.rows import Movement, Owner
    from billing.storage.db import write_transaction
    from tests.credits.helpers import at

    ok(acme.post("/v1/credits/grants", json=GRANT), 201)
    now = at("2026-12-01T00:00:00Z")
    late = CreditGrant(grant_id="g1", customer_id="acme", amount_pusd=1, effective_at=now,
                       priority=1, kind="purchased", created_at=now)  # fmt: skip
    move = Movement("grant", now, Owner("acme", None), "g1", 1)
    with write_transaction(app.state.billing.sessions) as session:
        assert repository(session).add_grant(session, late, move) is False
        assert repository(session).customer_known(session, "acme")
    assert stored(app) == (1, 1, 1)


@pytest.mark.parametrize("value", ["yes", "false", 1, 0, "on"])
def test_credit_required_must_be_a_json_boolean(acme: TestClient, value: object) -> None:
    # "yes" or 1 was read as true and "false" as false: a typo flipped who must hold credit.
    ok(acme.put("/v1/customers/acme", json={"credit_required": True}), 200)
    response = acme.put("/v1/customers/acme", json={"credit_required": value})
    assert response.status_code == 422, response.text
    error = {"index": None, "path": "body.credit_required"}
    assert response.json()["errors"] == [{**error, "message": "Input should be a valid boolean"}]
    assert ok(acme.get("/v1/customers/acme"), 200)["credit_required"] is True
