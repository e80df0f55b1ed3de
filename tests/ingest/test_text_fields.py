"""Issue 44: one text rule (``billing.fields.no_control``) for every free-text field: NUL,
CR/LF, ESC, U+2028, a direction override, a zero-width space and a BOM are each a 422 in the
shared shape wherever a client sends text (a failure's message, metadata, a token's and a key's
name, a budget's webhook URL), nothing stored; the text that passes keeps every stored event
readable as ``jsonb`` on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from billing.taps.fields import normalize_error
from tests.builders import post

HOSTILE = ["\x00", "\r", "\n", "\x1b", "\u2028", "\u202e", "\u200b", "\ufeff"]


def _failed(message: str, rid: str = "r-1") -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"{rid}-s",
            "request_id": rid,
            "type": "stream.started",
            "occurred_at": "2026-03-01T10:00:00Z",
            "api_key_id": "key_1",
            "model": "m",
            "protocol": "openai.chat_completions",
            "metadata": {"team": f"a{message}b" if message in HOSTILE else "ok"},
        },
        {
            "event_id": f"{rid}-f",
            "request_id": rid,
            "type": "stream.failed",
            "occurred_at": "2026-03-01T10:00:01Z",
            "error_type": "api_error",
            "message": f"upstream said {message} here",
        },
    ]


@pytest.mark.parametrize("char", HOSTILE)
def test_a_hostile_character_is_refused_in_every_text_field(client: TestClient, char: str) -> None:
    response = post(client, _failed(char))
    assert response.status_code == 422, response.text
    paths = sorted(e["path"] for e in response.json()["errors"])
    assert paths == ["events[0].metadata.team", "events[1].message"], paths
    assert client.get("/v1/calls").json()["data"] == []
    for method, path, body, field in [
        ("post", "/v1/tokens", {"role": "read", "name": f"ci{char}"}, "body.name"),
        ("put", "/v1/keys/key_1", {"name": f"k{char}"}, "body.name"),
        (
            "post",
            "/v1/budgets",
            {
                "budget_id": "b",
                "scope": {"api_key_id": "key_1"},
                "limit_usd": "1",
                "period": "total",
                "webhook_url": f"https://hooks.example.com/{char}x",
            },
            "body.webhook_url",
        ),
    ]:
        answer = getattr(client, method)(path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        assert [e["path"] for e in answer.json()["errors"]] == [field], answer.text
    assert client.get("/v1/tokens").json()["data"] == []
    assert client.get("/v1/keys").json()["data"] == []
    assert client.get("/v1/budgets").json()["data"] == []


def test_the_text_that_passes_keeps_every_event_readable_as_jsonb(
    client: TestClient, is_postgres: bool
) -> None:
    odd = 'é ü 日本 🙂 "quoted" back\\slash \\u0000 literally'
    assert post(client, _failed(odd)).status_code == 200
    raw = b'{"events": [{"event_id": "r-2-f", "request_id": "r-2", "type": "stream.failed",'
    raw += b' "occurred_at": "2026-03-01T10:00:01Z", "error_type": "e",'
    raw += b' "message": "\\u00e9\\ud83d\\ude42\\u005c"}]}'
    response = client.post("/v1/events", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    if not is_postgres:
        return
    sessions = client.app.state.billing.sessions  # type: ignore[attr-defined]
    with sessions() as session:
        messages = session.execute(
            text("SELECT body::jsonb ->> 'message' FROM events WHERE type = 'stream.failed'")
        ).scalars()
        assert sorted(messages) == sorted([f"upstream said {odd} here", "é🙂\\"])


def test_our_senders_make_an_upstream_message_printable(client: TestClient) -> None:
    """An upstream's error text with line breaks and escapes (the taps' ``normalize_error``,
    which the gateway and the LiteLLM callback read) is sent with spaces in their place: the
    event is accepted, never refused for text the gateway did not write."""
    error = normalize_error({"type": "overloaded_error", "message": "busy\r\nretry\x1b[0m\u2028"})
    assert error["message"] == "busy  retry [0m "
    event = {
        "event_id": "r-3-f",
        "request_id": "r-3",
        "type": "stream.failed",
        "occurred_at": "2026-03-01T10:00:01Z",
        "error_type": error["type"],
        "message": error["message"],
    }
    assert post(client, [event]).status_code == 200
