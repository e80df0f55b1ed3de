"""The metered stream's events, bounds and retries (billing.gateway), in process: the meter
relays the fake upstream to a client loop here, its events are recorded as the billing client
would queue them, then posted to the real service, which must accept them and bill the call.

CONTRACT "Events" (the lifecycle), "Reconciliation" (billed, delivered), v2 "Usage dimensions"
(``anomalies``: ``drain_skipped``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from billing.client import AsyncBillingClient
from billing.gateway import DrainPolicy, Meters
from billing.taps import open_tap
from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import PATHS, PRICE


class Recorder:
    """Records the events a meter sends (the billing client's ``send``)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def send(self, event: Mapping[str, Any]) -> str:
        self.events.append(dict(event))
        return f"e{len(self.events)}"

    def kinds(self, request_id: str) -> list[tuple[int, str]]:
        return [(e["attempt"], e["type"]) for e in self.events if e["request_id"] == request_id]

    def of(self, request_id: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["request_id"] == request_id and e["type"] == kind]


def _post(client: TestClient, events: list[dict[str, Any]]) -> None:
    """Post the recorded events as a gateway's client would, with ids and times filled in."""
    stamped = []
    for n, event in enumerate(events):
        at = f"2026-01-01T00:00:{n // 1000:02d}.{n % 1000:03d}000Z"
        stamped.append({"event_id": f"evt-{n}", "occurred_at": at, **event})
    answer = client.post("/v1/events", json={"events": stamped})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"accepted": len(events), "duplicates": 0}


def _call(client: TestClient, request_id: str) -> dict[str, Any]:
    assert client.post("/v1/prices", json=PRICE).status_code in (200, 201)
    assert client.post("/v1/reconcile", json={}).status_code == 200
    answer = client.get(f"/v1/calls/{request_id}")
    assert answer.status_code == 200
    call: dict[str, Any] = answer.json()
    return call


async def _consume(
    relay: AsyncIterator[bytes], protocol: str, leave_after: int | None = None
) -> int:
    """Read the relay as a server would; close it (the client left) after ``leave_after``
    output tokens. Returns the tokens read."""
    tap = open_tap(protocol)
    async for chunk in relay:
        tap.feed(chunk)
        if leave_after is not None and tap.output_tokens >= leave_after:
            break
    await relay.aclose()  # type: ignore[attr-defined]
    return tap.output_tokens


def check_full(rec: Recorder, client: TestClient, request_id: str) -> None:
    """A whole stream of 40 output tokens after 9 input, ``progress_every=16``, the default
    drain policy: its events, and the service bills 9 * 2.5e-6 + 40 * 10e-6 USD."""
    assert rec.kinds(request_id) == [
        (1, "stream.started"),
        (1, "stream.tokens"),
        (1, "stream.tokens"),
        (1, "stream.tokens"),
        (1, "stream.usage"),
    ]
    [started] = rec.of(request_id, "stream.started")
    assert started["metadata"] == {
        "billing.drain": "on",
        "billing.drain_max_s": "60",
        "billing.drain_max_tokens": "16384",
        "billing.drain_max_concurrent": "256",
    }
    progress = [(e["output_tokens_generated"]) for e in rec.of(request_id, "stream.tokens")]
    assert progress == [16, 32, 40]
    assert rec.of(request_id, "stream.tokens")[-1]["output_tokens_delivered"] == 40
    [usage] = rec.of(request_id, "stream.usage")
    assert (usage["source"], usage["input_tokens"], usage["output_tokens"]) == ("upstream", 9, 40)
    _post(client, rec.events)
    call = _call(client, request_id)
    assert (call["status"], call["settled"], call["output_tokens_billed"]) == (
        "completed",
        True,
        40,
    )
    assert call["output_tokens_delivered"] == 40 and call["cost_usd"] == "0.0004225"


def check_retried(rec: Recorder, client: TestClient, request_id: str) -> None:
    """A call whose first attempt stalled before its first byte and was retried as a second:
    its events, and the service bills the second attempt's 20 tokens."""
    assert rec.kinds(request_id) == [
        (1, "stream.started"),
        (1, "stream.tokens"),
        (1, "stream.usage"),
        (1, "stream.failed"),
        (2, "stream.started"),
        (2, "stream.tokens"),
        (2, "stream.usage"),
    ]
    [failed] = rec.of(request_id, "stream.failed")
    assert failed["error_type"] == "stalled" and failed["output_tokens_generated"] == 0
    _post(client, rec.events)
    call = _call(client, request_id)
    assert call["attempts"] == 2 and call["output_tokens_billed"] == 20


