"""Issue 29, the request limits that need no server process (``billing.api.limits``): the
open mode closed to browsers, the 422's length, gzip batches, authentication before the body,
metadata text, secrets refused as ids; on the configured database (SQLite or PostgreSQL)."""

from __future__ import annotations

import gzip
import json
import secrets as random_secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from bench.attack import hold_connections, read_some, status_of
from billing.auth.tokens import create_token
from billing.cli.serve import uvicorn_options
from billing.errors import MAX_LISTED_ERRORS, ValidationFailed
from billing.ingest.validation import MAX_BODY_BYTES, parse_batch
from billing.secret_ids import canonical, looks_like_secret
from billing.server.app import create_app
from billing.settings import get_settings
from billing.storage.db import write_transaction
from billing.storage.models import Call, Event
from tests.builders import started

JSON = {"Content-Type": "application/json"}


def _events(app: FastAPI) -> int:
    with app.state.billing.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Event)) or 0)


def _admin(app: FastAPI, role: str = "admin") -> str:
    with write_transaction(app.state.billing.sessions) as session:
        secret, _ = create_token(session, role, f"limits-{role}", datetime.now(UTC))
    return secret


# -- the open mode is closed to browsers --------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "path"),
    [
        ("text/plain", "/v1/events"),
        ("application/x-www-form-urlencoded", "/v1/events"),
        ("multipart/form-data; boundary=x", "/v1/events"),
        (None, "/v1/events"),
        ("text/plain", "/v1/reconcile"),
        (None, "/v1/reconcile"),
        ("application/jsonx", "/v1/prices"),
    ],
)
def test_a_post_that_is_not_json_is_415_and_stores_nothing(
    client: TestClient, app: FastAPI, content_type: str | None, path: str
) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = orjson.dumps({"events": [started("ct-1")]})
    response = client.post(path, content=body, headers=headers)
    assert response.status_code == 415, response.text
    assert "Content-Type: application/json" in response.json()["error"]
    assert _events(app) == 0


def test_a_post_without_a_body_is_415_and_says_to_send_an_empty_object(
    client: TestClient,
) -> None:
    """``curl -X POST …/void`` sends no body and no type: still 415 (a web page can make a
    browser send such a post anywhere, without a preflight), saying what to send."""
    grant = {"grant_id": "g-void", "api_key_id": "k1", "amount_usd": "5", "kind": "purchased"}
    assert client.post("/v1/credits/grants", json=grant).status_code == 201
    refused = client.post("/v1/credits/grants/g-void/void")
    assert refused.status_code == 415, refused.text
    assert refused.json()["error"] == (
        "a POST body must be sent with Content-Type: application/json (none was given), even "
        "where the endpoint takes none: send `{}`"
    )
    assert (
        client.get("/v1/credits/balance", params={"api_key_id": "k1"}).json()["balance_usd"] == "5"
    )
    voided = client.post("/v1/credits/grants/g-void/void", json={})
    assert (voided.status_code, voided.json()["state"]) == (200, "voided")


def test_json_with_a_charset_is_json(client: TestClient, app: FastAPI) -> None:
    body = orjson.dumps({"events": [started("ct-2")]})
    headers = {"Content-Type": "Application/JSON; charset=utf-8"}
    response = client.post("/v1/events", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": 1, "duplicates": 0}


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "0.0.0.0"]
)
@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/calls"), ("POST", "/v1/events"), ("GET", "/healthz")]
)
def test_open_mode_serves_loopback_host_names_only(
    client: TestClient, app: FastAPI, host: str, method: str, path: str
) -> None:
    response = client.request(
        method, path, json={"events": [started("h-1")]}, headers={"Host": host}
    )
    assert response.status_code == 400, response.text
    assert f"Host {host!r} is not served in open mode" in response.json()["error"]
    assert _events(app) == 0


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:9", "[::1]", "[::1]:8000"]
)
def test_open_mode_serves_loopback_names(client: TestClient, host: str) -> None:
    response = client.post("/v1/events", json={"events": [started("h-2")]}, headers={"Host": host})
    assert response.status_code == 200, response.text


def test_once_a_token_exists_any_host_is_served(client: TestClient, app: FastAPI) -> None:
    token = _admin(app)
    app.state.tokens._count = None  # the mode is cached: ask the database again
    headers = {"Host": "billing.internal:8000", "Authorization": f"Bearer {token}"}
    assert client.get("/v1/calls", headers=headers).status_code == 200
    assert client.get("/v1/calls", headers={"Host": "billing.internal"}).status_code == 401


