"""The example gateway (``examples/fastapi_gateway.py``, uvicorn in its own process) driven by
the real ``openai`` SDK, in front of the fake upstream on 127.0.0.1 (issue 41): no upstream
call without a call record, what the client did not ask for is billed but not sent, and the
call's id reaches the client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import billing_server, example_gateway, wait_calls

MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.mark.slow  # a gateway process
def test_the_openai_sdk_through_the_example_gateway(db_url: str, tmp_path: Path) -> None:
    with (
        FakeUpstream(total=12, delay_s=0.001, input_tokens=5) as fake,
        billing_server(db_url) as billing,
        example_gateway(fake.url, billing, env={"XDG_CACHE_HOME": str(tmp_path)}) as url,
    ):
        anonymous = openai.OpenAI(base_url=url + "/v1", api_key="sk-unused", max_retries=3)
        with pytest.raises(openai.BadRequestError) as refused:
            anonymous.chat.completions.create(model="fake-model", messages=MESSAGES)  # type: ignore[arg-type]
        assert refused.value.status_code == 400
        keyed = anonymous.with_options(default_headers={"X-Api-Key-Id": "key_sdk"})
        with pytest.raises(openai.BadRequestError):
            keyed.chat.completions.create(model="", messages=MESSAGES)  # type: ignore[arg-type]
        chat = url + "/v1/chat/completions"
        for bad in (
            b"not json",
            b"[1, 2]",
            b'{"model": "fake-model", "stream_options": "x"}',
            b'{"model": 5, "stream": true}',
            b'{"model": "fake-model", "stream": "true"}',
        ):
            answer = httpx.post(chat, content=bad, headers={"X-Api-Key-Id": "key_sdk"})
            assert answer.status_code == 400, (bad, answer.text)
            assert answer.json()["error"]["type"] == "invalid_request_error"
        for key in ("k" * 300, "key\tsdk"):  # ids stream.started would refuse: the meter's 400
            with pytest.raises(openai.BadRequestError) as refused:
                anonymous.with_options(
                    default_headers={"X-Api-Key-Id": key}
                ).chat.completions.create(
                    model="fake-model",
                    messages=MESSAGES,  # type: ignore[arg-type]
                )
            assert refused.value.status_code == 400
        assert fake.records == {}  # nothing was sent upstream, retries included

        raw = keyed.chat.completions.with_raw_response.create(
            model="fake-model",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_headers={"X-Request-Id": "sdk-same"},  # the client's id: metadata only
        )
        quiet_id = raw.headers["x-request-id"]  # the call's id, the gateway's own
        assert quiet_id.startswith("gw-") and len(quiet_id) == 35
        assert raw.headers["x-upstream-request-id"] == f"req_{quiet_id}"
        assert raw.headers["x-ratelimit-remaining-requests"] == "99"
        quiet = list(raw.parse())
        assert [c.usage for c in quiet] == [None] * len(quiet)
        assert all(c.choices for c in quiet)  # no usage chunk (choices: []) reached the client
        assert "".join(c.choices[0].delta.content or "" for c in quiet) == " t" * 12

        asked_stream = keyed.chat.completions.create(
            model="fake-model",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Request-Id": "sdk-same"},  # reused: still a call of its own
        )
        asked_id = asked_stream.response.headers["x-request-id"]
        asked = list(asked_stream)
        assert asked_id.startswith("gw-") and asked_id != quiet_id
        assert asked[-1].choices == [] and asked[-1].usage is not None
        assert (asked[-1].usage.prompt_tokens, asked[-1].usage.completion_tokens) == (5, 12)

        whole = keyed.chat.completions.create(model="fake-model", messages=MESSAGES)  # type: ignore[arg-type]
        assert whole.usage is not None and whole.usage.completion_tokens == 12
        assert whole.choices[0].message.content == " t" * 12
        whole_id = whole._request_id  # the SDK reads X-Request-Id: the call's id
        assert whole_id is not None and whole_id.startswith("gw-")

        ids = [quiet_id, asked_id, whole_id]
        calls = asyncio.run(wait_calls(billing, ids))
        answer = httpx.get(
            f"{billing.url}/v1/calls?api_key_id=key_sdk",
            headers={"Authorization": f"Bearer {billing.admin_token}"},
        )
        assert answer.status_code == 200
        assert sorted(c["request_id"] for c in answer.json()["data"]) == sorted(ids)
    for request_id in ids:
        call = calls[request_id]
        assert (call["usage_source"], call["input_tokens"], call["output_tokens_billed"]) == (
            "upstream",
            5,
            12,
        )
        assert (call["status"], call["output_tokens_delivered"]) == ("completed", 12)
        assert call["api_key_id"] == "key_sdk"
    same = [calls[rid]["metadata"].get("client_request_id") for rid in ids]
    assert same == ["sdk-same", "sdk-same", None]
    assert [len(fake.records[rid]) for rid in ids] == [1, 1, 1]
