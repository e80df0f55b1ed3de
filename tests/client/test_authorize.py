"""``authorize`` and ``release`` of both clients against the real service (uvicorn in a thread,
real HTTP, the real database): the typed decision and the hold given back; no decision (503, no
answer) raised apart from a refused request (CONTRACT "Authorizations and holds (v3)")."""

from __future__ import annotations

import asyncio
from datetime import UTC, timedelta
from decimal import Decimal

import httpx
import pytest
from fastapi import FastAPI
from starlette.responses import JSONResponse

from billing.client import (
    AsyncBillingClient,
    AuthorizationRejected,
    AuthorizationUnavailable,
    BillingClient,
    Release,
)
from tests.conftest import LiveServer, _free_port
from tests.gateway.harness import PRICE  # $2.5 (input) and $10 (output) per million tokens


def _priced_with_budget(http: httpx.Client) -> None:
    assert http.post("/v1/prices", json=PRICE).status_code in (200, 201)
    budget = {"budget_id": "b1", "scope": {"api_key_id": "key_c"}, "limit_usd": "1"}
    made = http.post("/v1/budgets", json={**budget, "period": "total"})
    assert made.status_code == 201, made.text


def test_the_sync_client_authorizes_and_releases(
    live_server: LiveServer, http: httpx.Client
) -> None:
    _priced_with_budget(http)
    with BillingClient(live_server.url, spool_path=None) as client:
        call = {"api_key_id": "key_c", "model": "fake-model"}
        tokens = {"input_tokens": 4_000, "max_output_tokens": 1_000}
        first = client.authorize(request_id="r1", estimate=tokens, ttl_s=60, **call)
        over = client.authorize(
            request_id="r2", estimate={"input_tokens": 0, "max_output_tokens": 200_000}, **call
        )
        fixed = client.authorize(request_id="r3", estimate={"amount_usd": Decimal("0.25")}, **call)
        released = client.release("r1")
    # $0.01 of input and $0.01 of output
    assert (first.decision, first.allowed, first.reason) == ("allow", True, None)
    assert first.hold_usd == Decimal("0.02") and first.binding_budget_id == "b1"
    assert first.expires_at is not None and first.expires_at.tzinfo is not None
    assert first.expires_at - first.as_of == timedelta(seconds=60)
    assert first.as_of.utcoffset() == UTC.utcoffset(None)
    assert [b["held_usd"] for b in first.budgets] == ["0.02"]
    assert (over.decision, over.reason, over.retryable, over.hold_usd) == (
        "deny",
        "estimate_exceeds_limit",
        False,
        Decimal("0"),
    )
    assert (fixed.decision, fixed.hold_usd) == ("allow", Decimal("0.25"))
    assert released == Release("r1", "released", Decimal("0.02"))
    budget = http.get("/v1/budgets/b1").json()
    assert budget["held_usd"] == "0.25"  # r3's hold only


def test_the_async_client_authorizes_and_releases(
    live_server: LiveServer, http: httpx.Client
) -> None:
    _priced_with_budget(http)

    async def run() -> tuple[Decimal, Decimal, str | None, str]:
        async with AsyncBillingClient(live_server.url, spool_path=None) as client:
            call = {"api_key_id": "key_c", "model": "fake-model", "estimate": {"amount_usd": "0.6"}}
            held = await client.authorize(request_id="a1", **call)  # type: ignore[arg-type]
            busy = await client.authorize(request_id="a2", **call)  # type: ignore[arg-type]
            released = await client.release("a1")
            return held.hold_usd, Decimal(busy.retry_after_s or 0), busy.reason, released.state

    hold, retry_after, reason, state = asyncio.run(run())
    assert (hold, reason, state) == (Decimal("0.6"), "insufficient_headroom", "released")
    assert 1 <= retry_after <= 60
    assert http.get("/v1/budgets/b1").json()["held_usd"] == "0"


def test_no_decision_is_raised_apart_from_a_refusal() -> None:
    app = FastAPI()

    @app.post("/v1/authorizations")
    async def authorize() -> JSONResponse:
        return JSONResponse({"error": "database unavailable"}, 503, {"Retry-After": "3"})

    @app.delete("/v1/authorizations/{rid}")
    async def release(rid: str) -> JSONResponse:
        return JSONResponse({"error": "token lacks the ingest role"}, 403)

    fields = {"request_id": "u1", "api_key_id": "k", "model": "m", "estimate": {"amount_usd": "1"}}
    with LiveServer(app) as down, BillingClient(down.url, spool_path=None) as client:
        with pytest.raises(AuthorizationUnavailable) as unavailable:
            client.authorize(**fields)  # type: ignore[arg-type]
        with pytest.raises(AuthorizationRejected) as refused:
            client.release("u1")
    assert (unavailable.value.status, unavailable.value.retry_after_s) == (503, 3.0)
    assert unavailable.value.message == "authorization: HTTP 503: database unavailable"
    assert refused.value.status == 403
    nowhere = f"http://127.0.0.1:{_free_port()}"
    with BillingClient(nowhere, spool_path=None) as client:
        with pytest.raises(AuthorizationUnavailable) as unreachable:
            client.authorize(**fields, timeout_s=2)  # type: ignore[arg-type]
        client.close(timeout=0)
    assert unreachable.value.status is None
    assert unreachable.value.message.startswith("authorization: no answer (ConnectError")