# -- authentication and size before the body ----------------------------------------------------


def test_without_a_token_a_body_is_refused_before_it_is_read(
    client: TestClient, app: FastAPI
) -> None:
    _admin(app)
    big = b"[" + b" " * (200 * 1024) + b"]"
    response = client.post("/v1/prices", content=big, headers=JSON)
    assert response.status_code == 401
    assert response.headers["connection"] == "close"
    assert response.headers["www-authenticate"] == "Bearer"
    response = client.post("/v1/events", content=big, headers=JSON)
    assert response.status_code == 401


def test_a_body_over_the_routes_limit_is_413(client: TestClient, app: FastAPI) -> None:
    token = _admin(app)
    headers = {**JSON, "Authorization": f"Bearer {token}"}
    limit = app.state.billing.settings.max_body_bytes
    response = client.post("/v1/prices", content=b" " * (limit + 1), headers=headers)
    assert response.status_code == 413
    assert response.json() == {"error": f"request body is {limit + 1} bytes; the limit is {limit}"}
    assert response.headers["connection"] == "close"
    response = client.post("/v1/events", content=b" " * (MAX_BODY_BYTES + 1), headers=headers)
    assert response.status_code == 413
    # A chunked body without a Content-Length is cut off where it passes the limit.
    chunks = iter([b" " * 40_000] * 3)
    response = client.post("/v1/prices", content=chunks, headers=headers)
    assert response.status_code == 413
    assert response.json() == {"error": f"request body is over the limit of {limit} bytes"}


# -- a 422 lists at most 100 problems -----------------------------------------------------------


def test_a_422_lists_100_problems_and_how_many_more(client: TestClient, app: FastAPI) -> None:
    bad = [{**started(f"bad-{i}"), "attempt": 0, "model": ""} for i in range(1000)]
    body = orjson.dumps({"events": bad})
    with pytest.raises(ValidationFailed) as every:
        parse_batch(body, datetime.now(UTC))
    total = len(every.value.errors)
    assert total == 2000
    response = client.post("/v1/events", content=body, headers=JSON)
    assert response.status_code == 422
    answer = response.json()
    assert len(answer["errors"]) == MAX_LISTED_ERRORS == 100
    assert answer["more_errors"] == total - 100 == 1900
    assert answer["errors"][0] == {
        "index": 0,
        "path": "events[0].attempt",
        "message": "must be an integer ≥ 1 (attempts are numbered from 1)",
    }
    assert len(response.content) < 20_000
    assert _events(app) == 0


def test_a_short_422_has_no_count_of_more(client: TestClient) -> None:
    response = client.post("/v1/events", json={"events": [{**started("b-1"), "attempt": 0}]})
    assert response.status_code == 422
    assert set(response.json()) == {"errors"}


def test_posts_that_miss_the_token_cache_together_look_the_token_up_once(
    client: TestClient, app: FastAPI
) -> None:
    """Posts whose token's cached answer is missing (or expired) while it is being looked up
    wait for that one lookup instead of each asking the database."""
    token = _admin(app, "ingest")
    lookups: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "api_tokens.token_hash =" in statement:
            lookups.append(statement)

    headers = {**JSON, "Authorization": f"Bearer {token}"}
    bodies = [orjson.dumps({"events": [started(f"one-{i}", f"one-r{i}")]}) for i in range(24)]
    engine = app.state.billing.engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        with ThreadPoolExecutor(len(bodies)) as pool:
            statuses = list(
                pool.map(
                    lambda body: client.post("/v1/events", content=body, headers=headers),
                    bodies,
                )
            )
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert [r.status_code for r in statuses] == [200] * len(bodies)
    assert _events(app) == len(bodies)
    assert len(lookups) == 1


# -- gzip batches -------------------------------------------------------------------------------

GZIP = {**JSON, "Content-Encoding": "gzip"}


def test_a_gzip_batch_is_stored(client: TestClient, app: FastAPI) -> None:
    events = [started(f"gz-{i}", f"gz-r{i}", metadata={"team": "search"}) for i in range(500)]
    body = orjson.dumps({"events": events})
    response = client.post("/v1/events", content=gzip.compress(body), headers=GZIP)
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": 500, "duplicates": 0}
    assert _events(app) == 500
    # The same events uncompressed are the same events: duplicates.
    again = client.post("/v1/events", content=body, headers=JSON)
    assert again.json() == {"accepted": 0, "duplicates": 500}


