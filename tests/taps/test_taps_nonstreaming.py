"""Non-streaming responses, hosted-tool units, cached input and the provider's cost at the tap.

CONTRACT "Non-streaming calls, hosted-tool fees, provider-reported cost (v3)". The bodies and
streams are written from the providers' documented shapes (OpenAI "The chat completion object",
"The response object" with ``web_search_call`` actions and ``file_search_call`` items;
Anthropic "Messages" with ``usage.server_tool_use``; OpenRouter "Usage Accounting" with
``usage.cost``; DeepSeek's ``prompt_cache_hit_tokens``), with figures of our own.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from billing.ingest.validation import parse_batch
from billing.taps import Tap, open_tap

pytestmark = pytest.mark.nodb


def body_tap(protocol: str, body: dict[str, Any] | str) -> Tap:
    tap = open_tap(protocol)
    tap.read_json((body if isinstance(body, str) else json.dumps(body)).encode())
    return tap


def stream_tap(protocol: str, events: list[dict[str, Any]]) -> Tap:
    tap = open_tap(protocol)
    for event in events:
        tap.feed(f"data: {json.dumps(event)}\n\n".encode())
    tap.close()
    return tap


def posted(tap: Tap) -> list[dict[str, Any]]:
    """The tap's closing events, validated by ingest as a gateway would post them."""
    now = datetime.now(UTC)
    events = [
        {"event_id": f"e{i}", "request_id": "r", "occurred_at": now.isoformat(), **payload}
        for i, payload in enumerate(tap.final_events())
    ]
    parse_batch(json.dumps({"events": events}).encode(), now)  # raises on any 422
    return tap.final_events()


# -- OpenAI Chat Completions ---------------------------------------------------------------------

CHAT_COMPLETION = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "The image shows a wooden boardwalk.",
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 1117,
        "completion_tokens": 46,
        "total_tokens": 1163,
        "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 12,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
    "service_tier": "default",
    "system_fingerprint": "fp_fc9f1d7035",
}


def test_a_chat_completion_is_one_upstream_usage() -> None:
    tap = body_tap("openai.chat_completions", CHAT_COMPLETION)
    assert posted(tap) == [
        {
            "type": "stream.usage",
            "input_tokens": 93,
            "output_tokens": 46,
            "cache_read_input_tokens": 1024,
            "cache_creation_input_tokens": 0,
            "reasoning_tokens": 12,
            "source": "upstream",
            "service_tier": "default",
            "model": "gpt-4o-2024-08-06",
            "stop_reason": "stop",
        }
    ]
    assert (tap.output_tokens, tap.closed, tap.events_seen) == (46, True, 1)


@pytest.mark.parametrize(
    ("cached", "expected"),
    [
        ({"prompt_tokens_details": {"cached_tokens": 600}}, 600),
        ({"cached_tokens": 700}, 700),  # top-level usage.cached_tokens
        ({"prompt_cache_hit_tokens": 800, "prompt_cache_miss_tokens": 200}, 800),  # DeepSeek
    ],
    ids=["prompt_tokens_details", "top-level", "prompt_cache_hit_tokens"],
)
def test_cached_input_is_read_from_every_documented_place(
    cached: dict[str, Any], expected: int
) -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020, **cached}
    body = {**CHAT_COMPLETION, "usage": usage}
    for tap in (
        body_tap("openai.chat_completions", body),
        stream_tap(
            "openai.chat_completions",
            [
                {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "Hi"}}]},
                {"object": "chat.completion.chunk", "choices": [], "usage": usage},
            ],
        ),
    ):
        usage_event = posted(tap)[0]
        assert (usage_event["input_tokens"], usage_event["cache_read_input_tokens"]) == (
            1000 - expected,
            expected,
        )
        assert usage_event["source"] == "upstream"


