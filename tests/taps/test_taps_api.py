"""Public API, robustness and per-protocol rules of billing.taps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.dimensions import USAGE_FIELDS
from billing.taps import (
    PROTOCOLS,
    AnthropicMessagesTap,
    ChatCompletionsTap,
    InputUsage,
    ResponsesTap,
    Tap,
    Usage,
    attempt_final_events,
    open_tap,
    stream_failed_payload,
    stream_usage_payload,
)

pytestmark = pytest.mark.nodb

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sse"


def run(protocol: str, sse: str | bytes) -> Tap:
    tap = open_tap(protocol)
    tap.feed(sse.encode() if isinstance(sse, str) else sse)
    tap.close()
    return tap


def data(payload: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n"


# -- public API ------------------------------------------------------------------------------


def test_protocols() -> None:
    assert PROTOCOLS == ("openai.chat_completions", "openai.responses", "anthropic.messages")
    assert isinstance(open_tap("openai.chat_completions"), ChatCompletionsTap)
    assert isinstance(open_tap("openai.responses"), ResponsesTap)
    assert isinstance(open_tap("anthropic.messages"), AnthropicMessagesTap)
    for protocol in PROTOCOLS:
        assert open_tap(protocol).protocol == protocol


@pytest.mark.parametrize("bad", ["openai", "anthropic", "", "OPENAI.RESPONSES"])
def test_unknown_protocol(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown protocol") as info:
        open_tap(bad)
    assert "anthropic.messages" in str(info.value)


def test_usage_is_frozen() -> None:
    usage = Usage(input_tokens=1, output_tokens=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        usage.input_tokens = 5  # type: ignore[misc]
    assert usage.as_dict() == {
        "input_tokens": 1,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "output_tokens": 2,
        "reasoning_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
    }
    assert InputUsage(3, 2, 1).as_dict() == {
        "input_tokens": 3,
        "cache_read_input_tokens": 2,
        "cache_creation_input_tokens": 1,
        "cache_creation_1h_input_tokens": 0,
    }
    assert set(USAGE_FIELDS) <= set(usage.as_dict())  # every stream.usage token field


def test_fresh_tap_state() -> None:
    tap = open_tap("openai.chat_completions")
    assert tap.output_tokens == 0
    assert tap.output_tokens_is_estimate
    assert tap.usage is None
    assert tap.input_reported is None
    assert tap.stop_reason is None
    assert tap.error is None
    assert tap.malformed_events == 0
    # nothing reported: the input is not known, so it is left out (never 0)
    assert stream_usage_payload(tap) == {
        "output_tokens": 0,
        "reasoning_tokens": 0,
        "source": "estimate",
    }
    assert stream_usage_payload(tap, fallback_input_tokens=77) == {
        "input_tokens": 77,
        "output_tokens": 0,
        "reasoning_tokens": 0,
        "source": "estimate",
    }
    assert stream_failed_payload(tap) is None
    assert attempt_final_events(tap) == [{"type": "stream.usage", **stream_usage_payload(tap)}]


def test_feed_after_close_is_ignored() -> None:
    tap = run("openai.chat_completions", "")
    tap.feed(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
    tap.close()
    assert tap.closed
    assert tap.output_tokens == 0


def test_payloads_carry_no_envelope_fields() -> None:
    path = FIXTURES / "seed_anthropic_interrupted.sse"
    tap = run("anthropic.messages", path.read_bytes())
    for event in tap.final_events():
        assert not {"event_id", "request_id", "occurred_at", "attempt"} & set(event)
    assert "type" not in tap.usage_payload()
    failed = tap.failed_payload()
    assert failed == {
        "error_type": "api_error",
        "message": "Response stream interrupted, please retry",
        "output_tokens_generated": 1,
    }


def test_output_tokens_grow_while_feeding() -> None:
    tap = open_tap("anthropic.messages")
    raw = (FIXTURES / "seed_anthropic.sse").read_bytes()
    seen = []
    for i in range(len(raw)):
        tap.feed(raw[i : i + 1])
        seen.append(tap.output_tokens)
    tap.close()
    assert seen == sorted(seen)
    assert seen[-1] == 14
    assert tap.input_reported == InputUsage(9, 0, 0)


# -- malformed events ---------------------------------------------------------------------------

CHAT_USAGE = data(
    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}}
)
RESPONSES_USAGE = data(
    {
        "type": "response.completed",
        "response": {"status": "completed", "usage": {"input_tokens": 10, "output_tokens": 4}},
    }
)
ANTHROPIC_USAGE = data(
    {"type": "message_start", "message": {"usage": {"input_tokens": 10, "output_tokens": 1}}}
) + data(
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}
)
USAGE_STREAMS = {
    "openai.chat_completions": CHAT_USAGE,
    "openai.responses": RESPONSES_USAGE,
    "anthropic.messages": ANTHROPIC_USAGE,
}

BAD_EVENTS = [
    "data: {not json\n\n",
    "data: [1, 2]\n\n",
    'data: "text"\n\n',
    "data: : OPENROUTER PROCESSING\n\n",
    'data: {"a": 1e999999}\n\n',
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("bad", BAD_EVENTS)
def test_malformed_event_counted_and_usage_after_it_kept(protocol: str, bad: str) -> None:
    tap = run(protocol, bad + USAGE_STREAMS[protocol])
    assert tap.malformed_events == 1
    assert tap.usage == Usage(input_tokens=10, output_tokens=4)


@pytest.mark.parametrize(
    ("protocol", "payload"),
    [
        ("openai.chat_completions", {"choices": "nope"}),
        ("openai.chat_completions", {"choices": [1]}),
        ("openai.chat_completions", {"choices": [{"delta": "x"}]}),
        ("openai.chat_completions", {"choices": [{"delta": {"tool_calls": {}}}]}),
        ("openai.chat_completions", {"choices": [], "usage": "lots"}),
        ("openai.chat_completions", {"choices": [], "usage": {"prompt_tokens": "10"}}),
        ("openai.chat_completions", {"choices": [], "usage": {"completion_tokens": True}}),
        ("openai.responses", {"type": "response.completed", "response": []}),
        ("openai.responses", {"type": "response.completed"}),
        (
            "openai.responses",
            {"type": "response.completed", "response": {"usage": {"input_tokens": 1.5}}},
        ),
        ("anthropic.messages", {"type": "message_start", "message": None}),
        ("anthropic.messages", {"type": "message_start", "message": {"usage": [1]}}),
        ("anthropic.messages", {"type": "message_delta", "usage": {"output_tokens": "many"}}),
        ("anthropic.messages", {"type": "content_block_delta", "delta": "x"}),
        ("anthropic.messages", {"type": "content_block_delta", "delta": {"text": "no type"}}),
    ],
)
def test_unexpected_shape_counted(protocol: str, payload: dict[str, Any]) -> None:
    tap = run(protocol, data(payload) + USAGE_STREAMS[protocol])
    assert tap.malformed_events == 1
    assert tap.usage == Usage(input_tokens=10, output_tokens=4)


def test_chat_bad_choice_does_not_lose_usage_in_the_same_chunk() -> None:
    tap = run(
        "openai.chat_completions",
        data({"choices": ["bad"], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
    )
    assert tap.malformed_events == 1
    assert tap.usage == Usage(input_tokens=3, output_tokens=2)


def test_unknown_event_kinds_are_not_malformed() -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("openai.responses", {"type": "response.some_future_event", "x": 1}),
        ("anthropic.messages", {"type": "some_future_event"}),
        ("anthropic.messages", {"type": "ping"}),
        ("openai.chat_completions", {"object": "chat.completion.chunk"}),
    ]
    for protocol, payload in cases:
        tap = run(protocol, data(payload) + USAGE_STREAMS[protocol])
        assert tap.malformed_events == 0, payload


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=400), protocol=st.sampled_from(PROTOCOLS))
def test_never_raises_on_arbitrary_bytes(raw: bytes, protocol: str) -> None:
    tap = open_tap(protocol)
    tap.feed(raw)
    tap.close()
    assert tap.output_tokens >= 0
    tap.final_events()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**20) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_KEYS = st.sampled_from(
    ["type", "choices", "delta", "usage", "response", "message", "error", "content", "index"]
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.dictionaries(_KEYS, _JSON, max_size=5), max_size=6),
    protocol=st.sampled_from(PROTOCOLS),
)
def test_never_raises_on_odd_json(payloads: list[dict[str, Any]], protocol: str) -> None:
    sse = "".join(f"data: {json.dumps(p)}\n\n" for p in payloads)
    tap = run(protocol, sse + USAGE_STREAMS[protocol])
    assert tap.usage is not None
    tap.final_events()


# -- stream end -----------------------------------------------------------------------------------


def test_events_after_done_are_ignored() -> None:
    tap = run("openai.chat_completions", CHAT_USAGE + "data: [DONE]\n\n" + "data: {bad\n\n")
    assert tap.done
    assert tap.malformed_events == 0
    assert tap.usage == Usage(input_tokens=10, output_tokens=4)


def test_final_block_without_blank_line_is_read() -> None:
    tap = run("openai.chat_completions", CHAT_USAGE.rstrip("\n"))
    assert tap.usage == Usage(input_tokens=10, output_tokens=4)


# -- delta counting -------------------------------------------------------------------------------


def test_chat_counts_every_kind_of_delta_across_choices() -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {
            "choices": [
                {"index": 0, "delta": {"content": "a"}},
                {"index": 1, "delta": {"content": "b"}},
            ]
        },
        {"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "think"}}]},
        {"choices": [{"index": 0, "delta": {"refusal": "no"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "function": {"arguments": '{"a"'}},
                            {"index": 1, "function": {"arguments": ""}},
                        ]
                    },
                }
            ]
        },
        {"choices": [{"index": 1, "delta": {"function_call": {"arguments": "{}"}}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    tap = run("openai.chat_completions", "".join(data(c) for c in chunks))
    assert tap.output_tokens == 7
    assert tap.output_tokens_is_estimate
    assert tap.stop_reason == "stop"
    assert tap.usage is None


def test_anthropic_counts_text_json_and_thinking_not_signature() -> None:
    deltas = [
        {"type": "text_delta", "text": "a"},
        {"type": "text_delta", "text": ""},
        {"type": "input_json_delta", "partial_json": '{"x'},
        {"type": "thinking_delta", "thinking": "hmm"},
        {"type": "signature_delta", "signature": "abc"},
        {"type": "citations_delta", "citation": {"cited_text": "x"}},
    ]
    sse = "".join(data({"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas)
    tap = run("anthropic.messages", sse)
    assert tap.output_tokens == 3
    assert tap.malformed_events == 0


def test_responses_counts_delta_events() -> None:
    kinds = [
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.refusal.delta",
    ]
    sse = "".join(data({"type": k, "delta": "x"}) for k in kinds)
    sse += data({"type": "response.output_text.delta", "delta": ""})
    sse += data({"type": "response.output_text.done", "text": "xxxx"})
    tap = run("openai.responses", sse)
    assert tap.output_tokens == 5


# -- errors ---------------------------------------------------------------------------------------


def test_chat_error_chunk() -> None:
    sse = (
        data({"choices": [{"index": 0, "delta": {"content": "a"}}]})
        + data({"error": {"message": "Upstream overloaded", "code": 502}})
        + "data: [DONE]\n\n"
    )
    tap = run("openai.chat_completions", sse)
    assert tap.error is not None
    assert tap.error["type"] == "502"
    assert tap.error["message"] == "Upstream overloaded"
    assert tap.error["code"] == 502
    assert tap.failed_payload() == {
        "error_type": "502",
        "message": "Upstream overloaded",
        "output_tokens_generated": 1,
    }


def test_chat_error_string() -> None:
    tap = run("openai.chat_completions", data({"error": "boom"}))
    assert tap.error == {"type": "api_error", "message": "boom"}


def test_responses_flat_error_event() -> None:
    payload = {
        "type": "error",
        "code": "rate_limit_exceeded",
        "message": "slow down",
        "param": None,
    }
    tap = run("openai.responses", data(payload, "error"))
    assert tap.error is not None
    assert tap.error["type"] == "rate_limit_exceeded"
    assert tap.error["message"] == "slow down"


def test_responses_failed_without_error_object() -> None:
    payload = {"type": "response.failed", "response": {"status": "failed", "error": None}}
    tap = run("openai.responses", data(payload))
    assert tap.stop_reason == "failed"
    assert tap.error is not None
    assert tap.error["type"] == "api_error"


def test_first_error_wins() -> None:
    sse = data({"type": "error", "error": {"type": "overloaded_error", "message": "a"}}) + data(
        {"type": "error", "error": {"type": "api_error", "message": "b", "extra": 1}}
    )
    tap = run("anthropic.messages", sse)
    assert tap.error == {"type": "overloaded_error", "message": "a", "extra": 1}


# -- usage details --------------------------------------------------------------------------------


def test_anthropic_reasoning_and_cache_creation_breakdown() -> None:
    start = {
        "type": "message_start",
        "message": {
            "model": "claude-x",
            "usage": {
                "input_tokens": 5,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 100,
                    "ephemeral_1h_input_tokens": 20,
                },
                "output_tokens": 1,
            },
        },
    }
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 90, "output_tokens_details": {"thinking_tokens": 60}},
    }
    tap = run("anthropic.messages", data(start) + data(delta))
    assert tap.usage == Usage(
        input_tokens=5,
        output_tokens=90,
        cache_creation_input_tokens=120,
        reasoning_tokens=60,
        cache_creation_1h_input_tokens=20,
    )
    assert tap.model == "claude-x"


def test_anthropic_null_fields_in_message_delta_do_not_replace() -> None:
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}}
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"input_tokens": None, "cache_read_input_tokens": None, "output_tokens": 7},
    }
    tap = run("anthropic.messages", data(start) + data(delta))
    assert tap.usage == Usage(input_tokens=5, output_tokens=7)


def test_responses_cached_tokens_subtracted() -> None:
    response = {
        "status": "completed",
        "model": "gpt-x",
        "usage": {
            "input_tokens": 3000,
            "input_tokens_details": {"cached_tokens": 2048},
            "output_tokens": 50,
            "output_tokens_details": {"reasoning_tokens": 20},
        },
    }
    tap = run("openai.responses", data({"type": "response.completed", "response": response}))
    assert tap.usage == Usage(
        input_tokens=952, output_tokens=50, cache_read_input_tokens=2048, reasoning_tokens=20
    )
    payload = tap.usage_payload()
    assert payload["model"] == "gpt-x"
    assert payload["stop_reason"] == "completed"


def test_chat_groq_x_groq_usage() -> None:
    chunk = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "x_groq": {"id": "req", "usage": {"prompt_tokens": 20, "completion_tokens": 6}},
    }
    tap = run("openai.chat_completions", data(chunk) + "data: [DONE]\n\n")
    assert tap.usage == Usage(input_tokens=20, output_tokens=6)


def test_chat_input_only_usage_is_input_reported() -> None:
    tap = run("openai.chat_completions", data({"choices": [], "usage": {"prompt_tokens": 20}}))
    assert tap.usage is None
    assert tap.input_reported == InputUsage(20, 0, 0, 0)
    assert tap.usage_payload()["input_tokens"] == 20


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_text_error_event(protocol: str) -> None:
    tap = run(protocol, "event: error\ndata: upstream connection reset\n\n")
    assert tap.malformed_events == 1
    assert tap.error == {"type": "api_error", "message": "upstream connection reset"}


@pytest.mark.slow  # 300 kB fed one byte at a time: 300,000 feeds (one-byte feeding of whole
# streams stays in the fast run: test_taps_fixtures, test_taps_sse_decoder)
def test_one_byte_feeding_of_a_long_line_is_linear() -> None:
    text = "x" * 300_000
    raw = data({"type": "response.output_text.delta", "delta": text}).encode()
    tap = open_tap("openai.responses")
    for i in range(len(raw)):
        tap.feed(raw[i : i + 1])
    tap.close()
    assert tap.output_tokens == 1
