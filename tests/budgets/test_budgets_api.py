"""``/v1/budgets``, ``/v1/spend`` and ``/v1/alerts`` over HTTP: shapes, versions, roles, and a
clear 422 naming the field for bad input (CONTRACT "Budgets and alerts (v2)")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.auth.tokens import create_token
from billing.storage.db import write_transaction
from tests.budgets.helpers import call, price

BODY: dict[str, Any] = {
    "budget_id": "b-total",
    "scope": {"api_key_id": "key_b1"},
    "limit_usd": "0.3",
    "period": "total",
}


def test_create_read_change_delete(client: TestClient) -> None:
    created = client.post("/v1/budgets", json=BODY)
    assert created.status_code == 201, created.text
    out = created.json()
    assert out["webhook_secret"].startswith("whsec_")
    assert {k: out[k] for k in ("budget_id", "version", "scope", "limit_usd", "measure")} == {
        "budget_id": "b-total",
        "version": 1,
        "scope": {"api_key_id": "key_b1"},
        "limit_usd": "0.3",
        "measure": "charge",
    }
    assert (out["period"], out["tz"], out["thresholds"], out["webhook_url"]) == (
        "total",
        "UTC",
        ["0.8", "1"],
        None,
    )
    again = client.post("/v1/budgets", json=BODY)
    assert again.json() == {
        "error": "budget 'b-total' already exists; change it with PUT /v1/budgets/{budget_id}"
    }
    listed = client.get("/v1/budgets").json()["data"]
    assert [b["budget_id"] for b in listed] == ["b-total"]
    assert "webhook_secret" not in listed[0]
    status = client.get("/v1/budgets/b-total").json()
    assert list(status) == [
        "budget_id",
        "scope",
        "limit_usd",
        "measure",
        "period",
        "period_start",
        "period_end",
        "spent_usd",
        "settled_usd",
        "provisional_usd",
        "held_usd",
        "remaining_usd",
        "fraction_used",
        "state",
        "thresholds_crossed",
        "as_of",
    ]
    assert (status["spent_usd"], status["remaining_usd"], status["state"]) == ("0", "0.3", "ok")
    changed = client.put(
        "/v1/budgets/b-total",
        json={**{k: v for k, v in BODY.items() if k != "budget_id"}, "limit_usd": "2"},
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["version"], changed.json()["limit_usd"]) == (2, "2")
    assert (
        client.put(
            "/v1/budgets/nope", json={k: v for k, v in BODY.items() if k != "budget_id"}
        ).status_code
        == 404
    )
    deleted = client.delete("/v1/budgets/b-total")
    assert deleted.status_code == 200 and deleted.json()["ended_at"] is not None
    assert client.get("/v1/budgets/b-total").status_code == 404
    assert client.delete("/v1/budgets/b-total").status_code == 404
    assert client.get("/v1/budgets").json()["data"] == []
    history = client.get("/v1/budgets", params={"include_ended": "true"}).json()["data"]
    assert [(b["budget_id"], b["version"]) for b in history] == [("b-total", 2)]
    # The id stays taken: its history keeps it. The 409 says so, rather than pointing at a
    # PUT that answers 404 for a deleted budget.
    reused = client.post("/v1/budgets", json=BODY)
    assert (reused.status_code, reused.json()) == (
        409,
        {"error": "budget 'b-total' was deleted and its id stays taken (its history keeps it); "
                  "create the budget under a new budget_id"},
    )  # fmt: skip
    # An id may hold a slash.
    assert client.post("/v1/budgets", json={**BODY, "budget_id": "team/a"}).status_code == 201
    assert client.get("/v1/budgets/team/a").json()["budget_id"] == "team/a"


def test_the_spend_check_stops_a_key_over_its_budget(client: TestClient) -> None:
    price(client)
    assert client.post("/v1/budgets", json=BODY).status_code == 201
    check = client.get("/v1/spend", params={"api_key_id": "key_b1"}).json()
    assert check["allowed"] is True and [b["state"] for b in check["budgets"]] == ["ok"]
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    call(client, "c1", now, 300_000)  # $0.30: the whole limit
    assert client.post("/v1/reconcile", json={}).status_code == 200
    check = client.get("/v1/spend", params={"api_key_id": "key_b1"}).json()
    assert check["allowed"] is False
    assert [(b["spent_usd"], b["state"]) for b in check["budgets"]] == [("0.3", "exceeded")]
    alerts = client.get("/v1/alerts", params={"budget_id": "b-total"}).json()["data"]
    assert [(a["type"], a["threshold"]) for a in alerts] == [
        ("budget.threshold_crossed", "0.8"),
        ("budget.threshold_crossed", "1"),
    ]
    assert alerts[0]["delivery"]["state"] == "none"
    since = client.get("/v1/alerts", params={"since": "2999-01-01T00:00:00Z"}).json()["data"]
    assert since == []
    assert client.get("/v1/spend", params={"api_key_id": "key_b1", "x": "1"}).status_code == 422
    assert client.get("/v1/spend").status_code == 422
    assert client.get("/v1/alerts", params={"since": "2026-01-01T00:00:00"}).status_code == 422


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"tz": "Mars/Olympus"}, "body.tz"),
        ({"limit_usd": "0"}, "body.limit_usd"),
        ({"limit_usd": "-1"}, "body.limit_usd"),
        ({"limit_usd": 1.5}, "body.limit_usd"),
        ({"limit_usd": "ten"}, "body.limit_usd"),
        ({"thresholds": ["1", "0.8"]}, "body.thresholds"),
        ({"thresholds": ["0", "1"]}, "body.thresholds"),
        ({"thresholds": []}, "body.thresholds"),
        ({"webhook_url": "ftp://example.com/x"}, "body.webhook_url"),
        ({"webhook_url": "javascript:alert(1)"}, "body.webhook_url"),
        ({"period": "year"}, "body.period"),
        ({"measure": "price"}, "body.measure"),
        ({"scope": {"api_key_id": "k", "customer_id": "c"}}, "body.scope"),
        ({"scope": {}}, "body.scope"),
        ({"extra": 1}, "body.extra"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(
    client: TestClient, change: dict[str, Any], path: str
) -> None:
    response = client.post("/v1/budgets", json={**BODY, **change})
    assert response.status_code == 422, response.text
    paths = [e["path"] for e in response.json()["errors"]]
    assert any(p.startswith(path) for p in paths), paths


def test_roles_ingest_may_check_spend_only(client: TestClient, app: FastAPI) -> None:
    with write_transaction(app.state.billing.sessions) as session:
        admin, _ = create_token(session, "admin", "root", datetime.now(UTC))
        ingest, _ = create_token(session, "ingest", "gw", datetime.now(UTC))
    as_admin = {"Authorization": f"Bearer {admin}"}
    as_ingest = {"Authorization": f"Bearer {ingest}"}
    assert client.post("/v1/budgets", json=BODY, headers=as_admin).status_code == 201
    assert (
        client.post("/v1/budgets", json={**BODY, "budget_id": "x"}, headers=as_ingest).status_code
        == 403
    )
    spend = client.get("/v1/spend", params={"api_key_id": "key_b1"}, headers=as_ingest)
    assert spend.status_code == 200 and spend.json()["allowed"] is True
    assert client.get("/v1/budgets/b-total", headers=as_ingest).status_code == 403
    assert client.get("/v1/spend", params={"api_key_id": "key_b1"}).status_code == 401
