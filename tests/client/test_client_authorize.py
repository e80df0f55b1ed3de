"""The client's ``authorize`` and ``release`` against the real app on 127.0.0.1 (CONTRACT
"Authorizations and holds (v3)"), sync and asyncio, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
import pytest

from billing.client import (
    AsyncBillingClient,
    AuthorizationRejected,
    AuthorizationUnavailable,
    BillingClient,
)
from tests.budgets.helpers import MODEL, PRICE
from tests.conftest import LiveServer

TENTH = {"input_tokens": 50_000, "max_output_tokens": 25_000}


def _budget(url: str) -> None:
    with httpx.Client(base_url=url) as admin:
        assert admin.post("/v1/prices", json=PRICE).status_code in (200, 201)
        made = admin.post(
            "/v1/budgets",
            json={
                "budget_id": "b-client",
                "scope": {"api_key_id": "key_c"},
                "limit_usd": "0.15",
                "period": "total",
            },
        )
        assert made.status_code == 201, made.text


def test_authorize_and_release(live_server: LiveServer) -> None:
    _budget(live_server.url)
    with BillingClient(live_server.url, spool_path=None) as client:
        call = {"api_key_id": "key_c", "model": MODEL}
        first = client.authorize(
            request_id="cl-1", estimate=TENTH, tags=["team-a"], ttl_s=60, **call
        )
        assert (first.decision, first.hold_usd, first.binding_budget_id) == (
            "allow",
            Decimal("0.1"),
            "b-client",
        )
        again = client.authorize(
            request_id="cl-1", estimate=TENTH, tags=["team-a"], ttl_s=60, **call
        )
        assert again == first
        second = client.authorize(request_id="cl-2", estimate=TENTH, **call)
        assert (second.decision, second.reason, second.retryable) == (
            "deny",
            "insufficient_headroom",
            True,
        )
        released = client.release("cl-1")
        assert (released.state, released.hold_usd) == ("released", Decimal("0.1"))
        assert client.authorize(request_id="cl-2", estimate=TENTH, **call).decision == "allow"
        with pytest.raises(AuthorizationRejected) as conflict:
            client.authorize(request_id="cl-1", estimate={"amount_usd": "0.01"}, **call)
        assert conflict.value.status == 409
        with pytest.raises(AuthorizationRejected) as bad:
            client.authorize(request_id="cl-3", estimate=TENTH, ttl_s=5, **call)
        assert bad.value.status == 422
        assert bad.value.detail["errors"][0]["path"] == "body.ttl_s"
        with pytest.raises(AuthorizationRejected) as missing:
            client.release("cl-none")
        assert missing.value.status == 404


def test_authorize_and_release_asyncio(live_server: LiveServer) -> None:
    _budget(live_server.url)

    async def run() -> None:
        client = AsyncBillingClient(live_server.url, spool_path=None)
        try:
            first = await client.authorize(
                request_id="ca-1", api_key_id="key_c", model=MODEL, estimate={"amount_usd": "0.15"}
            )
            assert (first.decision, first.hold_usd) == ("allow", Decimal("0.15"))
            assert (await client.release("ca-1")).state == "released"
        finally:
            await client.close()

    asyncio.run(run())


def test_no_answer_is_a_service_error() -> None:
    with BillingClient("http://127.0.0.1:9", spool_path=None, timeout_s=2) as client:
        with pytest.raises(AuthorizationUnavailable) as error:
            client.authorize(request_id="x", api_key_id="key_c", model=MODEL, estimate=TENTH)
        assert error.value.status is None
