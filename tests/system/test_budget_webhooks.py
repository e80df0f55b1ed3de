"""A budget alert survives a crash: ``billing serve`` crosses a threshold while the webhook
receiver is down, is SIGKILLed before delivering, restarts; the receiver comes up and gets the
alert (at least once), always with the alert's ``webhook-id``, verified by the
``standardwebhooks`` package (CONTRACT "Budgets and alerts (v2)": a durable outbox)."""

from __future__ import annotations

import functools
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from tests.budgets.helpers import MODEL, PRICE, receiving
from tests.client.test_client import ServeProcess
from tests.conftest import _free_port
from tests.system.cluster import wait_for

pytestmark = pytest.mark.slow


_wait = functools.partial(wait_for, timeout=30.0)


def test_an_alert_crossed_before_a_sigkill_is_delivered_after_the_restart(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_RECONCILE_INTERVAL_S", "0.2")
    monkeypatch.setenv("BILLING_WEBHOOK_POLL_S", "0.2")
    monkeypatch.setenv("BILLING_WEBHOOK_ALLOW_PRIVATE", "true")  # the receiver is on 127.0.0.1
    port = _free_port()  # nothing listens there yet: the receiver is down
    url = f"http://127.0.0.1:{port}/hook"
    with ServeProcess(db_url, tmp_path) as server:
        server.start()
        http = httpx.Client(base_url=server.url, timeout=10)
        assert http.post("/v1/prices", json=PRICE).status_code in (200, 201)
        created = http.post(
            "/v1/budgets",
            json={
                "budget_id": "crash",
                "scope": {"api_key_id": "key_sys"},
                "limit_usd": "1",
                "period": "total",
                "webhook_url": url,
            },
        )
        assert created.status_code == 201, created.text
        secret = created.json()["webhook_secret"]
        at = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        events = [
            {
                "event_id": "sys-s",
                "request_id": "sys-1",
                "type": "stream.started",
                "occurred_at": at,
                "api_key_id": "key_sys",
                "model": MODEL,
                "protocol": "openai.chat_completions",
            },
            {
                "event_id": "sys-u",
                "request_id": "sys-1",
                "type": "stream.usage",
                "occurred_at": at,
                "input_tokens": 900_000,  # $0.90: crosses 0.8 only
                "output_tokens": 0,
                "source": "upstream",
            },
        ]
        assert http.post("/v1/events", json={"events": events}).status_code == 200
        alerts = _wait(
            "the alert",
            lambda: http.get("/v1/alerts", params={"budget_id": "crash"}).json()["data"],
        )
        assert [(a["type"], a["threshold"]) for a in alerts] == [
            ("budget.threshold_crossed", "0.8")
        ]
        alert_id = alerts[0]["alert_id"]
        assert alerts[0]["delivery"]["state"] == "pending"
        server.kill(signal.SIGKILL)
        http.close()
        with receiving(port=port) as receiver:
            server.start()
            _wait("the webhook", lambda: receiver.received, timeout=60)
            http = httpx.Client(base_url=server.url, timeout=10)
            delivered = _wait(
                "the delivered state",
                lambda: [
                    a
                    for a in http.get("/v1/alerts").json()["data"]
                    if a["delivery"]["state"] == "delivered"
                ],
            )
            http.close()
    assert [a["alert_id"] for a in delivered] == [alert_id]
    assert {headers["webhook-id"] for headers, _ in receiver.received} == {alert_id}
    for headers, body in receiver.received:
        payload = Webhook(secret).verify(body, headers)
        assert payload["type"] == "budget.threshold_crossed"
        assert payload["data"]["budget_id"] == "crash"
        assert payload["data"]["spent_usd"] == "0.9"