def test_a_gzip_batch_over_1_mib_inflated_is_413(client: TestClient, app: FastAPI) -> None:
    noise = {f"k{j}": random_secrets.token_hex(50) for j in range(8)}
    events = [started(f"big-{i}", f"big-r{i}", metadata=noise) for i in range(1000)]
    body = orjson.dumps({"events": events})
    assert len(body) > MAX_BODY_BYTES
    packed = gzip.compress(body)
    assert len(packed) < MAX_BODY_BYTES and len(body) < 100 * len(packed)
    response = client.post("/v1/events", content=packed, headers=GZIP)
    assert response.status_code == 413
    assert response.json() == {
        "error": f"the gzip body inflates to more than the limit of {MAX_BODY_BYTES} bytes"
    }
    assert _events(app) == 0


def test_a_gzip_bomb_is_413_by_its_ratio(client: TestClient, app: FastAPI) -> None:
    packed = gzip.compress(b" " * (2 * 1024 * 1024))  # 2 KiB: 100 times that is under 1 MiB
    response = client.post("/v1/events", content=packed, headers=GZIP)
    assert response.status_code == 413
    assert response.json() == {
        "error": f"the gzip body inflates to more than 100 times its {len(packed)} bytes; "
        "send it uncompressed"
    }


@pytest.mark.parametrize(
    "body",
    [
        b'{"events": []}',
        gzip.compress(b'{"events": []}')[:-6],
        gzip.compress(b'{"events": []}') + b"junk",
    ],
    ids=["not gzip", "truncated", "data after the end"],
)
def test_bad_gzip_is_400(client: TestClient, app: FastAPI, body: bytes) -> None:
    response = client.post("/v1/events", content=body, headers=GZIP)
    assert response.status_code == 400, response.text
    assert "gzip" in response.json()["error"]
    assert _events(app) == 0


def test_an_encoding_other_routes_do_not_take_is_415(client: TestClient) -> None:
    price = gzip.compress(b"{}")
    response = client.post("/v1/prices", content=price, headers=GZIP)
    assert response.status_code == 415
    assert response.json() == {
        "error": "Content-Encoding 'gzip' is not taken here (identity only); send the body as is"
    }
    headers = {**JSON, "Content-Encoding": "br"}
    response = client.post("/v1/events", content=b"{}", headers=headers)
    assert response.status_code == 415
    assert "(identity or gzip)" in response.json()["error"]


