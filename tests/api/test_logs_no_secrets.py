"""Secrets never reach the logs: a real ``billing serve`` at DEBUG level, driven with a valid
token, a wrong token and a secret-looking ``api_key_id``, logs none of them (CONTRACT "Access
control": tokens are stored hashed and never logged; a provider key is refused, not stored)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import _free_port

pytestmark = pytest.mark.slow

BILLING = [sys.executable, "-c", "from billing.cli import main; main()"]


def _at(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def test_serve_at_debug_level_logs_no_token_and_no_provider_key(
    db_url: str, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "BILLING_DATABASE_URL": db_url,
        "BILLING_LOG_LEVEL": "debug",
        "BILLING_SETTLE_AFTER_S": "0.1",
    }
    created = subprocess.run(
        [*BILLING, "tokens", "create", "--role", "admin", "--name", "ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("bt_")
    wrong = "bt_" + "Z" * (len(secret) - 3)
    provider_key = "sk-proj-Zq9ThisMustNeverBeLogged000"

    port = _free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [*BILLING, "serve", "--port", str(port)], env=env, stdout=log, stderr=log
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        good = {"Authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=base, headers=good, timeout=30) as http:
            started = {
                "event_id": "log-1",
                "request_id": "log-call",
                "type": "stream.started",
                "occurred_at": _at(10),
                "api_key_id": "key_public_1",
                "model": "claude-sonnet-4",
                "protocol": "anthropic.messages",
            }
            refused = http.post(
                "/v1/events",
                json={"events": [{**started, "event_id": "log-0", "api_key_id": provider_key}]},
            )
            assert refused.status_code == 422
            assert provider_key not in refused.text
            assert http.post("/v1/events", json={"events": [started]}).status_code == 200
            unauthorised = http.get("/v1/calls", headers={"Authorization": f"Bearer {wrong}"})
            assert unauthorised.status_code == 401
            assert wrong not in unauthorised.text
            time.sleep(0.3)
            assert http.post("/v1/reconcile", json={}).json()["settled"] == 1
            assert http.get("/v1/calls/log-call").status_code == 200
            usage = http.get(
                "/v1/usage",
                params={"since": _at(3600), "until": _at(-3600), "group_by": "api_key_id"},
            )
            assert usage.status_code == 200, usage.text
            export = http.get(
                "/v1/exports/usage.csv",
                params={"since": _at(3600), "until": _at(-3600)},
            )
            assert export.status_code == 200
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    logged = log_path.read_text()
    # The log is not empty: it says what the server did, at DEBUG level.
    assert "serving on" in logged and "reconciled: 1 settled" in logged, logged
    assert secret not in logged and secret[3:] not in logged
    assert wrong not in logged
    assert provider_key not in logged
