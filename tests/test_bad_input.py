"""Input that a database would refuse is a 4xx naming the field, never a 500, and changes nothing
stored: NUL characters (PostgreSQL text cannot hold them) anywhere in a query string, a path or
an event's strings."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

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
    assert client.post("/v1/reconcile").status_code == 200
    assert client.get("/v1/calls").status_code == 200
