"""Three replicas of ``billing serve`` over one PostgreSQL (CONTRACT "Replicas, failover and
archives (v3)"): every call is settled by exactly one of them (ledger settlement entries = calls,
none twice) and every alert is delivered by one of them at a time (no two deliveries of one alert
overlap at the receiver).

Each replica runs its own background reconciler and webhook worker on the same database; three
gateways post through ``billing.client`` (with its retries), each to its own replica, while the
reconcilers settle. What keeps the work apart is the database's: each reconciliation step locks
its calls ``FOR UPDATE SKIP LOCKED`` (``billing.reconcile.sql.common.CoreReconcile.due_calls``) and
the delivery worker leases due outbox rows the same way (``billing.budgets.sql.postgres``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from billing.client import BillingClient
from tests.budgets.helpers import MODEL, PRICE
from tests.client.test_client import ServeProcess
from tests.conftest import PG_URL
from tests.system.cluster import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PG_URL is None, reason="replicas share one PostgreSQL"),
]

REPLICAS = 3
CALLS_PER_GATEWAY = 150
KEYS = 6
#: Each delivery is held this long at the receiver, so two at once of one alert would overlap.
HOLD_S = 0.3


class SlowReceiver:
    """A webhook receiver on 127.0.0.1 that records each delivery's webhook-id and the instants
    it began and ended, and holds each for ``HOLD_S``."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, float, float]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                began = time.monotonic()
                self.rfile.read(int(self.headers.get("content-length", "0")))
                time.sleep(HOLD_S)
                with outer.lock:
                    outer.deliveries.append(
                        (self.headers.get("webhook-id", ""), began, time.monotonic())
                    )
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> SlowReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def _gateway(url: str, gateway: int, started: datetime) -> None:
    """One gateway's calls: a start and the upstream usage each, 100,000 input tokens ($0.10)."""
    with BillingClient(url, batch_size=50, flush_interval_s=0.05, spool_path=None) as client:
        for n in range(CALLS_PER_GATEWAY):
            rid = f"g{gateway}-{n:04d}"
            at = started + timedelta(milliseconds=n)
            stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            client.send(
                {
                    "event_id": f"{rid}-s",
                    "request_id": rid,
                    "type": "stream.started",
                    "occurred_at": stamp,
                    "api_key_id": f"key_r{n % KEYS}",
                    "model": MODEL,
                    "protocol": "openai.chat_completions",
                }
            )
            client.send(
                {
                    "event_id": f"{rid}-u",
                    "request_id": rid,
                    "type": "stream.usage",
                    "occurred_at": stamp,
                    "input_tokens": 100_000,
                    "output_tokens": 0,
                    "source": "upstream",
                }
            )
        assert client.flush(timeout=60)


@pytest.fixture
def replicas(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[ServeProcess]]:
    monkeypatch.setenv("BILLING_RECONCILE_INTERVAL_S", "0.1")
    monkeypatch.setenv("BILLING_RECONCILE_BATCH_SIZE", "20")  # many small steps: more contention
    monkeypatch.setenv("BILLING_SETTLE_AFTER_S", "1")
    monkeypatch.setenv("BILLING_WEBHOOK_POLL_S", "0.05")
    monkeypatch.setenv("BILLING_WEBHOOK_ALLOW_PRIVATE", "true")  # the receiver is on 127.0.0.1
    with ExitStack() as stack:
        servers = [stack.enter_context(ServeProcess(db_url, tmp_path)) for _ in range(REPLICAS)]
        for server in servers:
            server.start(wait=False)
        for server in servers:
            server.wait_ready(timeout=60)
        yield servers


def test_three_replicas_settle_each_call_once_and_deliver_each_alert_once_at_a_time(
    replicas: list[ServeProcess], db_url: str
) -> None:
    first = httpx.Client(base_url=replicas[0].url, timeout=10)
    assert first.post("/v1/prices", json=PRICE).status_code in (200, 201)
    with SlowReceiver() as receiver:
        for k in range(KEYS):
            created = first.post(
                "/v1/budgets",
                json={
                    "budget_id": f"b{k}",
                    "scope": {"api_key_id": f"key_r{k}"},
                    # 75 calls of $0.10 per key: $7.50 crosses 0.5, 0.8 and 1.0 of $5.
                    "limit_usd": "5",
                    "period": "total",
                    "thresholds": ["0.5", "0.8", "1"],
                    "webhook_url": receiver.url,
                },
            )
            assert created.status_code == 201, created.text
        started = datetime.now(UTC) - timedelta(minutes=1)
        gateways = [
            threading.Thread(target=_gateway, args=(replica.url, g, started))
            for g, replica in enumerate(replicas)
        ]
        for gateway in gateways:
            gateway.start()
        for gateway in gateways:
            gateway.join()
        calls = REPLICAS * CALLS_PER_GATEWAY
        engine = create_engine(db_url, poolclass=NullPool)
        try:

            def settled() -> bool:
                with engine.connect() as conn:
                    return bool(
                        conn.scalar(text("SELECT count(*) FROM calls WHERE settled")) == calls
                    )

            wait_for("every call settled", settled, timeout=90.0)
            alerts = wait_for(
                "every alert",
                lambda: (
                    len(
                        found := [
                            a
                            for a in first.get("/v1/alerts").json()["data"]
                            if a["delivery"]["state"] == "delivered"
                        ]
                    )
                    == 3 * KEYS
                    and found
                ),
                timeout=90.0,
            )
            with engine.connect() as conn:
                entries = conn.execute(
                    text(
                        "SELECT request_id, count(*) FROM ledger_entries "
                        "GROUP BY request_id, kind ORDER BY request_id"
                    )
                ).all()
                kinds = conn.execute(
                    text("SELECT kind, count(*) FROM ledger_entries GROUP BY kind")
                ).all()
                outbox = conn.scalar(text("SELECT count(*) FROM webhook_outbox"))
        finally:
            engine.dispose()
        first.close()
    # Every call settled by exactly one replica: one settlement each, no adjustment.
    assert dict(kinds) == {"settlement": calls}
    assert len(entries) == calls and {n for _, n in entries} == {1}
    # Every alert delivered, once, and never two deliveries of one alert at the same time.
    assert outbox == 3 * KEYS
    ids = sorted(d[0] for d in receiver.deliveries)
    assert ids == sorted(a["alert_id"] for a in alerts)
    by_alert: dict[str, list[tuple[float, float]]] = {}
    for alert_id, began, ended in receiver.deliveries:
        by_alert.setdefault(alert_id, []).append((began, ended))
    for spans in by_alert.values():
        spans.sort()
        for (_, end), (begin, _) in pairwise(spans):
            assert begin >= end, "one alert delivered by two replicas at once"
