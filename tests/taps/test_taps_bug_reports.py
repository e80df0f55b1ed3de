"""Streams reconstructed from public bug reports about usage accounting, one test each."""

from __future__ import annotations

import json
from typing import Any

import pytest

from billing.taps import Tap, Usage, open_tap

pytestmark = pytest.mark.nodb


def run(protocol: str, sse: str, *, bytewise: bool = False) -> Tap:
    raw = sse.encode()
    tap = open_tap(protocol)
    if bytewise:
        for i in range(len(raw)):
            tap.feed(raw[i : i + 1])
    else:
        tap.feed(raw)
    tap.close()
    return tap


def both(protocol: str, sse: str) -> list[Tap]:
    """The stream read whole and in 1-byte pieces (they must agree)."""
    whole, pieces = run(protocol, sse), run(protocol, sse, bytewise=True)
    assert whole.final_events() == pieces.final_events()
    assert whole.malformed_events == pieces.malformed_events
    return [whole, pieces]


def ev(name: str | None, payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data}\n\n"


def anthropic_start(input_tokens: int, output_tokens: int = 1, **cache: int) -> str:
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens, **cache}
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "usage": usage,
    }
    return ev("message_start", {"type": "message_start", "message": message})


def text_delta(text: str) -> str:
    return ev(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    )


def message_delta(stop_reason: str | None = "end_turn", **usage: int) -> str:
    return ev(
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": usage},
    )


def chat_chunk(**fields: Any) -> str:
    return ev(None, {"id": "c1", "object": "chat.completion.chunk", "model": "m", **fields})


def chat_choice(content: str | None = None, finish: str | None = None, index: int = 0) -> Any:
    delta = {} if content is None else {"content": content}
    return {"index": index, "delta": delta, "finish_reason": finish}


# 1 ------------------------------------------------------------------------------------------


def test_anthropic_message_start_placeholder_not_added() -> None:
    sse = (
        anthropic_start(31, 1)
        + text_delta("Hello")
        + message_delta(output_tokens=22)
        + ev("message_stop", {"type": "message_stop"})
    )
    for tap in both("anthropic.messages", sse):
        assert tap.usage is not None
        assert tap.usage.output_tokens == 22
        assert tap.usage.input_tokens == 31
        assert tap.output_tokens == 22
        assert not tap.output_tokens_is_estimate
        assert tap.usage_payload()["output_tokens"] == 22


# 2 ------------------------------------------------------------------------------------------


def test_anthropic_message_delta_snapshot_replaces_never_adds() -> None:
    sse = (
        anthropic_start(27, 1, cache_read_input_tokens=1200)
        + text_delta("Hi")
        + message_delta(input_tokens=27, cache_read_input_tokens=1200, output_tokens=47)
    )
    for tap in both("anthropic.messages", sse):
        assert tap.usage == Usage(input_tokens=27, output_tokens=47, cache_read_input_tokens=1200)


def test_anthropic_message_delta_repeated_snapshots_replace() -> None:
    sse = (
        anthropic_start(10, 1)
        + message_delta(None, output_tokens=5)
        + message_delta("end_turn", input_tokens=12, output_tokens=9)
    )
    for tap in both("anthropic.messages", sse):
        assert tap.usage == Usage(input_tokens=12, output_tokens=9)
        assert tap.stop_reason == "end_turn"


# 3 ------------------------------------------------------------------------------------------


