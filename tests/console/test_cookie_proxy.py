"""Issue 44: behind a TLS-terminating proxy the console cookie follows the client's scheme.

``billing serve --forwarded-allow-ips`` turns on uvicorn's own proxy headers for those proxies
(here a real uvicorn in this process, with ``billing serve``'s options, on 127.0.0.1): an
``X-Forwarded-Proto: https`` from a trusted proxy makes the cookie ``Secure``; from an untrusted
one it changes nothing. ``BILLING_COOKIE_SECURE=true`` makes it ``Secure`` whatever the scheme."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.cli.serve import uvicorn_options
from billing.server.app import create_app
from billing.settings import Settings
from tests.console.conftest import make_tokens


@contextmanager
def _serving(app: FastAPI, forwarded_allow_ips: str | None) -> Iterator[str]:
    options = uvicorn_options("warning", forwarded_allow_ips=forwarded_allow_ips)
    options["log_config"] = None
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _cookie(base: str, token: str) -> str:
    response = httpx.post(
        f"{base}/console/sign-in",
        data={"token": token},
        headers={"X-Forwarded-Proto": "https"},
        timeout=10,
    )
    assert response.status_code == 303, response.text
    return response.headers["set-cookie"]


@pytest.mark.parametrize(("trusted", "secure"), [("127.0.0.1", True), (None, False)])
def test_the_cookie_follows_a_trusted_proxys_scheme(
    app: FastAPI, tokens: dict[str, str], trusted: str | None, secure: bool
) -> None:
    with _serving(app, trusted) as base:
        assert ("Secure" in _cookie(base, tokens["admin"])) is secure


def test_the_cookie_is_forced_secure_by_the_setting(db_url: str) -> None:
    app = create_app(Settings(database_url=db_url, cookie_secure=True))
    tokens = make_tokens(app)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        response = client.post(
            "/console/sign-in", data={"token": tokens["admin"]}, follow_redirects=False
        )
    assert response.status_code == 303
    assert "Secure" in response.headers["set-cookie"]
