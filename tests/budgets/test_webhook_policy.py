"""Issue 44: the webhook destination policy and delivery that nothing can stall or aim.

A URL naming a loopback, private, link-local, metadata or multicast address (in every spelling a
resolver accepts), or carrying credentials, is a 422 at create and update, nothing stored; a name
that resolves to a private address is refused at send time by the module's resolver with no
connection made (the test's resolver answers for a made-up name: nothing leaves 127.0.0.1); any
error of a delivery (an invalid host included) is a counted attempt with its backoff and a fixed
category; a database outage is logged less and less often."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from billing import destinations
from billing.budgets import webhooks
from billing.budgets.webhooks import DeliveryWorker
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import WebhookOutbox
from tests.budgets.helpers import call, deliver, price, receiving, state, write
from tests.system.test_webhook_stall import _huge, _RawReceiver

REFUSED_URLS = [
    "http://127.0.0.1/x",
    "http://127.1/x",
    "http://0x7f000001/x",
    "http://2130706433/x",
    "http://017700000001/x",
    "http://0177.0.0.1/x",
    "http://[::1]/x",
    "http://[::ffff:127.0.0.1]/x",
    "http://[::ffff:7f00:1]/x",
    "http://0.0.0.0/x",
    "http://0/x",
    "http://10.0.0.1/x",
    "http://172.16.5.4/x",
    "http://192.168.1.1/x",
    "http://169.254.169.254/latest/meta-data",
    "http://[fd00:ec2::254]/x",
    "http://100.100.100.200/x",
    "http://[fe80::1]/x",
    "http://224.0.0.1/x",
    "http://[ff02::1]/x",
    "http://[64:ff9b::a9fe:a9fe]/x",
    "https://user:pass@example.com/x",
    "https://token@example.com/x",
    "ftp://example.com/x",
    "https://ex\u00adample.com/x",  # soft hyphen
    "https://\ufeffexample.com/x",  # BOM
    "https://exa\u200dmple.com/x",  # ZWJ
]


def _body(url: str) -> dict[str, Any]:
    return {
        "budget_id": "aimed",
        "scope": {"api_key_id": "key_b1"},
        "limit_usd": "1",
        "period": "total",
        "webhook_url": url,
    }


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_a_refused_destination_is_a_422_at_create_and_update(client: TestClient, url: str) -> None:
    response = client.post("/v1/budgets", json=_body(url))
    assert response.status_code == 422, response.text
    assert [e["path"] for e in response.json()["errors"]] == ["body.webhook_url"]
    assert client.get("/v1/budgets").json()["data"] == []
    assert client.post("/v1/budgets", json=_body("https://hooks.example.com/x")).status_code == 201
    change = {k: v for k, v in _body(url).items() if k != "budget_id"}
    assert client.put("/v1/budgets/aimed", json=change).status_code == 422
    [budget] = client.get("/v1/budgets").json()["data"]
    assert budget["webhook_url"] == "https://hooks.example.com/x"


def test_public_destinations_pass_and_private_ones_pass_when_allowed() -> None:
    for url in ("https://hooks.example.com/a?b=c", "http://93.184.216.34:8080/x"):
        destinations.check_url(url)
    with destinations.allowing_private(True):
        destinations.check_url("http://127.0.0.1:9/x")
        with pytest.raises(destinations.RefusedDestination):
            destinations.check_url("http://u:p@127.0.0.1/x")  # credentials: never
    with pytest.raises(destinations.RefusedDestination):
        destinations.check_url("http://127.0.0.1:9/x")


def _alert_crossed(client: TestClient, url: str) -> None:
    price(client)
    body = {**_body(url), "thresholds": ["0.5"]}
    assert client.post("/v1/budgets", json=body).status_code == 201
    call(client, "c1", datetime.now(UTC) - timedelta(minutes=1), 600_000)
    assert client.post("/v1/reconcile", json={}).status_code == 200


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """The module's resolver answers loopback for every name (refused as private unless the
    test allows private destinations; even a connection the fake below missed would stay on
    this machine); any TCP connection is recorded and refused."""
    seen: dict[str, list[Any]] = {"resolved": [], "connected": []}

    async def resolve(host: str, port: int) -> list[str]:
        seen["resolved"].append((host, port))
        return ["127.0.0.1"]

    async def connect_tcp(*args: Any, **kwargs: Any) -> Any:
        seen["connected"].append(kwargs.get("remote_host", args[:1]))
        raise OSError("no connection in this test")

    monkeypatch.setattr(destinations, "resolve", resolve)
    monkeypatch.setattr(anyio, "connect_tcp", connect_tcp)
    return seen


def test_a_name_resolving_to_a_private_address_is_refused_at_send_time(
    client: TestClient, no_network: dict[str, list[Any]]
) -> None:
    _alert_crossed(client, "https://hooks.rebinding.test/x")
    assert deliver(client) == 1
    [alert] = client.get("/v1/alerts").json()["data"]
    delivery = alert["delivery"]
    assert (delivery["state"], delivery["attempts"]) == ("pending", 1)
    assert (delivery["last_status"], delivery["last_error"]) == (None, webhooks.REFUSED)
    assert delivery["next_attempt_at"] is not None
    assert no_network["resolved"] == [("hooks.rebinding.test", 443)]
    assert no_network["connected"] == []


def _allow_private(client: TestClient) -> None:
    st = state(client)
    st.settings = st.settings.model_copy(update={"webhook_allow_private": True})


@pytest.mark.parametrize(
    "url",
    [
        "http://ex\u00adample.test/x",
        "http://\ufeffexample.test/x",
        "http://exa\u200dmple.test/x",
        "http://[::1/x",
        "http://example.test:99999/x",
        "http://xn--a.test/x",
        "http://a..b/x",
        "http:///x",
    ],
)
def test_an_odd_stored_url_is_a_counted_failed_attempt(
    client: TestClient, no_network: dict[str, list[Any]], url: str
) -> None:
    """A row stored before the policy (or written by hand) with a hostile host: a counted
    attempt with its backoff, never a stuck ``pending`` with 0 attempts."""
    _allow_private(client)
    _alert_crossed(client, "https://hooks.example.com/x")
    write(client, lambda s: s.execute(update(WebhookOutbox).values(url=url)))
    assert deliver(client) == 1
    [alert] = client.get("/v1/alerts").json()["data"]
    delivery = alert["delivery"]
    assert (delivery["state"], delivery["attempts"]) == ("pending", 1)
    assert delivery["next_attempt_at"] is not None
    assert delivery["last_error"] in {webhooks.INVALID_URL, webhooks.UNREACHABLE}
    # a connection, if any, went to the address the resolver gave (and was refused by the fake)
    assert set(no_network["connected"]) <= {"127.0.0.1"}


def test_a_failure_shows_a_category_and_none_of_the_response(client: TestClient) -> None:
    _allow_private(client)
    with receiving(answers=[503]) as receiver:
        _alert_crossed(client, receiver.url)
        assert deliver(client) == 1
    [alert] = client.get("/v1/alerts").json()["data"]
    assert alert["delivery"]["last_error"] == "answered 503"
    assert alert["delivery"]["last_status"] == 503


def test_an_outage_is_logged_less_and_less_often(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="billing.webhooks")
    broken = Settings(
        database_url=f"sqlite:///{tmp_path}/missing/dir/billing.db", webhook_poll_s=0.01
    )
    worker = DeliveryWorker(make_sessionmaker(make_engine(broken)), broken)

    async def run_a_second() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                await worker.run()

    asyncio.run(run_a_second())
    lines = [r for r in caplog.records if "round failed" in r.getMessage()]
    assert 1 <= len(lines) <= 4, [r.getMessage() for r in lines]


def _trickle_fast(receiver: _RawReceiver, conn: Any) -> None:
    for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 40\r\n\r\n" + b"x" * 40:
        if receiver.stop.wait(0.3):
            return
        conn.sendall(bytes([byte]))
        receiver.sent += 1


def test_one_deadline_bounds_the_whole_attempt(client: TestClient) -> None:
    """A receiver that answers a byte every 0.3 s (no read ever waits 1 s) is cut at the
    attempt's deadline (1 s here): a counted attempt, ``timed out``."""
    _allow_private(client)
    st = state(client)
    st.settings = st.settings.model_copy(update={"webhook_timeout_s": 1.0})
    with _RawReceiver(_trickle_fast) as receiver:
        _alert_crossed(client, receiver.url)
        started = time.monotonic()
        assert deliver(client) == 1
        elapsed = time.monotonic() - started
        receiver.stop.set()
    assert elapsed < 3.0, elapsed
    [alert] = client.get("/v1/alerts").json()["data"]
    delivery = alert["delivery"]
    assert (delivery["state"], delivery["attempts"]) == ("pending", 1)
    assert delivery["last_error"] == webhooks.TIMED_OUT


def test_a_1_gib_reply_is_read_no_further_than_64_kib(client: TestClient) -> None:
    _allow_private(client)
    with _RawReceiver(_huge) as receiver:
        _alert_crossed(client, receiver.url)
        assert deliver(client) == 1
        assert receiver.closed.wait(10)
    assert receiver.sent < 64 << 20
    [alert] = client.get("/v1/alerts").json()["data"]
    assert alert["delivery"]["state"] == "delivered"