def test_anthropic_cut_stream_bills_generated_count_as_estimate() -> None:
    sse = anthropic_start(50, 1) + ev(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    sse += "".join(text_delta(f"t{i}") for i in range(2300))
    tap = run("anthropic.messages", sse)
    assert tap.usage is None
    assert tap.output_tokens == 2300
    assert tap.output_tokens_is_estimate
    payload = tap.usage_payload()
    assert payload["source"] == "estimate"
    assert payload["output_tokens"] == 2300
    assert payload["input_tokens"] == 50
    assert tap.failed_payload() is None


def test_anthropic_cut_right_after_message_start_is_zero_not_placeholder() -> None:
    tap = run("anthropic.messages", anthropic_start(50, 1))
    assert tap.output_tokens == 0
    assert tap.usage_payload()["output_tokens"] == 0
    assert tap.usage_payload()["source"] == "estimate"


# 4 ------------------------------------------------------------------------------------------


def test_anthropic_cache_read_kept_separate() -> None:
    sse = (
        anthropic_start(4, 1, cache_read_input_tokens=2455, cache_creation_input_tokens=0)
        + text_delta("ok")
        + message_delta(output_tokens=23)
    )
    for tap in both("anthropic.messages", sse):
        assert tap.usage == Usage(input_tokens=4, output_tokens=23, cache_read_input_tokens=2455)
        payload = tap.usage_payload()
        assert payload["input_tokens"] == 4
        assert payload["cache_read_input_tokens"] == 2455
        assert payload["source"] == "upstream"


# 5 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_choices_key", [True, False], ids=["empty-choices", "no-choices"])
def test_chat_usage_chunk_without_choices(with_choices_key: bool) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    last = chat_chunk(choices=[], usage=usage) if with_choices_key else chat_chunk(usage=usage)
    sse = (
        chat_chunk(choices=[chat_choice("Hi")])
        + chat_chunk(choices=[chat_choice(None, "stop")])
        + last
        + "data: [DONE]\n\n"
    )
    for tap in both("openai.chat_completions", sse):
        assert tap.usage == Usage(input_tokens=12, output_tokens=3)
        assert tap.stop_reason == "stop"
        assert tap.malformed_events == 0
        assert tap.done


# 6 ------------------------------------------------------------------------------------------


def test_chat_usage_after_finish_reason_length() -> None:
    partial = {"prompt_tokens": 2300, "completion_tokens": 235, "total_tokens": 2535}
    full = {
        "prompt_tokens": 2300,
        "completion_tokens": 235,
        "total_tokens": 2535,
        "prompt_tokens_details": {"cached_tokens": 1536},
    }
    head = chat_chunk(choices=[chat_choice("a")]) + chat_chunk(
        choices=[chat_choice(None, "length")], usage=partial
    )
    for tail in (chat_chunk(choices=[], usage=full) + "data: [DONE]\n\n", chat_chunk(usage=full)):
        for tap in both("openai.chat_completions", head + tail):
            assert tap.usage == Usage(
                input_tokens=764, output_tokens=235, cache_read_input_tokens=1536
            )
            assert tap.stop_reason == "length"


def test_chat_later_usage_chunk_with_only_details_keeps_earlier_fields() -> None:
    sse = chat_chunk(
        choices=[chat_choice(None, "length")],
        usage={"prompt_tokens": 2300, "completion_tokens": 235},
    ) + chat_chunk(choices=[], usage={"prompt_tokens_details": {"cached_tokens": 1536}})
    for tap in both("openai.chat_completions", sse):
        assert tap.usage == Usage(input_tokens=764, output_tokens=235, cache_read_input_tokens=1536)


# 7 ------------------------------------------------------------------------------------------


def test_chat_cumulative_usage_on_every_chunk() -> None:
    sse = ""
    for n, word in enumerate(["a", "b", "c", "d", "e"], start=1):
        usage = {"prompt_tokens": 1000, "completion_tokens": n, "total_tokens": 1000 + n}
        sse += chat_chunk(choices=[chat_choice(word, "stop" if n == 5 else None)], usage=usage)
        if n == 3:
            for tap in both("openai.chat_completions", sse):
                assert tap.output_tokens == 3
                assert not tap.output_tokens_is_estimate
    sse += "data: [DONE]\n\n"
    for tap in both("openai.chat_completions", sse):
        assert tap.usage == Usage(input_tokens=1000, output_tokens=5)
        assert tap.output_tokens == 5
        assert tap.usage_payload()["source"] == "upstream"


def test_chat_stale_usage_followed_by_content_is_not_final() -> None:
    # a provider that reports usage early and is then cut: the early snapshot is not final
    sse = chat_chunk(
        choices=[chat_choice("a")], usage={"prompt_tokens": 100, "completion_tokens": 1}
    ) + "".join(chat_chunk(choices=[chat_choice(w)]) for w in "bcd")
    tap = run("openai.chat_completions", sse)
    assert tap.output_tokens == 4
    assert tap.output_tokens_is_estimate
    payload = tap.usage_payload()
    assert payload["source"] == "estimate"
    assert payload["output_tokens"] == 4
    assert payload["input_tokens"] == 100


# 8 ------------------------------------------------------------------------------------------


def test_chat_comments_retry_and_processing_data_line() -> None:
    sse = (
        ": keepalive\n\n"
        + chat_chunk(choices=[chat_choice("Hello")])
        + ": OPENROUTER PROCESSING\n\n"
        + ":\n\n"
        + "retry: 3000\n\n"
        + "data: : OPENROUTER PROCESSING\n\n"
        + chat_chunk(choices=[chat_choice(None, "stop")])
        + chat_chunk(choices=[], usage={"prompt_tokens": 40, "completion_tokens": 9})
        + "data: [DONE]\n\n"
    )
    for tap in both("openai.chat_completions", sse):
        assert tap.usage == Usage(input_tokens=40, output_tokens=9)
        assert tap.malformed_events == 1
        assert tap.error is None


# 9 ------------------------------------------------------------------------------------------


def test_anthropic_framing_through_proxies() -> None:
    sse = (
        "event: ping\n\n"
        + anthropic_start(15, 1).split("\n", 1)[1]  # no event: line
        + "event: ping\n\n"
        + text_delta("Hi").split("\n", 1)[1]
        + ev("ping", {"type": "ping"})
        + message_delta(output_tokens=8).split("\n", 1)[1]
        + ev(None, {"type": "message_stop"})
        + "event: done\ndata: [DONE]\n\n"
    )
    for tap in both("anthropic.messages", sse):
        assert tap.usage == Usage(input_tokens=15, output_tokens=8)
        assert tap.stop_reason == "end_turn"
        assert tap.malformed_events == 0
        assert tap.error is None


# 10 -----------------------------------------------------------------------------------------


def responses_terminal(kind: str, status: str, **extra: Any) -> str:
    usage = {
        "input_tokens": 1200,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1024,
        "output_tokens_details": {"reasoning_tokens": 417},
        "total_tokens": 2224,
    }
    response = {"id": "resp_1", "status": status, "model": "gpt-x", "usage": usage, **extra}
    return ev(kind, {"type": kind, "response": response})


def responses_head() -> str:
    created = {"id": "resp_1", "status": "in_progress", "model": "gpt-x", "usage": None}
    return ev("response.created", {"type": "response.created", "response": created}) + ev(
        "response.output_text.delta",
        {"type": "response.output_text.delta", "delta": "Hi", "output_index": 0},
    )


def test_responses_incomplete_is_billed_from_its_usage() -> None:
    sse = responses_head() + responses_terminal(
        "response.incomplete", "incomplete", incomplete_details={"reason": "max_output_tokens"}
    )
    for tap in both("openai.responses", sse):
        assert tap.usage == Usage(input_tokens=1200, output_tokens=1024, reasoning_tokens=417)
        assert tap.stop_reason == "incomplete"
        assert tap.error is None
        payload = tap.usage_payload()
        assert payload["source"] == "upstream"
        assert payload["reasoning_tokens"] == 417
        assert payload["stop_reason"] == "incomplete"


def test_responses_failed_with_usage_is_billed_and_error_reported() -> None:
    error = {"code": "server_error", "message": "The model failed mid-generation."}
    sse = responses_head() + responses_terminal("response.failed", "failed", error=error)
    for tap in both("openai.responses", sse):
        assert tap.usage == Usage(input_tokens=1200, output_tokens=1024, reasoning_tokens=417)
        assert tap.stop_reason == "failed"
        assert tap.error is not None
        assert tap.error["type"] == "server_error"
        assert tap.error["message"] == "The model failed mid-generation."
        events = tap.final_events()
        assert [e["type"] for e in events] == ["stream.usage", "stream.failed"]
        assert events[0]["source"] == "upstream"
        assert events[1] == {
            "type": "stream.failed",
            "error_type": "server_error",
            "message": "The model failed mid-generation.",
            "output_tokens_generated": 1024,
        }


# 11 -----------------------------------------------------------------------------------------


def test_chat_cached_tokens_subtracted_from_prompt() -> None:
    usage = {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920},
        "completion_tokens_details": {"reasoning_tokens": 128},
    }
    sse = (
        chat_chunk(choices=[chat_choice("x", "stop")])
        + chat_chunk(choices=[], usage=usage)
        + "data: [DONE]\n\n"
    )
    for tap in both("openai.chat_completions", sse):
        assert tap.usage == Usage(
            input_tokens=86,
            output_tokens=300,
            cache_read_input_tokens=1920,
            reasoning_tokens=128,
        )
