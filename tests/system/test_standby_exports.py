"""Exports of a closed period read from the synchronous standby (``BILLING_READ_DATABASE_URL``)
are byte-identical to the primary's (CONTRACT "Replicas, failover and archives (v3)"), and their
``X-Billing-As-Of`` is no later than what the standby has replayed.

Runs on the loopback Patroni cluster of ``tests/system/cluster.py`` (skipped without patroni and
etcd, except under CI)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.migrate import upgrade_to_head
from tests.budgets.helpers import call, price, reconcile
from tests.extras import skip_unless_ci
from tests.system.cluster import PatroniCluster, missing_requirements

pytestmark = [pytest.mark.nodb, pytest.mark.slow]

AT = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
PERIOD = "since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PatroniCluster]:
    missing = missing_requirements()
    if missing:
        skip_unless_ci(f"needs {', '.join(missing)}: apt-get install -y patroni etcd-server")
    with PatroniCluster() as running:
        running.create_database("readroute")
        yield running


def test_closed_exports_from_the_standby_are_the_primarys_bytes(cluster: PatroniCluster) -> None:
    leader, standby = cluster.wait_ready()
    primary_url = cluster.url("readroute")
    upgrade_to_head(primary_url)
    primary = TestClient(
        create_app(Settings(database_url=primary_url)), base_url="http://127.0.0.1"
    )
    routed = TestClient(
        create_app(
            Settings(
                database_url=primary_url,
                read_database_url=cluster.url("readroute", node=standby),
            )
        ),
        base_url="http://127.0.0.1",
    )
    with primary, routed:
        price(primary)
        for n in range(40):
            call(primary, f"sb-{n:02d}", AT, 1_000 * (n + 1), 10 * n)
        # A standby's as_of is the commit time of the last transaction it replayed: the
        # settlements commit after ``written``, so an as_of at or past it has replayed them.
        written = datetime.now(UTC)
        reconcile(primary, NOW)
        # The standby has flushed every commit (synchronous replication); wait until it has
        # replayed them too, as its own as_of says.
        deadline = time.monotonic() + 30
        while True:
            probe = routed.get("/v1/calls", params={"limit": 1})
            as_of = probe.headers.get("x-billing-as-of")
            if as_of is not None and datetime.fromisoformat(as_of) >= written:
                break
            assert time.monotonic() < deadline, f"the standby did not replay (as_of {as_of})"
            time.sleep(0.2)
        for path in ("/v1/exports/calls.csv", "/v1/exports/usage.csv"):
            ours = primary.get(f"{path}?{PERIOD}")
            theirs = routed.get(f"{path}?{PERIOD}")
            assert ours.status_code == theirs.status_code == 200
            assert theirs.headers["x-billing-period"] == "closed"
            assert theirs.content == ours.content
            assert ours.content.count(b"\n") > 1
            assert datetime.fromisoformat(theirs.headers["x-billing-as-of"]) <= datetime.now(UTC)
    assert leader != standby
