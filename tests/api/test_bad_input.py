"""Input that a database would refuse is a 4xx naming the field, never a 500, and changes nothing
stored: NUL characters (PostgreSQL text cannot hold them) anywhere in a query string, a path or
an event's strings."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient

from billing.server.app import create_app
from billing.settings import Settings
from tests.conftest import LiveServer

STARTED: dict[str, Any] = {
    "event_id": "nul-1",
    "request_id": "nul-call",
    "type": "stream.started",
    "occurred_at": "2026-11-01T10:00:00Z",
    "api_key_id": "key_nul",
    "model": "claude-sonnet-4",
    "protocol": "anthropic.messages",
}


@pytest.mark.parametrize(
    "url",
    [
        "/v1/prices?model=%00",
        "/v1/prices?model=gpt%00x",
        "/v1/calls?api_key_id=%00",
        "/v1/calls/nul%00call",
        "/v1/usage?since=2026-11-01T00:00:00Z&until=2026-11-02T00:00:00Z&model=%00",
        "/v1/exports/calls.csv?since=2026-11-01T00:00:00Z&until=2026-11-02T00:00:00Z&x=%00",
    ],
)
def test_nul_in_a_query_or_path_is_a_422(client: TestClient, url: str) -> None:
    assert client.post("/v1/events", json={"events": [STARTED]}).status_code == 200
    reply = client.get(url)
    assert reply.status_code == 422, reply.text
    [error] = reply.json()["errors"]
    assert error["path"] in ("query", "path") and "NUL" in error["message"]
    # Nothing stored changed: the call is still there, as it was.
    assert client.get("/v1/calls/nul-call").json()["request_id"] == "nul-call"


@pytest.mark.parametrize(
    "event",
    [
        {**STARTED, "event_id": "nul-2", "metadata": {"team": "a\u0000b"}},
        {**STARTED, "event_id": "nul-3", "metadata": {"a\u0000": "b"}},
        {**STARTED, "event_id": "nul-4", "request_id": "nul\u0000call"},
        {
            "event_id": "nul-5",
            "request_id": "nul-call",
            "type": "stream.error",
            "occurred_at": "2026-11-01T10:00:01Z",
            "error_type": "overloaded",
            "message": "upstream said \u0000",
        },
    ],
)
def test_nul_in_an_event_is_never_a_500(client: TestClient, event: dict[str, Any]) -> None:
    reply = client.post("/v1/events", json={"events": [event]})
    assert reply.status_code in (200, 422), reply.text
    if reply.status_code == 422:
        assert reply.json()["errors"][0]["index"] == 0
    # Reading it back and reconciling work too.
    assert client.post("/v1/reconcile", json={}).status_code == 200
    assert client.get("/v1/calls").status_code == 200


@pytest.mark.parametrize(
    "request_id",
    ["req/with/slashes", "req?with#odd%2Fchars", "/leading", "trailing/", "ünï-çødé/ß", "a b"],
)
def test_any_stored_request_id_can_be_fetched(http: httpx.Client, request_id: str) -> None:
    """Ids are free text (CONTRACT "Ingest": 1–128 characters): a call is fetched back by its id
    percent-encoded as one path segment, slashes included (through a real server: the test
    client decodes a path twice)."""
    event = {**STARTED, "event_id": f"e-{request_id}", "request_id": request_id}
    assert http.post("/v1/events", json={"events": [event]}).status_code == 200
    reply = http.get(f"/v1/calls/{quote(request_id, safe='')}")
    assert reply.status_code == 200, reply.text
    assert reply.json()["request_id"] == request_id
    missing = http.get(f"/v1/calls/{quote(request_id + '/x', safe='')}")
    assert missing.status_code == 404 and "request_id" in missing.json()["error"]


@pytest.mark.parametrize("field", ["event_id", "request_id", "api_key_id", "model"])
def test_a_blank_id_is_a_422_naming_it(client: TestClient, field: str) -> None:
    reply = client.post("/v1/events", json={"events": [{**STARTED, field: "   "}]})
    assert reply.status_code == 422, reply.text
    [error] = reply.json()["errors"]
    assert error["path"] == f"events[0].{field}" and "blank" in error["message"]


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("event_id", "e\x001"),
        ("request_id", "req\n1"),
        ("api_key_id", "key\u200b1"),  # a zero-width space: Unicode "Other, format"
        ("model", "gpt\u2028x"),  # a line separator
    ],
)
def test_an_id_with_a_character_that_is_not_printable_is_a_422_naming_it(
    client: TestClient, field: str, text: str
) -> None:
    """Ids are printable text (``str.isprintable``: no Unicode "Other" or "Separator" character
    but the space): the 422 names the field and the reason, and nothing is stored."""
    reply = client.post("/v1/events", json={"events": [{**STARTED, field: text}]})
    assert reply.status_code == 422, reply.text
    [error] = reply.json()["errors"]
    assert error["path"] == f"events[0].{field}"
    assert error["message"] == "must be printable text (no control characters)"
    assert client.get("/v1/calls").json()["data"] == []


@pytest.mark.parametrize("text", ["a b", "ünï-çødé", "名前", "e\u0301", "😀", "x"])
def test_printable_ids_with_spaces_or_any_script_are_accepted(
    client: TestClient, text: str
) -> None:
    event = {**STARTED, "event_id": f"e-{text}", "request_id": text, "model": text}
    reply = client.post("/v1/events", json={"events": [event]})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 1, "duplicates": 0}
    call = client.get(f"/v1/calls/{quote(text, safe='')}").json()
    assert (call["request_id"], call["model"]) == (text, text)
    assert [e["event_id"] for e in call["events"]] == [f"e-{text}"]


def _raw_post(port: int, head: bytes, body: bytes) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(head + body)
    return conn


@pytest.mark.slow
def test_a_body_that_never_arrives_in_full_is_a_408_and_a_hang_up_is_quiet(db_url: str) -> None:
    """A client that declares 100 bytes and sends 4 gets a 408 after ``body_timeout_s``, not a
    connection held for ever; one that hangs up mid-body leaves no error in the log; nothing is
    stored by either."""
    app = create_app(Settings(database_url=db_url, body_timeout_s=1.0))
    head = (
        b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    with LiveServer(app) as server:
        # uvicorn's loggers do not propagate to the root logger: listen to them directly.
        logging.getLogger("uvicorn.error").addHandler(handler)
        started = time.monotonic()
        conn = _raw_post(server.port, head, b'{"ev')
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        conn.close()
        waited = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"did not arrive in full within 1 s (4 bytes received of the 100 declared)" in answer
        assert 0.9 <= waited < 5
        hung_up = _raw_post(server.port, head, b'{"ev')
        time.sleep(0.2)
        hung_up.close()
        time.sleep(0.5)
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/v1/calls").json()["data"] == []
    logging.getLogger("uvicorn.error").removeHandler(handler)
    assert not errors, [r.getMessage() for r in errors]
