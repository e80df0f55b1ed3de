"""The drift's rollup (``billing.rollups.drift``) against the drift's definition: after
settlements, a re-settlement with new usage and a reprice, ``drift_rollups`` equals its rebuild
from calls, and ours read through it equals summing the calls by start, on the test database."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from billing.drift.repository import repository as drift_repository
from billing.rollups import drift as rollup
from billing.storage.migrate import alembic_config
from billing.storage.models import Call, DriftRollup
from tests.builders import post
from tests.drift.test_drift import DAY, call, settle
from tests.storage import test_migrations

#: An empty database of its own at no revision (the migrations' fixture).
fresh_url = test_migrations.fresh_url

PRICE = {
    "model": "gpt-4o",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "2.5",
    "output_usd_per_mtok": "10",
    "cache_read_usd_per_mtok": "1.25",
    "cache_creation_usd_per_mtok": "0",
}
#: Whole days, whole hours around whole days, and ragged ends.
PERIODS = [
    (DAY, DAY + timedelta(days=1)),
    (DAY - timedelta(hours=3), DAY + timedelta(days=1, hours=2)),
    (DAY - timedelta(hours=3, minutes=30), DAY + timedelta(days=1, hours=2, minutes=15)),
    (DAY + timedelta(hours=10, minutes=20), DAY + timedelta(hours=11, minutes=40)),
    (DAY + timedelta(hours=10, minutes=5), DAY + timedelta(hours=10, minutes=50)),
]


def _rows(session: Session) -> set[tuple[Any, ...]]:
    table = DriftRollup.__table__
    return {tuple(r) for r in session.execute(select(table).where(table.c.calls != 0))}


def _defined(session: Session, since: datetime, until: datetime, grain: str) -> dict[Any, Any]:
    """Ours as the drift defines it: every call started in the period, summed by slot."""
    summed: dict[Any, list[int]] = defaultdict(lambda: [0] * 7)
    for c in session.scalars(select(Call)):
        if c.started_at is None or not since <= c.started_at < until:
            continue
        at = c.started_at.astimezone(UTC)
        slot = at.strftime("%Y-%m-%d" if grain == "day" else "%Y-%m-%d %H")
        key = (slot, c.provider, c.model, c.upstream_account, c.service_tier)
        figures = (max(c.attempts, 1), c.input_tokens, c.cache_read_input_tokens)
        figures += (c.cache_creation_input_tokens, c.output_tokens_billed, c.cost_pusd or 0)
        figures += (int(c.settled and c.cost_pusd is None),)
        summed[key] = [a + b for a, b in zip(summed[key], figures, strict=True)]
    return dict(summed)


def _read(session: Session, since: datetime, until: datetime, grain: str) -> dict[Any, Any]:
    summed: dict[Any, list[int]] = defaultdict(lambda: [0] * 7)
    for row in drift_repository(session).ours(session, since, until, None, grain):  # type: ignore[arg-type]
        key = tuple(row[:5])
        summed[key] = [a + b for a, b in zip(summed[key], row[5:], strict=True)]
    return dict(summed)


def _check(db_url: str) -> set[tuple[Any, ...]]:
    engine = create_engine(db_url, poolclass=NullPool)
    with Session(engine) as session:
        kept = _rows(session)
        for since, until in PERIODS:
            for grain in ("day", "hour"):
                assert _read(session, since, until, grain) == _defined(session, since, until, grain)
        rollup.rebuild(session)
        assert _rows(session) == kept
        session.rollback()
    engine.dispose()
    return kept


def test_the_rollup_equals_the_calls_after_settlements_re_settlements_and_a_reprice(
    client: TestClient, db_url: str
) -> None:
    assert client.post("/v1/prices", json=PRICE).status_code == 201
    call(client, "r1", at=DAY + timedelta(hours=10, minutes=10), upstream_account="proj_a")
    call(client, "r2", at=DAY + timedelta(hours=10, minutes=30), tier="priority")
    call(client, "r3", at=DAY + timedelta(hours=11, minutes=45), output=7)
    call(client, "r4", model="claude-sonnet-4-5", protocol="anthropic.messages")
    # An open call (no usage yet): not in the rollup, one request in ours.
    started = {
        "event_id": "r5-s",
        "request_id": "r5",
        "type": "stream.started",
        "occurred_at": "2026-11-10T10:40:00Z",
        "api_key_id": "key_7f3a",
        "model": "gpt-4o",
        "protocol": "openai.chat_completions",
    }
    assert post(client, [started]).status_code == 200
    _check(db_url)
    settle(client)
    first = _check(db_url)
    assert len(first) == 8  # r1, r2 (a tier), r3, r4 (anthropic): their hours and days

    # r1 re-settled with new usage (a later stream.usage wins): its figures move.
    retry = [
        {
            **started,
            "event_id": "r1-s2",
            "request_id": "r1",
            "attempt": 1,
            "occurred_at": "2026-11-10T10:10:05Z",
            "upstream_account": "proj_a",
        },
        {
            "event_id": "r1-u2",
            "request_id": "r1",
            "attempt": 1,
            "type": "stream.usage",
            "occurred_at": "2026-11-10T10:10:09Z",
            "input_tokens": 40,
            "output_tokens": 9,
            "source": "upstream",
        },
    ]
    assert post(client, retry).status_code == 200
    _check(db_url)
    settle(client)
    second = _check(db_url)
    assert second != first
    # r1's hour and day rows (its own account): the new usage's 40 input and 9 output tokens;
    # its cache reads, which the new usage lowers to 0, keep the largest count, 50 (v3:
    # ``usage_inconsistent``).
    (r1_hour,) = [r for r in second if r[0] == 0 and r[4] == "proj_a"]
    (r1_day,) = [r for r in second if r[0] == 1 and r[4] == "proj_a"]
    assert r1_hour[6:12] == r1_day[6:12] == (1, 1, 40, 50, 0, 9)

    # A reprice from before the calls: every gpt-4o call settles again at the new price.
    assert (
        client.post(
            "/v1/prices",
            json={**PRICE, "effective_from": "2026-11-01T00:00:00Z", "output_usd_per_mtok": "20"},
        ).status_code
        == 201
    )
    settle(client)
    third = _check(db_url)

    def day_cost(rows: set[tuple[Any, ...]]) -> int:
        # ... cost_whole_usd, cost_frac_pusd, unpriced_calls
        return sum(r[-3] * 10**12 + r[-2] for r in rows if r[0] == 1 and r[3] == "gpt-4o")

    # Output at 20 instead of 10 USD per million: r1 9, r2 200, r3 7 output tokens.
    assert day_cost(third) - day_cost(second) == (9 + 200 + 7) * 10 * 10**6


def test_the_migration_backfills_the_rollup_from_the_settled_calls(fresh_url: str) -> None:
    config = alembic_config(fresh_url)
    command.upgrade(config, "0004")
    at = DAY + timedelta(hours=10, minutes=5)

    def row(rid: str, n: int, **values: Any) -> dict[str, Any]:
        base = {
            "request_id": rid,
            "call_no": n,
            "first_received_at": at,
            "last_received_at": at,
            "started_at": at,
            "api_key_id": "key_1",
            "model": "gpt-4o",
            "provider": "openai",
            "settled": True,
            "pending": False,
            "status": "completed",
            "attempts": 1,
            "anomalies": [],
            "input_tokens": 10,
            "output_tokens_billed": 20,
            "cost_pusd": 3 * 10**12 + 5,
        }
        return {**base, **values}

    calls = [
        row("a", 1),
        row("b", 2, attempts=2, started_at=at + timedelta(hours=1), cost_pusd=None),  # unpriced
        row("c", 3, settled=False, status="open"),  # open: read from calls
        row("d", 4, api_key_id=None, anomalies=["started_missing"]),  # key-less: from calls
    ]
    engine = create_engine(fresh_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(Call.__table__.insert(), calls)
    command.upgrade(config, "head")
    with Session(engine) as session:
        backfilled = _rows(session)
        rollup.rebuild(session)
        assert _rows(session) == backfilled
    engine.dispose()
    labels = ("openai", "gpt-4o", "", "")
    hour, day = DAY + timedelta(hours=10), DAY
    figures = (1, 1, 10, 0, 0, 20, 3, 5, 0)
    later = (1, 2, 10, 0, 0, 20, 0, 0, 1)
    both = (2, 3, 20, 0, 0, 40, 3, 5, 1)
    assert {(r[0], r[1].astimezone(UTC), *r[2:]) for r in backfilled} == {
        (0, hour, *labels, *figures),
        (0, hour + timedelta(hours=1), *labels, *later),
        (1, day, *labels, *both),
    }
