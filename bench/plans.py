"""The plans of the statements that read or write ``events`` on PostgreSQL, on a small seeded
database: run before and after a change of the table (migration 0017 partitions it by month) and
compare.

    python bench/plans.py --url postgresql+psycopg://postgres@127.0.0.1:5432/plans --calls 5000

The database must exist and be empty (it is migrated to the head, seeded with
``bench/reconcile.py``'s ``seed`` and analysed). Every statement runs under ``EXPLAIN (ANALYZE,
BUFFERS)`` in a transaction that is rolled back: the ingest insert of 100 new events (20 calls),
the reconciler's reads of 200 calls' events (``EVENT_BODIES``, ``FOLD_TOKENS``, the fast path's
``CALL_AGGREGATES``) and the duplicate check (``STORED_HASHES``). The exports read the ledger
only (``billing/export/sql``: no statement names ``events``), so they are not here.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from reconcile import seed  # noqa: E402

#: Runs of each statement (each rolled back).
REPEAT = 5


def _explain(conn: Any, title: str, statement: str, params: tuple[Any, ...]) -> None:
    """The plan of the last of ``REPEAT`` runs (caches warm) and every run's execution time."""
    cursor = conn.cursor()
    times: list[str] = []
    lines: list[str] = []
    for _ in range(REPEAT):
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON) " + statement, params)
        lines = [line for (line,) in cursor.fetchall()]
        conn.rollback()
        times.extend(line.split(": ")[1] for line in lines if line.startswith("Execution Time"))
    print(f"-- {title}: execution {', '.join(times)}")
    for line in lines:
        # The parameters' literal arrays and JSON, shortened.
        print("   ", re.sub(r"'(\{[^}]*\}|\[\[.*?\]\])'", "'…'", line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="an empty PostgreSQL database")
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()

    import orjson
    from lifecycles import Lifecycles
    from sqlalchemy import create_engine

    from billing.ingest.service import _call_fields, prepare_batch
    from billing.ingest.sql import postgres as ingest_sql
    from billing.ingest.sql.common import event_values
    from billing.ingest.validation import parse_batch
    from billing.reconcile.sql import postgres as reconcile_sql
    from billing.reconcile.sql.fastpath import CALL_AGGREGATES
    from billing.storage.migrate import upgrade_to_head

    upgrade_to_head(args.url)
    events, seconds = seed(args.url, args.calls)
    print(f"seeded {args.calls} calls, {events} events in {seconds:.1f} s")
    engine = create_engine(args.url)
    with engine.connect() as sa_conn:
        conn = sa_conn.connection.dbapi_connection
        assert conn is not None
        cursor = conn.cursor()
        cursor.execute("SELECT request_id FROM calls ORDER BY md5(request_id) LIMIT 200")
        ids = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT event_id FROM events ORDER BY md5(event_id) LIMIT 100")
        event_ids = [row[0] for row in cursor.fetchall()]
        conn.rollback()

        gen = Lifecycles(99, inflight=20)
        body = b'{"events":[' + b",".join(gen.next() for _ in range(100)) + b"]}"
        now = datetime.now(UTC)
        batch = prepare_batch(parse_batch(body, now), now)
        rows = list(batch.rows)
        values = orjson.dumps([event_values(r) for r in rows], option=orjson.OPT_UTC_Z).decode()
        calls = ingest_sql._call_values(_call_fields([(row, 0) for row in rows]))
        insert = ingest_sql.INSERT_EVENTS
        _explain(conn, "ingest: INSERT_EVENTS (100 events)", insert, (calls, values))
        _explain(conn, "ingest: STORED_HASHES (100 ids)", ingest_sql.STORED_HASHES, (event_ids,))
        for title, statement in (
            ("reconcile: EVENT_BODIES (200 calls)", reconcile_sql.EVENT_BODIES),
            ("reconcile: FOLD_TOKENS (200 calls)", reconcile_sql.FOLD_TOKENS),
            (
                "reconcile: CALL_AGGREGATES (200 calls)",
                CALL_AGGREGATES.format(calls="request_id = ANY(%b)"),
            ),
        ):
            _explain(conn, title, statement.replace("%b", "%s"), (ids,))
    engine.dispose()


if __name__ == "__main__":
    main()
