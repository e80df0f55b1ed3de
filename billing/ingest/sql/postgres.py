"""Ingest's SQL on PostgreSQL (``billing.ingest.repository``).

A group's rows go as one JSON array of arrays (a text parameter, unpacked by the server): building
and sending it costs the service's process far less CPU than one binary array per column, and
that process (one GIL for the event loop and the writers) is what bounds single-event posts.
Timestamps are RFC 3339 with ``Z``; the body is a JSON string element. The parameter is cast to
``jsonb``, parsed once: each ``->>`` on a ``json`` value would parse the element's text again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy.engine import Connection

from billing.ingest.rows import CallFields, CallRaced, Inserted
from billing.ingest.sql.common import CALL_COLUMNS, EVENT_COLUMNS, event_values

if TYPE_CHECKING:
    from billing.ingest.prepare import EventRow

#: A new ``calls`` row (``CALL_COLUMNS``) from an element ``j`` of ``_call_values`` ({rid}: its
#: request_id).
_NEW_CALL = (
    "nextval('calls_call_no_seq'), {rid}, (j->>1)::timestamptz, (j->>2)::timestamptz, 1, true, "
    "'open', false, 0, '[]'::json, j->>3, j->>4, j->>5, (j->>6)::timestamptz, (j->>7)::json, "
    "j->>8, j->>9"
)

#: One statement locks the stored calls and reads their numbers (``c``: a LATERAL primary-key
#: probe per call, ``FOR NO KEY UPDATE``, so that a reconciler settling one is waited for and its
#: result seen: ``quiet`` is read from the row as it is once locked), creates the calls not seen
#: before (``n``: numbered by the sequence, so only new calls take a number) and inserts the
#: events with their call's number (``k``: the new calls and the stored ones). The calls created
#: here and the stored ones pending with a key need nothing more (``quiet``): the reconciler will
#: read the new events; only the others go through ``UPSERT_CALLS`` (already locked here).
#:
#: The probes are parameterized by each element, one primary-key lookup per call whatever the
#: planner thinks of the size of ``calls`` (as joins or ``= ANY(array)``, a generic plan made
#: while the table was small would scan all of it for every group).
#:
#: Every transaction takes its locks in one order — the stored calls by request_id (the array is
#: sorted, and ``n``'s sort reads all of ``c`` before its first insert), then the new calls by
#: request_id, then the event ids by event_id (``d``: its ``ORDER BY`` reads all of ``k``, joined
#: only for that, before the first is inserted), then the events (no unique index there) — so
#: concurrent groups cannot deadlock. A call committed by another
#: transaction after this statement's snapshot is waited for by the ``calls`` insert and then
#: skipped, without being visible here, so it is neither created nor locked, and its events get
#: a null number: the group is rolled back and written again (``CallRaced``; a new snapshot sees
#: that call), or with ``fill_raced`` they are given the number by ``FILL_CALL_NO`` and the call
#: is locked after the events, out of order.
INSERT_EVENTS = (
    "WITH c AS (SELECT j->>0 AS request_id, j, s.call_no AS stored_no, s.quiet "
    "FROM jsonb_array_elements(%s::jsonb) AS j LEFT JOIN LATERAL "
    "(SELECT call_no, pending AND api_key_id IS NOT NULL AS quiet FROM calls "
    "WHERE calls.request_id = j->>0 FOR NO KEY UPDATE) AS s ON true), "
    f"n AS (INSERT INTO calls ({CALL_COLUMNS}) "
    f"SELECT {_NEW_CALL.format(rid='request_id')} FROM c WHERE stored_no IS NULL "
    'ORDER BY request_id COLLATE "C" '
    "ON CONFLICT (request_id) DO NOTHING RETURNING request_id, call_no), "
    "k AS (SELECT request_id, call_no, true AS quiet FROM n UNION ALL "
    "SELECT request_id, stored_no, quiet FROM c WHERE stored_no IS NOT NULL), "
    # The values once (d and e both read them), then the dedup authority (event_ids, see the
    # migration 0017: a partitioned events table cannot hold event_id unique), then the events
    # that went in there.
    "v AS MATERIALIZED (SELECT j FROM jsonb_array_elements(%s::jsonb) AS j), "
    "d AS (INSERT INTO event_ids (event_id, content_hash) SELECT j->>0, decode(j->>6, 'hex') "
    "FROM v LEFT JOIN k ON k.request_id = v.j->>1 "
    'ORDER BY (j->>0) COLLATE "C" '
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id), "
    f"e AS (INSERT INTO events ({EVENT_COLUMNS}) "
    "SELECT j->>0, j->>1, (j->>2)::integer, j->>3, (j->>4)::timestamptz, (j->>5)::timestamptz, "
    "j->>6, j->>7, (j->>8)::bigint, (j->>9)::bigint, (j->>10)::boolean, k.call_no "
    "FROM v JOIN d ON d.event_id = v.j->>0 LEFT JOIN k ON k.request_id = j->>1 "
    'ORDER BY (j->>0) COLLATE "C" '
    "RETURNING event_id, request_id, call_no) "
    "SELECT e.event_id, e.request_id, e.call_no, coalesce(k.quiet, false) "
    "FROM e LEFT JOIN k ON k.request_id = e.request_id"
)
FILL_CALL_NO = (
    "UPDATE events SET call_no = calls.call_no FROM calls "
    "WHERE events.event_id = ANY(%s) AND events.call_no IS NULL "
    "AND calls.request_id = events.request_id"
)
#: From the dedup authority: an archived event (``billing archive``) is still known there.
STORED_HASHES = (
    "SELECT event_id, encode(content_hash, 'hex') FROM event_ids WHERE event_id = ANY(%s)"
)
#: Marks pending the calls reconciled since their last event, and fills in the stream.started
#: fields (api_key_id, model, protocol, started_at, metadata) only while the stored call has no
#: key yet. A call that is pending with a key is left alone.
UPSERT_CALLS = (
    f"INSERT INTO calls ({CALL_COLUMNS}) "
    f"SELECT {_NEW_CALL.format(rid='j->>0')} FROM jsonb_array_elements(%s::jsonb) AS j "
    "ON CONFLICT (request_id) DO UPDATE SET last_received_at = excluded.last_received_at, "
    "change_seq = calls.change_seq + 1, pending = excluded.pending, "
    "api_key_id = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
    "THEN excluded.api_key_id ELSE calls.api_key_id END, "
    "model = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
    "THEN excluded.model ELSE calls.model END, "
    "protocol = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
    "THEN excluded.protocol ELSE calls.protocol END, "
    "started_at = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
    "THEN excluded.started_at ELSE calls.started_at END, "
    "metadata = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
    "THEN excluded.metadata ELSE calls.metadata END, "
    "provider = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
    "THEN excluded.provider ELSE calls.provider END, "
    "upstream_account = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
    "THEN excluded.upstream_account ELSE calls.upstream_account END "
    "WHERE NOT calls.pending OR (calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL)"
)

_TO_JSON = orjson.OPT_UTC_Z

#: The months of ``events`` (migration ``0017_event_partitions``), made ahead by the service
#: (``billing.ingest.partitions``) one transaction each, under a transaction-level advisory
#: lock so that replicas starting at once make each month once. The new month is built as a
#: table of its own, given the rows of its month that the default partition holds (events whose
#: ``occurred_at`` had no partition), then attached: ``ATTACH PARTITION`` locks ``events`` in
#: ``SHARE UPDATE EXCLUSIVE`` mode, which lets ingest and the reconciler go on (``CREATE TABLE
#: … PARTITION OF`` would stop them), and the default partition, locked first, takes no new row
#: of that month meanwhile.
PARTITION_LOCK = "SELECT pg_advisory_xact_lock(7130170001)"
PARTITION_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"
LOCK_DEFAULT = "LOCK TABLE events_default IN ACCESS EXCLUSIVE MODE"
#: Templates ({name}: the partition, {start} and {end}: its bounds as timestamptz literals).
NEW_PARTITION = "CREATE TABLE {name} (LIKE events INCLUDING DEFAULTS)"
FROM_DEFAULT = (
    "WITH moved AS (DELETE FROM events_default WHERE occurred_at >= {start} "
    "AND occurred_at < {end} RETURNING *) INSERT INTO {name} SELECT * FROM moved"
)
ATTACH_PARTITION = "ALTER TABLE events ATTACH PARTITION {name} FOR VALUES FROM ({start}) TO ({end})"


def partition_name(year: int, month: int) -> str:
    """``events_YYYY_MM``: the partition of that month (``billing.storage.models.by_database``)."""
    return f"events_{year:04d}_{month:02d}"


def _month_start(year: int, month: int) -> str:
    return f"'{year:04d}-{month:02d}-01 00:00:00+00'::timestamptz"


def _call_values(calls: CallFields) -> str:
    """The calls as the JSON array of arrays the statements unpack, by request_id: request_id,
    first and last received, then api_key_id, model, protocol, started_at, metadata, provider
    and upstream_account of the stream.started (or nulls)."""
    ordered: list[tuple[Any, ...]] = []
    for rid in sorted(calls):
        first, last, started, _ = calls[rid]
        if started is None:
            ordered.append((rid, first, last, None, None, None, None, None, None, None))
        else:
            key, model, protocol, metadata, provider, account = started.started
            at = started.occurred_at
            ordered.append(
                (rid, first, last, key, model, protocol, at, metadata, provider, account)
            )
    return orjson.dumps(ordered, option=_TO_JSON).decode()


class PostgresIngest:
    """``IngestRepository`` on PostgreSQL."""

    #: Writer threads on an engine of their own (PostgreSQL's own group commit merges their
    #: flushes), without pre-ping: a round trip saved per transaction.
    writers = 3
    writers_share_engine = False

    def insert_events(
        self, conn: Connection, rows: Sequence[EventRow], calls: CallFields, *, fill_raced: bool
    ) -> Inserted:
        """See ``INSERT_EVENTS``: the new calls are created and the stored ones locked; the
        calls that need no upsert after it (created, or pending with a key) are ``quiet``."""
        values = orjson.dumps(
            [event_values(row) for row in rows],
            option=_TO_JSON,
        ).decode()
        returned = conn.exec_driver_sql(INSERT_EVENTS, (_call_values(calls), values)).all()
        unnumbered = [event_id for event_id, _, call_no, _ in returned if call_no is None]
        if unnumbered:
            if not fill_raced:
                raise CallRaced
            conn.exec_driver_sql(FILL_CALL_NO, (unnumbered,))
        quiet = {request_id for _, request_id, _, is_quiet in returned if is_quiet}
        inserted = {event_id for event_id, _, _, _ in returned}
        return Inserted(None if len(inserted) == len(rows) else inserted, quiet)

    def make_partition(self, conn: Connection, year: int, month: int) -> bool:
        """See ``PARTITION_LOCK``."""
        name = partition_name(year, month)
        conn.exec_driver_sql(PARTITION_LOCK)
        if conn.exec_driver_sql(PARTITION_EXISTS, (name,)).scalar():
            return False
        after = (year + month // 12, month % 12 + 1)
        bounds = {"name": name, "start": _month_start(year, month), "end": _month_start(*after)}
        conn.exec_driver_sql(LOCK_DEFAULT)
        for template in (NEW_PARTITION, FROM_DEFAULT, ATTACH_PARTITION):
            conn.exec_driver_sql(template.format(**bounds))
        return True

    def stored_hashes(self, conn: Connection, event_ids: Sequence[str]) -> dict[str, str]:
        return {
            eid: digest for eid, digest in conn.exec_driver_sql(STORED_HASHES, (list(event_ids),))
        }

    def touch_calls(self, conn: Connection, calls: CallFields, inserted: Inserted) -> None:
        """See ``IngestRepository.touch_calls``: the new calls exist already and the stored ones
        are locked (``INSERT_EVENTS``), so the upsert only marks calls pending or fills in a
        key."""
        conn.exec_driver_sql(UPSERT_CALLS, (_call_values(calls),))
