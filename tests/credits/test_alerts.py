"""Credit alerts through the budgets' signed webhook outbox: ``credits.low`` once per crossing,
``credits.exhausted`` at zero, ``credits.expiring`` seven days ahead; delivered to a real
receiver on 127.0.0.1 and verified as Standard Webhooks (CONTRACT "Prepaid credits (v3)")."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from billing.settings import Settings
from tests.budgets.helpers import deliver, receiving
from tests.credits.helpers import JAN, PRICE, call, grant, ok, reconcile


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The receivers listen on 127.0.0.1: private destinations allowed."""
    return Settings(database_url=db_url, webhook_allow_private=True)


def _hooked(client: TestClient, url: str) -> str:
    """acme (low balance 0.02) with a budget over it that has a webhook; its secret."""
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    ok(client.put("/v1/customers/acme", json={"low_balance_usd": "0.02"}), 201)
    budget = {"budget_id": "acme-hook", "scope": {"customer_id": "acme"}, "limit_usd": "1000",
              "period": "total", "thresholds": ["1"], "webhook_url": url}  # fmt: skip
    return str(ok(client.post("/v1/budgets", json=budget), 201)["webhook_secret"])


def test_the_low_balance_webhook_arrives_once_per_crossing(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    with receiving() as receiver:
        secret = _hooked(client, receiver.url)
        grant(client, "g", "0.05")
        # 0.01 a call: available 0.04, 0.03, 0.02, then 0.01 (below 0.02: low), then 0.
        for n in range(5):
            call(client, f"r{n}", f"2026-03-01T10:0{n}:00Z", 1000)
            reconcile(app, settings, f"2026-03-01T10:0{n}:30Z")
        # A top-up to 0.025, then 0.015: below 0.02 again, a second crossing.
        grant(client, "top-up", "0.025")
        call(client, "r5", "2026-03-01T10:06:00Z", 1000)
        reconcile(app, settings, "2026-03-01T10:06:30Z")
        call(client, "r6", "2026-03-01T10:07:00Z", 100)  # 0.014: still below, no new alert
        reconcile(app, settings, "2026-03-01T10:07:30Z")
        assert deliver(client) == 3
        assert deliver(client) == 0
    payloads = [Webhook(secret).verify(body, headers) for headers, body in receiver.received]
    payloads.sort(key=lambda p: p["timestamp"])  # delivered concurrently, in any order
    assert [(p["type"], p["data"]["available_usd"]) for p in payloads] == [
        ("credits.low", "0.01"),
        ("credits.exhausted", "0"),
        ("credits.low", "0.015"),
    ]
    assert [p["timestamp"] for p in payloads] == [
        "2026-03-01T10:03:30Z",
        "2026-03-01T10:04:30Z",
        "2026-03-01T10:06:30Z",
    ]
    assert payloads[0]["data"]["customer_id"] == "acme"
    assert payloads[0]["data"]["low_balance_usd"] == "0.02"
    assert len({headers["webhook-id"] for headers, _ in receiver.received}) == 3
    assert set(json.loads(receiver.received[0][1])) == {"type", "timestamp", "data"}


def test_a_grant_with_a_remainder_warns_seven_days_before_it_expires(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    with receiving() as receiver:
        secret = _hooked(client, receiver.url)
        grant(client, "spent", "0.01", JAN, expires_at="2026-03-20T00:00:00Z")
        grant(client, "left", "1", JAN, priority=200, expires_at="2026-03-20T00:00:00Z")
        call(client, "r1", "2026-03-01T10:00:00Z", 1000)  # draws all of "spent"
        reconcile(app, settings, "2026-03-12T23:59:59Z")  # 7 days + 1 s before: nothing yet
        reconcile(app, settings, "2026-03-13T00:00:00Z")
        reconcile(app, settings, "2026-03-14T00:00:00Z")  # once
        assert deliver(client) == 1
    ((headers, body),) = receiver.received
    payload = Webhook(secret).verify(body, headers)
    assert payload["type"] == "credits.expiring"
    assert payload["data"] == {
        "customer_id": "acme",
        "api_key_id": None,
        "grant_id": "left",
        "remaining_usd": "1",
        "expires_at": "2026-03-20T00:00:00Z",
    }


def test_a_void_that_empties_the_balance_sends_exhausted(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    with receiving() as receiver:
        secret = _hooked(client, receiver.url)
        grant(client, "g", "1")
        ok(client.post("/v1/credits/grants/g/void", json={}), 200)
        ok(client.post("/v1/credits/grants/g/void", json={}), 200)  # once
        assert deliver(client) == 2
    payloads = [Webhook(secret).verify(body, headers) for headers, body in receiver.received]
    assert sorted((p["type"], p["data"]["available_usd"]) for p in payloads) == [
        ("credits.exhausted", "0"),
        ("credits.low", "0"),
    ]
