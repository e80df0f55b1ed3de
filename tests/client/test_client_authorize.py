"""The client's ``authorize`` and ``release`` against the real app on 127.0.0.1 (CONTRACT
"Authorizations and holds (v3)"), sync and asyncio, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from billing.client import AsyncBillingClient, BillingClient, ServiceError
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
        first = client.authorize("cl-1", "key_c", MODEL, TENTH, tags=["team-a"], ttl_s=60)
        assert (first["decision"], first["hold_usd"], first["binding_budget_id"]) == (
            "allow",
            "0.1",
            "b-client",
        )
        assert client.authorize("cl-1", "key_c", MODEL, TENTH, tags=["team-a"], ttl_s=60) == first
        second = client.authorize("cl-2", "key_c", MODEL, TENTH)
        assert (second["decision"], second["reason"], second["retryable"]) == (
            "deny",
            "insufficient_headroom",
            True,
        )
        released = client.release("cl-1")
        assert (released["state"], released["hold_usd"]) == ("released", "0.1")
        assert client.authorize("cl-2", "key_c", MODEL, TENTH)["decision"] == "allow"
        with pytest.raises(ServiceError) as conflict:
            client.authorize("cl-1", "key_c", MODEL, {"amount_usd": "0.01"})
        assert conflict.value.status == 409
        with pytest.raises(ServiceError) as bad:
            client.authorize("cl-3", "key_c", MODEL, TENTH, ttl_s=5)
        assert bad.value.status == 422
        assert bad.value.detail["errors"][0]["path"] == "body.ttl_s"
        with pytest.raises(ServiceError) as missing:
            client.release("cl-none")
        assert missing.value.status == 404


def test_authorize_and_release_asyncio(live_server: LiveServer) -> None:
    _budget(live_server.url)

    async def run() -> None:
        client = AsyncBillingClient(live_server.url, spool_path=None)
        try:
            first = await client.authorize("ca-1", "key_c", MODEL, {"amount_usd": "0.15"})
            assert (first["decision"], first["hold_usd"]) == ("allow", "0.15")
            assert (await client.release("ca-1"))["state"] == "released"
        finally:
            await client.close()

    asyncio.run(run())


def test_no_answer_is_a_service_error() -> None:
    with BillingClient("http://127.0.0.1:9", spool_path=None, timeout_s=2) as client:
        with pytest.raises(ServiceError) as error:
            client.authorize("x", "key_c", MODEL, TENTH)
        assert error.value.status is None
