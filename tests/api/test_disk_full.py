"""Issue 44: a full disk under a SQLite database makes ``/readyz`` 503 "disk full" (its writes
fail while its reads go on, so reading the revision alone stayed 200). The disk is "full" here
by the bound (``BILLING_MIN_FREE_DISK_BYTES`` past any disk's free space): the test fills no
disk. PostgreSQL reports its own disk: the bound does not apply to it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.disk import free_bytes


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
