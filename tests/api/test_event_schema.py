"""``GET /v1/schema/events.json``: the JSON Schema of the events (CONTRACT "Events"), checked
with a JSON Schema validator against events the service accepts and refuses."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from tests.builders import disconnect, failed, post, started, tokens, usage


@pytest.fixture
def schema(client: TestClient) -> dict[str, Any]:
    response = client.get("/v1/schema/events.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/schema+json"
    body: dict[str, Any] = response.json()
    return body


def test_the_schema_is_a_valid_draft_2020_12_schema(schema: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert set(schema["discriminator"]["mapping"]) == {
        "stream.started",
        "stream.tokens",
        "stream.client_disconnected",
        "stream.usage",
        "stream.failed",
    }
    defs = schema["$defs"]
    assert sorted(defs["StreamStarted"]["required"]) == sorted(
        ["event_id", "request_id", "type", "occurred_at", "api_key_id", "model", "protocol"]
    )
    assert defs["StreamStarted"]["properties"]["protocol"]["enum"] == [
        "openai.chat_completions",
        "openai.responses",
        "anthropic.messages",
    ]
    assert sorted(defs["StreamTokens"]["required"]) == sorted(
        ["event_id", "request_id", "type", "occurred_at", "output_tokens_generated",
         "output_tokens_delivered"]
    )  # fmt: skip
    assert defs["StreamUsage"]["properties"]["source"]["enum"] == ["upstream", "estimate"]
    assert defs["StreamTokens"]["additionalProperties"] is False


def test_what_the_service_accepts_the_schema_accepts(
    schema: dict[str, Any], client: TestClient
) -> None:
    events = [
        started("s1", "rs1", input_tokens=12, protocol="openai.chat_completions"),
        tokens("t1", 5, 4, rid="rs1", at=1),
        disconnect("d1", 4, 5, rid="rs1", at=2),
        usage("u1", 12, 9, rid="rs1", at=3, cache_read_input_tokens=2, stop_reason="length"),
        failed("f1", "overloaded_error", rid="rs1", at=4, gen=9),
    ]
    validator = Draft202012Validator(schema)
    for event in events:
        assert list(validator.iter_errors(event)) == [], event
    assert post(client, events).json() == {"accepted": 5, "duplicates": 0}


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"api_key_id": None}, "api_key_id"),  # a required field left out
        ({"protocol": "openai.completions"}, "protocol"),
        ({"input_tokens": -1}, "input_tokens"),
        ({"input_tokens": 1.5}, "input_tokens"),
        ({"colour": "blue"}, "colour"),  # unknown fields are refused
        ({"attempt": 0}, "attempt"),
        ({"type": "stream.paused"}, "type"),
    ],
)
def test_what_the_service_refuses_the_schema_refuses(
    schema: dict[str, Any], client: TestClient, change: dict[str, Any], path: str
) -> None:
    event = started("bad1", "rb1", protocol="openai.chat_completions")
    event.update(change)
    event = {k: v for k, v in event.items() if v is not None}
    assert not Draft202012Validator(schema).is_valid(event)
    response = post(client, [event])
    assert response.status_code == 422
    assert path in " ".join(e["path"] + " " + e["message"] for e in response.json()["errors"])
