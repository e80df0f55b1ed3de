"""``billing archive --before YYYY-MM`` then ``billing archive restore FILE`` (CONTRACT "Replicas,
failover and archives (v3)"): the month's events leave the database for a Parquet file listed in
the manifest (rows, SHA-256), every export and query of the month answers the same bytes while
they are away, and the restore gives back the very rows."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from billing.archive.schemas import Month
from billing.archive.service import ArchiveRefused, archive_before
from tests.budgets.helpers import call, price, reconcile, state
from tests.builders import post
from tests.cli_runs import run_billing

OCT = datetime(2026, 10, 14, 9, 30, tzinfo=UTC)
NOV = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
READS = [
    "/v1/exports/calls.csv?since=2026-10-01T00:00:00Z&until=2026-11-01T00:00:00Z",
    "/v1/exports/usage.csv?since=2026-10-01T00:00:00Z&until=2026-11-01T00:00:00Z",
    "/v1/exports/calls.csv?since=2026-10-01T00:00:00Z&until=2026-12-01T00:00:00Z&format=v2",
    "/v1/exports/usage.csv?since=2026-10-01T00:00:00Z&until=2026-12-01T00:00:00Z&group_by=hour,"
    "api_key_id,model",
    "/v1/usage?since=2026-10-01T00:00:00Z&until=2026-12-01T00:00:00Z&group_by=day,model",
    "/v1/calls?limit=100",
]


def _events(client: TestClient) -> list[tuple[Any, ...]]:
    with state(client).engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT * FROM events ORDER BY seq"))]


def _reads(client: TestClient) -> list[bytes]:
    answers = []
    for path in READS:
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
        answers.append(response.content)
    return answers


def _seed(client: TestClient) -> None:
    price(client, effective_from="2026-01-01T00:00:00Z")
    for n in range(12):
        call(client, f"oct-{n}", OCT + timedelta(hours=n), 1_000 * (n + 1), 37 * n)
    for n in range(5):
        call(client, f"nov-{n}", NOV + timedelta(minutes=n), 500, 10)
    reconcile(client, NOW)


def test_archive_then_restore_a_month(
    client: TestClient, db_url: str, tmp_path: Path, is_postgres: bool
) -> None:
    _seed(client)
    before_events = _events(client)
    before_reads = _reads(client)
    october = [row for row in before_events if row[1].startswith("oct-")]
    assert len(october) == 24 and len(before_events) == 34

    env = {**os.environ, "BILLING_DATABASE_URL": db_url}
    archive_dir = tmp_path / "archive"
    done = run_billing(
        "in process", ["archive", "--before", "2026-11", "--to", str(archive_dir)], env, tmp_path
    )
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(done.stdout)["archived"]
    assert (entry["month"], entry["file"], entry["rows"]) == (
        "2026-10",
        "events-2026-10.parquet",
        24,
    )

    # The file and the manifest agree, and pyarrow reads the rows back.
    file = archive_dir / "events-2026-10.parquet"
    manifest = json.loads((archive_dir / "manifest.json").read_text())
    assert manifest["months"] == [entry]
    assert entry["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    table = pq.read_table(file)
    assert table.num_rows == entry["rows"] == 24
    assert sorted(table.column("event_id").to_pylist()) == sorted(row[1] for row in october)
    assert (entry["first_seq"], entry["last_seq"]) == (october[0][0], october[-1][0])

    # Away: October's events are gone, November's stay, every answer is the same bytes.
    assert _events(client) == [row for row in before_events if row not in october]
    assert _reads(client) == before_reads
    if is_postgres:
        # An archived event sent again is still known (event_ids, the dedup authority).
        again = {
            "event_id": october[0][1],
            "request_id": october[0][2],
            "type": "stream.started",
            "occurred_at": "2026-10-14T09:30:00Z",
            "api_key_id": "key_b1",
            "model": "m-budget",
            "protocol": "openai.chat_completions",
            "input_tokens": 1000,
        }
        assert post(client, [again]).json()["duplicates"] == 1
        assert len(_events(client)) == 10

    done = run_billing("in process", ["archive", "restore", str(file)], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "restored": "events-2026-10.parquet",
        "rows": 24,
        "already_stored": 0,
    }
    assert _events(client) == before_events
    assert _reads(client) == before_reads
    # Nothing left before November: a second archive writes nothing.
    assert archive_before(state(client).sessions, Month.parse("2026-10"), archive_dir, NOW) == []


def test_a_damaged_file_is_not_restored(client: TestClient, tmp_path: Path) -> None:
    _seed(client)
    [entry] = archive_before(state(client).sessions, Month.parse("2026-11"), tmp_path, NOW)
    file = tmp_path / entry.file
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    from billing.archive.service import restore

    with pytest.raises(ArchiveRefused, match="SHA-256"):
        restore(state(client).sessions, file)


def test_open_months_and_open_calls_are_refused(client: TestClient, tmp_path: Path) -> None:
    _seed(client)
    sessions = state(client).sessions
    with pytest.raises(ArchiveRefused, match="after the current month"):
        archive_before(sessions, Month.parse("2027-01"), tmp_path, NOW)
    # A call of October still open (no usage yet): October stays.
    assert (
        post(
            client,
            [
                {
                    "event_id": "late-s",
                    "request_id": "late",
                    "type": "stream.started",
                    "occurred_at": "2026-10-20T00:00:00Z",
                    "api_key_id": "key_b1",
                    "model": "m-budget",
                    "protocol": "openai.chat_completions",
                }
            ],
        ).status_code
        == 200
    )
    with pytest.raises(ArchiveRefused, match="1 call"):
        archive_before(sessions, Month.parse("2026-11"), tmp_path, NOW)
    assert not list(tmp_path.glob("*.parquet"))


def _late_usage(client: TestClient, event_id: str = "oct-3-late") -> None:
    """A later upstream usage of oct-3 (started 2026-10-14T12:30Z: 4,000 input tokens, 111
    output), arriving after October was archived: 500 output tokens."""
    late = {
        "event_id": event_id,
        "request_id": "oct-3",
        "type": "stream.usage",
        "occurred_at": "2026-10-14T12:30:05Z",
        "input_tokens": 4000,
        "output_tokens": 500,
        "source": "upstream",
    }
    assert post(client, [late]).json() == {"accepted": 1, "duplicates": 0}


def _parked(client: TestClient) -> list[tuple[Any, ...]]:
    with state(client).engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT p.request_id, c.pending FROM parked_calls AS p "
                    "JOIN calls AS c ON c.request_id = p.request_id"
                )
            )
        ]


def test_a_late_event_of_an_archived_call_waits_for_the_restore(
    client: TestClient, tmp_path: Path
) -> None:
    # Rebuilt from the events still stored (the late one alone), the call lost its key, model
    # and cost: a reversal was booked. It is left as it was until its month is restored, then
    # settled with all its events.
    _seed(client)
    sessions = state(client).sessions
    before = client.get("/v1/calls/oct-3").json()
    assert (before["cost_usd"], before["output_tokens_billed"]) == ("0.004222", 111)
    # Archived after the calls arrived (the test's clock NOW is in the past of their arrival).
    [entry] = archive_before(sessions, Month.parse("2026-11"), tmp_path, datetime.now(UTC))
    reads = _reads(client)
    _late_usage(client)
    reconcile(client, NOW + timedelta(minutes=5))
    assert _reads(client) == reads
    after = client.get("/v1/calls/oct-3").json()
    # The same call and ledger; its events away but the late one.
    assert {k: v for k, v in after.items() if k != "events"} == {
        k: v for k, v in before.items() if k != "events"
    }
    assert [e["event_id"] for e in after["events"]] == ["oct-3-late"]
    assert _parked(client) == [("oct-3", False)]
    # Another pass leaves it alone too; so does one after the same report sent again (the
    # call pending and parked again: noted once).
    reconcile(client, NOW + timedelta(minutes=6))
    assert _reads(client) == reads
    _late_usage(client, "oct-3-late-again")
    reconcile(client, NOW + timedelta(minutes=7))
    assert _reads(client) == reads
    assert _parked(client) == [("oct-3", False)]

    from billing.archive.service import restore

    assert restore(sessions, tmp_path / entry.file).rows == 24
    reconcile(client, NOW + timedelta(minutes=10))
    settled = client.get("/v1/calls/oct-3").json()
    assert (settled["api_key_id"], settled["model"]) == ("key_b1", "m-budget")
    assert (settled["cost_usd"], settled["output_tokens_billed"]) == ("0.005", 500)
    assert [e["cost_usd"] for e in settled["ledger_entries"]] == ["0.004222", "0.000778"]
    assert _parked(client) == []


def test_a_month_archived_is_not_written_again_with_its_late_events(
    client: TestClient, tmp_path: Path
) -> None:
    # A late event of an October call (occurred in October) is stored in the emptied month;
    # archiving again wrote October's file anew with that one event in place of the 24.
    _seed(client)
    sessions = state(client).sessions
    [october] = archive_before(sessions, Month.parse("2026-11"), tmp_path, datetime.now(UTC))
    first = (tmp_path / october.file).read_bytes()
    _late_usage(client)
    reconcile(client, NOW + timedelta(minutes=5))
    [november] = archive_before(sessions, Month.parse("2026-12"), tmp_path, datetime.now(UTC))
    assert (november.month, november.rows) == ("2026-11", 10)
    assert (tmp_path / october.file).read_bytes() == first
    assert [m["month"] for m in json.loads((tmp_path / "manifest.json").read_text())["months"]] == [
        "2026-10",
        "2026-11",
    ]
    assert [row[1] for row in _events(client)] == ["oct-3-late"]


def _body(client: TestClient, event_id: str) -> dict[str, Any]:
    with state(client).engine.connect() as conn:
        body = conn.execute(
            text("SELECT body FROM events WHERE event_id = :i"), {"i": event_id}
        ).scalar_one()
    return json.loads(body) if isinstance(body, str) else dict(body)


def test_a_restore_again_or_over_events_sent_again_keeps_what_is_stored(
    client: TestClient, tmp_path: Path, is_postgres: bool
) -> None:
    # A restore met an archived event's id already stored (SQLite: sent again by a gateway
    # after the archive; either database: the file restored a second time) and stopped on the
    # unique event_id with a traceback. The event stored with the same content stands for it.
    _seed(client)
    sessions = state(client).sessions
    resent = _body(client, "oct-3-s") if not is_postgres else None
    before_reads = _reads(client)
    [entry] = archive_before(sessions, Month.parse("2026-11"), tmp_path, datetime.now(UTC))
    if resent is not None:  # SQLite keeps no event_ids: it is stored again
        assert post(client, [resent]).json() == {"accepted": 1, "duplicates": 0}
    from billing.archive.service import restore

    done = restore(sessions, tmp_path / entry.file)
    assert (done.rows, done.already_stored) == (24, 0 if is_postgres else 1)
    assert sorted(row[1] for row in _events(client)) == sorted(
        [f"oct-{n}-{kind}" for n in range(12) for kind in "su"]
        + [f"nov-{n}-{kind}" for n in range(5) for kind in "su"]
    )
    reconcile(client, NOW + timedelta(minutes=10))
    assert _reads(client) == before_reads
    # Again: every row is stored already, nothing changes.
    events = _events(client)
    assert restore(sessions, tmp_path / entry.file).already_stored == 24
    assert _events(client) == events


def test_a_restore_over_an_event_id_stored_with_other_content_is_refused(
    client: TestClient, tmp_path: Path, is_postgres: bool
) -> None:
    if is_postgres:
        pytest.skip("PostgreSQL answers an archived event id sent again with other content 409")
    _seed(client)
    sessions = state(client).sessions
    other = {**_body(client, "oct-3-s"), "input_tokens": 7}
    [entry] = archive_before(sessions, Month.parse("2026-11"), tmp_path, datetime.now(UTC))
    assert post(client, [other]).json() == {"accepted": 1, "duplicates": 0}
    events = _events(client)
    from billing.archive.service import restore

    with pytest.raises(ArchiveRefused, match="oct-3-s"):
        restore(sessions, tmp_path / entry.file)
    assert _events(client) == events  # nothing restored
