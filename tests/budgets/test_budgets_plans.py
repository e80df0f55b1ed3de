"""Budgets with keys, customers and plans (CONTRACT "Budgets and alerts (v2)" over "Keys,
customers and plans (v2)"): a customer budget sums the keys assigned to it, ``measure: charge``
counts what the plan charges and ``cost`` what the provider bills, settled and open calls
alike. Both databases (``BILLING_TEST_DATABASE_URL``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient

from billing.budgets import service
from tests.budgets.helpers import call, create, price, read, reconcile, status

NOV = datetime(2026, 11, 10, tzinfo=UTC)
SINCE = "2026-01-01T00:00:00Z"


def _assign(client: TestClient, key: str, customer: str | None, plan: str | None) -> None:
    body = {"customer_id": customer, "plan_id": plan, "effective_from": SINCE}
    response = client.put(f"/v1/keys/{key}", json=body)
    assert response.status_code in (200, 201), response.text


def _plans(client: TestClient) -> None:
    response = client.post(
        "/v1/plans", json={"plan_id": "double", "effective_from": SINCE, "markup_pct": "100"}
    )
    assert response.status_code in (200, 201), response.text


def test_a_customer_charge_budget_sums_its_keys_at_the_plan_charge(client: TestClient) -> None:
    price(client)  # $1 per million input tokens
    _plans(client)
    _assign(client, "key_c1", "cus_1", "double")
    _assign(client, "key_c2", "cus_1", None)  # the customer's, charged at cost
    _assign(client, "key_c3", "cus_2", "double")  # another customer's
    create(
        client, NOV, budget_id="cus", scope={"customer_id": "cus_1"}, limit_usd="1", period="month"
    )
    create(
        client,
        NOV,
        budget_id="k1cost",
        scope={"api_key_id": "key_c1"},
        limit_usd="1",
        period="month",
        measure="cost",
    )
    at = NOV + timedelta(hours=1)
    call(client, "p1", at, 100_000, key="key_c1")  # cost $0.10, charge $0.20
    call(client, "p2", at, 200_000, key="key_c2")  # cost = charge $0.20
    call(client, "p3", at, 300_000, key="key_c3")  # not cus_1's
    call(client, "p4", at, 150_000, key="key_c1", settled=False)  # open: charge $0.30 so far
    reconcile(client, NOV + timedelta(hours=2))
    cus = status(client, "cus", NOV + timedelta(hours=2))
    assert (cus["settled_usd"], cus["provisional_usd"], cus["spent_usd"]) == ("0.4", "0.3", "0.7")
    assert (cus["state"], cus["thresholds_crossed"]) == ("ok", [])
    k1 = status(client, "k1cost", NOV + timedelta(hours=2))
    assert (k1["settled_usd"], k1["provisional_usd"], k1["spent_usd"]) == ("0.1", "0.15", "0.25")
    # The open call settles: its charge replaces the provisional figure, and crosses 80 %.
    call(client, "p5", at, 150_000, key="key_c2")  # $0.15
    reconcile(client, NOV + timedelta(hours=3))
    cus = status(client, "cus", NOV + timedelta(hours=3))
    assert (cus["spent_usd"], cus["state"], cus["thresholds_crossed"]) == (
        "0.85",
        "warning",
        ["0.8"],
    )
    check = read(client, lambda s: service.spend_check(s, "key_c2", NOV + timedelta(hours=3)))
    assert check["allowed"] is True
    assert [b["budget_id"] for b in check["budgets"]] == ["cus"]
    other = read(client, lambda s: service.spend_check(s, "key_c3", NOV + timedelta(hours=3)))
    assert other["budgets"] == []


def test_a_key_moved_to_another_customer_leaves_its_spend_with_the_first(
    client: TestClient,
) -> None:
    price(client)
    _assign(client, "key_m", "acme", None)
    before = create(
        client,
        NOV,
        budget_id="acme-before",
        scope={"customer_id": "acme"},
        limit_usd="1",
        period="month",
        measure="cost",
    )
    assert before["scope"] == {"customer_id": "acme"}
    call(client, "m1", NOV + timedelta(hours=1), 100_000, key="key_m")  # $0.10, acme's
    call(client, "m2", NOV + timedelta(hours=1), 50_000, key="key_m", settled=False)  # open
    reconcile(client, NOV + timedelta(hours=2))
    moved = {"customer_id": "initech", "plan_id": None, "effective_from": "2026-11-10T03:00:00Z"}
    response = client.put("/v1/keys/key_m", json=moved)
    assert response.status_code in (200, 201), response.text
    for name, customer in (("acme-after", "acme"), ("initech", "initech")):
        create(
            client,
            NOV + timedelta(hours=4),
            budget_id=name,
            scope={"customer_id": customer},
            limit_usd="1",
            period="month",
            measure="cost",
        )
    call(client, "m3", NOV + timedelta(hours=5), 200_000, key="key_m")  # $0.20, initech's
    reconcile(client, NOV + timedelta(hours=6))
    at = NOV + timedelta(hours=6)
    spent = {
        b: (status(client, b, at)["settled_usd"], status(client, b, at)["provisional_usd"])
        for b in ("acme-before", "acme-after", "initech")
    }
    assert spent == {
        "acme-before": ("0.1", "0.05"),
        "acme-after": ("0.1", "0.05"),
        "initech": ("0.2", "0"),
    }
    usage = client.get(
        "/v1/usage",
        params={
            "since": "2026-11-01T00:00:00Z",
            "until": "2026-12-01T00:00:00Z",
            "group_by": "customer_id",
        },
    )
    assert usage.status_code == 200, usage.text
    by_customer = {r["customer_id"]: r["cost_usd"] for r in usage.json()["data"]}
    assert by_customer == {"acme": "0.1", "initech": "0.2"}
    # The gateway's check answers the budgets of the key's customer now.
    check = read(client, lambda s: service.spend_check(s, "key_m", at))
    assert [b["budget_id"] for b in check["budgets"]] == ["initech"]
