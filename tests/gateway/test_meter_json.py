"""Non-streaming responses metered by ``Meter.json`` / ``settle_json`` (CONTRACT "Non-streaming
calls, hosted-tool fees, provider-reported cost (v3)"): the events, then the service bills them;
the usage chunk a client did not ask for is hidden but billed; the client's response head."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from billing.gateway import Meters
from billing.gateway.headers import relayed_headers
from billing.gateway.hidden import UsageChunkFilter
from billing.taps import open_tap
from tests.gateway.test_meter import Recorder, _call, _post

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "fake-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}
    ],
    "usage": {
        "prompt_tokens": 30,
        "completion_tokens": 8,
        "total_tokens": 38,
        "prompt_tokens_details": {"cached_tokens": 20},
    },
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "fake-model",
    "content": [{"type": "text", "text": "Hi!"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "cache_read_input_tokens": 20, "output_tokens": 8},
}
RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "model": "fake-model",
    "output": [
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi!", "annotations": []}],
        }
    ],
    "usage": {
        "input_tokens": 30,
        "input_tokens_details": {"cached_tokens": 20},
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 38,
    },
}
BODIES = {
    "openai.chat_completions": COMPLETION,
    "openai.responses": RESPONSE,
    "anthropic.messages": MESSAGE,
}


@pytest.mark.parametrize("protocol", list(BODIES))
def test_a_whole_response_is_billed_the_upstream_usage_delivered_in_full(
    protocol: str, client: TestClient
) -> None:
    rec = Recorder()
    meter = Meters(rec).call(
        request_id="whole", api_key_id="key_1", model="fake-model", protocol=protocol
    )
    body = json.dumps(BODIES[protocol]).encode()
    upstream = httpx.Response(
        200, content=body, headers={"x-request-id": "req_9", "x-ratelimit-remaining-tokens": "7"}
    )
    response = meter.json(upstream)
    assert (response.status_code, response.body) == (200, body)
    assert response.headers["x-request-id"] == "whole"
    assert response.headers["x-upstream-request-id"] == "req_9"
    assert response.headers["x-ratelimit-remaining-tokens"] == "7"
    assert rec.kinds("whole") == [(1, "stream.started"), (1, "stream.tokens"), (1, "stream.usage")]
    [tokens] = rec.of("whole", "stream.tokens")
    assert (tokens["output_tokens_generated"], tokens["output_tokens_delivered"]) == (8, 8)
    [usage] = rec.of("whole", "stream.usage")
    assert (usage["source"], usage["input_tokens"], usage["cache_read_input_tokens"]) == (
        "upstream",
        10,
        20,
    )
    _post(client, rec.events)
    call = _call(client, "whole")
    assert (call["status"], call["output_tokens_billed"], call["output_tokens_delivered"]) == (
        "completed",
        8,
        8,
    )
    # 10 * 2.5 + 20 * 1.25 + 8 * 10 micro-USD
    assert call["cost_usd"] == "0.00013"


def test_a_body_of_another_protocol_is_flagged_not_billed_from_guessed_fields(
    client: TestClient,
) -> None:
    """A Responses body metered as Anthropic Messages (the same ``usage.input_tokens`` and
    ``output_tokens`` names) is not read: the call is an estimate flagged ``usage_missing``
    (and ``input_unknown``: the gateway gave no count of its own), not 30 input tokens billed
    as if Anthropic had reported them."""
    rec = Recorder()
    meter = Meters(rec).call(
        request_id="foreign", api_key_id="key_1", model="fake-model", protocol="anthropic.messages"
    )
    body = json.dumps(RESPONSE).encode()
    response = meter.json(httpx.Response(200, content=body))
    assert (response.status_code, response.body) == (200, body)  # the client gets it as it came
    [usage] = rec.of("foreign", "stream.usage")
    assert usage == {
        "type": "stream.usage",
        "output_tokens": 0,
        "reasoning_tokens": 0,
        "source": "estimate",
        "request_id": "foreign",
        "attempt": 1,
    }
    _post(client, rec.events)
    call = _call(client, "foreign")
    # an estimate: open until settle_after, as a stream cut before its usage would be
    assert (call["status"], call["usage_source"], call["cost_usd"]) == ("open", "estimate", "0")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (0, 0)
    assert call["anomalies"] == ["input_unknown", "usage_missing"]


def test_an_error_body_and_an_unopened_upstream_are_recorded_calls(client: TestClient) -> None:
    rec = Recorder()
    meters = Meters(rec)
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    meter = meters.call(
        request_id="err", api_key_id="key_1", model="fake-model", protocol="anthropic.messages"
    )
    response = meter.json(httpx.Response(529, json=error))
    assert response.status_code == 529
    [failed] = rec.of("err", "stream.failed")
    assert (failed["error_type"], failed["output_tokens_generated"]) == ("overloaded_error", 0)
    unopened = meters.call(
        request_id="down", api_key_id="key_1", model="fake-model", protocol="openai.responses"
    )
    unopened.failed(httpx.ConnectError("connection refused"))
    assert rec.kinds("down") == [
        (1, "stream.started"),
        (1, "stream.tokens"),
        (1, "stream.usage"),
        (1, "stream.failed"),
    ]
    [failed] = rec.of("down", "stream.failed")
    assert (failed["error_type"], failed["message"]) == (
        "upstream_disconnect",
        "connection refused",
    )
    _post(client, rec.events)
    for request_id in ("err", "down"):  # each a call of its key (settled once it is due)
        call = _call(client, request_id)
        assert (call["api_key_id"], len(call["events"]), call["output_tokens_billed"]) == (
            "key_1",
            4,
            0,
        )


STREAM = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"content":"Hi"},"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
    b'"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":'
    b'{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_the_usage_chunk_is_hidden_whatever_the_split(size: int) -> None:
    hide = UsageChunkFilter()
    out = b"".join(hide(STREAM[i : i + size]) for i in range(0, len(STREAM), size))
    out += hide.finish()
    usage_block = STREAM.split(b"\n\n")[2] + b"\n\n"
    assert out == STREAM.replace(usage_block, b"")
    tap = open_tap("openai.chat_completions")
    tap.feed(out)
    tap.close()
    assert (tap.usage, tap.output_tokens, tap.stop_reason) == (None, 1, "stop")


def test_what_the_client_asked_for_passes_and_the_gateways_account_does_not() -> None:
    upstream = {
        "Content-Length": "3",
        "Content-Encoding": "gzip",
        "Retry-After": "2",
        "openai-organization": "org-of-the-gateway",
        "anthropic-organization-id": "the-gateway",
        "anthropic-ratelimit-tokens-remaining": "5",
        "request-id": "req_a",
    }
    assert relayed_headers(upstream, "r") == {
        "retry-after": "2",
        "anthropic-ratelimit-tokens-remaining": "5",
        "request-id": "req_a",
        "X-Request-Id": "r",
    }
    other = b'data: {"choices":[],"usage":null}\n\ndata: {"choices":[{"delta":{}}]}\n\n'
    hide = UsageChunkFilter()
    assert hide(other) + hide.finish() == other


async def _aiter(data: bytes) -> Any:
    yield data


def test_the_relay_hides_the_usage_chunk_and_bills_it() -> None:
    rec = Recorder()

    async def run() -> bytes:
        meter = Meters(rec).call(
            request_id="hidden",
            api_key_id="key_1",
            model="fake-model",
            protocol="openai.chat_completions",
        )
        return b"".join([c async for c in meter.relay(_aiter(STREAM), hide_usage=True)])

    out = asyncio.run(run())
    assert b'"usage":{' not in out and out.endswith(b"data: [DONE]\n\n")
    [usage] = rec.of("hidden", "stream.usage")
    assert (usage["source"], usage["input_tokens"], usage["output_tokens"]) == ("upstream", 9, 2)
