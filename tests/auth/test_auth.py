"""Who may do what (CONTRACT "Who may do what"): the whole matrix of endpoints × credentials."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from billing.auth.tokens import ROLES, create_token, revoke_token
from billing.cli.serve import _cannot_listen
from billing.storage.db import write_transaction
from tests.conftest import _free_port

EVENT = {
    "event_id": "auth-e1",
    "request_id": "auth-r1",
    "type": "stream.started",
    "occurred_at": "2026-10-15T08:00:00Z",
    "api_key_id": "key_auth",
    "model": "m-auth",
    "protocol": "openai.responses",
}
PRICE = {
    "model": "m-auth",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "1",
    "output_usd_per_mtok": "2",
    "cache_read_usd_per_mtok": "0.1",
    "cache_creation_usd_per_mtok": "0",
}
EMPTY_PAGE = {"object": "page", "data": [], "has_more": False, "next_page": None}
PLAN_TIME = {"effective_from": "2026-01-01T00:00:00Z"}
PERIOD = {"since": "2026-10-01T00:00:00Z", "until": "2026-11-01T00:00:00Z"}

#: A valid request for every guarded endpoint, and the roles (besides admin) allowed to call it.
BUDGET = {
    "budget_id": "auth-b",
    "scope": {"api_key_id": "key_auth"},
    "limit_usd": "1",
    "period": "month",
}
EXAMPLES: dict[tuple[str, str], tuple[dict[str, Any], set[str]]] = {
    ("POST", "/v1/events"): ({"json": {"events": [EVENT]}}, {"ingest"}),
    ("POST", "/v1/prices"): ({"json": PRICE}, set()),
    ("GET", "/v1/prices"): ({}, {"read"}),
    ("POST", "/v1/reconcile"): ({"json": {}}, set()),
    ("GET", "/v1/tokens"): ({}, set()),
    ("POST", "/v1/tokens"): ({"json": {"role": "read"}}, set()),
    ("DELETE", "/v1/tokens/{token_id}"): ({"path": "/v1/tokens/TOKEN"}, set()),
    ("GET", "/v1/calls"): ({}, {"read"}),
    ("GET", "/v1/calls/{request_id:path}"): ({"path": "/v1/calls/auth-r1"}, {"read"}),
    ("GET", "/v1/usage"): ({"params": PERIOD}, {"read", "export"}),
    ("GET", "/v1/exports/usage.csv"): ({"params": PERIOD}, {"export"}),
    ("GET", "/v1/exports/calls.csv"): ({"params": PERIOD}, {"export"}),
    ("GET", "/v1/exports/focus.csv"): ({"params": {"period": "2026-10"}}, {"export"}),
    ("POST", "/v1/provider-reports"): (
        {"json": {"provider": "openai", "kind": "usage", "report": EMPTY_PAGE}},
        set(),
    ),
    ("GET", "/v1/drift"): ({"params": PERIOD}, {"read", "export"}),
    ("GET", "/v1/drift/calls"): ({"params": PERIOD}, {"read", "export"}),
    ("GET", "/v1/exports/drift.csv"): ({"params": PERIOD}, {"read", "export"}),
    ("GET", "/v1/schema/events.json"): ({}, {"ingest", "read", "export"}),
    ("POST", "/v1/plans"): ({"json": {"plan_id": "auth-plan", **PLAN_TIME}}, set()),
    ("GET", "/v1/plans"): ({}, {"read", "export"}),
    ("PUT", "/v1/keys/{api_key_id:path}"): (
        {"path": "/v1/keys/key_auth", "json": {"customer_id": "acme"}},
        set(),
    ),
    ("GET", "/v1/keys"): ({}, {"read", "export"}),
    ("GET", "/v1/keys/{api_key_id:path}"): ({"path": "/v1/keys/key_auth"}, {"read", "export"}),
    ("POST", "/v1/budgets"): ({"json": BUDGET}, set()),
    ("PUT", "/v1/budgets/{budget_id:path}"): (
        {
            "path": "/v1/budgets/auth-b",
            "json": {k: v for k, v in BUDGET.items() if k != "budget_id"},
        },
        set(),
    ),
    ("GET", "/v1/budgets"): ({}, {"read"}),
    ("GET", "/v1/budgets/{budget_id:path}"): ({"path": "/v1/budgets/auth-b"}, {"read"}),
    ("GET", "/v1/spend"): ({"params": {"api_key_id": "key_auth"}}, {"ingest", "read"}),
    ("GET", "/v1/alerts"): ({}, {"read"}),
    ("DELETE", "/v1/budgets/{budget_id:path}"): ({"path": "/v1/budgets/auth-b"}, set()),
    ("POST", "/v1/authorizations"): (
        {
            "json": {
                "request_id": "auth-h1",
                "api_key_id": "key_auth",
                "model": "m-auth",
                "estimate": {"amount_usd": "0.01"},
            }
        },
        {"ingest"},
    ),
    ("DELETE", "/v1/authorizations/{request_id:path}"): (
        {"path": "/v1/authorizations/auth-h1"},
        {"ingest"},
    ),
    ("PUT", "/v1/customers/{customer_id:path}"): (
        {"path": "/v1/customers/auth-c", "json": {"name": "Auth"}},
        set(),
    ),
    ("GET", "/v1/customers"): ({}, {"read"}),
    ("GET", "/v1/customers/{customer_id:path}"): ({"path": "/v1/customers/auth-c"}, {"read"}),
    ("POST", "/v1/credits/grants"): (
        {
            "json": {
                "grant_id": "auth-g",
                "customer_id": "auth-c",
                "amount_usd": "1",
                "kind": "purchased",
            }
        },
        set(),
    ),
    ("POST", "/v1/credits/grants/{grant_id:path}/void"): (
        {"path": "/v1/credits/grants/auth-g/void", "json": {}},
        set(),
    ),
    ("GET", "/v1/credits/balance"): ({"params": {"customer_id": "auth-c"}}, {"read", "ingest"}),
    ("GET", "/v1/exports/credits.csv"): ({"params": {"period": "2026-03"}}, {"export"}),
    ("GET", "/v1/exports/credits.manifest.json"): (
        {"params": {"period": "2026-03"}},
        {"export"},
    ),
}
OPEN = {"/healthz", "/readyz", "/metrics"}


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif hasattr(route, "original_router"):  # FastAPI's included routers
            found.extend(_api_routes(route.original_router.routes))
    return found


def _routes(app: FastAPI) -> list[tuple[str, str]]:
    found = []
    for route in _api_routes(app.routes):
        if route.path.startswith("/v1"):
            found.extend((method, route.path) for method in sorted(route.methods))
    return found


def _allowed(app: FastAPI, method: str, path: str) -> set[str]:
    for route in _api_routes(app.routes):
        if isinstance(route, APIRoute) and route.path == path and method in route.methods:
            for dependency in route.dependant.dependencies:
                roles = getattr(dependency.call, "allowed_roles", None)
                if roles is not None:
                    return set(roles)
    return set()


def test_every_endpoint_declares_its_roles(app: FastAPI) -> None:
    routes = _routes(app)
    assert ("POST", "/v1/events") in routes
    for method, path in routes:
        assert (method, path) in EXAMPLES, f"{method} {path} has no example in the access matrix"
        allowed = _allowed(app, method, path)
        assert allowed == EXAMPLES[(method, path)][1] | {"admin"}, (method, path, allowed)


@pytest.fixture
def tokens(app: FastAPI) -> dict[str, str]:
    state = app.state.billing
    made: dict[str, str] = {}
    now = datetime.now(UTC)
    with write_transaction(state.sessions) as session:
        for role in ROLES:
            made[role], _ = create_token(session, role, f"test-{role}", now)
        made["revoked"], info = create_token(session, "admin", "revoked", now)
        revoke_token(session, info.id, now)
        # The token that DELETE /v1/tokens/{token_id} revokes in the matrix (idempotent).
        _, victim = create_token(session, "read", "victim", now)
    _VICTIM[0] = victim.id
    return made


_VICTIM = ["tok_none"]


def _call(client: TestClient, method: str, path: str, token: str | None) -> int:
    example, _ = EXAMPLES[(method, path)]
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    response = client.request(
        method,
        example.get("path", path).replace("TOKEN", _VICTIM[0]),
        json=example.get("json"),
        params=example.get("params"),
        headers=headers,
    )
    return response.status_code


def test_access_matrix(app: FastAPI, client: TestClient, tokens: dict[str, str]) -> None:
    # The call named in the examples exists, so that GET /v1/calls/{id} can answer 200.
    assert (
        client.post(
            "/v1/events",
            json={"events": [EVENT]},
            headers={"Authorization": f"Bearer {tokens['ingest']}"},
        ).status_code
        == 200
    )
    for method, path in _routes(app):
        _, allowed = EXAMPLES[(method, path)]
        allowed = allowed | {"admin"}
        assert _call(client, method, path, None) == 401, (method, path)
        assert _call(client, method, path, "bt_wrong") == 401, (method, path)
        assert _call(client, method, path, tokens["revoked"]) == 401, (method, path)
        for role in ROLES:
            status = _call(client, method, path, tokens[role])
            if role in allowed:
                assert 200 <= status < 300, (method, path, role, status)
            else:
                assert status == 403, (method, path, role, status)
    for path in OPEN:
        assert client.get(path).status_code == 200, path


def test_without_tokens_everything_is_open_on_loopback(client: TestClient) -> None:
    assert client.post("/v1/events", json={"events": [EVENT]}).json() == {
        "accepted": 1,
        "duplicates": 0,
    }
    assert client.post("/v1/reconcile", json={}).status_code == 200


def test_401_names_the_scheme(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.post("/v1/events", json={"events": [EVENT]})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "Authorization: Bearer" in response.json()["error"]


def _cli(args: list[str], db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from billing.cli import main; main()", *args],
        env={"BILLING_DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_tokens_cli_create_list_revoke(db_url: str, app: FastAPI, client: TestClient) -> None:
    created = _cli(["tokens", "create", "--role", "read", "--name", "ops"], db_url)
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("bt_") and "\n" not in secret
    token_id = created.stderr.split("created token ")[1].split()[0]
    listed = _cli(["tokens", "list"], db_url)
    assert token_id in listed.stdout and "read" in listed.stdout and secret not in listed.stdout
    headers = {"Authorization": f"Bearer {secret}"}
    assert client.get("/v1/prices", headers=headers).status_code == 200
    assert client.post("/v1/reconcile", json={}, headers=headers).status_code == 403
    assert _cli(["tokens", "revoke", token_id], db_url).returncode == 0
    app.state.tokens._roles.clear()  # the guard caches answers for 2 s
    assert client.get("/v1/prices", headers=headers).status_code == 401
    bad = _cli(["tokens", "create", "--role", "root"], db_url)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_serve_refuses_public_interface_without_tokens(db_url: str) -> None:
    port = _free_port("0.0.0.0")  # free: the refusal, not the port check, must stop it
    result = _cli(["serve", "--host", "0.0.0.0", "--port", str(port)], db_url)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "billing: refusing to listen on 0.0.0.0 without API tokens: create one with "
        "`billing tokens create --role admin`, or listen on 127.0.0.1"
    ]


@pytest.mark.parametrize("key", ["sk-proj-abc123", "sk-ant-api03-xyz", "k" * 129])
def test_secret_looking_api_key_id_is_refused(client: TestClient, key: str) -> None:
    event = {**EVENT, "api_key_id": key}
    response = client.post("/v1/events", json={"events": [event]})
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["path"] == "events[0].api_key_id"
    assert "public id" in error["message"]


def test_sql_is_parameterised(client: TestClient) -> None:
    key = "'; DROP TABLE calls; --"
    event = {**EVENT, "api_key_id": key}
    assert client.post("/v1/events", json={"events": [event]}).status_code == 200
    assert client.post("/v1/reconcile", json={}).status_code == 200
    call = client.get("/v1/calls/auth-r1").json()
    assert call["api_key_id"] == key


@pytest.mark.slow
def test_serve_says_in_one_line_that_its_port_is_taken(db_url: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _cli(["serve", "--port", str(port)], db_url)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"billing: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another server holds the port? choose another with --port)"
    ]


@pytest.mark.slow
def test_serve_names_an_ipv6_address_in_brackets_and_takes_it_either_way(db_url: str) -> None:
    try:
        holder = socket.socket(socket.AF_INET6)
        holder.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with holder:
        holder.listen()
        port = holder.getsockname()[1]
        for host in ("::1", "[::1]"):
            result = _cli(["serve", "--host", host, "--port", str(port)], db_url)
            assert result.returncode == 1
            assert result.stderr.strip().splitlines() == [
                f"billing: cannot listen on [::1]:{port}: Address already in use "
                "(another server holds the port? choose another with --port)"
            ]


@pytest.mark.slow
def test_serve_says_a_host_it_cannot_resolve_or_a_port_out_of_range(db_url: str) -> None:
    reason = _cannot_listen("no-such-host.invalid", 8000)
    assert reason is not None
    assert reason.startswith(
        "cannot listen on no-such-host.invalid:8000: cannot resolve 'no-such-host.invalid' ("
    )
    for port in ("0", "65536", "99999999999999999999"):
        result = _cli(["serve", "--port", port], db_url)
        assert result.returncode == 2, result.stderr
        assert "Invalid value for '--port'" in result.stderr
        assert "Traceback" not in result.stderr


def test_serve_checks_the_wildcard_ipv6_address_as_its_workers_bind_it() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        # One worker: asyncio binds "::" to IPv6 only, so an IPv4 holder is no conflict; more
        # workers: uvicorn binds one socket that takes IPv4 as well.
        assert _cannot_listen("::", port) is None
        assert _cannot_listen("::", port, dual_stack=True) == (
            f"cannot listen on [::]:{port}: Address already in use "
            "(another server holds the port? choose another with --port)"
        )
