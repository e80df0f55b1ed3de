"""The low-balance webhook survives a SIGKILL between the draw and the delivery (CONTRACT "Prepaid
credits (v3)": credit alerts go through the budgets' durable, signed outbox).

A real ``billing serve`` draws a customer's credit below its ``low_balance_usd``: the draw and the
``credits.low`` alert are booked in one reconciliation step, the webhook waits in the outbox. The
receiver on 127.0.0.1 does not take it yet: it refuses it (503), or holds the request open so that
the service is killed in the middle of the delivery (its lease still held). The service is
SIGKILLed, restarted on the same database, the receiver takes deliveries again: the restarted
service delivers the alert once (a 2xx once, never again after), signed as a Standard Webhook
(verified with the ``standardwebhooks`` package), and a later draw still below the threshold makes
no second alert (once per crossing, across the restart)."""

from __future__ import annotations

import functools
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from standardwebhooks import Webhook

from tests.client.test_client import ServeProcess
from tests.credits.helpers import PRICE
from tests.system.cluster import wait_for

pytestmark = pytest.mark.slow

Mode = Literal["refuse", "hold"]
#: A delivery attempt's deadline in the service (its lease is this + 5 s): a held delivery is
#: still in flight when the service is killed, and the restarted one takes it over after the lease.
WEBHOOK_TIMEOUT_S = 4


class GatedReceiver:
    """A webhook receiver on 127.0.0.1 that does not take deliveries until ``open()``: before,
    it answers 503 (``refuse``) or holds the request without answering (``hold``; the handler
    lets go when ``open()`` is called, and answers nothing). Records each request as (headers,
    body, answered status or None)."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.opened = threading.Event()
        self.lock = threading.Lock()
        self.requests: list[tuple[dict[str, str], bytes, int | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if outer.opened.is_set():
                    code: int | None = 200
                elif outer.mode == "refuse":
                    code = 503
                else:
                    code = None
                with outer.lock:
                    outer.requests.append((headers, body, code))
                if code is None:
                    outer.opened.wait(60)
                    self.close_connection = True
                    return  # never answered: the service that sent it is dead by now
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/credits"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def seen(self) -> list[tuple[dict[str, str], bytes, int | None]]:
        with self.lock:
            return list(self.requests)

    def open(self) -> None:
        self.opened.set()

    def __enter__(self) -> GatedReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.opened.set()
        self.server.shutdown()
        self.server.server_close()


_wait = functools.partial(wait_for, timeout=60.0)


def _ok(response: httpx.Response, *codes: int) -> dict[str, Any]:
    assert response.status_code in (codes or (200, 201)), response.text
    return dict(response.json())


def _call(http: httpx.Client, rid: str, at: datetime, output_tokens: int) -> None:
    """A settled call of ``key_a``: its start and its upstream usage (``output_tokens`` at $10
    per million: 1,000 cost $0.01)."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    events = [
        {"event_id": f"{rid}-s", "request_id": rid, "type": "stream.started",
         "occurred_at": stamp, "api_key_id": "key_a", "model": PRICE["model"],
         "protocol": "anthropic.messages"},
        {"event_id": f"{rid}-u", "request_id": rid, "type": "stream.usage", "occurred_at": stamp,
         "input_tokens": 0, "output_tokens": output_tokens, "source": "upstream"},
    ]  # fmt: skip
    assert _ok(http.post("/v1/events", json={"events": events}))["accepted"] == 2


def _balance(http: httpx.Client) -> tuple[str, str]:
    found = _ok(http.get("/v1/credits/balance", params={"customer_id": "acme"}))
    return found["balance_usd"], found["available_usd"]


def _credit_alerts(http: httpx.Client) -> list[dict[str, Any]]:
    found = _ok(http.get("/v1/alerts", params={"budget_id": "acme-hook"}))["data"]
    return [a for a in found if a["type"].startswith("credits.")]