# -- metadata is text like every other field ----------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "path"),
    [
        ({"a\x00": "x"}, "events[0].metadata.a\x00"),
        ({"\x1b[31m": "x"}, "events[0].metadata.\x1b[31m"),
        ({"  ": "x"}, "events[0].metadata.  "),
        ({"team": "a\x00b"}, "events[0].metadata.team"),
        ({"team": "line\nbreak"}, "events[0].metadata.team"),
        ({"team": "\x7f"}, "events[0].metadata.team"),
        ({"team": "a\u2028b"}, "events[0].metadata.team"),
    ],
)
def test_control_characters_in_metadata_are_422(
    client: TestClient, app: FastAPI, metadata: dict[str, str], path: str
) -> None:
    body = orjson.dumps({"events": [started("md-1", metadata=metadata)]})
    response = client.post("/v1/events", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["path"] == path
    assert "printable" in error["message"] or "blank" in error["message"]
    assert _events(app) == 0


def test_printable_metadata_is_stored_as_sent(client: TestClient, app: FastAPI) -> None:
    metadata = {"team": "café ☕", "empty": "", "space": " ", "ключ": "значение"}
    assert (
        client.post("/v1/events", json={"events": [started("md-2", metadata=metadata)]}).status_code
        == 200
    )
    with app.state.billing.sessions() as session:
        call = session.scalars(select(Call)).one()
    assert call.metadata_ == metadata


# -- secrets are refused as ids -----------------------------------------------------------------

SECRETS = [
    "sk-abc123",
    "sk-proj-Abc123def456",
    "sk-ant-api03-xyz",
    "sk_live_51H8abc",
    "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "rk_live_51H8abc",
    "gsk_abc123def456",
    "xai-abc123def456",
    "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
    "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "github_pat_11ABCDEFG0123456789_abcdef",
    "AKIAIOSFODNN7EXAMPLE",
    "bt_" + "x" * 43,
    "SK-PROJ-UPPERCASE",  # case folded
    "  sk-ant-padded  ",  # trimmed
    "Bearer sk-ant-api03-xyz",  # the header's scheme pasted along
    "bearer: gsk_abc",
    "key:sk-proj-abc",
    "Key: AKIAIOSFODNN7EXAMPLE",
    "api_key=xai-abc",
    '"sk-quoted"',
    "ｓｋ－ｐｒｏｊ－fullwidth",  # NFKC folds full-width forms
    "ＡＫＩＡＩＯＳＦＯＤＮＮ７ＥＸＡＭＰＬＥ",
    "ǅ" + "sk-",  # not a secret: a letter before the prefix (checked below)
]


@pytest.mark.parametrize("key", [k for k in SECRETS if not k.startswith("ǅ")])
def test_a_secret_as_api_key_id_is_refused(client: TestClient, app: FastAPI, key: str) -> None:
    assert looks_like_secret(key), canonical(key)
    body = orjson.dumps({"events": [started("sec-1", key=key)]})
    response = client.post("/v1/events", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["path"] == "events[0].api_key_id"
    assert "public id" in error["message"]
    assert _events(app) == 0


@pytest.mark.parametrize(
    "key",
    [
        "key_7f3a",
        "aizawa-team",
        "skeleton",
        "sky-1",
        "akiapolaau",
        "bt_team",
        "xai",
        "ǅsk-",
        "tok_3f9a",
    ],
)
def test_a_public_id_is_accepted(client: TestClient, key: str) -> None:
    assert not looks_like_secret(key)
    response = client.post("/v1/events", json={"events": [started("pub-1", key=key)]})
    assert response.status_code == 200, response.text


def test_this_services_own_token_is_a_secret(app: FastAPI) -> None:
    token = _admin(app)
    assert looks_like_secret(token) and looks_like_secret(f"Bearer {token}")


def _json(response: Any) -> Any:
    return json.loads(response.text)


def test_the_console_forms_take_form_bodies_only_and_within_their_limit(
    client: TestClient,
) -> None:
    """The sign-in form: a JSON body is 415, a body over 4 KiB is 413 before it is read, and a
    form body passes to the console (401: an unknown token)."""
    from billing.console.routes import MAX_FORM_BYTES

    assert client.post("/console/sign-in", json={"token": "x"}).status_code == 415
    big = {"token": "x" * MAX_FORM_BYTES}
    assert client.post("/console/sign-in", data=big).status_code == 413
    answer = client.post("/console/sign-in", data={"token": "bt_unknown"})
    assert answer.status_code == 401 and "unknown or revoked" in answer.text


# -- connection deadlines -------------------------------------------------------------------------


def test_idle_and_half_sent_connections_are_closed_in_process(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``billing serve``'s connection deadlines (its protocol and keep-alive, from
    ``uvicorn_options``) on a server in this process, with deadlines of 0.5 s: an idle connection
    is closed, half a request line is 408, so is half a body, a kept-alive connection idle
    after its answer is closed. tests/system/test_hardening.py holds 200 connections against a
    real ``billing serve`` (slow)."""
    monkeypatch.setenv("BILLING_DATABASE_URL", db_url)
    monkeypatch.setenv("BILLING_HEADER_TIMEOUT_S", "0.5")
    monkeypatch.setenv("BILLING_BODY_TIMEOUT_S", "0.5")
    monkeypatch.setenv("BILLING_KEEP_ALIVE_S", "0.5")
    get_settings.cache_clear()
    try:
        settings = get_settings()
        options = uvicorn_options(
            settings.log_level, settings.keep_alive_s, settings.max_header_bytes
        )
        options["log_config"] = None  # the test process keeps its own logging
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, **options)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while not server.started:
                assert time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            assert hold_connections(port, idle=3, half=3, hold_s=1.2) == {
                "idle closed": 3,
                "half answered 408": 3,
            }
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(
                    b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"events"'
                )
                started_at = time.monotonic()
                answer = read_some(sock)
                assert status_of(answer) == 408, answer
                assert 0.4 < time.monotonic() - started_at < 3
                assert b"did not arrive in full within 0.5 s" in answer
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert status_of(read_some(sock)) == 200
                started_at = time.monotonic()
                assert sock.recv(1) == b""
                assert time.monotonic() - started_at < 3
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    finally:
        get_settings.cache_clear()