OPENROUTER_USAGE = {
    "completion_tokens": 2,
    "completion_tokens_details": {"reasoning_tokens": 0},
    "cost": 0.95,
    "cost_details": {"upstream_inference_cost": 19},
    "prompt_tokens": 194,
    "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 100, "audio_tokens": 0},
    "total_tokens": 196,
}


@pytest.mark.parametrize(
    ("cost_text", "expected"),
    [
        ("0.95", "0.95"),
        ("1234567.123456789012", "1234567.123456789012"),  # a float would keep 17 digits
        ("0.000140", "0.00014"),
        ("1.5e-05", "0.000015"),
        ("0", "0"),
        # Past the picodollar (a float's artefact): rounded half-even to 12 places.
        ("0.00016949999999999999", "0.0001695"),
        ("0.0000000000005", "0"),
        ("0.0000000000015", "0.000000000002"),
    ],
)
def test_openrouter_cost_is_the_provider_cost_exactly_from_the_json_text(
    cost_text: str, expected: str
) -> None:
    usage_text = json.dumps(OPENROUTER_USAGE).replace('"cost": 0.95', f'"cost": {cost_text}')
    body_text = json.dumps({**CHAT_COMPLETION, "usage": "U"}).replace('"U"', usage_text)
    tap = body_tap("openai.chat_completions", body_text)
    event = posted(tap)[0]
    assert event["provider_cost_usd"] == expected
    assert (event["input_tokens"], event["cache_creation_input_tokens"]) == (94, 100)
    chunk_text = '{"object": "chat.completion.chunk", "choices": [], "usage": ' + usage_text + "}"
    streamed = open_tap("openai.chat_completions")
    streamed.feed(f"data: {chunk_text}\n\ndata: [DONE]\n\n".encode())
    streamed.close()
    assert posted(streamed)[0]["provider_cost_usd"] == expected


@pytest.mark.parametrize("cost_text", ["-0.5", "1e30", '"0.95"', "null", "true"])
def test_a_cost_ingest_would_refuse_is_left_out_and_the_usage_kept(cost_text: str) -> None:
    usage_text = json.dumps(OPENROUTER_USAGE).replace('"cost": 0.95', f'"cost": {cost_text}')
    body_text = json.dumps({**CHAT_COMPLETION, "usage": "U"}).replace('"U"', usage_text)
    event = posted(body_tap("openai.chat_completions", body_text))[0]
    assert "provider_cost_usd" not in event
    assert (event["input_tokens"], event["output_tokens"], event["source"]) == (94, 2, "upstream")


def test_a_chat_completion_without_usage_is_an_estimate_of_its_pieces() -> None:
    body = {k: v for k, v in CHAT_COMPLETION.items() if k != "usage"}
    body["choices"] = [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}},
                ],
            },
            "finish_reason": "tool_calls",
        }
    ]
    assert posted(body_tap("openai.chat_completions", body))[0] == {
        "type": "stream.usage",
        "output_tokens": 1,
        "reasoning_tokens": 0,
        "source": "estimate",
        "service_tier": "default",
        "model": "gpt-4o-2024-08-06",
        "stop_reason": "tool_calls",
    }


