"""Issue 44: a full disk under a SQLite database makes ``/readyz`` 503 "disk full" (its writes
fail while its reads go on, so reading the revision alone stayed 200). The disk is "full" here
by the bound (``BILLING_MIN_FREE_DISK_BYTES`` past any disk's free space): the test fills no
disk. PostgreSQL reports its own disk: the bound does not apply to it."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from billing.api.errors import domain_error
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import is_unavailable
from billing.storage.disk import free_bytes, is_disk_full


def test_readyz_reports_a_full_disk_beside_sqlite(db_url: str, is_postgres: bool) -> None:
    full = Settings(database_url=db_url, min_free_disk_bytes=1 << 62)
    with TestClient(create_app(full), base_url="http://127.0.0.1") as client:
        response = client.get("/readyz")
    if is_postgres:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["status"] == "not ready"
    assert body["reason"].startswith("disk full: ")


def test_readyz_is_ready_with_room_on_the_disk(client: TestClient, is_postgres: bool) -> None:
    assert client.get("/readyz").json() == {"status": "ready"}
    free = free_bytes(client.app.state.billing.engine)  # type: ignore[attr-defined]
    assert (free is None) == is_postgres
    assert free is None or free > 0


def test_a_full_database_is_an_outage_logged_as_a_full_disk(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite's ``SQLITE_FULL``, made here by capping the file's pages (``max_page_count``)
    rather than by filling a disk: an outage (503, retried), logged as a full disk, not only
    "unavailable"."""
    engine = create_engine(f"sqlite:///{tmp_path}/full.db")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (b BLOB)"))
    caplog.set_level(logging.WARNING, logger="billing")
    with pytest.raises(OperationalError) as caught, engine.begin() as connection:
        pages = connection.execute(text("PRAGMA page_count")).scalar_one()
        connection.execute(text(f"PRAGMA max_page_count = {pages}"))
        connection.execute(text("INSERT INTO t VALUES (zeroblob(1000000))"))
    assert is_disk_full(caught.value) and is_unavailable(caught.value)
    answer = domain_error(caught.value, 2)
    assert answer is not None and answer.status == 503
    assert any("disk full" in r.getMessage() for r in caplog.records)
    other = OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked"))
    assert not is_disk_full(other)
