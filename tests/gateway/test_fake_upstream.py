"""The fake upstream speaks each protocol as the taps read it, and keeps generating after its
client leaves (what the gateway tests compare billing against)."""

from __future__ import annotations

import httpx
import pytest

from billing.taps import open_tap
from tests.fakes.upstream import FakeUpstream

pytestmark = pytest.mark.nodb

PATHS = {
    "openai.chat_completions": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
}


def _body(protocol: str) -> dict[str, object]:
    body: dict[str, object] = {"model": "m-1", "stream": True, "messages": []}
    if protocol == "openai.chat_completions":
        body["stream_options"] = {"include_usage": True}
    return body


@pytest.mark.parametrize("protocol", list(PATHS))
def test_full_stream_reports_the_generated_usage(protocol: str) -> None:
    with FakeUpstream(total=23, tokens_per_chunk=2, delay_s=0) as fake:
        tap = open_tap(protocol)
        with httpx.stream(
            "POST",
            fake.url + PATHS[protocol],
            json=_body(protocol),
            headers={"X-Request-Id": "r1", "X-Fake-Input": "7"},
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for chunk in response.iter_raw():
                tap.feed(chunk)
        tap.close()
        fake.wait_finished(["r1"])
        assert fake.generated("r1") == 23
    assert tap.usage is not None and tap.usage_is_final
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (7, 23)
    assert tap.content_deltas == 12  # 11 chunks of 2 tokens and one of 1
    assert tap.error is None and tap.malformed_events == 0


def test_chat_completions_without_include_usage_has_no_usage() -> None:
    with FakeUpstream(total=5, delay_s=0) as fake:
        tap = open_tap("openai.chat_completions")
        body = {"model": "m", "stream": True}
        with httpx.stream("POST", fake.url + "/v1/chat/completions", json=body) as response:
            for chunk in response.iter_raw():
                tap.feed(chunk)
        tap.close()
    assert tap.usage is None and tap.output_tokens == 5 and tap.done


@pytest.mark.parametrize("protocol", list(PATHS))
def test_generation_goes_on_after_the_client_leaves(protocol: str) -> None:
    with FakeUpstream(total=200, delay_s=0.002) as fake:
        tap = open_tap(protocol)
        with httpx.stream(
            "POST", fake.url + PATHS[protocol], json=_body(protocol), headers={"X-Request-Id": "r2"}
        ) as response:
            for chunk in response.iter_raw():
                tap.feed(chunk)
                if tap.output_tokens >= 10:
                    break
        fake.wait_finished(["r2"])
        [gen] = fake.records["r2"]
        assert gen.generated == 200 and gen.client_left
    assert 10 <= tap.output_tokens < 200


def test_a_stalled_upstream_stops_sending_and_the_retry_is_a_second_record() -> None:
    with FakeUpstream(total=30, delay_s=0) as fake:
        url = fake.url + "/v1/messages"
        headers = {"X-Request-Id": "r3", "X-Fake-Stall-After": "4"}
        with (
            pytest.raises(httpx.ReadTimeout),
            httpx.stream(
                "POST",
                url,
                json=_body("anthropic.messages"),
                headers=headers,
                timeout=httpx.Timeout(5, read=0.3),
            ) as response,
        ):
            for _ in response.iter_raw():
                pass
        with httpx.stream(
            "POST", url, json=_body("anthropic.messages"), headers={"X-Request-Id": "r3"}
        ) as response:
            response.read()
        fake.wait_finished(["r3"])
        assert [g.generated for g in fake.records["r3"]] == [4, 30]
        assert fake.generated("r3") == 34
