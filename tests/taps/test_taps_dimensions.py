"""Usage dimensions (v2) at the tap level: exact figures of the events a tap produces.

CONTRACT "Usage dimensions (v2)", "Reading upstream usage (taps)". The streams here are written
from the protocols' documented shapes (Anthropic ``usage.iterations``, ``server_tool_use``,
``cache_creation``, ``service_tier``; OpenAI ``service_tier``, ``web_search_call`` output items;
OpenRouter ``server_tool_use_details``), with figures of our own; each one is also read in
1-byte pieces, which must give the same events.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.ingest.validation import parse_batch
from billing.taps import Tap, open_tap
from billing.taps.usage import OtherModelUsage, Usage

pytestmark = pytest.mark.nodb

INCONSISTENT = ["usage_inconsistent"]


def ev(payload: dict[str, Any], name: str | None = None) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(payload)}\n\n"


def read(protocol: str, sse: str) -> Tap:
    """The stream read whole; reading it in 1-byte pieces must give the same events."""
    raw = sse.encode()
    whole = open_tap(protocol)
    whole.feed(raw)
    whole.close()
    pieces = open_tap(protocol)
    for i in range(len(raw)):
        pieces.feed(raw[i : i + 1])
    pieces.close()
    assert pieces.final_events() == whole.final_events()
    return whole


# -- Anthropic ----------------------------------------------------------------------------------


def message_start(usage: dict[str, Any], model: str = "claude-main-1") -> str:
    message = {"id": "msg_x", "type": "message", "role": "assistant", "model": model}
    return ev({"type": "message_start", "message": {**message, "content": [], "usage": usage}})


def text(value: str, index: int = 0) -> str:
    delta = {"type": "text_delta", "text": value}
    return ev({"type": "content_block_delta", "index": index, "delta": delta})


def message_delta(usage: dict[str, Any], stop_reason: str = "end_turn") -> str:
    return ev({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": usage})


STOP = ev({"type": "message_stop"})


def iteration(kind: str, inp: int, out: int, model: str | None = None, **more: Any) -> Any:
    entry: dict[str, Any] = {"type": kind, "input_tokens": inp, "output_tokens": out, **more}
    if model is not None:
        entry["model"] = model
    return entry


def test_compaction_two_iterations_are_billed_as_their_sum() -> None:
    """The top-level counts cover only the final iteration; the attempt is both iterations."""
    sse = (
        message_start({"input_tokens": 41000, "output_tokens": 3})
        + ev({"type": "content_block_start", "index": 0, "content_block": {"type": "compaction"}})
        + ev(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "compaction_delta", "content": "Summary."},
            }
        )
        + text("Answer", 1)
        + message_delta(
            {
                "input_tokens": 730,
                "cache_read_input_tokens": 1200,
                "output_tokens": 905,
                "iterations": [
                    iteration("compaction", 41000, 410, cache_read_input_tokens=0),
                    iteration("message", 730, 905, cache_read_input_tokens=1200),
                ],
            }
        )
        + STOP
    )
    tap = read("anthropic.messages", sse)
    assert tap.usage == Usage(input_tokens=41730, output_tokens=1315, cache_read_input_tokens=1200)
    assert tap.output_tokens == 1315
    assert tap.usage_payload() == {
        "input_tokens": 41730,
        "output_tokens": 1315,
        "cache_read_input_tokens": 1200,
        "cache_creation_input_tokens": 0,
        "reasoning_tokens": 0,
        "source": "upstream",
        "model": "claude-main-1",
        "stop_reason": "end_turn",
    }


def test_advisor_iterations_go_to_other_models_one_entry_per_model() -> None:
    sse = (
        message_start({"input_tokens": 900, "output_tokens": 20, "service_tier": "standard"})
        + text("Plan")
        + message_delta(
            {
                "input_tokens": 2100,
                "output_tokens": 640,
                "server_tool_use": {"web_search_requests": 0},
                "iterations": [
                    iteration("message", 900, 20),
                    iteration(
                        "advisor_message",
                        1500,
                        700,
                        "claude-advisor-9",
                        cache_read_input_tokens=300,
                        cache_creation={"ephemeral_1h_input_tokens": 0},
                    ),
                    iteration("message", 1200, 600, "claude-main-1"),  # its own model: main
                    iteration("advisor_message", 400, 100, "claude-advisor-9"),
                ],
            }
        )
        + STOP
    )
    tap = read("anthropic.messages", sse)
    assert tap.usage is not None
    assert tap.usage.as_dict() == {
        "input_tokens": 2100,
        "output_tokens": 620,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "reasoning_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
    }
    assert tap.usage.other_models == (OtherModelUsage("claude-advisor-9", 1900, 800, 300, 0),)
    payload = tap.usage_payload()
    assert payload["other_models"] == [
        {
            "model": "claude-advisor-9",
            "input_tokens": 1900,
            "output_tokens": 800,
            "cache_read_input_tokens": 300,
            "cache_creation_input_tokens": 0,
        }
    ]
    assert payload["service_tier"] == "standard"
    assert "units" not in payload  # a zero counter is not a unit
    assert tap.output_tokens == 620  # the advisor's output is not the call model's output


def test_iterations_without_a_message_model_bill_compaction_and_message_at_the_call_model() -> None:
    start = ev({"type": "message_start", "message": {"usage": {"input_tokens": 5}}})
    sse = start + message_delta(
        {
            "output_tokens": 9,
            "iterations": [
                iteration("compaction", 50, 7),
                iteration("message", 5, 9),
                iteration("advisor_message", 30, 4, "claude-advisor-9"),
            ],
        }
    )
    tap = read("anthropic.messages", sse)
    assert tap.usage is not None
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (55, 16)
    assert tap.usage.other_models == (OtherModelUsage("claude-advisor-9", 30, 4),)


def test_empty_iterations_keep_the_top_level_counts() -> None:
    sse = message_start({"input_tokens": 12}) + message_delta(
        {"output_tokens": 30, "iterations": []}
    )
    assert read("anthropic.messages", sse).usage == Usage(input_tokens=12, output_tokens=30)


def test_server_tool_use_counters_are_units() -> None:
    sse = (
        message_start({"input_tokens": 2000, "output_tokens": 1})
        + text("Found it")
        + message_delta(
            {
                "input_tokens": 9100,
                "output_tokens": 420,
                "server_tool_use": {"web_search_requests": 3, "web_fetch_requests": 0},
            }
        )
    )
    tap = read("anthropic.messages", sse)
    assert tap.usage == Usage(
        input_tokens=9100, output_tokens=420, units={"web_search_requests": 3}
    )
    assert tap.units == {"web_search_requests": 3}
    assert tap.usage_payload()["units"] == {"web_search_requests": 3}


def test_one_hour_cache_writes_are_their_own_count() -> None:
    cache = {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2500}
    sse = message_start(
        {"input_tokens": 20, "cache_creation_input_tokens": 3500, "cache_creation": cache}
    ) + message_delta({"output_tokens": 60})
    tap = read("anthropic.messages", sse)
    assert tap.usage == Usage(
        input_tokens=20,
        output_tokens=60,
        cache_creation_input_tokens=3500,
        cache_creation_1h_input_tokens=2500,
    )
    payload = tap.usage_payload()
    assert payload["cache_creation_input_tokens"] == 3500
    assert payload["cache_creation_1h_input_tokens"] == 2500
    assert "anomalies" not in payload


def test_one_hour_writes_above_the_writes_are_cut_and_flagged() -> None:
    cache = {"ephemeral_1h_input_tokens": 800}
    sse = message_start(
        {"input_tokens": 20, "cache_creation_input_tokens": 500, "cache_creation": cache}
    ) + message_delta({"output_tokens": 6})
    payload = read("anthropic.messages", sse).usage_payload()
    assert (payload["cache_creation_input_tokens"], payload["cache_creation_1h_input_tokens"]) == (
        500,
        500,
    )
    assert payload["anomalies"] == INCONSISTENT
    assert payload["source"] == "upstream"


def test_anthropic_served_tier_the_latest_report_wins() -> None:
    sse = message_start({"input_tokens": 7, "service_tier": "priority"}) + message_delta(
        {"output_tokens": 3}
    )
    assert read("anthropic.messages", sse).usage_payload()["service_tier"] == "priority"
    sse = message_start({"input_tokens": 7, "service_tier": "priority"}) + message_delta(
        {"output_tokens": 3, "service_tier": "standard"}
    )
    tap = read("anthropic.messages", sse)
    assert tap.service_tier == "standard"
    assert tap.usage is not None and tap.usage.service_tier == "standard"


def test_anthropic_negative_count_is_zero_and_the_rest_kept() -> None:
    sse = message_start({"input_tokens": 310, "cache_read_input_tokens": 4000}) + message_delta(
        {"cache_read_input_tokens": -4000, "output_tokens": 75}
    )
    tap = read("anthropic.messages", sse)
    assert tap.malformed_events == 0
    assert tap.usage == Usage(input_tokens=310, output_tokens=75, anomalies=("usage_inconsistent",))
    payload = tap.usage_payload()
    assert payload["source"] == "upstream"
    assert (payload["input_tokens"], payload["cache_read_input_tokens"]) == (310, 0)
    assert payload["anomalies"] == INCONSISTENT


def test_a_negative_iteration_count_is_zero_and_flagged() -> None:
    sse = message_start({"input_tokens": 100}) + message_delta(
        {
            "output_tokens": 40,
            "iterations": [iteration("compaction", 900, -5), iteration("message", 100, 40)],
        }
    )
    tap = read("anthropic.messages", sse)
    assert tap.usage is not None
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (1000, 40)
    assert tap.usage.anomalies == ("usage_inconsistent",)


def test_anthropic_cut_stream_keeps_the_known_input_and_the_tier() -> None:
    sse = message_start(
        {"input_tokens": 64, "cache_read_input_tokens": 9, "service_tier": "priority"}
    ) + "".join(text(word) for word in "abcde")
    payload = read("anthropic.messages", sse).usage_payload()
    assert payload == {
        "input_tokens": 64,
        "output_tokens": 5,
        "cache_read_input_tokens": 9,
        "cache_creation_input_tokens": 0,
        "reasoning_tokens": 0,
        "source": "estimate",
        "service_tier": "priority",
        "model": "claude-main-1",
    }


# -- OpenAI Chat Completions ---------------------------------------------------------------------


def chunk(**fields: Any) -> str:
    return ev({"id": "c", "object": "chat.completion.chunk", "model": "gpt-x", **fields})


def choice(content: str | None = None, finish: str | None = None) -> list[dict[str, Any]]:
    delta = {} if content is None else {"content": content}
    return [{"index": 0, "delta": delta, "finish_reason": finish}]


DONE = "data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("tiers", "served"),
    [
        (["priority", "priority", "priority"], "priority"),
        (["auto", "auto", "flex"], "flex"),
        (["auto", "auto", "auto"], None),
        ([None, None, None], None),
    ],
    ids=["priority", "auto-then-flex", "only-auto", "absent"],
)
def test_chat_served_tier(tiers: list[str | None], served: str | None) -> None:
    def tiered(tier: str | None, **fields: Any) -> str:
        return chunk(**fields, **({"service_tier": tier} if tier else {}))

    sse = (
        tiered(tiers[0], choices=choice("Hi"))
        + tiered(tiers[1], choices=choice(None, "stop"))
        + tiered(tiers[2], choices=[], usage={"prompt_tokens": 30, "completion_tokens": 2})
        + DONE
    )
    tap = read("openai.chat_completions", sse)
    assert tap.service_tier == served
    assert tap.usage is not None and tap.usage.service_tier == served
    assert tap.usage_payload().get("service_tier") == served


def test_chat_cached_above_the_prompt_is_the_prompt_and_flagged() -> None:
    usage = {
        "prompt_tokens": 500,
        "completion_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 800},
    }
    sse = chunk(choices=choice("x", "stop")) + chunk(choices=[], usage=usage) + DONE
    tap = read("openai.chat_completions", sse)
    assert tap.usage == Usage(
        input_tokens=0,
        output_tokens=40,
        cache_read_input_tokens=500,
        anomalies=("usage_inconsistent",),
    )
    payload = tap.usage_payload()
    assert (payload["input_tokens"], payload["cache_read_input_tokens"]) == (0, 500)
    assert payload["anomalies"] == INCONSISTENT


def test_chat_negative_count_is_zero_and_the_usage_kept() -> None:
    usage = {"prompt_tokens": 40, "completion_tokens": -3}
    sse = chunk(choices=choice("x", "stop")) + chunk(choices=[], usage=usage) + DONE
    tap = read("openai.chat_completions", sse)
    assert tap.malformed_events == 0
    assert tap.usage == Usage(input_tokens=40, output_tokens=0, anomalies=("usage_inconsistent",))
    payload = tap.usage_payload()
    assert payload["source"] == "upstream"
    assert payload["anomalies"] == INCONSISTENT


def test_chat_a_later_valid_snapshot_clears_an_earlier_negative() -> None:
    sse = (
        chunk(choices=choice("a"), usage={"prompt_tokens": 40, "completion_tokens": -1})
        + chunk(choices=choice("b", "stop"), usage={"prompt_tokens": 40, "completion_tokens": 2})
        + DONE
    )
    tap = read("openai.chat_completions", sse)
    assert tap.usage == Usage(input_tokens=40, output_tokens=2)
    assert "anomalies" not in tap.usage_payload()


def test_chat_reasoning_above_the_output_is_the_output_and_flagged() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "completion_tokens_details": {"reasoning_tokens": 64},
    }
    tap = read("openai.chat_completions", chunk(choices=[], usage=usage) + DONE)
    assert tap.usage == Usage(
        input_tokens=10, output_tokens=20, reasoning_tokens=20, anomalies=("usage_inconsistent",)
    )


def test_openrouter_web_search_requests_are_units() -> None:
    usage = {
        "prompt_tokens": 1800,
        "completion_tokens": 150,
        "server_tool_use_details": {
            "web_search_requests": 2,
            "tool_calls_requested": 2,
            "tool_calls_executed": 2,
        },
    }
    sse = chunk(choices=choice("News", "stop")) + chunk(choices=[], usage=usage) + DONE
    tap = read("openai.chat_completions", sse)
    assert tap.usage == Usage(
        input_tokens=1800, output_tokens=150, units={"web_search_requests": 2}
    )
    assert tap.usage_payload()["units"] == {"web_search_requests": 2}


def test_chat_cut_stream_leaves_the_unknown_input_out() -> None:
    """An estimate never replaces a known input with 0: without a reported input the payload
    has none, and the service bills ``stream.started.input_tokens``."""
    sse = chunk(choices=choice("a")) + chunk(choices=choice("b"))
    tap = read("openai.chat_completions", sse)
    assert tap.usage_payload() == {
        "output_tokens": 2,
        "reasoning_tokens": 0,
        "source": "estimate",
        "model": "gpt-x",
    }
    assert tap.usage_payload(fallback_input_tokens=500)["input_tokens"] == 500


# -- OpenAI Responses ----------------------------------------------------------------------------


def response(kind: str, status: str, tier: str, **more: Any) -> str:
    body = {"id": "resp_x", "status": status, "model": "gpt-y", "service_tier": tier, **more}
    return ev({"type": kind, "response": body}, kind)


def search_item(n: int, status: str) -> dict[str, Any]:
    return {"id": f"ws_{n}", "type": "web_search_call", "status": status}


def searches(n: int) -> str:
    sse = ""
    for i in range(n):
        for kind, status in (("added", "in_progress"), ("done", "completed")):
            name = f"response.output_item.{kind}"
            sse += ev({"type": name, "output_index": i, "item": search_item(i, status)}, name)
    return sse


RESPONSES_USAGE = {
    "input_tokens": 3000,
    "input_tokens_details": {"cached_tokens": 1000},
    "output_tokens": 200,
    "output_tokens_details": {"reasoning_tokens": 120},
}


def test_responses_web_search_calls_are_counted_once_each_and_the_served_tier_wins() -> None:
    output = [search_item(i, "completed") for i in range(3)]
    output.append({"id": "msg_1", "type": "message", "status": "completed", "content": []})
    sse = (
        response("response.created", "in_progress", "auto")
        + searches(3)
        + ev({"type": "response.output_text.delta", "delta": "Today"})
        + response(
            "response.completed", "completed", "priority", output=output, usage=RESPONSES_USAGE
        )
    )
    tap = read("openai.responses", sse)
    assert tap.usage == Usage(
        input_tokens=2000,
        output_tokens=200,
        cache_read_input_tokens=1000,
        reasoning_tokens=120,
        service_tier="priority",
        units={"web_search_requests": 3},
    )
    payload = tap.usage_payload()
    assert (payload["service_tier"], payload["units"]) == ("priority", {"web_search_requests": 3})


def test_responses_cut_stream_bills_the_searches_made_and_no_requested_tier() -> None:
    sse = response("response.created", "in_progress", "auto") + searches(2)
    sse += ev({"type": "response.output_text.delta", "delta": "Par"})
    payload = read("openai.responses", sse).usage_payload()
    assert payload == {
        "output_tokens": 1,
        "reasoning_tokens": 0,
        "source": "estimate",
        "units": {"web_search_requests": 2},
        "model": "gpt-y",
    }


def test_responses_cached_above_the_input_is_the_input_and_flagged() -> None:
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 130},
        "output_tokens": 5,
    }
    tap = read(
        "openai.responses", response("response.completed", "completed", "default", usage=usage)
    )
    assert tap.usage == Usage(
        input_tokens=0,
        output_tokens=5,
        cache_read_input_tokens=100,
        service_tier="default",
        anomalies=("usage_inconsistent",),
    )


@pytest.mark.parametrize(
    "iterations",
    ["many", [1, 2], [{"type": "message", "input_tokens": "x", "output_tokens": 3}]],
    ids=["not-a-list", "not-objects", "bad-count"],
)
def test_unreadable_iterations_keep_the_top_level_usage(iterations: Any) -> None:
    sse = message_start({"input_tokens": 12}) + message_delta(
        {"output_tokens": 30, "iterations": iterations}
    )
    tap = read("anthropic.messages", sse)
    assert tap.malformed_events == 1
    assert tap.usage == Usage(input_tokens=12, output_tokens=30)
    assert tap.usage_payload()["source"] == "upstream"


def test_unreadable_server_tool_use_keeps_the_usage() -> None:
    sse = message_start({"input_tokens": 12, "cache_creation": "n/a"}) + message_delta(
        {
            "output_tokens": 30,
            "server_tool_use": {"web_search_requests": "two", "web_fetch_requests": 1, "X": 4},
        }
    )
    tap = read("anthropic.messages", sse)
    assert tap.malformed_events == 0
    assert tap.usage == Usage(input_tokens=12, output_tokens=30, counters={"web_fetch_requests": 1})
    sse = message_start({"input_tokens": 12}) + message_delta(
        {"output_tokens": 30, "server_tool_use": [3]}
    )
    assert read("anthropic.messages", sse).usage == Usage(input_tokens=12, output_tokens=30)


def test_a_negative_unit_is_left_out_and_flagged() -> None:
    sse = message_start({"input_tokens": 12}) + message_delta(
        {"output_tokens": 30, "server_tool_use": {"web_search_requests": -2}}
    )
    payload = read("anthropic.messages", sse).usage_payload()
    assert "units" not in payload
    assert payload["anomalies"] == INCONSISTENT
    assert (payload["input_tokens"], payload["output_tokens"]) == (12, 30)


# -- whatever the upstream says, the tap's events pass ingest ------------------------------------

_COUNT = st.one_of(st.none(), st.integers(-(10**6), 10**7))
_TIER = st.one_of(st.none(), st.sampled_from(["auto", "default", "priority", "flex", "x" * 40]))


def _usage_object() -> st.SearchStrategy[dict[str, Any]]:
    fields = st.fixed_dictionaries(
        {},
        optional={
            "input_tokens": _COUNT,
            "output_tokens": _COUNT,
            "cache_read_input_tokens": _COUNT,
            "cache_creation_input_tokens": _COUNT,
            "cache_creation": st.fixed_dictionaries(
                {},
                optional={"ephemeral_5m_input_tokens": _COUNT, "ephemeral_1h_input_tokens": _COUNT},
            ),
            "service_tier": _TIER,
            "server_tool_use": st.dictionaries(
                st.sampled_from(["web_search_requests", "web_fetch_requests", "Bad-Name"]), _COUNT
            ),
        },
    )
    iterations = st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["compaction", "message", "advisor_message"]),
                "input_tokens": _COUNT,
                "output_tokens": _COUNT,
            },
            optional={
                "model": st.sampled_from(["claude-main-1", "claude-advisor-9", "claude-other"]),
                "cache_read_input_tokens": _COUNT,
            },
        ),
        max_size=12,
    )
    return st.builds(lambda f, i: {**f, "iterations": i} if i else f, fields, iterations)


def _chat_usage() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"prompt_tokens": _COUNT, "completion_tokens": _COUNT},
        optional={
            "prompt_tokens_details": st.fixed_dictionaries(
                {"cached_tokens": _COUNT}, optional={"cache_write_tokens": _COUNT}
            ),
            "completion_tokens_details": st.fixed_dictionaries({"reasoning_tokens": _COUNT}),
            "server_tool_use_details": st.fixed_dictionaries({"web_search_requests": _COUNT}),
        },
    )


def _post(tap: Tap) -> None:
    now = datetime.now(UTC)
    events = [
        {
            "event_id": f"e{i}",
            "request_id": "r",
            "occurred_at": now.isoformat(),
            **payload,
        }
        for i, payload in enumerate(tap.final_events())
    ]
    parse_batch(json.dumps({"events": events}).encode(), now)  # raises on any 422


@settings(max_examples=150, deadline=None)
@given(start=_usage_object(), delta=_usage_object(), cut=st.booleans())
def test_anthropic_events_always_pass_ingest(
    start: dict[str, Any], delta: dict[str, Any], cut: bool
) -> None:
    sse = message_start(start) + text("x") + ("" if cut else message_delta(delta))
    tap = read("anthropic.messages", sse)
    _post(tap)


@settings(max_examples=150, deadline=None)
@given(usage=_chat_usage(), tier=_TIER, cut=st.booleans())
def test_chat_events_always_pass_ingest(usage: dict[str, Any], tier: str | None, cut: bool) -> None:
    last = chunk(choices=[], usage=usage, service_tier=tier)
    tap = read("openai.chat_completions", chunk(choices=choice("x")) + ("" if cut else last))
    _post(tap)


def test_a_counter_beyond_any_count_is_left_out_and_the_usage_kept() -> None:
    """A counter past ``MAX_TOKENS`` (here past 64 bits, which the client could not post) is
    left out as a counter that is not a count is; the tokens beside it are still billed."""
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "server_tool_use_details": {"web_search_requests": 99999999999999999999999},
    }
    tap = read("openai.chat_completions", chunk(choices=[], usage=usage) + DONE)
    assert tap.usage == Usage(input_tokens=100, output_tokens=10)
    assert json.loads(json.dumps(tap.usage_payload()))["input_tokens"] == 100


def test_a_token_count_beyond_any_count_makes_the_usage_unreadable() -> None:
    """A token count past ``MAX_TOKENS`` is malformed: the tap skips that event (and counts
    it) rather than posting a usage the service refuses or the client cannot serialize."""
    usage = {"prompt_tokens": 10**23, "completion_tokens": 10}
    sse = chunk(choices=choice("a")) + chunk(choices=[], usage=usage) + DONE
    tap = read("openai.chat_completions", sse)
    assert tap.usage is None
    assert tap.usage_payload()["source"] == "estimate"
