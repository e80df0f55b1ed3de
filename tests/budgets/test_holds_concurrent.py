"""Admission is atomic per budget (CONTRACT "Authorizations and holds (v3)"): fifty gateways
authorizing $0.10 at once against a $1 budget get exactly ten holds; real HTTP clients against
a real server (uvicorn on 127.0.0.1), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.budgets.helpers import PRICE
from tests.budgets.test_holds import KEY, body
from tests.conftest import LiveServer

CLIENTS = 50


def _dollar_budget(server: LiveServer, budget_id: str) -> None:
    """The price of ``MODEL`` and a $1 budget over ``KEY`` for this month."""
    with httpx.Client(base_url=server.url, timeout=60) as admin:
        assert admin.post("/v1/prices", json=PRICE).status_code in (200, 201)
        made = admin.post(
            "/v1/budgets",
            json={
                "budget_id": budget_id,
                "scope": {"api_key_id": KEY},
                "limit_usd": "1",
                "period": "month",
            },
        )
        assert made.status_code == 201, made.text


def _at_once(server: LiveServer, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each body posted to ``/v1/authorizations`` by a client of its own, all released at once
    (a barrier); the answers in order."""
    start = threading.Barrier(len(bodies))

    def one(sent: dict[str, Any]) -> dict[str, Any]:
        with httpx.Client(base_url=server.url, timeout=60) as gateway:
            start.wait()
            response = gateway.post("/v1/authorizations", json=sent)
            assert response.status_code == 200, response.text
            out: dict[str, Any] = response.json()
            return out

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def test_fifty_concurrent_tenths_against_a_dollar_admit_exactly_ten(
    live_server: LiveServer,
) -> None:
    _dollar_budget(live_server, "b-dollar")
    answers = _at_once(live_server, [body(f"conc-{i}") for i in range(CLIENTS)])
    allowed = [a for a in answers if a["decision"] == "allow"]
    denied = [a for a in answers if a["decision"] == "deny"]
    assert len(allowed) == 10
    assert {a["hold_usd"] for a in allowed} == {"0.1"}
    assert {(a["reason"], a["retryable"]) for a in denied} == {("insufficient_headroom", True)}
    assert all(1 <= a["retry_after_s"] <= 60 for a in denied)
    with httpx.Client(base_url=live_server.url, timeout=60) as reader:
        status = reader.get("/v1/budgets/b-dollar").json()
    assert (status["held_usd"], status["spent_usd"], status["state"]) == ("1", "1", "exceeded")


def test_one_request_id_authorized_at_once_by_many_holds_once(live_server: LiveServer) -> None:
    _dollar_budget(live_server, "b-once")
    answers = _at_once(live_server, [body("same")] * 20)
    assert all(a == answers[0] for a in answers)
    assert (answers[0]["decision"], answers[0]["hold_usd"]) == ("allow", "0.1")
    with httpx.Client(base_url=live_server.url, timeout=60) as reader:
        assert reader.get("/v1/budgets/b-once").json()["held_usd"] == "0.1"
