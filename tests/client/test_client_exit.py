"""Issue #41: a process that exits without ``close()`` loses nothing silently. A
``BillingClient`` left open delivers what it holds at interpreter exit (or spools it); an
``AsyncBillingClient`` whose loop ended (``asyncio.run`` cancels its delivery task) spools
what it holds, delivered by the next client process. Either way stderr says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import LiveServer, _free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter with no logging configured, sharing this test's
    ``XDG_CACHE_HOME`` (so its default spool is the one the next process replays)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def _events(prefix: str) -> list[dict[str, Any]]:
    """Three whole calls: ``{prefix}-n`` read 100 + n input and wrote 10 + n output tokens."""
    events: list[dict[str, Any]] = []
    for n in range(3):
        rid = f"{prefix}-{n}"
        events.append(
            {
                "event_id": f"evt-{rid}-started",
                "request_id": rid,
                "type": "stream.started",
                "api_key_id": "key_exit",
                "model": "m",
                "protocol": "openai.chat_completions",
            }
        )
        events.append(
            {
                "event_id": f"evt-{rid}-usage",
                "request_id": rid,
                "type": "stream.usage",
                "input_tokens": 100 + n,
                "output_tokens": 10 + n,
                "source": "upstream",
            }
        )
    return events


def _figures(url: str, prefix: str) -> list[tuple[Any, ...]]:
    with httpx.Client(base_url=url, timeout=10) as http:
        assert http.post("/v1/reconcile", json={}).status_code == 200
        rows = []
        for n in range(3):
            answer = http.get(f"/v1/calls/{prefix}-{n}")
            assert answer.status_code == 200, answer.text
            call = answer.json()
            rows.append(
                (
                    call["request_id"],
                    call["input_tokens"],
                    call["output_tokens_billed"],
                    call["usage_source"],
                    len(call["events"]),
                )
            )
    return rows


def _expected(prefix: str) -> list[tuple[Any, ...]]:
    return [(f"{prefix}-{n}", 100 + n, 10 + n, "upstream", 2) for n in range(3)]


def test_a_sync_client_left_open_delivers_at_exit(live_server: LiveServer) -> None:
    done = _run(
        f"""
        from billing.client import BillingClient
        client = BillingClient({live_server.url!r})
        for event in {_events("req-exit-sync")!r}:
            client.send(event)
        """
    )
    assert done.stderr.splitlines() == [
        "billing client: the process is exiting without close(): delivering 6 queued "
        "event(s) (up to 2 s, then to the spool)"
    ]
    assert _figures(live_server.url, "req-exit-sync") == _expected("req-exit-sync")


def test_a_sync_client_left_open_spools_at_exit_when_the_service_is_down(
    live_server: LiveServer,
) -> None:
    """Nothing listens at the client's URL: after the bounded flush its events go to the spool,
    which the next process delivers once the service is there."""
    port = _free_port()
    down = f"http://127.0.0.1:{port}"
    done = _run(
        f"""
        from billing.client import BillingClient
        client = BillingClient({down!r}, max_retries=0)
        for event in {_events("req-exit-down")!r}:
            client.send(event)
        """
    )
    lines = done.stderr.splitlines()
    assert lines[0] == (
        "billing client: the process is exiting without close(): delivering 6 queued "
        "event(s) (up to 2 s, then to the spool)"
    )
    assert lines[-1].startswith("billing client: 6 event(s) written to the spool "), lines
    assert f"127-0-0-1-{port}-" in lines[-1]

    # the service comes up at that address: the next client process replays the spool
    server = LiveServer(live_server.server.config.app)
    server.port, server.url = port, down
    server.server.config.port = port
    with server:
        _run(
            f"""
            from billing.client import BillingClient
            with BillingClient({down!r}) as client:
                assert client.flush(timeout=20)
            """
        )
        assert _figures(down, "req-exit-down") == _expected("req-exit-down")


def test_an_async_client_left_open_spools_and_the_next_process_delivers(
    live_server: LiveServer,
) -> None:
    done = _run(
        f"""
        import asyncio
        from billing.client import AsyncBillingClient

        async def main():
            client = AsyncBillingClient({live_server.url!r})
            for event in {_events("req-exit-async")!r}:
                client.send(event)

        asyncio.run(main())
        """
    )
    lines = done.stderr.splitlines()
    assert lines[0] == "billing client: the client was not closed: 6 event(s) still queued"
    assert lines[1].startswith("billing client: 6 event(s) written to the spool "), lines
    assert len(lines) == 2, lines

    _run(
        f"""
        from billing.client import BillingClient
        with BillingClient({live_server.url!r}) as client:
            assert client.flush(timeout=20)
        """
    )
    assert _figures(live_server.url, "req-exit-async") == _expected("req-exit-async")


def test_a_closed_client_logs_nothing_at_exit(live_server: LiveServer) -> None:
    done = _run(
        f"""
        import asyncio
        from billing.client import AsyncBillingClient, BillingClient
        events = {_events("req-exit-closed")!r}
        client = BillingClient({live_server.url!r})
        for event in events[:3]:
            client.send(event)
        assert client.close()

        async def main():
            async with AsyncBillingClient({live_server.url!r}) as client:
                for event in events[3:]:
                    client.send(event)

        asyncio.run(main())
        """
    )
    assert done.stderr == ""
    assert _figures(live_server.url, "req-exit-closed") == _expected("req-exit-closed")


def test_an_async_client_left_open_without_a_spool_reports_the_loss(
    live_server: LiveServer,
) -> None:
    done = _run(
        f"""
        import asyncio
        from billing.client import AsyncBillingClient

        async def main():
            client = AsyncBillingClient({live_server.url!r}, spool_path=None)
            for event in {_events("req-exit-lost")!r}:
                client.send(event)

        asyncio.run(main())
        """
    )
    assert done.stderr.splitlines() == [
        "billing client: the client was not closed: 6 event(s) still queued",
        "billing client: 6 event(s) dropped: the client was not closed and no spool_path is "
        "configured",
    ]
