"""Benchmark of the finance export: 1,000,000 ledger entries through ``export_chunks``.

Seeds ``--rows`` ledger entries with set-based inserts (SQLite recursive CTE, PostgreSQL
``generate_series``) in a period of their own (January 2001, request ids ``bench-…``; earlier
bench rows are deleted first, and a database holding other ledger entries is refused), then
exports that period as ``calls.csv`` and as ``usage.csv`` (default ``day,api_key_id,model``, and
``hour,model`` in Europe/Paris), each in a fresh subprocess that runs the same generator as
``GET /v1/exports/…`` and ``billing export``, hashes the bytes (as ``--output`` does) and writes
them to /dev/null. It reports ledger entries per second (the fastest of ``--repeat`` runs, all
of which must write the same bytes), the process CPU time, and the highest peak RSS (VmHWM) of
the runs.

    python bench/export.py                        # SQLite file in a temporary directory
    BILLING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/bench python bench/export.py

Targets: at least 100,000 rows per second and a peak RSS under 150 MB, on both databases.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SINCE = "2001-01-01T00:00:00Z"
UNTIL = "2001-02-01T00:00:00Z"
TARGET_ROWS_PER_S = 100_000
TARGET_RSS_MB = 150.0

_COLUMNS = (
    "request_id, seq, kind, reason, booked_at, api_key_id, model, protocol, status, "
    "call_started_at, input_tokens, cache_read_input_tokens, cache_creation_input_tokens, "
    "output_tokens_billed, output_tokens_delivered, output_tokens_undelivered, reasoning_tokens, "
    "price_id, input_uusd_per_mtok, output_uusd_per_mtok, cache_read_uusd_per_mtok, "
    "cache_creation_uusd_per_mtok, cost_pusd"
)


def _values(booked: str, started: str, concat: str) -> str:
    """The SELECT list of a seeded entry ``i`` (shared by both dialects but for time and ``||``)."""
    sign = "(CASE WHEN i % 10 = 0 THEN -1 ELSE 1 END)"
    priced = "(i % 97 <> 0)"
    inp, cr, cc, out = "(i % 5000)", "(i % 300)", "(i % 70)", "((i * 7) % 3000)"
    delivered = "((i * 7) % 3000 - (i % 40))"

    def price(micro: int) -> str:
        return f"CASE WHEN {priced} THEN {micro} END"

    cost = (
        f"CASE WHEN {priced} THEN {sign} * ({inp} * 3000000 + {cr} * 300000 + {cc} * 3750000"
        f" + {out} * 15000000) END"
    )
    return (
        f"'bench-' {concat} i, 1, CASE WHEN i % 10 = 0 THEN 'adjustment' ELSE 'settlement' END, "
        f"CASE WHEN i % 10 = 0 THEN 'late events changed the usage: input_tokens -' {concat} "
        f"{inp} {concat} ', output_tokens_billed -' {concat} {out} ELSE "
        f"'settled: upstream usage for every attempt' END, {booked}, "
        f'CASE WHEN i % 1000 = 0 THEN \'=HYPERLINK("http://x","y")\' '
        f"ELSE 'key_' {concat} (i % 500) END, "
        f"'model-' {concat} (i % 4), 'anthropic.messages', 'completed', {started}, "
        f"{sign} * {inp}, {sign} * {cr}, {sign} * {cc}, {sign} * {out}, {sign} * {delivered}, "
        f"{sign} * (i % 40), {sign} * (i % 100), CASE WHEN {priced} THEN 1 END, "
        f"{price(3000000)}, {price(15000000)}, {price(300000)}, {price(3750000)}, {cost}"
    )


def seed(url: str, rows: int) -> float:
    """Replace the bench rows with ``rows`` new ledger entries; returns the seconds it took."""
    from sqlalchemy import create_engine, text

    from billing.storage.migrate import upgrade_to_head

    upgrade_to_head(url)
    engine = create_engine(url)
    started = time.perf_counter()
    with engine.begin() as conn:
        others = conn.execute(
            text("SELECT count(*) FROM ledger_entries WHERE request_id NOT LIKE 'bench-%'")
        ).scalar_one()
        if others:
            engine.dispose()
            sys.exit(
                f"{url.split('@')[-1]} holds {others} real ledger entries: bench on an empty "
                "database"
            )
        conn.execute(text("DELETE FROM ledger_entries WHERE request_id LIKE 'bench-%'"))
        if engine.dialect.name == "postgresql":
            booked = (
                "timestamptz '2001-01-01 00:00:00+00' + i * interval '2 seconds' "
                "+ ((i * 7919) % 1000000) * interval '1 microsecond'"
            )
            started_at = "timestamptz '2001-01-01 00:00:00+00' + i * interval '2 seconds'"
            select = _values(booked, started_at, "||")
            sql = (
                f"INSERT INTO ledger_entries ({_COLUMNS}) SELECT {select} "
                "FROM generate_series(1::bigint, :rows) AS g(i)"
            )
        else:
            booked = (
                "strftime('%Y-%m-%d %H:%M:%S', '2001-01-01', '+' || (i * 2) || ' seconds') "
                "|| '.' || printf('%06d', (i * 7919) % 1000000)"
            )
            started_at = (
                "strftime('%Y-%m-%d %H:%M:%S', '2001-01-01', '+' || (i * 2) || ' seconds') "
                "|| '.000000'"
            )
            select = _values(booked, started_at, "||")
            sql = (
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows) "
                f"INSERT INTO ledger_entries ({_COLUMNS}) SELECT {select} FROM n"
            )
        conn.execute(text(sql), {"rows": rows})
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE ledger_entries"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    engine.dispose()
    return time.perf_counter() - started


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (VmHWM, else ru_maxrss)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(url: str, kind: str, group_by: str | None, tz: str | None) -> None:
    """Run one export in this (fresh) process and print its figures as JSON."""
    import hashlib

    from billing.export.params import parse_params
    from billing.export.service import ExportStats, export_chunks
    from billing.settings import Settings
    from billing.storage.db import make_engine, make_sessionmaker

    settings = Settings(database_url=url)
    sessions = make_sessionmaker(make_engine(settings))
    params = parse_params("calls" if kind == "calls" else "usage", SINCE, UNTIL, group_by, tz)
    stats = ExportStats()
    digest = hashlib.sha256()
    size = 0
    rss_before = peak_rss_mb()
    started = time.perf_counter()
    cpu_started = time.process_time()
    with open(os.devnull, "wb") as sink:
        for chunk in export_chunks(sessions, params, stats):
            digest.update(chunk)
            sink.write(chunk)
            size += len(chunk)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    print(
        json.dumps(
            {
                "kind": kind,
                "group_by": ",".join(params.group_by) if kind == "usage" else None,
                "tz": params.tz if kind == "usage" else None,
                "entries": stats.entries,
                "rows": stats.rows,
                "bytes": size,
                "seconds": round(elapsed, 3),
                "entries_per_s": round(stats.entries / elapsed),
                "cpu_seconds": round(cpu, 3),
                "entries_per_cpu_s": round(stats.entries / cpu),
                "rss_after_imports_mb": round(rss_before, 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "sha256": digest.hexdigest(),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--database-url", default=os.environ.get("BILLING_DATABASE_URL"))
    parser.add_argument("--no-seed", action="store_true", help="reuse the rows already seeded")
    parser.add_argument(
        "--repeat", type=int, default=3, help="fresh runs per export; the fastest is reported"
    )
    parser.add_argument("--child", choices=("calls", "usage"), help=argparse.SUPPRESS)
    parser.add_argument("--group-by", help=argparse.SUPPRESS)
    parser.add_argument("--tz", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.database_url, args.child, args.group_by, args.tz)
        return
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        url = args.database_url or f"sqlite:///{tmp}/bench.db"
        if not args.no_seed:
            print(f"seeding {args.rows:,} ledger entries into {url.split('@')[-1]} …", flush=True)
            print(f"  seeded in {seed(url, args.rows):.1f} s", flush=True)
        runs = [
            ("calls", None, None),
            ("usage", None, None),
            ("usage", "hour,model", "Europe/Paris"),
        ]
        ok = True
        for kind, group_by, tz in runs:
            command = [sys.executable, __file__, "--child", kind, "--database-url", url]
            if group_by:
                command += ["--group-by", group_by]
            if tz:
                command += ["--tz", tz]
            results = []
            for _ in range(max(1, args.repeat)):
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                results.append(json.loads(out))
            assert len({r["sha256"] for r in results}) == 1, "runs wrote different bytes"
            result = min(results, key=lambda r: r["seconds"])
            result["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
            runs_s = ", ".join(f"{r['seconds']:.2f}" for r in results)
            passed = (
                result["entries_per_s"] >= TARGET_ROWS_PER_S
                and result["peak_rss_mb"] < TARGET_RSS_MB
            )
            ok = ok and passed
            label = f"{kind}.csv" + (
                f" group_by={result['group_by']} tz={result['tz']}" if kind == "usage" else ""
            )
            print(
                f"{label}: {result['entries']:,} entries → {result['rows']:,} rows, "
                f"{result['bytes'] / 1e6:.1f} MB in {result['seconds']:.2f} s = "
                f"{result['entries_per_s']:,} entries/s "
                f"(process CPU {result['cpu_seconds']:.2f} s = "
                f"{result['entries_per_cpu_s']:,} entries/CPU-s); "
                f"peak RSS {result['peak_rss_mb']:.1f} MB "
                f"(after imports {result['rss_after_imports_mb']:.1f} MB); "
                f"runs: {runs_s} s; {'OK' if passed else 'BELOW TARGET'}",
                flush=True,
            )
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
