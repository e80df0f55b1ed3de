"""Bytes per call in each table and index, on SQLite and PostgreSQL, projected to 100 M and 1 B
calls a month (docs/SCALE.md).

    python bench/scale.py --calls 1000000            # both databases (the lead's run, alone)
    python bench/scale.py --db sqlite --calls 5000   # a smoke run

Each database is fresh (at the migration head), seeded with ``bench/reconcile.py``'s ``seed``
(the ingest path itself: per call a start, 2-8 progress records, 5 % disconnects, 2 % retries and
the usage, 500 keys, 8 models) and settled with one ``run_pass`` (ledger entries, attempts and
rollups as the service books them); PostgreSQL is then ``VACUUM ANALYZE``d, SQLite checkpointed.
Sizes: PostgreSQL's ``pg_relation_size`` of every table (main fork, TOAST included) and index,
a partitioned table's partitions summed under its own name; SQLite's ``dbstat`` (pages of each
table and index). Printed as a Markdown table: bytes per call of each object, its share, and
the projection at 100 M and 1 B calls (linear: the rollups grow with keys × models × quarter
hours, not with calls, so they are over-projected).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import Databases, machine  # noqa: E402
from reconcile import PG_DEFAULT, seed, settle  # noqa: E402

#: Each object of a partitioned table (or its index), summed under the parent's name.
PG_SIZES = """
WITH objects AS (
    SELECT c.oid, c.relname, c.relkind,
        coalesce((SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                  WHERE i.inhrelid = c.oid), c.relname) AS owner_name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')
)
SELECT owner_name, relkind,
    sum(pg_relation_size(oid) + CASE WHEN relkind = 'r'
        THEN coalesce(pg_total_relation_size(
            (SELECT reltoastrelid FROM pg_class WHERE oid = objects.oid)), 0) ELSE 0 END)
FROM objects GROUP BY owner_name, relkind
"""
SQLITE_SIZES = """
SELECT d.name, CASE WHEN m.type = 'index' THEN 'i' ELSE 'r' END, sum(d.pgsize)
FROM dbstat d LEFT JOIN sqlite_schema m ON m.name = d.name GROUP BY d.name
"""


#: Objects this small (a page or two: empty tables, their indexes) are summed on one line.
SMALL_BYTES = 16_384


def sizes(url: str) -> list[tuple[str, str, int]]:
    """(object, 'r' table or 'i' index, bytes) of the database, largest first."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
            rows = conn.exec_driver_sql(PG_SIZES).all()
        else:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            rows = conn.exec_driver_sql(SQLITE_SIZES).all()
    engine.dispose()
    found = [(str(name), str(kind), int(size)) for name, kind, size in rows if size]
    return sorted(found, key=lambda row: -row[2])


def report(kind: str, calls: int, events: int, measured: list[tuple[str, str, int]]) -> str:
    total = sum(size for _, _, size in measured)
    lines = [
        f"### {kind}: {calls:,} calls, {events:,} events",
        "",
        "| object | kind | bytes | bytes/call | share | at 100 M calls | at 1 B calls |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    small = [row for row in measured if row[2] <= SMALL_BYTES]
    for name, rel, size in [row for row in measured if row[2] > SMALL_BYTES]:
        per_call = size / calls
        lines.append(
            f"| {name} | {'index' if rel == 'i' else 'table'} | {size:,} | {per_call:,.1f} | "
            f"{size / total:.1%} | {per_call * 1e8 / 2**30:,.1f} GiB | "
            f"{per_call * 1e9 / 2**30:,.0f} GiB |"
        )
    if small:
        size = sum(row[2] for row in small)
        lines.append(
            f"| {len(small)} other objects (≤ {SMALL_BYTES:,} bytes each: empty here, or a page"
            f" or two) | | {size:,} | {size / calls:,.1f} | {size / total:.1%} | | |"
        )
    per_call = total / calls
    lines.append(
        f"| **total** | | {total:,} | {per_call:,.1f} | 100% | {per_call * 1e8 / 2**30:,.1f} GiB |"
        f" {per_call * 1e9 / 2**30:,.0f} GiB |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgres", help="sqlite, postgres, or both")
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", PG_DEFAULT))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    print(machine())
    print(f"command: python bench/scale.py --db {args.db} --calls {args.calls}\n")
    databases = Databases(args.pg_url, args.keep)
    try:
        for kind in args.db.split(","):
            url = databases.fresh(kind)
            events, _ = seed(url, args.calls)
            settle(url, 4000)
            print(report(kind, args.calls, events, sizes(url)))
            print()
            databases.done(url)
    finally:
        databases.cleanup()


if __name__ == "__main__":
    main()
