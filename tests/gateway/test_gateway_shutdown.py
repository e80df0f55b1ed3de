"""Nothing lost on exit (issue 41): the example gateway (``examples/fastapi_gateway.py``, uvicorn
in its own process, the fake upstream on 127.0.0.1) stopped with SIGTERM while streams are in
flight settles every call, on the upstream's usage or on an estimate flagged ``drain_skipped``;
killed with SIGKILL, its client's spool is delivered by the next process at its start."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import _free_port
from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import (
    ROOT,
    Billing,
    billing_server,
    example_argv,
    server_process,
    wait_calls,
)


def _env(billing: Billing, cache: Path, token: str | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BILLING_TOKEN": token or billing.ingest_token,
        "XDG_CACHE_HOME": str(cache),
    }


async def _stream(
    http: httpx.AsyncClient, url: str, name: str, total: int, ids: dict[str, str]
) -> int:
    """One streamed call of ``total`` tokens (its id, the gateway's, put in ``ids[name]``); the
    bytes read until the stream ends or breaks."""
    body = {"model": "fake-model", "stream": True, "messages": [], "x_fake": {"total": total}}
    headers = {"X-Api-Key-Id": "key_sd"}
    read = 0
    try:
        async with http.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers
        ) as r:
            assert r.status_code == 200
            ids[name] = r.headers["x-request-id"]
            async for chunk in r.aiter_raw():
                read += len(chunk)
    except httpx.HTTPError:  # the gateway cut the stream at its shutdown
        pass
    return read


def _events(billing: Billing, request_id: str) -> list[dict[str, Any]]:
    """The call's events as the service stored them."""
    headers = {"Authorization": f"Bearer {billing.admin_token}"}
    answer = httpx.get(f"{billing.url}/v1/calls/{request_id}", headers=headers, timeout=30)
    events: list[dict[str, Any]] = answer.json()["events"]
    return events


@pytest.mark.slow  # a gateway process
def test_sigterm_with_streams_in_flight_settles_every_call(db_url: str, tmp_path: Path) -> None:
    port = _free_port()
    totals = {"sd-short": 100, "sd-drained": 350, "sd-cut": 3000}
    ids: dict[str, str] = {}  # name: the call's id
    with (
        FakeUpstream(delay_s=0.01, input_tokens=6) as fake,
        billing_server(db_url) as billing,
        server_process(
            example_argv(fake.url, billing, port, "--grace-s", "3"),
            _env(billing, tmp_path),
            port,
        ) as (url, proc),
    ):

        async def run() -> None:
            async with httpx.AsyncClient(timeout=30) as http:
                calls = [
                    asyncio.create_task(_stream(http, url, name, n, ids))
                    for name, n in totals.items()
                ]
                # every stream is in flight (each authorized first: a round trip more under load)
                for _ in range(100):
                    opened = sum(len(fake.records.get(i, [])) for i in ids.values())
                    if len(ids) == 3 and opened == 3:
                        break
                    await asyncio.sleep(0.1)
                assert sum(len(fake.records.get(i, [])) for i in ids.values()) == 3
                proc.send_signal(signal.SIGTERM)
                await asyncio.gather(*calls)

        started = time.monotonic()
        asyncio.run(run())
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn raises it again at exit
        assert time.monotonic() - started < 15  # 3 s for the streams, 3 s for the drains
        calls = asyncio.run(wait_calls(billing, [ids[name] for name in totals]))
        events = _events(billing, ids["sd-drained"]) + _events(billing, ids["sd-cut"])
    short, drained, cut = (calls[ids[name]] for name in totals)
    assert (short["status"], short["usage_source"], short["output_tokens_billed"]) == (
        "completed",
        "upstream",
        100,
    )
    assert short["output_tokens_delivered"] == 100
    # cut off by the server's grace, drained to its end within the meters' grace
    assert (drained["usage_source"], drained["output_tokens_billed"]) == ("upstream", 350)
    # the gateway cut the stream, not the client: failed gateway_shutdown, no disconnect
    assert (drained["status"], drained["error_type"]) == ("failed", "gateway_shutdown")
    assert 0 < drained["output_tokens_delivered"] < 350
    # still generating when the grace ran out: the tap's count, flagged
    assert cut["usage_source"] == "estimate" and "drain_skipped" in cut["anomalies"]
    assert 0 < cut["output_tokens_delivered"] <= cut["output_tokens_billed"] < 3000
    assert (cut["status"], cut["error_type"]) == ("failed", "gateway_shutdown")
    kinds = [e["type"] for e in events]
    assert "stream.client_disconnected" not in kinds, kinds
    failed = [e for e in events if e["type"] == "stream.failed"]
    assert [e["error_type"] for e in failed] == ["gateway_shutdown"] * 2
    assert all(e["output_tokens_generated"] > 0 for e in failed), failed
    for call in calls.values():
        assert call["settled"] and call["api_key_id"] == "key_sd"


def _spooled(cache: Path) -> list[str]:
    return [
        line
        for path in (cache / "billing" / "spool").glob("*.jsonl*")
        for line in path.read_text().splitlines()
        if line.strip()
    ]


@pytest.mark.slow  # two gateway processes
def test_a_killed_gateways_spool_is_delivered_by_the_next_process(
    db_url: str, tmp_path: Path
) -> None:
    with FakeUpstream(total=9, input_tokens=4) as fake, billing_server(db_url) as billing:
        port = _free_port()
        argv = example_argv(fake.url, billing, port)
        # the first process's token is refused: its events wait in the spool (it authorizes
        # nothing: a refused authorization refuses the call, whatever fail_open says)
        first = [*argv, "--no-authorize"]
        with server_process(first, _env(billing, tmp_path, token="bt_revoked"), port) as (
            url,
            proc,
        ):
            body: dict[str, Any] = {"model": "fake-model", "messages": []}
            answer = httpx.post(
                url + "/v1/chat/completions",
                json=body,
                headers={"X-Api-Key-Id": "key_kill", "X-Request-Id": "killed-1"},
            )
            killed = answer.headers["x-request-id"]  # the call's id, the gateway's own
            assert answer.status_code == 200 and killed.startswith("gw-")
            deadline = time.monotonic() + 30
            while len(_spooled(tmp_path)) < 3:
                assert time.monotonic() < deadline, "the events never reached the spool"
                time.sleep(0.1)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert [line.count(f'"request_id":"{killed}"') for line in _spooled(tmp_path)] == [1, 1, 1]
        port = _free_port()
        argv = example_argv(fake.url, billing, port)
        with server_process(argv, _env(billing, tmp_path), port):  # no request at all
            calls = asyncio.run(wait_calls(billing, [killed]))
            deadline = time.monotonic() + 10
            while _spooled(tmp_path):  # acknowledged, then removed
                assert time.monotonic() < deadline, "the spool was not emptied"
                time.sleep(0.1)
    call = calls[killed]
    assert call["metadata"]["client_request_id"] == "killed-1"
    assert (call["usage_source"], call["input_tokens"], call["output_tokens_billed"]) == (
        "upstream",
        4,
        9,
    )
    assert (call["api_key_id"], call["output_tokens_delivered"]) == ("key_kill", 9)