async def _open(http: httpx.AsyncClient, protocol: str, rid: str, **headers: str) -> httpx.Response:
    body: dict[str, Any] = {"model": "fake-model", "stream": True}
    if protocol == "openai.chat_completions":
        body["stream_options"] = {"include_usage": True}
    request = http.build_request(
        "POST", PATHS[protocol], json=body, headers={"X-Request-Id": rid, **headers}
    )
    return await http.send(request, stream=True)


async def _settled(meters: Meters, timeout: float = 10) -> None:
    assert await meters.wait_drains(timeout)


def _meter(meters: Meters, rid: str, protocol: str = "anthropic.messages") -> Any:
    return meters.call(request_id=rid, api_key_id="key_1", model="fake-model", protocol=protocol)


@pytest.mark.parametrize("protocol", list(PATHS))
def test_a_full_stream_sends_started_progress_and_the_upstream_usage(
    protocol: str, client: TestClient
) -> None:
    rec = Recorder()

    async def run() -> int:
        meters = Meters(rec, progress_every=16)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            upstream = await _open(http, protocol, "full")
            return await _consume(_meter(meters, "full", protocol).relay(upstream), protocol)

    with FakeUpstream(total=40, delay_s=0.001, input_tokens=9) as fake:
        read = asyncio.run(run())
    assert read == 40
    check_full(rec, client, "full")


