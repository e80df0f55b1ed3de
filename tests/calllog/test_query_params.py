"""The one reading of timestamps and zones in query strings (/v1/calls, /v1/usage, exports)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing.calllog.params import parse_timestamp, parse_zone

pytestmark = pytest.mark.nodb


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-08T00:00:00Z", datetime(2026, 3, 8, tzinfo=UTC)),
        ("2026-03-08 05:30:00+05:30", datetime(2026, 3, 8, tzinfo=UTC)),
        ("2026-03-08t05:30:00 05:30", datetime(2026, 3, 8, tzinfo=UTC)),  # + arrived as a space
        (" 2026-03-08T00:00:00z ", datetime(2026, 3, 8, tzinfo=UTC)),
        ("2026-03-07T23:00:00-01:00", datetime(2026, 3, 8, tzinfo=UTC)),
        # Beyond microseconds: rounded up, so a half-open bound keeps stored instants on their side.
        ("2026-03-08T00:00:00.0000001Z", datetime(2026, 3, 8, 0, 0, 0, 1, tzinfo=UTC)),
        ("2026-03-08T00:00:00.123456001Z", datetime(2026, 3, 8, 0, 0, 0, 123457, tzinfo=UTC)),
        ("2026-03-08T00:00:00.999999999Z", datetime(2026, 3, 8, 0, 0, 1, tzinfo=UTC)),
        ("2026-03-08T00:00:00.123456000Z", datetime(2026, 3, 8, 0, 0, 0, 123456, tzinfo=UTC)),
    ],
)
def test_query_timestamps_are_read_as_instants(text: str, expected: datetime) -> None:
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("2026-03-08T00:00:00+05:60", "not an RFC 3339 timestamp"),  # minutes of an offset
        ("2026-03-08T00:00:00-00:99", "not an RFC 3339 timestamp"),
        ("2026-03-08T00:00:00", "has no UTC offset"),
        ("2026-03-08", "not an RFC 3339 timestamp"),
        ("2026-02-30T00:00:00Z", "not a valid date and time"),
        ("9999-12-31T23:59:59.9999999Z", "out of range"),
    ],
)
def test_bad_query_timestamps_are_refused_in_words(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_timestamp(text)


@pytest.mark.parametrize(
    ("text", "key"),
    [("UTC", "UTC"), (" Europe/Paris ", "Europe/Paris"), ("Etc/GMT 5", "Etc/GMT+5")],
)
def test_zone_names_of_the_time_zone_database(text: str, key: str) -> None:
    assert parse_zone(text).key == key


@pytest.mark.parametrize(
    "text",
    ["localtime", "posix/Europe/Paris", "right/Europe/Paris", "posixrules", "Mars/Olympus", ""],
)
def test_zones_that_depend_on_the_server_or_do_not_exist_are_refused(text: str) -> None:
    """``localtime`` is the server's own zone and ``right/…`` counts leap seconds: the same
    export would differ from one server to another."""
    with pytest.raises(ValueError, match="unknown time zone"):
        parse_zone(text)