@pytest.mark.parametrize("mode", ["refuse", "hold"])
def test_the_low_balance_webhook_survives_a_sigkill_between_the_draw_and_the_delivery(
    mode: Mode, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_RECONCILE_INTERVAL_S", "0.2")
    monkeypatch.setenv("BILLING_WEBHOOK_POLL_S", "0.2")
    monkeypatch.setenv("BILLING_WEBHOOK_TIMEOUT_S", str(WEBHOOK_TIMEOUT_S))
    monkeypatch.setenv("BILLING_WEBHOOK_ALLOW_PRIVATE", "true")  # the receiver is on 127.0.0.1
    now = datetime.now(UTC)
    with GatedReceiver(mode) as receiver, ServeProcess(db_url, tmp_path) as server:
        server.start()
        with httpx.Client(base_url=server.url, timeout=10) as http:
            _ok(http.post("/v1/prices", json=PRICE), 201)
            since = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            _ok(http.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": since}))
            _ok(http.put("/v1/customers/acme", json={"low_balance_usd": "0.02"}))
            budget = {"budget_id": "acme-hook", "scope": {"customer_id": "acme"},
                      "limit_usd": "1000", "period": "total", "thresholds": ["1"],
                      "webhook_url": receiver.url}  # fmt: skip
            secret = _ok(http.post("/v1/budgets", json=budget), 201)["webhook_secret"]
            grant = {"grant_id": "g", "customer_id": "acme", "amount_usd": "0.03",
                     "kind": "purchased", "effective_at": since}  # fmt: skip
            _ok(http.post("/v1/credits/grants", json=grant), 201)
            # $0.01 and $0.01: available 0.03 → 0.02 → 0.01, below 0.02 once.
            _call(http, "r1", now - timedelta(seconds=30), 1000)
            _wait("the first draw", lambda: _balance(http) == ("0.02", "0.02"))
            assert _credit_alerts(http) == []
            _call(http, "r2", now - timedelta(seconds=20), 1000)
            _wait("the second draw", lambda: _balance(http) == ("0.01", "0.01"))
            [alert] = _wait("the alert", lambda: _credit_alerts(http))
            assert alert["type"] == "credits.low"
            # The draw is booked and the alert is in the outbox; the receiver has it in hand
            # (held) or has refused it: it is not delivered.
            _wait("a delivery attempt", receiver.seen)
            [pending] = _credit_alerts(http)
            assert pending["delivery"]["state"] == "pending"
        server.kill(signal.SIGKILL)
        before = receiver.seen()
        assert before and {code for _, _, code in before} == {503 if mode == "refuse" else None}
        receiver.open()
        server.start()
        with httpx.Client(base_url=server.url, timeout=10) as http:
            [delivered] = _wait(
                "the delivery",
                lambda: [a for a in _credit_alerts(http) if a["delivery"]["state"] == "delivered"],
                timeout=WEBHOOK_TIMEOUT_S + 30,
            )
            # A later draw still below the threshold (0.01 → 0.005): no second crossing.
            _call(http, "r3", now - timedelta(seconds=10), 500)
            _wait("the third draw", lambda: _balance(http) == ("0.005", "0.005"))
            time.sleep(1.0)  # a few more reconcile passes and delivery rounds
            alerts = _credit_alerts(http)
        after = receiver.seen()[len(before) :]
    assert [(a["alert_id"], a["type"], a["delivery"]["state"]) for a in alerts] == [
        (alert["alert_id"], "credits.low", "delivered")
    ]
    # The attempts: the refusals recorded before the kill (the last one may have been refused
    # but not yet recorded when the service died) and the delivery; a held attempt never ended.
    if mode == "refuse":
        assert delivered["delivery"]["attempts"] in (len(before), len(before) + 1)
    else:
        assert delivered["delivery"]["attempts"] == 1
    assert delivered["delivery"]["last_status"] == 200
    assert delivered["delivery"]["last_error"] is None
    # The restarted service delivered it exactly once, taken with a 2xx.
    assert [(headers["webhook-id"], code) for headers, _, code in after] == [
        (alert["alert_id"], 200)
    ]
    for headers, body, _ in [*before, *after]:
        assert headers["webhook-id"] == alert["alert_id"]
        payload = Webhook(secret).verify(body, headers)
        assert payload["type"] == "credits.low"
        assert payload["data"] == {
            "customer_id": "acme",
            "api_key_id": None,
            "available_usd": "0.01",
            "low_balance_usd": "0.02",
        }
