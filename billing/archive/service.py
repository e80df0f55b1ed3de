"""``billing archive``: the raw events of closed months to Parquet and back (CONTRACT "Replicas,
failover and archives (v3)").

``archive_before`` takes every month before ``before`` (which must not be after the current
month: only ended months are closed) that still has events and is not archived already (the
events a month gains after its archive are late events of its calls: they wait for its
restore, and its file is never written again), oldest first, each in one
transaction: it locks the month against new events (``ArchiveRepository.lock_month``), writes
its rows by ``seq`` to ``events-YYYY-MM.parquet`` in the directory (made durable, then moved in
place), removes them, checks that it removed as many as it wrote, commits, and records the file
in the directory's ``manifest.json`` (rows, ``seq`` range, SHA-256). A failure before the commit
leaves the month in the database and no file. Calls, ledger entries and rollups stay: every
answer built on them (call log, usage, exports, drift) is the same; a call's own events are no
longer listed with it until its month is restored.

A month with a call still open or pending is refused: the reconciler rebuilds a call from its
events, so they must be there for as long as it may still change. The database notes each
month archived (``archived_months``, in the transaction that removes its events); a settled
call made pending while events of it are away (a late event, a re-rating) is **parked**
(``park_archived``): the reconciler leaves its figures and ledger as they were, instead of
rebuilding it from the events still stored (which lost its key, model and cost), and the
restore of a month makes every parked call pending again, to be settled with all its events.

``restore`` reads a file back, after checking it against its manifest entry (the SHA-256 and
the row count), and inserts its rows as they were, in one transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from billing.archive.parquet import MonthWriter, read_rows, sha256
from billing.archive.repository import repository
from billing.archive.schemas import MANIFEST, ArchivedMonth, Manifest, Month
from billing.archive.sql.common import COLUMNS
from billing.storage.db import write_connection
from billing.timefmt import rfc3339

_EVENT_ID = COLUMNS.index("event_id")
_HASH = COLUMNS.index("content_hash")


class ArchiveRefused(ValueError):
    """What was asked cannot be done (the month is not closed, a call is open, a file does not
    match its manifest); ``str()`` says why."""


@dataclass(frozen=True)
class Restored:
    file: str
    rows: int
    #: Of ``rows``, those whose event was in the database already with the same content (sent
    #: again after the archive, on SQLite; or the file restored before): left as stored.
    already_stored: int = 0


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    if not path.exists():
        return Manifest()
    return Manifest.model_validate_json(path.read_bytes())


def _write_manifest(directory: Path, manifest: Manifest) -> None:
    path = directory / MANIFEST
    partial = path.with_name(MANIFEST + ".partial")
    partial.write_text(manifest.model_dump_json(indent=2) + "\n")
    partial.replace(path)


def archive_before(
    sessions: sessionmaker[Session], before: Month, directory: Path, now: datetime
) -> list[ArchivedMonth]:
    """Archive every month before ``before`` that has events; the months written."""
    if before.start > Month.of(now).start:
        raise ArchiveRefused(
            f"{before.label} is after the current month: only months that have ended are closed"
        )
    directory.mkdir(parents=True, exist_ok=True)
    with write_connection(sessions) as conn:
        oldest = repository(conn).oldest(conn, before.start)
    done: list[ArchivedMonth] = []
    month = None if oldest is None else Month.of(oldest)
    while month is not None and month.start < before.start:
        entry = _archive_month(sessions, month, directory, now)
        if entry is not None:
            _write_manifest(directory, read_manifest(directory).with_month(entry))
            done.append(entry)
        month = month.next()
    return done


def _archive_month(
    sessions: sessionmaker[Session], month: Month, directory: Path, now: datetime
) -> ArchivedMonth | None:
    start, end = month.start, month.next().start
    with write_connection(sessions) as conn:
        repo = repository(conn)
        repo.lock_month(conn, start, end)
        archived = repo.archived_file(conn, start)
        if archived is not None:
            # Its events stored since are late events of its calls, parked until a restore:
            # written again, they would replace the month's file.
            _log.warning(
                "%s is archived already (%s): its events stored since wait for its restore",
                month.label,
                archived,
            )
            return None
        open_calls = repo.open_calls(conn, start, end)
        if open_calls:
            raise ArchiveRefused(
                f"{month.label}: {open_calls} call(s) with events in that month are not settled "
                "yet; archive it once they are"
            )
        writer = MonthWriter(directory / month.file_name)
        try:
            for rows in repo.month_rows(conn, start, end):
                writer.write(rows)
            if writer.rows == 0:
                writer.abandon()
                return None
            removed = repo.delete_month(conn, start, end)
            if removed != writer.rows:  # pragma: no cover - the lock prevents it
                raise ArchiveRefused(f"{month.label}: wrote {writer.rows} rows, removed {removed}")
            repo.record_month(conn, start, end, now, month.file_name)
            digest = writer.finish()
        except BaseException:
            writer.abandon()
            raise
    return ArchivedMonth(
        month=month.label,
        file=month.file_name,
        rows=writer.rows,
        first_seq=writer.first_seq,
        last_seq=writer.last_seq,
        sha256=digest,
        archived_at=rfc3339(now) or "",
    )


def restore(sessions: sessionmaker[Session], file: Path) -> Restored:
    """Put the events of ``file`` back (it must match its entry in the manifest beside it)."""
    entry = read_manifest(file.parent).entry(file.name)
    if entry is None:
        raise ArchiveRefused(f"{file.name} is not in {file.parent / MANIFEST}")
    if sha256(file) != entry.sha256:
        raise ArchiveRefused(f"{file.name}: its SHA-256 is not the manifest's (changed or damaged)")
    rows = already = 0
    month = Month.parse(entry.month)
    with write_connection(sessions) as conn:
        repo = repository(conn)
        for chunk in read_rows(file):
            # Every row of the file occurred in its month (so did any copy sent again).
            ids = [row[_EVENT_ID] for row in chunk]
            stored = repo.month_hashes(conn, month.start, month.next().start, ids)
            other = sorted(
                row[_EVENT_ID]
                for row in chunk
                if stored.get(row[_EVENT_ID], row[_HASH]) != row[_HASH]
            )
            if other:
                raise ArchiveRefused(
                    f"{file.name}: {len(other)} event id(s) of the file are stored with other "
                    f"content (sent again after the archive): {', '.join(other[:5])}; nothing "
                    "was restored"
                )
            repo.insert_rows(conn, [row for row in chunk if row[_EVENT_ID] not in stored])
            rows += len(chunk)
            already += len(stored)
        if rows != entry.rows:
            raise ArchiveRefused(f"{file.name}: {rows} rows, the manifest says {entry.rows}")
        repo.forget_month(conn, month.start)
        # Every parked call: a call still with events in another archived month is parked
        # again by its next step.
        repo.unpark(conn)
    return Restored(file.name, rows, already)


def park_archived(session: Session, request_ids: Sequence[str], now: datetime) -> set[str]:
    """Of a reconciliation step's calls (locked), the settled ones that may have events in an
    archived month (made pending again: a late event, a re-rating), parked: left as they are,
    figures and ledger, no longer pending, and noted in ``parked_calls`` until a restore
    (CONTRACT "Replicas, failover and archives (v3)": an archived month's calls answer the
    same). One probe when no month is archived."""
    conn = session.connection()
    repo = repository(conn)
    parked = repo.archived_calls(conn, request_ids)
    if parked:
        repo.park(conn, parked, now)
        _log.warning(
            "%d call(s) with archived events left as they were until their month is restored "
            "(billing archive restore): %s",
            len(parked),
            ", ".join(sorted(parked)[:5]),
        )
    return set(parked)


_log = logging.getLogger(__name__)
