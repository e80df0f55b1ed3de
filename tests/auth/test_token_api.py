"""Issue 29, tokens that expire: ``billing tokens create --expires-in``, the admin API
``GET/POST/DELETE /v1/tokens`` (a secret only in the answer that creates it), ``last_used_at``
written at most once a minute; on the configured database."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update
from typer.testing import CliRunner

from billing.auth.tokens import create_token
from billing.cli import app as cli
from billing.cli.tokens import parse_duration
from billing.settings import get_settings
from billing.storage.db import write_transaction
from billing.storage.models import ApiToken
from tests.cli_runs import run_billing, text


@pytest.fixture
def admin(app: FastAPI) -> dict[str, str]:
    with write_transaction(app.state.billing.sessions) as session:
        secret, _ = create_token(session, "admin", "root", datetime.now(UTC))
    return {"Authorization": f"Bearer {secret}"}


def _forget(app: FastAPI) -> None:
    app.state.tokens._roles.clear()  # the guard caches a token's answer for 2 s


def test_create_list_revoke_through_the_api(
    client: TestClient, app: FastAPI, admin: dict[str, str]
) -> None:
    expires = (datetime.now(UTC) + timedelta(days=90)).replace(microsecond=0)
    created = client.post(
        "/v1/tokens",
        json={"role": "read", "name": "dashboards", "expires_at": expires.isoformat()},
        headers=admin,
    )
    assert created.status_code == 201, created.text
    body = created.json()
    secret = body["token"]
    assert secret.startswith("bt_") and len(secret) == 46
    assert body["role"] == "read" and body["name"] == "dashboards"
    assert body["expires_at"] == expires.isoformat().replace("+00:00", "Z")
    assert body["revoked_at"] is None and body["last_used_at"] is None
    assert body["id"].startswith("tok_")

    reader = {"Authorization": f"Bearer {secret}"}
    assert client.get("/v1/calls", headers=reader).status_code == 200
    assert client.get("/v1/tokens", headers=reader).status_code == 403

    listed = client.get("/v1/tokens", headers=admin)
    assert listed.status_code == 200
    assert secret not in listed.text
    rows = {row["id"]: row for row in listed.json()["data"]}
    assert set(rows[body["id"]]) == {
        "id", "name", "role", "created_at", "expires_at", "revoked_at", "last_used_at"
    }  # fmt: skip
    assert rows[body["id"]]["last_used_at"] is not None  # used just above, flushed for GET

    revoked = client.delete(f"/v1/tokens/{body['id']}", headers=admin)
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None and "token" not in revoked.json()
    _forget(app)
    response = client.get("/v1/calls", headers=reader)
    assert response.status_code == 401
    assert response.json() == {"error": "the bearer token is unknown, revoked or expired"}
    assert client.delete("/v1/tokens/tok_nope", headers=admin).status_code == 404


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"role": "root"}, "body.role"),
        ({"role": "read", "expires_at": "2020-01-01T00:00:00Z"}, "body.expires_at"),
        ({"role": "read", "expires_at": "2030-01-01T00:00:00"}, "body.expires_at"),
        ({"role": "read", "secret": "x"}, "body.secret"),
    ],
)
def test_a_bad_token_body_is_422(
    client: TestClient, admin: dict[str, str], body: dict[str, str], path: str
) -> None:
    response = client.post("/v1/tokens", json=body, headers=admin)
    assert response.status_code == 422, response.text
    assert [e["path"] for e in response.json()["errors"]] == [path]


def test_an_expired_token_is_refused(
    client: TestClient, app: FastAPI, admin: dict[str, str]
) -> None:
    created = client.post("/v1/tokens", json={"role": "read"}, headers=admin).json()
    reader = {"Authorization": f"Bearer {created['token']}"}
    assert client.get("/v1/calls", headers=reader).status_code == 200
    with write_transaction(app.state.billing.sessions) as session:
        past = datetime.now(UTC) - timedelta(seconds=1)
        session.execute(
            update(ApiToken).where(ApiToken.id == created["id"]).values(expires_at=past)
        )
    _forget(app)
    response = client.get("/v1/calls", headers=reader)
    assert response.status_code == 401
    assert "expired" in response.json()["error"]


def test_last_used_at_is_written_at_most_once_a_minute(
    client: TestClient, app: FastAPI, admin: dict[str, str]
) -> None:
    cache = app.state.tokens
    created = client.post("/v1/tokens", json={"role": "ingest"}, headers=admin).json()
    cache.flush_last_used()  # the admin's own use
    ingest = {"Authorization": f"Bearer {created['token']}"}
    before = datetime.now(UTC)
    for i in range(20):
        event = {
            "event_id": f"lu-{i}",
            "request_id": "lu-r",
            "type": "stream.tokens",
            "occurred_at": "2026-10-15T08:00:00Z",
            "output_tokens_generated": i,
            "output_tokens_delivered": i,
        }
        assert (
            client.post("/v1/events", json={"events": [event]}, headers=ingest).status_code == 200
        )
        _forget(app)  # every post reads the token again: still one use noted per minute
    assert cache.flush_last_used() == 1
    assert cache.flush_last_used() == 0
    rows = {r["id"]: r for r in client.get("/v1/tokens", headers=admin).json()["data"]}
    used = datetime.fromisoformat(rows[created["id"]]["last_used_at"])
    assert before - timedelta(seconds=1) <= used <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90d", 90 * 86400),
        ("12h", 43200),
        ("30m", 1800),
        ("45s", 45),
        ("2w", 14 * 86400),
        ("7 D", 7 * 86400),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text", ["0d", "-1d", "1.5d", "90", "d", "1y", "", "\uff15d", "99999999999d"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="--expires-in"):
        parse_duration(text)


def test_cli_creates_a_token_that_expires(cli_way: str, db_url: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {"BILLING_DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"}
        return text(run_billing(cli_way, ["tokens", *args], env, Path.cwd(), timeout=60))

    before = datetime.now(UTC)
    created = cli("create", "--role", "read", "--expires-in", "90d")
    assert created.returncode == 0, created.stderr
    token_id = created.stderr.split("created token ")[1].split()[0]
    [row] = [line.split("\t") for line in cli("list").stdout.splitlines() if token_id in line]
    expires = datetime.fromisoformat(row[5])
    assert before + timedelta(days=90) <= expires <= datetime.now(UTC) + timedelta(days=90)
    assert row[6] == "-"
    bad = cli("create", "--role", "read", "--expires-in", "soon")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "billing: --expires-in 'soon': give a positive whole number and a unit s, m, h, d or w "
        "(such as 90d)"
    ]


@pytest.mark.parametrize("duration", ["99999999999d", "3000000d", "400000w"])
def test_a_duration_too_long_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, db_url: str, duration: str
) -> None:
    # timedelta (or the expiry past year 9999) raised an OverflowError with its traceback.
    monkeypatch.setenv("BILLING_DATABASE_URL", db_url)
    get_settings.cache_clear()
    result = CliRunner().invoke(
        cli, ["tokens", "create", "--role", "read", "--expires-in", duration]
    )
    get_settings.cache_clear()
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        f"billing: --expires-in {duration!r} is too long: the token would expire after 9000-01-01"
    ]
