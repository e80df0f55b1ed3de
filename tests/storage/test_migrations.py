"""The migrations build exactly the schema of the models, both ways, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.migrate import alembic_config, head_revision
from billing.storage.models import Base
from billing.storage.models.by_database import compared, only_on_postgres
from tests.conftest import PG_URL, pg_admin_url


@pytest.fixture
def fresh_url(tmp_path: Path) -> Iterator[str]:
    """An empty database of its own: a new SQLite file, or a new PostgreSQL database."""
    if not PG_URL:
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    name = f"billing_mig_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_admin_url(PG_URL), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _tables(url: str) -> set[str]:
    """The database's tables, PostgreSQL's own (``event_ids``, ``events``' partitions) left out
    (``_postgres_own`` looks at those)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        return {name for name in inspect(engine).get_table_names() if not only_on_postgres(name)}
    finally:
        engine.dispose()


def _postgres_own(url: str) -> tuple[str, set[str]]:
    """On PostgreSQL: the kind of ``events`` (``p``: partitioned) and the tables the models do
    not describe."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            kind = conn.scalar(text("SELECT relkind FROM pg_class WHERE relname = 'events'"))
        own = {name for name in inspect(engine).get_table_names() if only_on_postgres(name)}
        return str(kind), own
    finally:
        engine.dispose()


def _schema_diff(url: str) -> list[object]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "compare_server_default": True,
                    "include_object": compared(conn.dialect.name),
                },
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def _revision(url: str) -> str | None:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_matches_the_models(fresh_url: str) -> None:
    config = alembic_config(fresh_url)
    model_tables = {table.name for table in Base.metadata.sorted_tables}
    assert "events" in model_tables and "calls" in model_tables

    command.upgrade(config, "head")
    assert _tables(fresh_url) == model_tables | {"alembic_version"}
    assert _revision(fresh_url) == head_revision()
    assert _schema_diff(fresh_url) == []
    if PG_URL:
        kind, own = _postgres_own(fresh_url)
        assert kind == "p"
        assert {"event_ids", "events_default"} <= own
        assert len(own) >= 3  # and the current month's partition, and the months ahead

    command.downgrade(config, "base")
    assert _tables(fresh_url) <= {"alembic_version"}
    assert _revision(fresh_url) is None

    command.upgrade(config, "head")
    assert _tables(fresh_url) == model_tables | {"alembic_version"}
    assert _revision(fresh_url) == head_revision()
    assert _schema_diff(fresh_url) == []


def test_an_empty_database_differs_from_the_models(fresh_url: str) -> None:
    """The comparison above can fail: on an unmigrated database it finds every table missing."""
    added = {
        diff[1].name
        for diff in _schema_diff(fresh_url)
        if isinstance(diff, tuple) and diff[0] == "add_table"
    }
    assert added == {table.name for table in Base.metadata.sorted_tables}


def _billing_command() -> list[str]:
    script = shutil.which("billing", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-c", "from billing.cli import main; main()"]


def _clean_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    env.update(settings)
    return env


@pytest.mark.slow
def test_readyz_is_503_before_and_200_after_billing_migrate(fresh_url: str, tmp_path: Path) -> None:
    app = create_app(Settings(database_url=fresh_url))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        before = client.get("/readyz")
        assert before.status_code == 503, before.text
        assert before.json()["status"] != "ready"

        done = subprocess.run(
            [*_billing_command(), "migrate"],
            env=_clean_env(BILLING_DATABASE_URL=fresh_url),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""

        after = client.get("/readyz")
        assert after.status_code == 200, after.text
        assert after.json() == {"status": "ready"}
        assert client.get("/healthz").status_code == 200

    # Migrating again is a no-op that succeeds.
    again = subprocess.run(
        [*_billing_command(), "migrate"],
        env=_clean_env(BILLING_DATABASE_URL=fresh_url),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert _schema_diff(fresh_url) == []
    assert not (tmp_path / "billing.db").exists()  # the URL given was used, not the default


def test_readyz_is_503_when_the_database_is_behind_head(fresh_url: str) -> None:
    command.upgrade(alembic_config(fresh_url), "head")
    command.downgrade(alembic_config(fresh_url), "base")
    with TestClient(
        create_app(Settings(database_url=fresh_url)), base_url="http://127.0.0.1"
    ) as client:
        reply = client.get("/readyz")
    assert reply.status_code == 503, reply.text
    assert "billing migrate" in reply.json()["reason"]


def test_0020_fills_the_kept_remainders_and_overdrafts_from_the_entries(fresh_url: str) -> None:
    """Credit entries booked before migration 0020 give each grant its ``remaining_pusd`` and
    each owner with entries of no grant its ``credit_overdrafts`` row."""
    config = alembic_config(fresh_url)
    command.upgrade(config, "0019_open_calls_by_owner")
    engine = create_engine(fresh_url, poolclass=NullPool)
    at = "2026-03-01 10:00:00+00:00"
    grant_row = (
        "INSERT INTO credit_grants (grant_id, customer_id, api_key_id, amount_pusd, effective_at, "
        "priority, kind, created_at) VALUES (:g, :c, :k, :a, :t, 100, 'purchased', :t)"
    )
    entry_row = (
        "INSERT INTO credit_entries (kind, booked_at, customer_id, api_key_id, grant_id, "
        "amount_pusd, request_id) VALUES (:kind, :t, :c, :k, :g, :a, :r)"
    )
    try:
        with engine.begin() as conn:
            conn.execute(text(grant_row), {"g": "ga", "c": "acme", "k": None, "a": 100, "t": at})
            conn.execute(text(grant_row), {"g": "gk", "c": None, "k": "key_b", "a": 50, "t": at})
            conn.execute(text(grant_row), {"g": "gz", "c": "acme", "k": None, "a": 7, "t": at})
            for kind, c, k, g, a, r in (
                ("grant", "acme", None, "ga", 100, None),
                ("grant", None, "key_b", "gk", 50, None),
                ("draw", "acme", None, "ga", 30, "r1"),
                ("reversal", "acme", None, "ga", -30, "r1"),
                ("draw", "acme", None, "ga", 60, "r1"),
                ("overdraft", "acme", None, None, 20, "r1"),
                ("reversal", "acme", None, None, -5, "r2"),
                ("draw", None, "key_b", "gk", 50, "r3"),
                ("overdraft", None, "key_b", None, 9, "r3"),
            ):
                conn.execute(text(entry_row), {"kind": kind, "t": at, "c": c, "k": k, "g": g,
                                               "a": a, "r": r})  # fmt: skip
        command.upgrade(config, "head")
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT grant_id, remaining_pusd FROM credit_grants"))
            assert sorted(tuple(row) for row in kept) == [("ga", 40), ("gk", 0), ("gz", 0)]
            owed = conn.execute(
                text("SELECT owner, customer_id, api_key_id, overdraft_pusd FROM credit_overdrafts")
            )
            assert sorted(tuple(row) for row in owed) == [
                ("customer:acme", "acme", None, 15),
                ("key:key_b", None, "key_b", 9),
            ]
    finally:
        engine.dispose()


def test_0021_fills_the_rollups_by_key_and_by_status_from_what_is_stored(fresh_url: str) -> None:
    """The rollups 0021 adds, filled by the migration from the calls and rollups stored before
    it, are the rows the reconciler keeps: calls settled by the fast path and by the rule, of
    each status, a key with a customer, a late usage (an adjustment) and a late price."""
    from billing.rollups.service import dump
    from tests.calllog.test_calls_query import M1_PRICE, call_events, post, reconcile_at

    config = alembic_config(fresh_url)
    command.upgrade(config, "head")
    start = datetime(2026, 3, 1, 9, 58, tzinfo=UTC)
    with TestClient(
        create_app(Settings(database_url=fresh_url)), base_url="http://127.0.0.1"
    ) as client:
        assert client.post("/v1/prices", json=M1_PRICE).status_code == 201
        assert (
            client.put(
                "/v1/keys/key_c",
                json={"customer_id": "acme", "effective_from": "2026-01-01T00:00:00Z"},
            ).status_code
            == 201
        )
        events = []
        for i in range(40):
            key = ("key_a", "key_b", "key_c")[i % 3]
            status = ("completed", "failed", "client_disconnected", "completed")[i % 4]
            model = ("m1", "m9")[i % 5 == 0]  # m9: priced late
            at = start + timedelta(minutes=7 * i, microseconds=i)
            events += call_events(f"r{i:02d}", at, key=key, model=model, status=status)
        post(client, events)
        reconcile_at(client, start + timedelta(days=1))
        late = {"event_id": "r03-late", "request_id": "r03", "type": "stream.usage",
                "occurred_at": (start + timedelta(minutes=22)).isoformat(),
                "input_tokens": 9000, "output_tokens": 900, "source": "upstream"}  # fmt: skip
        post(client, [late])
        m9 = {**M1_PRICE, "model": "m9", "effective_from": "2026-01-01T00:00:00Z"}
        assert client.post("/v1/prices", json=m9).status_code == 201
        reconcile_at(client, start + timedelta(days=3))
        with client.app.state.billing.sessions() as session:  # type: ignore[attr-defined]
            kept = dump(session)
    new = ("usage_rollups_by_key", "usage_rollups_by_customer", "call_status_rollups")
    assert all(kept[name] for name in new)
    assert "acme" in {row[4] for row in kept["usage_rollups_by_key"]}
    assert {row[2] for row in kept["call_status_rollups"]} == {
        "completed", "failed", "client_disconnected"}  # fmt: skip
    command.downgrade(config, "0020_credit_remainders")
    command.upgrade(config, "head")
    engine = create_engine(fresh_url, poolclass=NullPool)
    try:
        with Session(engine) as session:
            filled = dump(session)
    finally:
        engine.dispose()
    for name in new:
        assert filled[name] == kept[name], name


def test_0026_numbers_the_credit_entries_of_calls_by_their_calls(fresh_url: str) -> None:
    """The credit entries booked before 0026 (draws of the fast path's and of the rule's calls,
    a reversal, an overdraft, grants) take their call's ``call_no``; the others none."""
    from tests.credits.helpers import JAN, PRICE, call, grant, reconcile

    config = alembic_config(fresh_url)
    command.upgrade(config, "head")
    settings = Settings(database_url=fresh_url)
    numbered = (
        "SELECT e.kind, e.request_id, e.call_no, c.call_no FROM credit_entries e "
        "LEFT JOIN calls c ON c.request_id = e.request_id ORDER BY e.entry_id"
    )
    app = create_app(settings)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.post("/v1/prices", json=PRICE).status_code == 201
        key = {"customer_id": "acme", "effective_from": JAN}
        assert client.put("/v1/keys/key_a", json=key).status_code == 201
        grant(client, "g", "0.015")
        grant(client, "k", "1", api_key_id="key_solo")
        call(client, "r1", "2026-03-01T10:00:00Z", 1000)
        call(client, "r2", "2026-03-01T10:00:00Z", 1000)  # 0.005 drawn, 0.005 overdraft
        call(client, "s1", "2026-03-01T10:00:00Z", 3000, key="key_solo")
        reconcile(app, settings, "2026-03-01T10:05:00Z")
        with app.state.billing.sessions() as session:
            before = [tuple(row) for row in session.execute(text(numbered))]
    kinds = [(kind, rid) for kind, rid, _, _ in before]
    assert kinds == [("grant", None), ("grant", None), ("draw", "r1"), ("draw", "r2"),
                     ("overdraft", "r2"), ("draw", "s1")]  # fmt: skip
    assert all(mine == theirs for _, rid, mine, theirs in before if rid is not None)
    assert [mine for _, _, mine, _ in before[:2]] == [None, None]
    command.downgrade(config, "0025_hold_settled")
    command.upgrade(config, "head")
    engine = create_engine(fresh_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            after = [tuple(row) for row in conn.execute(text(numbered))]
    finally:
        engine.dispose()
    assert after == before


def test_0027_splits_the_kept_overdrafts_into_dollars_and_picodollars(fresh_url: str) -> None:
    """The overdrafts kept before 0027 (one 64-bit sum an owner) are split into whole dollars
    and the picodollars below one; a downgrade joins them again."""
    config = alembic_config(fresh_url)
    command.upgrade(config, "0026_credit_entries_call_no")
    engine = create_engine(fresh_url, poolclass=NullPool)
    kept = "SELECT owner, overdraft_pusd FROM credit_overdrafts ORDER BY owner"
    try:
        with engine.begin() as conn:
            for owner, amount in (("customer:acme", 1_234_567_890_123_456), ("key:k", 9),
                                  ("key:z", 0), ("key:w", 7 * 10**12)):  # fmt: skip
                conn.execute(
                    text("INSERT INTO credit_overdrafts VALUES (:o, NULL, :k, :a)"),
                    {"o": owner, "k": owner, "a": amount},
                )
        command.upgrade(config, "0027_credit_overdraft_whole")
        with engine.connect() as conn:
            split = conn.execute(
                text(
                    "SELECT owner, overdraft_whole_usd, overdraft_pusd FROM credit_overdrafts "
                    "ORDER BY owner"
                )
            ).all()
        assert [tuple(row) for row in split] == [
            ("customer:acme", 1234, 567_890_123_456),
            ("key:k", 0, 9),
            ("key:w", 7, 0),
            ("key:z", 0, 0),
        ]
        command.downgrade(config, "0026_credit_entries_call_no")
        with engine.connect() as conn:
            joined = [tuple(row) for row in conn.execute(text(kept))]
        assert joined == [("customer:acme", 1_234_567_890_123_456), ("key:k", 9),
                          ("key:w", 7 * 10**12), ("key:z", 0)]  # fmt: skip
    finally:
        engine.dispose()
