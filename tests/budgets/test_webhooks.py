"""Budget webhooks: Standard Webhooks headers verified by the ``standardwebhooks`` package on a
real receiver on 127.0.0.1, the same ``webhook-id`` on a retry, delivery state in /v1/alerts, and
the URL's query never in the logs."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from billing.budgets.webhooks import retry_pause_s, sign
from billing.settings import Settings
from tests.budgets.helpers import call, deliver, price, receiving, state


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The receivers listen on 127.0.0.1: private destinations allowed."""
    return Settings(database_url=db_url, webhook_allow_private=True)


def test_a_crossing_is_delivered_signed_and_retried_with_the_same_id(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="billing")
    caplog.set_level(logging.INFO, logger="httpx")
    price(client)
    with receiving(answers=[500]) as receiver:
        created = client.post(
            "/v1/budgets",
            json={
                "budget_id": "hooked",
                "scope": {"api_key_id": "key_b1"},
                "limit_usd": "1",
                "period": "total",
                "thresholds": ["0.5"],
                "webhook_url": receiver.url,
            },
        ).json()
        secret = created["webhook_secret"]
        call(client, "c1", datetime.now(UTC) - timedelta(minutes=1), 600_000)
        assert client.post("/v1/reconcile", json={}).status_code == 200
        [alert] = client.get("/v1/alerts").json()["data"]
        assert alert["delivery"]["state"] == "pending"
        assert deliver(client) == 1  # answered 500
        [alert] = client.get("/v1/alerts").json()["data"]
        assert (alert["delivery"]["state"], alert["delivery"]["attempts"]) == ("pending", 1)
        assert alert["delivery"]["last_status"] == 500
        assert deliver(client) == 0  # not due yet
        time.sleep(1.1)  # the first pause is at most FIRST_RETRY_S
        assert deliver(client) == 1
    [alert] = client.get("/v1/alerts").json()["data"]
    assert (alert["delivery"]["state"], alert["delivery"]["attempts"]) == ("delivered", 2)
    assert len(receiver.received) == 2
    ids = {headers["webhook-id"] for headers, _ in receiver.received}
    assert ids == {alert["alert_id"]}
    for headers, body in receiver.received:
        payload = Webhook(secret).verify(body, headers)
        assert payload == alert["payload"]
    assert alert["payload"]["type"] == "budget.threshold_crossed"
    assert alert["payload"]["data"]["threshold"] == "0.5"
    assert alert["payload"]["data"]["spent_usd"] == "0.6"
    assert set(json.loads(receiver.received[0][1])) == {"type", "timestamp", "data"}
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "127.0.0.1" in logged and "s3cret" not in logged and "/hooks" not in logged


def test_the_signature_is_the_standard_webhooks_construction() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = '{"type":"budget.threshold_crossed"}'
    ours = sign(secret, "alert_1", 1_700_000_000, body)
    from datetime import datetime as dt

    theirs = Webhook(secret).sign("alert_1", dt.fromtimestamp(1_700_000_000, tz=UTC), body)
    assert ours == theirs


def test_the_backoff_grows_with_jitter_up_to_an_hour() -> None:
    import random

    rng = random.Random(7)
    pauses = [retry_pause_s(n, rng) for n in range(1, 20)]
    assert 0.5 <= pauses[0] <= 1 and 1 <= pauses[1] <= 2 and 4 <= pauses[3] <= 8
    assert max(pauses) <= 3600 and pauses[-1] >= 1800


def test_a_webhook_failing_past_the_retry_window_is_marked_failed(client: TestClient) -> None:
    price(client)
    st = state(client)
    st.settings = st.settings.model_copy(update={"webhook_retry_s": 0.5})
    with receiving(answers=[500, 500, 500]) as receiver:
        client.post(
            "/v1/budgets",
            json={
                "budget_id": "gives-up",
                "scope": {"api_key_id": "key_b1"},
                "limit_usd": "1",
                "period": "total",
                "thresholds": ["0.5"],
                "webhook_url": receiver.url,
            },
        )
        call(client, "c1", datetime.now(UTC) - timedelta(minutes=1), 600_000)
        assert client.post("/v1/reconcile", json={}).status_code == 200
        time.sleep(0.6)
        assert deliver(client) == 1  # 500, and the next try would be past the window
    [alert] = client.get("/v1/alerts").json()["data"]
    delivery = alert["delivery"]
    assert (delivery["state"], delivery["attempts"], delivery["last_status"]) == ("failed", 1, 500)
    assert delivery["next_attempt_at"] is None and deliver(client) == 0
