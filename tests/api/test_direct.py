"""The routes answered ahead of the framework (``billing.api.direct``: ``POST
/v1/authorizations``, ``GET /v1/credits/balance``) answer as the framework's routes do: the same
statuses and bodies for valid and invalid requests, with and without tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from billing.auth.tokens import create_token
from billing.storage.db import write_transaction
from tests.budgets.helpers import PRICE, price

BASE = "http://127.0.0.1"


def _framework(app: FastAPI) -> Any:
    """``app`` without its fast routes: FastAPI's own middleware stack and routing."""

    async def routed(scope: Scope, receive: Receive, send: Send) -> None:
        await FastAPI.__call__(app, scope, receive, send)

    return routed


def _both(app: FastAPI, client: TestClient, method: str, path: str, **kw: Any) -> list[Any]:
    """The answers of the app (its fast route) and of the framework's route alike."""
    with TestClient(_framework(app), base_url=BASE) as framework:
        answers = []
        for each in (client, framework):
            response = each.request(method, path, **kw)
            body = response.json()
            if isinstance(body, dict):
                body.pop("as_of", None)
            answers.append((response.status_code, body))
    return answers


AUTH = {
    "api_key_id": "key_d1",
    "model": "model-d",
    "estimate": {"input_tokens": 10, "max_output_tokens": 10},
}

BAD_BODIES: list[Any] = [
    b"{not json",
    b"[]",
    b"",
    {**AUTH},  # no request_id
    {**AUTH, "request_id": "d-1", "extra": 1},
    {**AUTH, "request_id": "d-2", "ttl_s": 60.0},
    {**AUTH, "request_id": "d-3", "estimate": {"input_tokens": -1, "max_output_tokens": 1}},
    {**AUTH, "request_id": "", "tags": ["x"] * 100},
]


@pytest.mark.parametrize("bad", BAD_BODIES)
def test_an_invalid_authorization_gets_the_frameworks_422(
    app: FastAPI, client: TestClient, bad: Any
) -> None:
    kw: dict[str, Any] = (
        {"content": bad, "headers": {"content-type": "application/json"}}
        if isinstance(bad, bytes)
        else {"json": bad}
    )
    fast, routed = _both(app, client, "POST", "/v1/authorizations", **kw)
    assert fast == routed
    assert fast[0] == 422


def test_an_authorization_and_a_balance_answer_alike(app: FastAPI, client: TestClient) -> None:
    price(client, model="model-d")
    body = {**AUTH, "request_id": "d-ok"}
    fast, routed = _both(app, client, "POST", "/v1/authorizations", json=body)
    assert fast == routed and fast[0] == 200 and fast[1]["decision"] == "allow"
    for params in ({"api_key_id": "key_d1"}, {"customer_id": "c"}, {}, {"other": "x"}):
        fast, routed = _both(app, client, "GET", "/v1/credits/balance", params=params)
        assert fast == routed
    assert client.get("/v1/credits/balance", params={"customer_id": "a\x00"}).status_code == 422


def test_the_guards_answer_alike(app: FastAPI, client: TestClient) -> None:
    now = datetime.now(UTC)
    with write_transaction(app.state.billing.sessions) as session:
        reader, _ = create_token(session, "read", "reader", now)
        admin, _ = create_token(session, "admin", "admin", now)
    assert client.post(
        "/v1/prices",
        json={**PRICE, "model": "model-d"},
        headers={"authorization": f"Bearer {admin}"},
    ).status_code in (200, 201)
    body = {**AUTH, "request_id": "d-guard"}
    for token in (None, "nope", reader, admin):
        headers = {} if token is None else {"authorization": f"Bearer {token}"}
        fast, routed = _both(app, client, "POST", "/v1/authorizations", json=body, headers=headers)
        assert fast == routed and fast[0] == {None: 401, "nope": 401, reader: 403}.get(token, 200)
        fast, routed = _both(
            app, client, "GET", "/v1/credits/balance", params={"customer_id": "c"}, headers=headers
        )
        assert fast == routed and fast[0] == {None: 401, "nope": 401}.get(token, 200)


def test_a_release_answers_alike(app: FastAPI, client: TestClient) -> None:
    price(client, model="model-d")
    for rid in ("d-rel", "d/rel 2", "d%rel"):
        held = client.post("/v1/authorizations", json={**AUTH, "request_id": rid}).json()
        assert held["decision"] == "allow"
    # The fast route releases the hold; the framework's route answers for it released.
    for path in (
        "/v1/authorizations/d-rel",
        "/v1/authorizations/d/rel 2",
        "/v1/authorizations/d%25rel",
    ):
        fast, routed = _both(app, client, "DELETE", path)
        assert fast == routed and fast[0] == 200 and fast[1]["state"] == "released"
    assert fast[1]["request_id"] == "d%rel"
    for path in ("/v1/authorizations/unknown", "/v1/authorizations/", "/v1/authorizations"):
        fast, routed = _both(app, client, "DELETE", path)
        assert fast == routed and fast[0] in (404, 405)
    # Released: its spend no longer holds the estimate (the hold stopped counting).
    assert client.delete("/v1/authorizations/d-rel").json()["state"] == "released"


def test_the_release_guard_answers_alike(app: FastAPI, client: TestClient) -> None:
    now = datetime.now(UTC)
    with write_transaction(app.state.billing.sessions) as session:
        reader, _ = create_token(session, "read", "reader", now)
        ingest, _ = create_token(session, "ingest", "gateway", now)
    for token in (None, "nope", reader, ingest):
        headers = {} if token is None else {"authorization": f"Bearer {token}"}
        fast, routed = _both(app, client, "DELETE", "/v1/authorizations/d-none", headers=headers)
        assert fast == routed and fast[0] == {None: 401, "nope": 401, reader: 403}.get(token, 404)
