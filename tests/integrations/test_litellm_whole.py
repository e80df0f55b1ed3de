"""The LiteLLM callback and a NON-streamed call (CONTRACT "Non-streaming calls, hosted-tool
fees, provider-reported cost (v3)"): real ``litellm.acompletion`` against the fake upstream on
127.0.0.1, the callback registered in ``litellm.callbacks``, its events posted to the real
service; and a request it cannot attribute refused before LiteLLM calls the upstream."""

from __future__ import annotations

import asyncio
import os
import re
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.extras import import_or_skip

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price map fetch at import
litellm = import_or_skip("litellm", "needs the billing[litellm] extra")

from fastapi import HTTPException  # noqa: E402

from billing.client import BillingClient  # noqa: E402
from billing.integrations.litellm import BillingCallback  # noqa: E402
from billing.integrations.litellm.reading import whole_usage  # noqa: E402
from tests.conftest import LiveServer  # noqa: E402
from tests.fakes.upstream import FakeUpstream  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say hi"}]


def test_a_non_streamed_call_is_billed_the_upstream_usage(
    live_server: LiveServer, http: httpx.Client
) -> None:
    client = BillingClient(live_server.url, spool_path=None, flush_interval_s=0.05)
    callback = BillingCallback(client)
    saved = list(litellm.callbacks)
    litellm.callbacks = [callback]
    try:
        with FakeUpstream(total=14, input_tokens=6) as fake:

            async def run() -> Any:
                response = await litellm.acompletion(
                    model="openai/fake-model",
                    api_base=fake.url + "/v1",
                    api_key="sk-fake-upstream",
                    messages=MESSAGES,
                    litellm_call_id="ll-whole-1",
                )
                deadline = time.monotonic() + 10
                while True:  # LiteLLM logs the success in a task of the loop
                    await asyncio.to_thread(client.flush, 5)
                    listed = await asyncio.to_thread(http.get, "/v1/calls")
                    ids = [c["request_id"] for c in listed.json()["data"]]
                    if ids:
                        answer = await asyncio.to_thread(http.get, f"/v1/calls/{ids[0]}")
                        if len(answer.json()["events"]) == 3:
                            return response, ids
                    assert time.monotonic() < deadline, listed.text
                    await asyncio.sleep(0.1)

            response, ids = asyncio.run(run())
            assert response.choices[0].message.content == " t" * 14
            assert len(fake.records) == 1
    finally:
        litellm.callbacks = saved
        client.close(1)
    assert http.post("/v1/reconcile", json={}).status_code == 200
    # Without LiteLLM's proxy (no pre-call hook) the call gets its id at the logging hook: the
    # callback's own, never LiteLLM's litellm_call_id, which is kept as metadata.
    assert len(ids) == 1 and re.fullmatch(r"llm-[0-9a-f]{32}", ids[0]), ids
    call = http.get(f"/v1/calls/{ids[0]}").json()
    assert call["metadata"]["litellm_call_id"] == "ll-whole-1"
    assert [e["type"] for e in call["events"]] == [
        "stream.started",
        "stream.tokens",
        "stream.usage",
    ]
    usage = call["events"][2]
    assert (usage["source"], usage["input_tokens"], usage["output_tokens"]) == ("upstream", 6, 14)
    assert (call["output_tokens_billed"], call["output_tokens_delivered"]) == (14, 14)
    assert call["api_key_id"] == "litellm"


def test_a_whole_response_is_read_by_the_taps_rules() -> None:
    response = litellm.ModelResponse(
        model="fake-model",
        choices=[{"index": 0, "message": {"role": "assistant", "content": "Hi"}}],
        usage=litellm.Usage(
            prompt_tokens=100,
            completion_tokens=9,
            total_tokens=109,
            prompt_tokens_details={"cached_tokens": 60},
        ),
    )
    fields = whole_usage(response, "openai.chat_completions")
    assert fields is not None
    assert {k: fields[k] for k in ("input_tokens", "cache_read_input_tokens", "output_tokens")} == {
        "input_tokens": 40,
        "cache_read_input_tokens": 60,
        "output_tokens": 9,
    }
    message: dict[str, Any] = {
        "type": "message",
        "model": "claude-x",
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 5,
            "output_tokens": 3,
            "server_tool_use": {"web_search_requests": 2, "web_fetch_requests": 1},
        },
    }
    fields = whole_usage(message, "anthropic.messages")
    assert fields is not None
    assert (fields["units"], fields["counters"]) == (
        {"web_search_requests": 2},
        {"web_fetch_requests": 1},
    )
    assert whole_usage(object(), "anthropic.messages") is None


@pytest.mark.nodb
def test_an_unattributable_request_is_refused_before_the_upstream() -> None:
    strict = BillingCallback(
        BillingClient("http://127.0.0.1:9", spool_path=None), default_api_key_id=None
    )
    anonymous = SimpleNamespace(key_alias=None, token=None, request_route="/v1/chat/completions")
    keyed = SimpleNamespace(key_alias="team-a", token="hash", request_route="/v1/chat/completions")
    with pytest.raises(HTTPException) as refused:
        asyncio.run(strict.async_pre_call_hook(anonymous, None, {"model": "m"}, "completion"))
    assert refused.value.status_code == 400
    with pytest.raises(HTTPException) as refused:
        asyncio.run(strict.async_pre_call_hook(keyed, None, {"messages": []}, "completion"))
    assert refused.value.status_code == 400
    data = {"model": "m", "messages": []}
    assert asyncio.run(strict.async_pre_call_hook(keyed, None, data, "completion")) is data
    lenient = BillingCallback(BillingClient("http://127.0.0.1:9", spool_path=None))
    assert asyncio.run(lenient.async_pre_call_hook(anonymous, None, data, "completion")) is data
    # The call's id is the callback's own, in the request's LiteLLM metadata: a client's value
    # under that key is replaced; on a route with litellm_metadata (/v1/messages, /v1/responses)
    # it goes there, the provider's own metadata untouched (LiteLLM sends that upstream).
    forged = {"model": "m", "litellm_call_id": "mine", "metadata": {"billing_call_id": "mine"}}
    asyncio.run(lenient.async_pre_call_hook(keyed, None, forged, "completion"))
    assert re.fullmatch(r"llm-[0-9a-f]{32}", forged["metadata"]["billing_call_id"]), forged
    messages = {"model": "m", "metadata": {"user_id": "u"}, "litellm_metadata": {}}
    asyncio.run(lenient.async_pre_call_hook(keyed, None, messages, "anthropic_messages"))
    assert messages["metadata"] == {"user_id": "u"}
    assert re.fullmatch(r"llm-[0-9a-f]{32}", messages["litellm_metadata"]["billing_call_id"])
    assert messages["litellm_metadata"] != forged["metadata"]
    strict.client.close(0.1)
    lenient.client.close(0.1)
