"""``Meter.response``, the metered stream as an ASGI response (billing.gateway): a real uvicorn
server in this process serves a small gateway app in front of the fake upstream; a real HTTP
client reads it (or leaves); the meter's events are recorded as the billing client would queue
them, then posted to the real service, which must bill the call.

CONTRACT "Events" (the lifecycle), "Reconciliation" (billed, delivered), v2 "Usage dimensions"
(``anomalies``: ``drain_skipped``). The same rules as ``Meter.relay`` (test_meter.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from starlette.responses import Response

from billing.gateway import DrainPolicy, Meters
from billing.taps import open_tap
from tests.conftest import LiveServer
from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import PATHS
from tests.gateway.test_meter import Recorder, _call, _post, check_full, check_retried


@contextmanager
def gateway(upstream: str, meters: Meters) -> Iterator[str]:
    """A gateway app for the three protocols' paths, each returning ``meter.response``; the
    fake upstream's ``X-Fake-*`` headers are passed on; ``X-Retry: 1`` gives the meter a
    ``retry`` that opens the upstream again (without the stall)."""
    app = FastAPI()
    http = httpx.AsyncClient(base_url=upstream, timeout=30)

    def route(protocol: str) -> None:
        async def relay(request: Request) -> Response:
            body = await request.json()
            meter = meters.call(  # the call's id is the gateway's own (meter.request_id)
                api_key_id="key_1",
                model="fake-model",
                protocol=protocol,
                client_request_id=request.headers.get("x-request-id"),
            )
            headers = {k: v for k, v in request.headers.items() if k.startswith("x-fake-")}
            headers["X-Request-Id"] = meter.request_id

            async def open_(headers: dict[str, str]) -> httpx.Response:
                built = http.build_request("POST", PATHS[protocol], json=body, headers=headers)
                return await http.send(built, stream=True)

            async def again() -> httpx.Response:
                return await open_({k: v for k, v in headers.items() if k != "x-fake-stall-after"})

            upstream = await open_(headers)
            retry = again if request.headers.get("x-retry") == "1" else None
            return meter.response(upstream, retry=retry, headers={"X-Metered": "1"})

        app.post(PATHS[protocol])(relay)

    for protocol in PATHS:
        route(protocol)
    with LiveServer(app) as server:
        yield server.url


def _body(protocol: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake-model", "stream": True}
    if protocol == "openai.chat_completions":
        body["stream_options"] = {"include_usage": True}
    return body


async def _read(
    url: str, protocol: str, rid: str | None, *, leave_after: int | None = None, **headers: str
) -> tuple[int, bytes, httpx.Headers]:
    """One call through the gateway: (output tokens read by the tap, the bytes, the headers:
    its ``x-request-id`` is the call's id); ``rid`` is the client's own X-Request-Id (the
    call's metadata only); the client closes the connection once ``leave_after`` tokens were
    read."""
    tap = open_tap(protocol)
    read = b""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with (
        httpx.AsyncClient(timeout=30, limits=limits) as http,
        http.stream(
            "POST",
            url + PATHS[protocol],
            json=_body(protocol),
            headers={**headers, **({} if rid is None else {"X-Request-Id": rid})},
        ) as response,
    ):
        assert response.status_code == 200
        async for chunk in response.aiter_raw():
            read += chunk
            tap.feed(chunk)
            if leave_after is not None and tap.output_tokens >= leave_after:
                break
        return tap.output_tokens, read, response.headers


@pytest.mark.parametrize("protocol", list(PATHS))
def test_the_response_relays_every_byte_and_sends_the_upstream_usage(
    protocol: str, client: TestClient
) -> None:
    rec = Recorder()
    meters = Meters(rec, progress_every=16)
    with (
        FakeUpstream(total=40, delay_s=0.001, input_tokens=9) as fake,
        gateway(fake.url, meters) as url,
    ):
        read, body, headers = asyncio.run(_read(url, protocol, None))
        frames = FakeUpstream.frames(protocol, total=40, input_tokens=9)
    rid = headers["x-request-id"]  # the call's id: the gateway's own
    assert rid.startswith("gw-")
    assert read == 40
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["x-metered"] == "1" and "content-length" not in headers
    # the same frames as the fake's (its ids and times differ by call: compare their count)
    assert body.count(b"\n\n") == sum(frame.count(b"\n\n") for frame in frames)
    check_full(rec, client, rid)


@pytest.mark.parametrize("drain", [True, False], ids=["drain", "no-drain"])
def test_a_client_that_leaves_is_drained_or_flagged(drain: bool, client: TestClient) -> None:
    rec = Recorder()
    meters = Meters(rec, drain=DrainPolicy(enabled=drain), progress_every=1000)
    protocol = "openai.chat_completions"
    with FakeUpstream(total=80, delay_s=0.01) as fake, gateway(fake.url, meters) as url:
        read, _, head = asyncio.run(_read(url, protocol, "left", leave_after=6))
        rid = head["x-request-id"]  # the call's id
        fake.wait_finished([rid])
        assert asyncio.run(meters.wait_drains(10))
        generated = fake.generated(rid)  # the fake model goes on, as a provider does
    assert generated == 80
    [left] = rec.of(rid, "stream.client_disconnected")
    # a chunk counts once the server wrote it: the client may not have read the last one
    assert read <= left["output_tokens_delivered"] <= read + 1
    [usage] = rec.of(rid, "stream.usage")
    if drain:
        assert (usage["source"], usage["output_tokens"]) == ("upstream", 80)
        assert "anomalies" not in usage
    else:
        # the upstream was cancelled at the disconnect: billed what the gateway had counted
        assert (usage["source"], usage["anomalies"]) == ("estimate", ["drain_skipped"])
        assert left["output_tokens_delivered"] <= usage["output_tokens"] < 80
    _post(client, rec.events)
    call = _call(client, rid)
    assert call["metadata"]["client_request_id"] == "left"
    # an estimate settles only once the call is quiet (settle_after_s): its figures show now
    assert call["status"] == ("client_disconnected" if drain else "open")
    assert call["output_tokens_billed"] == usage["output_tokens"]
    assert call["output_tokens_delivered"] == left["output_tokens_delivered"]
    assert (
        call["output_tokens_undelivered"]
        == usage["output_tokens"] - left["output_tokens_delivered"]
    )
    assert ("drain_skipped" in call["anomalies"]) is not drain


def test_a_stalled_upstream_is_retried_as_a_second_attempt(client: TestClient) -> None:
    rec = Recorder()
    meters = Meters(rec, stall_timeout_s=0.3, progress_every=1000)
    protocol = "anthropic.messages"
    with FakeUpstream(total=20, delay_s=0.001) as fake, gateway(fake.url, meters) as url:
        read, _, head = asyncio.run(
            _read(url, protocol, "retry", **{"X-Fake-Stall-After": "0", "X-Retry": "1"})
        )
        rid = head["x-request-id"]  # the call's id, the same for both attempts
        assert [g.generated for g in fake.records[rid]] == [0, 20]
    assert read == 20
    check_retried(rec, client, rid)


def test_a_stall_after_bytes_reached_the_client_ends_its_stream() -> None:
    rec = Recorder()
    meters = Meters(rec, stall_timeout_s=0.3, progress_every=1000)
    protocol = "openai.responses"
    with FakeUpstream(total=20, delay_s=0.001) as fake, gateway(fake.url, meters) as url:
        read, _, head = asyncio.run(
            _read(url, protocol, "mid", **{"X-Fake-Stall-After": "4", "X-Retry": "1"})
        )
        rid = head["x-request-id"]  # the call's id
        assert len(fake.records[rid]) == 1  # no retry once the client had bytes
    assert read == 4
    [failed] = rec.of(rid, "stream.failed")
    assert failed["error_type"] == "stalled" and failed["output_tokens_generated"] == 4
    [usage] = rec.of(rid, "stream.usage")
    assert (usage["source"], usage["output_tokens"]) == ("estimate", 4)


def test_a_write_that_fails_is_the_disconnect() -> None:
    """An ASGI 2.4 server raises ``OSError`` from ``send`` for a gone client (and may never
    say ``http.disconnect``): the meter counts what was written before, and drains."""
    rec = Recorder()
    meters = Meters(rec, progress_every=1000)
    protocol = "anthropic.messages"
    written: list[bytes] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body" and len(written) == 5:
            raise OSError("broken pipe")
        written.append(message.get("body", b""))

    async def receive() -> Any:
        await asyncio.Event().wait()  # never a disconnect

    async def run() -> None:
        async with httpx.AsyncClient(base_url=fake.url) as http:
            built = http.build_request(
                "POST", PATHS[protocol], json=_body(protocol), headers={"X-Request-Id": "pipe"}
            )
            upstream = await http.send(built, stream=True)
            meter = meters.call(
                request_id="pipe", api_key_id="key_1", model="fake-model", protocol=protocol
            )
            response = meter.response(upstream)
            # the response ends (the pump goes on, as the drain)
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
            assert await meters.wait_drains(10)

    with FakeUpstream(total=30, delay_s=0.002) as fake:
        asyncio.run(run())
        assert fake.generated("pipe") == 30
    tap = open_tap(protocol)
    for body in written[1:]:  # after the head
        tap.feed(body)
    [left] = rec.of("pipe", "stream.client_disconnected")
    assert left["output_tokens_delivered"] == tap.output_tokens
    [usage] = rec.of("pipe", "stream.usage")
    assert (usage["source"], usage["output_tokens"]) == ("upstream", 30)


def _asgi_upstream_call(fake_url: str, meters: Meters, rid: str, send: Any, receive: Any) -> Any:
    """Serve one ``meter.response`` of Anthropic Messages with a hand-made ASGI server's
    ``send`` and ``receive`` (what uvicorn cannot be made to do)."""

    async def run() -> None:
        protocol = "anthropic.messages"
        async with httpx.AsyncClient(base_url=fake_url) as http:
            built = http.build_request(
                "POST", PATHS[protocol], json=_body(protocol), headers={"X-Request-Id": rid}
            )
            upstream = await http.send(built, stream=True)
            meter = meters.call(
                request_id=rid, api_key_id="key_1", model="fake-model", protocol=protocol
            )
            with suppress(OSError):  # a failed head is raised on, as the server's
                await meter.response(upstream)({"type": "http"}, receive, send)
            assert await meters.wait_drains(10)
            assert meters.drains_running == 0

    return run()


def test_a_disconnect_seen_twice_takes_one_drain_slot() -> None:
    """``http.disconnect`` first, then the write that was waiting fails: one disconnect, one
    drain (a second would take a slot it never gives back, or, with one slot, skip a drain)."""
    rec = Recorder()
    meters = Meters(rec, drain=DrainPolicy(max_concurrent=1), progress_every=1000)
    bodies = 0
    blocked = asyncio.Event()
    fail = asyncio.Event()

    async def send(message: Any) -> None:
        nonlocal bodies
        if message["type"] != "http.response.body":
            return
        bodies += 1
        if bodies == 4:  # blocked on the client (the disconnect comes meanwhile), then broken
            blocked.set()
            await fail.wait()
            raise OSError("broken pipe")

    async def receive() -> Any:
        await blocked.wait()
        asyncio.get_running_loop().call_later(0.05, fail.set)
        return {"type": "http.disconnect"}

    with FakeUpstream(total=40, delay_s=0.005) as fake:
        asyncio.run(_asgi_upstream_call(fake.url, meters, "twice", send, receive))
    assert len(rec.of("twice", "stream.client_disconnected")) == 1
    [usage] = rec.of("twice", "stream.usage")
    assert (usage["source"], usage["output_tokens"]) == ("upstream", 40)


def test_a_client_gone_before_the_head_is_drained() -> None:
    rec = Recorder()
    meters = Meters(rec, progress_every=1000)

    async def send(message: Any) -> None:
        raise OSError("the client is gone")

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    with FakeUpstream(total=20, delay_s=0.002) as fake:
        asyncio.run(_asgi_upstream_call(fake.url, meters, "headless", send, receive))
    assert rec.kinds("headless") == [
        (1, "stream.started"),
        (1, "stream.client_disconnected"),
        (1, "stream.tokens"),
        (1, "stream.usage"),
    ]
    [left] = rec.of("headless", "stream.client_disconnected")
    assert left["output_tokens_delivered"] == 0
    [usage] = rec.of("headless", "stream.usage")
    assert (usage["source"], usage["output_tokens"]) == ("upstream", 20)
