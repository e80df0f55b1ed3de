"""Helpers of the budget tests: a priced model, calls posted over HTTP, reconciliation and the
budgets' service run at a chosen instant (so every period is fixed, whatever the clock)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from billing.api.state import AppState
from billing.budgets import service
from billing.budgets.schemas import BudgetChange, BudgetIn
from billing.budgets.webhooks import DeliveryWorker
from billing.reconcile.runner import run_pass
from billing.storage.db import read_transaction, write_transaction
from tests.builders import post

MODEL = "m-budget"
#: $1 per million input tokens, $2 per million output tokens: 100,000 input tokens cost $0.10.
PRICE = {
    "model": MODEL,
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "1",
    "output_usd_per_mtok": "2",
    "cache_read_usd_per_mtok": "0",
    "cache_creation_usd_per_mtok": "0",
}


def state(client: TestClient) -> AppState:
    st: AppState = client.app.state.billing  # type: ignore[attr-defined]
    return st


def price(client: TestClient, **changes: str) -> None:
    response = client.post("/v1/prices", json={**PRICE, **changes})
    assert response.status_code in (200, 201), response.text


def _ts(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def call(
    client: TestClient,
    rid: str,
    at: datetime,
    input_tokens: int,
    output_tokens: int = 0,
    *,
    key: str = "key_b1",
    settled: bool = True,
    generated: int | None = None,
) -> None:
    """A call of ``key`` started at ``at``: with its upstream usage (``settled``), else open
    with ``input_tokens`` on its start and ``generated`` output tokens so far."""
    events: list[dict[str, Any]] = [
        {
            "event_id": f"{rid}-s",
            "request_id": rid,
            "type": "stream.started",
            "occurred_at": _ts(at),
            "api_key_id": key,
            "model": MODEL,
            "protocol": "openai.chat_completions",
            "input_tokens": input_tokens,
        }
    ]
    if settled:
        events.append(
            {
                "event_id": f"{rid}-u",
                "request_id": rid,
                "type": "stream.usage",
                "occurred_at": _ts(at + timedelta(seconds=1)),
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "source": "upstream",
            }
        )
    elif generated is not None:
        events.append(
            {
                "event_id": f"{rid}-t{generated}",
                "request_id": rid,
                "type": "stream.tokens",
                "occurred_at": _ts(at + timedelta(seconds=1)),
                "output_tokens_generated": generated,
                "output_tokens_delivered": generated,
            }
        )
    response = post(client, events)
    assert response.status_code == 200, response.text


def usage(client: TestClient, rid: str, at: datetime, input_tokens: int, output: int) -> None:
    response = post(
        client,
        [
            {
                "event_id": f"{rid}-u",
                "request_id": rid,
                "type": "stream.usage",
                "occurred_at": _ts(at),
                "input_tokens": input_tokens,
                "output_tokens": output,
                "source": "upstream",
            }
        ],
    )
    assert response.status_code == 200, response.text


def reconcile(client: TestClient, now: datetime) -> None:
    st = state(client)
    run_pass(st.sessions, st.settings, None, now)


def write(client: TestClient, work: Callable[[Session], Any]) -> Any:
    with write_transaction(state(client).sessions) as session:
        return work(session)


def read(client: TestClient, work: Callable[[Session], Any]) -> Any:
    with read_transaction(state(client).sessions) as session:
        return work(session)


def create(client: TestClient, now: datetime, **body: Any) -> dict[str, Any]:
    parsed = BudgetIn.model_validate(body)
    out: dict[str, Any] = write(client, lambda s: service.create_budget(s, parsed, now))
    return out


def update(client: TestClient, budget_id: str, now: datetime, **body: Any) -> dict[str, Any]:
    parsed = BudgetChange.model_validate(body)
    out: dict[str, Any] = write(client, lambda s: service.update_budget(s, budget_id, parsed, now))
    return out


def status(client: TestClient, budget_id: str, now: datetime) -> dict[str, Any]:
    out: dict[str, Any] = read(client, lambda s: service.budget_status(s, budget_id, now))
    return out


def alerts(client: TestClient, budget_id: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = read(client, lambda s: service.list_alerts(s, budget_id, None))
    return out


class Receiver:
    """A webhook receiver on 127.0.0.1: records (headers, body) of each POST and answers the
    next status of ``answers`` (then 200)."""

    def __init__(self, answers: list[int] | None = None, port: int = 0) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.answers = list(answers or [])
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                code = outer.answers.pop(0) if outer.answers else 200
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/budget?token=s3cret"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiving(answers: list[int] | None = None, port: int = 0) -> Iterator[Receiver]:
    with Receiver(answers, port) as receiver:
        yield receiver


def deliver(client: TestClient) -> int:
    """One delivery round of the webhook worker over the app's database: deliveries made."""
    st = state(client)
    worker = DeliveryWorker(st.sessions, st.settings)

    async def once() -> int:
        async with worker.client() as http:
            return await worker.deliver_once(http)

    return asyncio.run(once())