def test_the_drain_reads_the_provider_usage_after_the_client_left(client: TestClient) -> None:
    rec = Recorder()

    async def run() -> int:
        meters = Meters(rec, progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            upstream = await _open(http, "openai.chat_completions", "left")
            read = await _consume(
                _meter(meters, "left", "openai.chat_completions").relay(upstream),
                "openai.chat_completions",
                leave_after=5,
            )
            assert meters.drains_running == 1
            await _settled(meters)
            return read

    with FakeUpstream(total=60, delay_s=0.003) as fake:
        read = asyncio.run(run())
        assert fake.generated("left") == 60
    [left] = rec.of("left", "stream.client_disconnected")
    assert left["output_tokens_delivered"] in (read - 1, read)  # the last chunk: not yet asked for
    [usage] = rec.of("left", "stream.usage")
    assert usage["source"] == "upstream" and usage["output_tokens"] == 60
    assert "anomalies" not in usage
    _post(client, rec.events)
    call = _call(client, "left")
    assert call["status"] == "client_disconnected" and call["output_tokens_billed"] == 60
    assert call["output_tokens_undelivered"] == 60 - left["output_tokens_delivered"]


@pytest.mark.parametrize(
    ("policy", "most"),
    [
        (DrainPolicy(max_seconds=0.3), 40),  # ~0.3 s at 100 tokens/s after leaving at 5
        (DrainPolicy(max_tokens=10), 16),  # 5 + 10, cut at the first token past the bound
    ],
    ids=["time", "tokens"],
)
def test_a_drain_past_its_bound_is_cut_and_flagged(
    policy: DrainPolicy, most: int, client: TestClient
) -> None:
    rec = Recorder()

    async def run() -> float:
        meters = Meters(rec, drain=policy, progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            upstream = await _open(http, "anthropic.messages", "cut")
            await _consume(
                _meter(meters, "cut").relay(upstream), "anthropic.messages", leave_after=5
            )
            start = time.monotonic()
            await _settled(meters)
            return time.monotonic() - start

    with FakeUpstream(total=400, delay_s=0.01) as fake:
        took = asyncio.run(run())
    assert took < 2.0
    [usage] = rec.of("cut", "stream.usage")
    assert usage["source"] == "estimate" and usage["anomalies"] == ["drain_skipped"]
    assert 5 <= usage["output_tokens"] <= most
    assert usage["input_tokens"] == 12  # Anthropic's message_start reported the input
    _post(client, rec.events)
    call = _call(client, "cut")
    assert "drain_skipped" in call["anomalies"]
    assert call["output_tokens_billed"] == usage["output_tokens"]


def test_past_the_concurrent_drains_the_upstream_is_cancelled_at_once() -> None:
    rec = Recorder()

    async def run() -> None:
        meters = Meters(rec, drain=DrainPolicy(max_concurrent=1), progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            first = await _open(http, "openai.responses", "first")
            second = await _open(http, "openai.responses", "second")
            await _consume(
                _meter(meters, "first", "openai.responses").relay(first),
                "openai.responses",
                leave_after=3,
            )
            await _consume(
                _meter(meters, "second", "openai.responses").relay(second),
                "openai.responses",
                leave_after=3,
            )
            await asyncio.sleep(0.05)
            assert rec.of("second", "stream.usage") and not rec.of("first", "stream.usage")
            await _settled(meters)

    with FakeUpstream(total=50, delay_s=0.005) as fake:
        asyncio.run(run())
    [first] = rec.of("first", "stream.usage")
    [second] = rec.of("second", "stream.usage")
    assert first["source"] == "upstream" and first["output_tokens"] == 50
    assert second["source"] == "estimate" and second["anomalies"] == ["drain_skipped"]
    assert 3 <= second["output_tokens"] < 50


def test_a_stalled_upstream_is_retried_as_a_second_attempt(client: TestClient) -> None:
    rec = Recorder()

    async def run() -> int:
        meters = Meters(rec, stall_timeout_s=0.3, progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            stalled = await _open(
                http, "anthropic.messages", "retry", **{"X-Fake-Stall-After": "0"}
            )

            async def again() -> httpx.Response:
                return await _open(http, "anthropic.messages", "retry")

            meter = _meter(meters, "retry")
            return await _consume(meter.relay(stalled, retry=again), "anthropic.messages")

    with FakeUpstream(total=20, delay_s=0.001) as fake:
        start = time.monotonic()
        read = asyncio.run(run())
        assert time.monotonic() - start < 3  # the stall timeout (0.3 s), not httpx's (5 s)
        assert [g.generated for g in fake.records["retry"]] == [0, 20]
    assert read == 20
    check_retried(rec, client, "retry")


def test_a_stall_after_bytes_reached_the_client_ends_the_stream_without_retry() -> None:
    rec = Recorder()
    opened: list[int] = []

    async def run() -> int:
        meters = Meters(rec, stall_timeout_s=0.3, progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            stalled = await _open(
                http, "openai.chat_completions", "mid", **{"X-Fake-Stall-After": "4"}
            )

            async def again() -> httpx.Response:
                opened.append(1)
                return await _open(http, "openai.chat_completions", "mid")

            meter = _meter(meters, "mid", "openai.chat_completions")
            return await _consume(meter.relay(stalled, retry=again), "openai.chat_completions")

    with FakeUpstream(total=20, delay_s=0.001) as fake:
        assert asyncio.run(run()) == 4
    assert opened == []
    [failed] = rec.of("mid", "stream.failed")
    assert failed["error_type"] == "stalled" and failed["output_tokens_generated"] == 4
    [usage] = rec.of("mid", "stream.usage")
    assert usage["source"] == "estimate" and usage["output_tokens"] == 4


def test_a_broken_upstream_is_a_failed_attempt_with_an_estimate() -> None:
    rec = Recorder()
    frames = FakeUpstream.frames("openai.chat_completions", total=10)

    async def broken() -> AsyncIterator[bytes]:
        for frame in frames[:6]:  # the role chunk and 5 content chunks
            yield frame
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")

    async def run() -> int:
        meters = Meters(rec)
        meter = _meter(meters, "broken", "openai.chat_completions")
        return await _consume(meter.relay(broken()), "openai.chat_completions")

    assert asyncio.run(run()) == 5
    [failed] = rec.of("broken", "stream.failed")
    assert failed["error_type"] == "upstream_disconnect"
    assert "peer closed" in failed["message"]
    [usage] = rec.of("broken", "stream.usage")
    assert (usage["source"], usage["output_tokens"]) == ("estimate", 5)


@pytest.mark.parametrize("drain", [True, False])
def test_the_sync_relay_drains_in_a_thread_or_cancels(drain: bool) -> None:
    rec = Recorder()
    meters = Meters(rec, drain=DrainPolicy(enabled=drain), progress_every=1000)
    with FakeUpstream(total=40, delay_s=0.003) as fake, httpx.Client(base_url=fake.url) as http:
        body = {"model": "fake-model", "stream": True}
        request = http.build_request(
            "POST", "/v1/responses", json=body, headers={"X-Request-Id": "sync"}
        )
        upstream = http.send(request, stream=True)
        relay = _meter(meters, "sync", "openai.responses").relay_sync(upstream)
        tap = open_tap("openai.responses")
        for chunk in relay:
            tap.feed(chunk)
            if tap.output_tokens >= 6:
                break
        relay.close()  # what a WSGI server does when the client is gone
        assert meters.slots.wait_idle(10)
        fake.wait_finished(["sync"])
    [left] = rec.of("sync", "stream.client_disconnected")
    assert left["output_tokens_delivered"] == 5  # the 6th chunk was read but not asked past
    [usage] = rec.of("sync", "stream.usage")
    if drain:
        assert usage["source"] == "upstream" and usage["output_tokens"] == 40
    else:
        assert usage["source"] == "estimate" and usage["anomalies"] == ["drain_skipped"]
        assert usage["output_tokens"] == 6


def test_a_slow_client_is_not_a_stalled_upstream() -> None:
    """The upstream is fast and the client pauses longer than the stall timeout, with the
    read-ahead full: the pump waits for the client, which is no stall of the upstream."""
    rec = Recorder()

    async def run() -> int:
        meters = Meters(rec, stall_timeout_s=0.3, progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            upstream = await _open(http, "openai.chat_completions", "slow")
            relay = _meter(meters, "slow", "openai.chat_completions").relay(upstream)
            tap = open_tap("openai.chat_completions")
            async for chunk in relay:
                tap.feed(chunk)
                if tap.output_tokens == 1:
                    await asyncio.sleep(0.8)  # the pump fills its read-ahead meanwhile
            return tap.output_tokens

    with FakeUpstream(total=150, delay_s=0) as fake:
        assert asyncio.run(run()) == 150
    assert rec.of("slow", "stream.failed") == []
    [usage] = rec.of("slow", "stream.usage")
    assert (usage["source"], usage["output_tokens"]) == ("upstream", 150)


def test_a_drain_that_reads_outlasts_the_stall_timeout() -> None:
    """The stall timeout bounds a silent upstream, not a drain that still reads: the drain goes
    on to the provider's usage (its own bound is max_seconds)."""
    rec = Recorder()

    async def run() -> None:
        meters = Meters(rec, stall_timeout_s=0.3, progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            upstream = await _open(http, "openai.chat_completions", "long")
            await _consume(
                _meter(meters, "long", "openai.chat_completions").relay(upstream),
                "openai.chat_completions",
                leave_after=3,
            )
            await _settled(meters)

    with FakeUpstream(total=60, delay_s=0.02) as fake:  # 1.2 s of upstream, 4 stall timeouts
        asyncio.run(run())
    [usage] = rec.of("long", "stream.usage")
    assert (usage["source"], usage["output_tokens"]) == ("upstream", 60)
    assert "anomalies" not in usage


def test_a_closed_billing_client_costs_the_drain_nothing_but_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Shut down with a drain still running: the events the closed client refuses are logged
    at WARNING; the drain ends, gives back its slot and closes the upstream."""
    billing = AsyncBillingClient("http://127.0.0.1:9", token=None, spool_path=None)
    upstreams: list[httpx.Response] = []

    async def run() -> None:
        meters = Meters(billing, progress_every=1000)
        async with httpx.AsyncClient(base_url=fake.url) as http:
            upstream = await _open(http, "anthropic.messages", "closed")
            upstreams.append(upstream)
            await _consume(
                _meter(meters, "closed").relay(upstream), "anthropic.messages", leave_after=3
            )
            assert meters.drains_running == 1
            await billing.close(timeout=0.1)
            assert await meters.wait_drains(5)  # the slot is back

    with (
        caplog.at_level(logging.WARNING, logger="billing.gateway"),
        FakeUpstream(total=30, delay_s=0.01) as fake,
    ):
        asyncio.run(run())
    assert upstreams[0].is_closed
    refused = [r for r in caplog.records if r.name == "billing.gateway"]
    assert refused and all("closed" in r.getMessage() for r in refused)
    assert any(r.getMessage().startswith("stream.usage of call closed") for r in refused)
