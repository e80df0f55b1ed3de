"""``events`` by month of ``occurred_at`` on PostgreSQL (migration ``0017_event_partitions``):
months made ahead by the service, an event of a month without a partition kept in the default
one and moved when its month is made, and ``event_id`` stored once across months (``event_ids``,
the dedup authority) on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from billing.ingest.partitions import make_partitions_ahead, months_ahead
from tests.budgets.helpers import state
from tests.builders import post
from tests.conftest import PG_URL


def _event(event_id: str, occurred_at: str, tokens: int = 5) -> dict[str, object]:
    return {
        "event_id": event_id,
        "request_id": "part-1",
        "type": "stream.tokens",
        "occurred_at": occurred_at,
        "output_tokens_generated": tokens,
        "output_tokens_delivered": tokens,
    }


def _where(client: TestClient) -> list[tuple[str, str]]:
    """(event_id, the table that holds it) of every event."""
    with state(client).engine.connect() as conn:
        query = "SELECT event_id, tableoid::regclass::text FROM events ORDER BY event_id"
        return [(e, t) for e, t in conn.execute(text(query))]


def test_months_ahead() -> None:
    assert months_ahead(datetime(2026, 11, 30, 23, tzinfo=UTC)) == [
        (2026, 11),
        (2026, 12),
        (2027, 1),
        (2027, 2),
    ]


def test_an_event_id_is_stored_once_whatever_its_month(client: TestClient) -> None:
    first = post(client, [_event("e-1", "2026-11-03T10:00:00Z")])
    assert first.json()["accepted"] == 1
    again = post(client, [_event("e-1", "2026-11-03T10:00:00Z")])
    assert (again.status_code, again.json()["duplicates"]) == (200, 1)
    # The same id with another occurred_at (another month: another partition on PostgreSQL).
    moved = post(client, [_event("e-1", "2026-10-03T10:00:00Z")])
    assert moved.status_code == 409, moved.text
    with state(client).engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM events")) == 1


@pytest.fixture
def months_2020(client: TestClient) -> Iterator[None]:
    """The partitions of 2020 the test makes are dropped after it (the test database outlives
    the test, and its rows are only truncated)."""
    yield
    with state(client).engine.begin() as conn:
        for year, month in months_ahead(datetime(2020, 5, 1, tzinfo=UTC)):
            conn.execute(text(f"DROP TABLE IF EXISTS events_{year}_{month:02d}"))


@pytest.mark.skipif(PG_URL is None, reason="partitions are PostgreSQL's")
@pytest.mark.usefixtures("months_2020")
def test_months_are_made_ahead_and_take_their_rows_from_the_default(client: TestClient) -> None:
    # 2020-05 and 06 have no partition yet: its event lands in the default partition.
    post(client, [_event("far-1", "2020-06-15T00:00:00Z"), _event("far-0", "2020-05-31T23:59:59Z")])
    assert _where(client) == [("far-0", "events_default"), ("far-1", "events_default")]
    sessions = state(client).sessions
    made = make_partitions_ahead(sessions, datetime(2020, 5, 20, tzinfo=UTC))
    assert made == [(2020, 5), (2020, 6), (2020, 7), (2020, 8)]
    assert _where(client) == [("far-0", "events_2020_05"), ("far-1", "events_2020_06")]
    # Made once: a second look (another replica) makes nothing.
    assert make_partitions_ahead(sessions, datetime(2020, 5, 20, tzinfo=UTC)) == []
    # New events of those months go to their partition; their ids are still stored once.
    post(client, [_event("far-2", "2020-07-01T00:00:00Z")])
    assert post(client, [_event("far-1", "2020-06-15T00:00:00Z")]).json()["duplicates"] == 1
    assert _where(client)[-1] == ("far-2", "events_2020_07")
