"""The SQLite text form of instants written by the driver-level statements (ingest, reconcile)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.storage.types import sqlite_text

pytestmark = pytest.mark.nodb


class _Clock(datetime):
    """A ``datetime`` subclass, such as a test clock's."""


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-9, minutes=-30))]
        ),
    )
)
def test_sqlite_text_is_the_utc_instant_with_microseconds(value: datetime) -> None:
    """Always ``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC (the fraction even when zero), so that text
    order is time order; the same as ``isoformat`` gives."""
    utc = value.astimezone(UTC)
    assert sqlite_text(value) == utc.replace(tzinfo=None).isoformat(" ", "microseconds")


def test_sqlite_text_examples() -> None:
    assert sqlite_text(datetime(2026, 11, 30, 18, 0, tzinfo=UTC)) == "2026-11-30 18:00:00.000000"
    assert (
        sqlite_text(datetime(2026, 1, 1, 1, 30, 0, 1, tzinfo=timezone(timedelta(hours=2))))
        == "2025-12-31 23:30:00.000001"
    )
    assert sqlite_text(datetime(999, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)) == (
        "0999-03-04 05:06:07.890000"
    )


def test_sqlite_text_of_a_datetime_subclass() -> None:
    value = _Clock(2026, 11, 30, 18, 0, 0, 5, tzinfo=UTC)
    assert sqlite_text(value) == "2026-11-30 18:00:00.000005"
