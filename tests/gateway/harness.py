"""What the gateway tests share: a billing server with tokens, gateway processes and apps, and
clients that read (or leave) a stream while counting what they read with the protocol's tap."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from billing.auth.tokens import create_token
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.taps import open_tap
from tests.conftest import LiveServer, _free_port

ROOT = Path(__file__).resolve().parents[2]
PATHS = {
    "openai.chat_completions": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
}

#: The fake model's price (USD per million tokens): 12 input and 40 output tokens cost
#: 12 * 2.5e-6 + 40 * 10e-6 = 0.00043.
PRICE = {
    "model": "fake-model",
    "effective_from": "2020-01-01T00:00:00Z",
    "input_usd_per_mtok": "2.5",
    "output_usd_per_mtok": "10",
    "cache_read_usd_per_mtok": "1.25",
    "cache_creation_usd_per_mtok": "3.125",
}


@dataclass
class Billing:
    """A running billing service and two of its tokens."""

    url: str
    ingest_token: str
    admin_token: str


def make_tokens(db_url: str) -> tuple[str, str]:
    """An ``ingest`` and an ``admin`` token, stored in the database (secrets returned)."""
    engine = make_engine(Settings(database_url=db_url))
    sessions = make_sessionmaker(engine)
    now = datetime.now(UTC)
    with sessions.begin() as session:
        ingest, _ = create_token(session, "ingest", "gateway", now)
        admin, _ = create_token(session, "admin", "test", now)
    engine.dispose()
    return ingest, admin


@contextmanager
def billing_server(db_url: str) -> Iterator[Billing]:
    """The real service (uvicorn in a thread of this process) on ``db_url``; calls settle 2 s
    after their last event (estimates included) and passes run every half second."""
    ingest, admin = make_tokens(db_url)
    settings = Settings(database_url=db_url, settle_after_s=2.0, reconcile_interval_s=0.5)
    with LiveServer(create_app(settings)) as server:
        price = httpx.post(
            server.url + "/v1/prices",
            json=PRICE,
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert price.status_code in (200, 201), price.text
        yield Billing(server.url, ingest, admin)


@contextmanager
def example_gateway(
    upstream: str,
    billing: Billing,
    *,
    drain: bool = True,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> Iterator[str]:
    """``examples/fastapi_gateway.py`` in its own process; yields its base URL. ``env`` is
    added to the process's environment (``XDG_CACHE_HOME``: where its client spools), ``args``
    to its command line."""
    port = _free_port()
    argv = example_argv(upstream, billing, port, *([] if drain else ["--no-drain"]))
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "BILLING_TOKEN": billing.ingest_token}
    with serving(argv + list(args), {**environ, **(env or {})}, port) as url:
        yield url


def example_argv(upstream: str, billing: Billing, port: int, *more: str) -> list[str]:
    """The command line of ``examples/fastapi_gateway.py`` on ``port``."""
    argv = [sys.executable, str(ROOT / "examples" / "fastapi_gateway.py"), "--port", str(port)]
    return [*argv, "--upstream", upstream, "--billing", billing.url, *more]


@contextmanager
def serving(args: list[str], env: dict[str, str], port: int) -> Iterator[str]:
    """Run a server process until it answers on ``port``; stop it (SIGTERM) afterwards."""
    with server_process(args, env, port) as (url, _):
        yield url


@contextmanager
def server_process(
    args: list[str], env: dict[str, str], port: int
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`serving`, yielding the process too (a test may signal it itself)."""
    proc = subprocess.Popen(args, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[1]} exited with {proc.returncode}")
            try:
                httpx.get(url + "/openapi.json", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args[1]} did not start") from None
                time.sleep(0.1)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def protocol_gateway(upstream: str, billing: Billing, *, drain: bool = True) -> Iterator[str]:
    """``tests/gateway/protocol_gateway.py`` (Responses and Anthropic Messages, the same meter as
    the example) in its own process; yields its base URL."""
    port = _free_port()
    args = [sys.executable, "-m", "tests.gateway.protocol_gateway", "--port", str(port)]
    args += ["--upstream", upstream, "--billing", billing.url] + ([] if drain else ["--no-drain"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BILLING_TOKEN": billing.ingest_token}
    with serving(args, env, port) as url:
        yield url


@dataclass
class Read:
    """What one client read: its call's id, protocol, output tokens read (by the tap), and
    whether it left early."""

    request_id: str
    protocol: str
    read: int
    left: bool


async def client_call(
    http: httpx.AsyncClient,
    url: str,
    protocol: str,
    *,
    key: str,
    leave_after: int | None = None,
    request_id: str | None = None,
) -> Read:
    """One streaming call through a gateway; leaves (closes the connection) once
    ``leave_after`` output tokens were read."""
    tap = open_tap(protocol)
    body: dict[str, Any] = {"model": "fake-model", "stream": True, "messages": []}
    headers = {"X-Api-Key-Id": key}
    if request_id is not None:  # the client's own id: the call's metadata, never its id
        headers["X-Request-Id"] = request_id
    left = False
    async with http.stream("POST", url + PATHS[protocol], json=body, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        rid = response.headers["x-request-id"]  # the call's id, the gateway's own
        assert rid.startswith("gw-") and rid != request_id, rid
        async for chunk in response.aiter_raw():
            tap.feed(chunk)
            if leave_after is not None and tap.output_tokens >= leave_after:
                left = True
                break
    return Read(rid, protocol, tap.output_tokens, left)


async def wait_calls(
    billing: Billing, request_ids: list[str], *, timeout: float = 60.0
) -> dict[str, dict[str, Any]]:
    """Every call settled, with no event left to come (two equal readings a pass apart)."""
    headers = {"Authorization": f"Bearer {billing.admin_token}"}
    deadline = time.monotonic() + timeout
    previous: dict[str, dict[str, Any]] | None = None
    async with httpx.AsyncClient(base_url=billing.url, headers=headers, timeout=30) as http:
        while True:
            assert (await http.post("/v1/reconcile", json={})).status_code == 200
            calls = {}
            for rid in request_ids:
                answer = await http.get(f"/v1/calls/{rid}")
                calls[rid] = answer.json() if answer.status_code == 200 else {"settled": False}
                calls[rid].pop("events", None)
                calls[rid].pop("ledger_entries", None)
            if all(c["settled"] for c in calls.values()) and calls == previous:
                return calls
            if time.monotonic() > deadline:
                open_ = [rid for rid, c in calls.items() if not c["settled"]]
                raise AssertionError(f"calls not settled in time: {open_[:5]}")
            previous = calls
            await asyncio.sleep(1.0)