def test_an_error_body_is_a_failed_attempt() -> None:
    error = {
        "error": {
            "message": "Rate limit reached for gpt-4o",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    events = posted(body_tap("openai.chat_completions", error))
    assert events[1] == {
        "type": "stream.failed",
        "error_type": "requests",
        "message": "Rate limit reached for gpt-4o",
        "output_tokens_generated": 0,
    }
    assert events[0]["source"] == "estimate"


def test_an_unreadable_body_is_one_malformed_event_and_read_only_once() -> None:
    tap = open_tap("openai.chat_completions")
    tap.read_json(b"<html>502 Bad Gateway</html>")
    tap.read_json(json.dumps(CHAT_COMPLETION).encode())  # closed: ignored
    assert (tap.malformed_events, tap.events_seen, tap.usage) == (1, 1, None)


# -- OpenAI Responses -----------------------------------------------------------------------------


def search_call(n: int, action: str | None, status: str = "completed") -> dict[str, Any]:
    item: dict[str, Any] = {"id": f"ws_{n}", "type": "web_search_call", "status": status}
    if action == "search":
        item["action"] = {"type": "search", "query": "weather in Paris"}
    elif action == "open_page":
        item["action"] = {"type": "open_page", "url": "https://example.com/"}
    elif action == "find_in_page":
        item["action"] = {"type": "find_in_page", "url": "https://example.com/", "pattern": "x"}
    return item


def file_search_call(n: int) -> dict[str, Any]:
    return {
        "id": f"fs_{n}",
        "type": "file_search_call",
        "status": "completed",
        "queries": ["What is deep research?"],
        "results": None,
    }


MESSAGE_ITEM = {
    "id": "msg_67ccd3acc8d48190a77525dc6de64b4104becb25c95c4a4a",
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
}

RESPONSE = {
    "id": "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c95c4a4a",
    "object": "response",
    "created_at": 1741476777,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "model": "gpt-4.1-2025-04-14",
    "output": [
        search_call(1, "search"),
        search_call(2, "open_page"),
        search_call(3, "find_in_page"),
        search_call(4, "search"),
        file_search_call(1),
        file_search_call(2),
        MESSAGE_ITEM,
    ],
    "service_tier": "default",
    "usage": {
        "input_tokens": 3000,
        "input_tokens_details": {"cached_tokens": 1000},
        "output_tokens": 200,
        "output_tokens_details": {"reasoning_tokens": 120},
        "total_tokens": 3200,
    },
}


def test_a_response_object_bills_searches_not_page_actions_and_file_search_calls() -> None:
    assert posted(body_tap("openai.responses", RESPONSE)) == [
        {
            "type": "stream.usage",
            "input_tokens": 2000,
            "output_tokens": 200,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 0,
            "reasoning_tokens": 120,
            "source": "upstream",
            "service_tier": "default",
            "units": {"web_search_requests": 2, "file_search_calls": 2},
            "model": "gpt-4.1-2025-04-14",
            "stop_reason": "completed",
        }
    ]


def test_a_streamed_page_action_is_free_once_its_action_is_known() -> None:
    def item(kind: str, n: int, action: str | None) -> dict[str, Any]:
        return {
            "type": f"response.output_item.{kind}",
            "output_index": n,
            "item": search_call(n, action, "in_progress" if kind == "added" else "completed"),
        }

    events = [
        item("added", 0, None),
        item("done", 0, "search"),
        item("added", 1, None),
        item("done", 1, "open_page"),
        item("added", 2, None),
        item("done", 2, "find_in_page"),
        {"type": "response.output_item.done", "output_index": 3, "item": file_search_call(1)},
    ]
    tap = stream_tap("openai.responses", events)
    assert tap.units == {"web_search_requests": 1, "file_search_calls": 1}
    completed = {
        "type": "response.completed",
        "response": {**RESPONSE, "output": [e["item"] for e in events[1::2]]},
    }
    tap = stream_tap("openai.responses", [*events, completed])
    assert posted(tap)[0]["units"] == {"web_search_requests": 1, "file_search_calls": 1}


def test_an_openrouter_response_cost_is_kept() -> None:
    usage_text = json.dumps(RESPONSE["usage"])[:-1] + ', "cost": 0.0012345678}'
    body_text = json.dumps({**RESPONSE, "usage": "U"}).replace('"U"', usage_text)
    assert posted(body_tap("openai.responses", body_text))[0]["provider_cost_usd"] == (
        "0.0012345678"
    )


def test_a_responses_error_body_is_a_failed_attempt() -> None:
    error = {"error": {"message": "Invalid model", "type": "invalid_request_error", "code": None}}
    assert posted(body_tap("openai.responses", error))[1]["error_type"] == "invalid_request_error"


# -- Anthropic Messages ---------------------------------------------------------------------------

MESSAGE = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {
            "type": "server_tool_use",
            "id": "srvtoolu_01",
            "name": "web_search",
            "input": {"query": "claude shannon birth date"},
        },
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": []},
        {
            "type": "server_tool_use",
            "id": "srvtoolu_02",
            "name": "web_fetch",
            "input": {"url": "https://example.com/article"},
        },
        {"type": "text", "text": "Claude Shannon was born on April 30, 1916."},
    ],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 2095,
        "cache_creation_input_tokens": 500,
        "cache_read_input_tokens": 1500,
        "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 300},
        "output_tokens": 503,
        "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 2},
        "service_tier": "standard",
        "inference_geo": "us",
    },
}


