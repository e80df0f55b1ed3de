"""``BILLING_READ_DATABASE_URL`` (CONTRACT "Replicas, failover and archives (v3)"): the call log,
usage, drift, console and exports read the read database, writes go to ``BILLING_DATABASE_URL``,
and every routed answer carries ``X-Billing-As-Of``.

The read URL here names a second database with other content, so an answer shows which one it
was read from."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.migrate import upgrade_to_head
from tests.budgets.helpers import call, price, reconcile
from tests.conftest import PG_URL, pg_admin_url

AT = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
PERIOD = {"since": "2026-11-01T00:00:00Z", "until": "2026-12-01T00:00:00Z"}
EXPORT = "/v1/exports/calls.csv?since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z"


@pytest.fixture
def other_db(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A second database at the migration head, empty."""
    if PG_URL is None:
        template: Path = request.getfixturevalue("_sqlite_template")
        path = tmp_path / "replica.db"
        shutil.copyfile(template, path)
        yield f"sqlite:///{path}"
        return
    url = make_url(db_url)
    name = f"{url.database}_read"
    admin = create_engine(pg_admin_url(db_url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    own = url.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_to_head(own)
        yield own
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _client(url: str, read_url: str | None = None) -> TestClient:
    settings = Settings(database_url=url, read_database_url=read_url)
    return TestClient(create_app(settings), base_url="http://127.0.0.1")


def _ids(client: TestClient) -> list[str]:
    response = client.get("/v1/calls")
    assert response.status_code == 200, response.text
    return sorted(c["request_id"] for c in response.json()["data"])


def test_readers_read_the_read_database_and_writes_go_to_the_primary(
    db_url: str, other_db: str
) -> None:
    with _client(db_url) as primary, _client(other_db) as replica:
        price(primary)
        call(primary, "on-primary", AT, 100_000)
        reconcile(primary, NOW)
        price(replica)
        for rid in ("on-replica-1", "on-replica-2"):
            call(replica, rid, AT, 200_000)
        reconcile(replica, NOW)
        replica_export = replica.get(EXPORT)
        primary_export = primary.get(EXPORT)
        replica_usage = replica.get("/v1/usage", params=PERIOD)
    assert replica_export.content != primary_export.content
    with _client(db_url, read_url=other_db) as routed:
        # Writes go to the primary ...
        call(routed, "written-through-routed", AT, 1_000)
        # ... reads come from the read database.
        assert _ids(routed) == ["on-replica-1", "on-replica-2"]
        detail = routed.get("/v1/calls/on-primary")
        assert detail.status_code == 404
        found = routed.get("/v1/calls/on-replica-1")
        assert found.json()["request_id"] == "on-replica-1"
        exported = routed.get(EXPORT)
        assert exported.content == replica_export.content
        assert exported.headers["x-billing-period"] == "closed"
        usage = routed.get("/v1/usage", params=PERIOD)
        assert usage.json() == replica_usage.json()
        assert usage.json()["data"][0]["calls"] == 2
        drift = routed.get("/v1/drift", params=PERIOD)
        assert drift.status_code == 200, drift.text
        console = routed.get("/console/calls")
        assert console.status_code == 200
        assert "on-replica-1" in console.text and "on-primary" not in console.text
        for answer in (exported, usage, drift, console, found):
            stamp = datetime.fromisoformat(answer.headers["x-billing-as-of"])
            assert stamp.tzinfo is not None
            assert datetime.now(UTC) - timedelta(minutes=1) < stamp <= datetime.now(UTC)
    with _client(db_url) as primary:
        assert _ids(primary) == ["on-primary", "written-through-routed"]
