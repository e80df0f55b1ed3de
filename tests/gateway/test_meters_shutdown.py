"""``Meters.shutdown`` in process: the streams and drains still reading an upstream when the grace
runs out are settled on what their taps counted, flagged ``drain_skipped``; the client is closed
last, whatever its kind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from billing.gateway import Meters
from tests.gateway.test_meter import Recorder

pytestmark = pytest.mark.nodb


class ClosingRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.closed_with: float | None = None

    async def close(self, timeout: float | None = None) -> bool:
        self.closed_with = timeout
        return True


def _delta(text: str) -> bytes:
    event = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}}
    return f"data: {json.dumps(event)}\n\n".encode()


async def endless() -> AsyncIterator[bytes]:
    start = {"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 7}}}
    yield f"data: {json.dumps(start)}\n\n".encode()
    for _ in range(3):
        yield _delta("a")
    await asyncio.sleep(3600)  # the model never finishes
    yield _delta("never")


def test_a_stream_in_flight_at_shutdown_settles_flagged_and_the_client_closes() -> None:
    rec = ClosingRecorder()

    async def run() -> list[bytes]:
        meters = Meters(rec, shutdown_grace_s=0.2)
        meter = meters.call(
            request_id="sd", api_key_id="key_1", model="m", protocol="anthropic.messages"
        )
        read: list[bytes] = []

        async def client() -> None:
            async for chunk in meter.relay(endless()):
                read.append(chunk)

        reader = asyncio.create_task(client())
        await asyncio.sleep(0.1)
        assert len(meters.pumps) == 1
        async with meters.lifespan():
            pass  # the process stops at once: shutdown with the grace
        await asyncio.wait_for(reader, 1)
        assert not meters.pumps
        return read

    read = asyncio.run(run())
    assert len(read) == 4
    assert rec.kinds("sd") == [
        (1, "stream.started"),
        (1, "stream.tokens"),
        (1, "stream.usage"),
        (1, "stream.failed"),
    ]
    [usage] = rec.of("sd", "stream.usage")
    expected: dict[str, Any] = {
        "input_tokens": 7,
        "output_tokens": 3,
        "source": "estimate",
        "anomalies": ["drain_skipped"],
    }
    assert {k: usage[k] for k in expected} == expected
    [failed] = rec.of("sd", "stream.failed")
    assert (failed["error_type"], failed["message"], failed["output_tokens_generated"]) == (
        "gateway_shutdown",
        "the gateway shut down",
        3,
    )
    assert rec.closed_with == 10.0
