"""Issue 44: no receiver can stall the alerts. Beside a receiver that trickles its answer (a byte
every 2 s, so no single read ever times out) and one that answers 1 GiB (generated as it is
sent), a normal receiver gets its alert within 2 s of the alert, and ``billing serve``'s memory
stays put (RSS growth under 50 MB): the worker reads at most 64 KiB of a reply. All receivers
listen on 127.0.0.1 (``BILLING_WEBHOOK_ALLOW_PRIVATE=true``)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.attack import Server
from tests.budgets.helpers import MODEL, PRICE, receiving
from tests.system.test_budget_webhooks import _wait

pytestmark = pytest.mark.slow

GIB = 1 << 30


class _RawReceiver:
    """A TCP receiver on 127.0.0.1 that reads a request's first bytes and then runs ``answer``
    on the connection until the client goes away."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.connections = 0
        self.sent = 0
        self.closed = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            with contextlib.suppress(OSError):
                self.answer(self, conn)
            self.closed.set()

    def __enter__(self) -> _RawReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def _trickle(receiver: _RawReceiver, conn: socket.socket) -> None:
    for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok":
        if receiver.stop.wait(2.0):
            return
        conn.sendall(bytes([byte]))
        receiver.sent += 1


def _huge(receiver: _RawReceiver, conn: socket.socket) -> None:
    conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-length: {GIB}\r\n\r\n".encode())
    chunk = bytes(64 * 1024)
    while receiver.sent < GIB and not receiver.stop.is_set():
        conn.sendall(chunk)
        receiver.sent += len(chunk)


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    env = {
        "BILLING_WEBHOOK_ALLOW_PRIVATE": "true",
        "BILLING_RECONCILE_INTERVAL_S": "0.2",
        "BILLING_WEBHOOK_POLL_S": "0.2",
        "BILLING_WEBHOOK_TIMEOUT_S": "60",  # the slow ones stay in flight through the test
    }
    with Server(db_url, workdir=tmp_path, env=env) as process:
        yield process


def _budget(http: httpx.Client, name: str, url: str) -> None:
    created = http.post(
        "/v1/budgets",
        json={
            "budget_id": name,
            "scope": {"api_key_id": f"key_{name}"},
            "limit_usd": "1",
            "period": "total",
            "thresholds": ["0.5"],
            "webhook_url": url,
        },
    )
    assert created.status_code == 201, created.text


def _cross(http: httpx.Client, name: str) -> None:
    at = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    events = [
        {
            "event_id": f"{name}-s",
            "request_id": name,
            "type": "stream.started",
            "occurred_at": at,
            "api_key_id": f"key_{name}",
            "model": MODEL,
            "protocol": "openai.chat_completions",
        },
        {
            "event_id": f"{name}-u",
            "request_id": name,
            "type": "stream.usage",
            "occurred_at": at,
            "input_tokens": 900_000,
            "output_tokens": 0,
            "source": "upstream",
        },
    ]
    assert http.post("/v1/events", json={"events": events}).status_code == 200


def test_a_trickling_and_a_1_gib_receiver_stall_no_alert_and_cost_no_memory(
    server: Server,
) -> None:
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10)
    assert http.post("/v1/prices", json=PRICE).status_code in (200, 201)
    with (
        _RawReceiver(_trickle) as trickle,
        _RawReceiver(_huge) as huge,
        receiving() as normal,
    ):
        _budget(http, "trickle", trickle.url)
        _budget(http, "huge", huge.url)
        _budget(http, "normal", normal.url)
        start_mb = server.rss_mb()
        _cross(http, "trickle")
        _cross(http, "huge")
        _wait("both slow deliveries in flight", lambda: trickle.sent and huge.sent)
        _cross(http, "normal")
        _wait(
            "the normal alert",
            lambda: http.get("/v1/alerts", params={"budget_id": "normal"}).json()["data"],
            timeout=10,
        )
        alerted = time.monotonic()
        _wait("the normal delivery", lambda: normal.received, timeout=10)
        assert time.monotonic() - alerted < 2.0
        _wait("the 1 GiB reply dropped", huge.closed.is_set, timeout=20)
        assert huge.sent < 64 << 20  # the worker stopped reading: the rest was never sent
        assert server.rss_mb() - start_mb < 50.0
        assert not trickle.closed.is_set()  # still in flight: it held one place, not the pool
        [alert] = http.get("/v1/alerts", params={"budget_id": "huge"}).json()["data"]
        assert alert["delivery"]["state"] == "delivered"
        trickle.stop.set()
    http.close()