def test_a_message_bills_searches_and_counts_fetches_apart() -> None:
    assert posted(body_tap("anthropic.messages", MESSAGE)) == [
        {
            "type": "stream.usage",
            "input_tokens": 2095,
            "output_tokens": 503,
            "cache_read_input_tokens": 1500,
            "cache_creation_input_tokens": 500,
            "reasoning_tokens": 0,
            "cache_creation_1h_input_tokens": 300,
            "source": "upstream",
            "service_tier": "standard",
            "inference_geo": "us",
            "units": {"web_search_requests": 1},
            "counters": {"web_fetch_requests": 2},
            "model": "claude-sonnet-4-5-20250929",
            "stop_reason": "end_turn",
        }
    ]


def test_a_streamed_web_fetch_is_a_counter_never_a_unit() -> None:
    start_usage = {"input_tokens": 40, "output_tokens": 1}
    events = [
        {"type": "message_start", "message": {**MESSAGE, "content": [], "usage": start_usage}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "A"}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 90, "server_tool_use": {"web_fetch_requests": 3}},
        },
    ]
    event = posted(stream_tap("anthropic.messages", events))[0]
    assert (event.get("units"), event["counters"]) == (None, {"web_fetch_requests": 3})
    assert (event["input_tokens"], event["output_tokens"]) == (40, 90)


def test_an_anthropic_error_body_is_a_failed_attempt() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    events = posted(body_tap("anthropic.messages", error))
    assert events[1] == {
        "type": "stream.failed",
        "error_type": "overloaded_error",
        "message": "Overloaded",
        "output_tokens_generated": 0,
    }


# -- A body of another protocol --------------------------------------------------------------------

BODIES = {
    "openai.chat_completions": CHAT_COMPLETION,
    "openai.responses": RESPONSE,
    "anthropic.messages": MESSAGE,
}


@pytest.mark.parametrize(
    ("protocol", "other"),
    [(p, o) for p in BODIES for o in BODIES if o != p],
)
def test_a_body_of_another_protocol_is_unreadable_not_billed_from_shared_fields(
    protocol: str, other: str
) -> None:
    """A Responses body read as Anthropic Messages (both say ``usage.input_tokens``) would
    bill Responses' input, cached part included, at the full rate: no figure of it is read."""
    tap = body_tap(protocol, BODIES[other])
    assert (tap.malformed_events, tap.usage, tap.model, tap.output_tokens) == (1, None, None, 0)
    assert posted(tap) == [
        {"type": "stream.usage", "output_tokens": 0, "reasoning_tokens": 0, "source": "estimate"}
    ]
    own = body_tap(protocol, BODIES[protocol])  # its own protocol's body is read
    assert own.malformed_events == 0 and own.usage is not None


def test_an_anthropic_body_names_its_type() -> None:
    untyped = {k: v for k, v in MESSAGE.items() if k != "type"}
    tap = body_tap("anthropic.messages", untyped)
    assert (tap.malformed_events, tap.usage) == (1, None)
    proxy_error = {"error": {"message": "upstream down", "type": "api_error"}}
    assert posted(body_tap("anthropic.messages", proxy_error))[1]["error_type"] == "api_error"
