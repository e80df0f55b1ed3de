"""Failover on PostgreSQL under Patroni with synchronous replication (deploy/, docs/FAILOVER.md;
CONTRACT "Replicas, failover and archives (v3)": a failover loses no acknowledged write).

Two gateways write rows through SQLAlchemy + psycopg 3 with the multi-host URL
(``target_session_attrs=read-write``), retrying a failed write as ``billing.client`` does (the
same row again, idempotent), while the primary is SIGKILLed: every acknowledged row must be on
the new primary, writes must resume within 30 s, and the same engine must reach the new
primary. Needs Debian's ``patroni`` and ``etcd-server`` (skipped without them, except with
``CI=true``, where .ci/run installs them and their absence is a failure).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from tests.extras import skip_unless_ci
from tests.system.cluster import Failover, PatroniCluster, missing_requirements

pytestmark = pytest.mark.nodb

#: The issue's bound: the service writes again within this many seconds of the kill.
WRITES_RESUME_WITHIN = 30.0
#: A gateway's pause before it retries a failed write (billing.client backs off similarly).
RETRY_PAUSE = 0.2


@dataclass
class Gateway:
    """A thread that inserts rows ``(gateway, seq)`` one transaction at a time: a row is
    acknowledged when its COMMIT returned; a failed write is retried until it is."""

    name: str
    engine: Engine
    table: str
    acknowledged: list[tuple[str, int, float]] = field(default_factory=list)
    errors: list[tuple[float, DBAPIError]] = field(default_factory=list)
    attempted: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), f"{self.name} did not stop"

    def acknowledged_after(self, moment: float) -> float | None:
        """When the first write acknowledged after ``moment`` was (``time.monotonic()``)."""
        return next((at for _, _, at in self.acknowledged if at > moment), None)

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            self.attempted.add(seq)
            while not self._stop.is_set():
                try:
                    with self.engine.begin() as conn:
                        conn.execute(
                            text(
                                f"INSERT INTO {self.table} (gateway, seq) VALUES (:g, :s)"
                                " ON CONFLICT DO NOTHING"
                            ),
                            {"g": self.name, "s": seq},
                        )
                except DBAPIError as exc:
                    self.errors.append((time.monotonic(), exc))
                    self._stop.wait(RETRY_PAUSE)
                else:
                    self.acknowledged.append((self.name, seq, time.monotonic()))
                    break
            self._stop.wait(0.01)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[PatroniCluster]:
    missing = missing_requirements()
    if missing:
        skip_unless_ci(
            f"needs {', '.join(missing)}: apt-get install -y patroni etcd-server postgresql-15"
        )
    failed_before = request.session.testsfailed
    with PatroniCluster() as running:
        running.create_database("failover")
        yield running
        if request.session.testsfailed > failed_before:
            running.dump_logs()


def rows_on(cluster: PatroniCluster, node: str, table: str) -> set[tuple[str, int]]:
    with psycopg.connect(cluster.conninfo(node, "failover")) as conn:
        query = sql.SQL("SELECT gateway, seq FROM {}").format(sql.Identifier(table))
        return {(g, s) for g, s in conn.execute(query)}


def run_through_kill(
    cluster: PatroniCluster, table: str, *, machine: bool
) -> tuple[Failover, list[Gateway]]:
    """Two gateways write into a new ``table``; the primary is SIGKILLed mid-load (its machine,
    or only its PostgreSQL); the gateways go on until both wrote again after the kill (or
    30 s passed)."""
    leader, standby = cluster.heal()
    engine = create_engine(cluster.url("failover"))
    with engine.begin() as conn:
        conn.execute(
            text(f"CREATE TABLE {table} (gateway text, seq bigint, PRIMARY KEY (gateway, seq))")
        )
    gateways = [Gateway(f"gw{i}", engine, table) for i in (1, 2)]
    try:
        for gateway in gateways:
            gateway.start()
        deadline = time.monotonic() + 20
        while min(len(g.acknowledged) for g in gateways) < 50 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert min(len(g.acknowledged) for g in gateways) >= 50, "no load before the kill"
        with psycopg.connect(cluster.conninfo(leader)) as conn:
            replication = conn.execute(
                "SELECT application_name, sync_state FROM pg_stat_replication"
            ).fetchall()
        assert replication == [(standby, "sync")], "commits are not synchronous"

        old, killed_at = cluster.kill_primary(machine=machine)
        assert old == leader
        failover = cluster.wait_for_primary(old, killed_at, other_than_old=machine)
        deadline = killed_at + WRITES_RESUME_WITHIN + 5
        while time.monotonic() < deadline and not all(
            g.acknowledged_after(killed_at) for g in gateways
        ):
            time.sleep(0.1)
        time.sleep(1)  # a little load on the new primary, too
    finally:
        for gateway in gateways:
            gateway.stop()
        engine.dispose()
    return failover, gateways


def check_no_write_lost(
    cluster: PatroniCluster, failover: Failover, gateways: list[Gateway]
) -> None:
    stored = rows_on(cluster, failover.new, gateways[0].table)
    acknowledged = {(g, s) for gw in gateways for g, s, _ in gw.acknowledged}
    attempted = {(gw.name, s) for gw in gateways for s in gw.attempted}
    assert acknowledged - stored == set(), "acknowledged rows lost in the failover"
    assert stored <= attempted
    # A write whose COMMIT was in flight at the kill may be stored without its acknowledgement
    # (it is retried, idempotently): at most one per gateway.
    assert len(stored - acknowledged) <= len(gateways)
    for gateway in gateways:
        resumed = gateway.acknowledged_after(failover.killed_at)
        assert resumed is not None, f"{gateway.name} never wrote again"
        assert resumed - failover.killed_at < WRITES_RESUME_WITHIN


def check_errors_are_operational(gateways: list[Gateway]) -> None:
    """What a client sees during the failover: only ``sqlalchemy.exc.OperationalError`` over
    ``psycopg.OperationalError``: the open connection breaks (``connection_invalidated``),
    then new connections fail until a node is read-write again."""
    errors = [exc for gw in gateways for _, exc in gw.errors]
    assert errors, "the kill broke no connection"
    kinds = {(type(e).__name__, type(e.orig).__qualname__) for e in errors}
    assert all(isinstance(e, OperationalError) for e in errors), kinds
    assert all(isinstance(e.orig, psycopg.OperationalError) for e in errors), kinds
    assert any(e.connection_invalidated for e in errors)


@pytest.mark.slow
def test_primary_machine_dies_no_acknowledged_write_lost(cluster: PatroniCluster) -> None:
    failover, gateways = run_through_kill(cluster, "machine_dies", machine=True)
    print(f"\nfailover {failover.old} -> {failover.new} in {failover.seconds:.1f} s")
    assert failover.new != failover.old
    assert failover.seconds < WRITES_RESUME_WITHIN
    check_no_write_lost(cluster, failover, gateways)
    check_errors_are_operational(gateways)

    # The same URL, through a new pool, reaches the new primary.
    engine = create_engine(cluster.url("failover"))
    try:
        with engine.connect() as conn:
            port, in_recovery = conn.execute(
                text("SELECT inet_server_port(), pg_is_in_recovery()")
            ).one()
    finally:
        engine.dispose()
    assert (port, in_recovery) == (cluster.node(failover.new).pg_port, False)


@pytest.mark.slow
def test_old_primary_rejoins_as_synchronous_standby(cluster: PatroniCluster) -> None:
    """After the kill above, the old primary's Patroni restarts: it is rewound (pg_rewind) and
    becomes the synchronous standby of the new primary, with every row."""
    before = cluster.primary().name
    leader, standby = cluster.heal()
    assert leader == before
    stored = rows_on(cluster, leader, "machine_dies")
    deadline = time.monotonic() + 10
    while rows_on(cluster, standby, "machine_dies") != stored and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rows_on(cluster, standby, "machine_dies") == stored


@pytest.mark.slow
def test_primary_postgres_killed_patroni_restarts_it(cluster: PatroniCluster) -> None:
    """Only PostgreSQL dies (its machine and Patroni live): Patroni restarts it in place with
    crash recovery, or fails over if that takes longer than ``primary_start_timeout``."""
    failover, gateways = run_through_kill(cluster, "postgres_dies", machine=False)
    print(f"\npostgres killed on {failover.old}: primary {failover.new}, {failover.seconds:.1f} s")
    check_no_write_lost(cluster, failover, gateways)
    check_errors_are_operational(gateways)


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        (
            "postgresql+psycopg://u:p@/db?host=h1:5432&host=h2:5433&target_session_attrs=read-write",
            "h1,h2",
            "5432,5433",
        ),
        (
            "postgresql+psycopg://u:p@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
            "h1,h2",
            "5432,5433",
        ),
        # One port for every host: libpq splits the host list itself.
        ("postgresql+psycopg://u:p@h1,h2:5432/db?target_session_attrs=read-write", "h1,h2", 5432),
    ],
)
def test_multi_host_url_spellings(url: str, host: str, port: str | int) -> None:
    """The spellings of a multi-host URL that SQLAlchemy hands to psycopg 3 as libpq's
    ``host=h1,h2 port=p1,p2``."""
    _, kwargs = create_engine(url).dialect.create_connect_args(make_url(url))
    assert (kwargs["host"], kwargs["port"]) == (host, port)
    assert kwargs["target_session_attrs"] == "read-write"


def test_multi_host_url_with_ports_in_the_netloc_is_refused() -> None:
    """``h1:p1,h2:p2`` before the path does not parse: SQLAlchemy reads one port."""
    with pytest.raises(ValueError, match="invalid literal for int"):
        make_url("postgresql+psycopg://u:p@h1:5432,h2:5433/db")
