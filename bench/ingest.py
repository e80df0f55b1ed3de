"""Ingest benchmark: ``POST /v1/events`` against a running ``billing serve``, side by side with two
ceilings measured in the same run on the same machine.

What it does, per database (a fresh SQLite file, and a fresh PostgreSQL database):

1. **storage ceiling** (in this process): a plain ``executemany`` of the same rows into the same
   tables — ``INSERT INTO events`` and the ``calls`` upsert — one transaction per post, through the
   service's own engine settings (SQLite WAL + ``synchronous=FULL`` + ``BEGIN IMMEDIATE``;
   PostgreSQL with ``synchronous_commit=on``), on the raw driver connection. SQLite: one writer
   thread (it has one writer); PostgreSQL: ``--storage-threads`` connections.
2. **HTTP ceiling**: a FastAPI app, run by uvicorn with the same settings as ``billing serve``,
   that reads the body and parses it into the same pydantic models (``parse_batch``) and stores
   nothing.
3. **billing serve**: the real service as a subprocess (an ``ingest`` token, background
   reconciliation off unless ``--reconciler``), 1 and/or 2 uvicorn workers.

The load generator is its own process (asyncio + uvloop, a keep-alive HTTP/1.1 connection per
concurrent gateway; ``--client httpx`` uses an ``httpx.AsyncClient`` pool instead). It posts
realistic stream lifecycles, interleaved across in-flight calls: ``stream.started`` (500 keys, 8
models, 3 protocols, metadata on some), 2-8 cumulative ``stream.tokens``, a client disconnect on
5 % of calls, a failed first attempt and a retry on 2 %, and the final ``stream.usage``
(``upstream``, or ``estimate`` on 5 %). Every post is checked: status 200 and every event
``accepted``. It reports events/s and the p50/p99 acknowledgement latency (request sent → reply
read) for posts of 1, 100 and 1000 events, and each result as a ratio to its ceilings.

The machine has 2 cores: the load generator, the server and the database share them.

    python bench/ingest.py                        # SQLite and PostgreSQL, 1 and 2 workers
    python bench/ingest.py --db sqlite --sizes 100 --duration 5
    python bench/ingest.py --db postgres --workers 1,2
    python bench/ingest.py --soak 600 --db sqlite            # RSS of the server at start and end

PostgreSQL: ``--pg-url`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432``); a database
``billing_bench_<pid>_<n>`` is created per run and dropped afterwards (``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import PG_DEFAULT, Databases, load_average, machine, quiesce, tree_cpu_s, tree_rss_kb
from ingest_ceilings import StorageCeiling, ceiling_server_main
from ingest_load import client_main, run_client
from ingest_servers import billing_server, ceiling_server

TARGET_BATCH100_EVENTS_S = 30_000
TARGET_SINGLE_EVENTS_S = 2_500
TARGET_SINGLE_RATIO = 0.60
TARGET_SINGLE_P99_MS = 25.0

#: Concurrent connections (gateways) per post size.
DEFAULT_CONCURRENCY = {1: 32, 100: 8, 1000: 3}


@dataclass
class Row:
    db: str
    workers: int
    size: int
    concurrency: int
    service: dict[str, Any]
    http: dict[str, Any] | None = None
    storage: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _load_config(
    args: argparse.Namespace, port: int, size: int, token: str | None, seed: int
) -> dict[str, Any]:
    return {
        "host": "127.0.0.1",
        "port": port,
        "size": size,
        "concurrency": args.concurrency.get(size, DEFAULT_CONCURRENCY.get(size, 8)),
        "duration": args.duration,
        "warmup": args.warmup,
        "token": token,
        "seed": seed,
        "client": args.client,
    }


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _fmt(result: dict[str, Any]) -> str:
    return (
        f"{result['events_per_s']:>9,.0f} ev/s  p50 {result['p50_ms']:6.1f} ms  "
        f"p99 {result['p99_ms']:6.1f} ms"
    )


def bench_db(args: argparse.Namespace, dbs: Databases, kind: str) -> list[Row]:
    rows: list[Row] = []
    workers_list = args.workers if kind == "postgres" else [1]
    storage: dict[int, dict[str, Any]] = {}
    if not args.no_ceilings:
        url = dbs.fresh(kind)
        ceiling = StorageCeiling(url)
        threads = 1 if kind == "sqlite" else args.storage_threads
        for size in args.sizes:
            quiesce(url)
            storage[size] = ceiling.run(size, threads, args.duration, min(args.warmup, 1.0))
            _say(f"[{kind}] storage ceiling, posts of {size:>4}: {_fmt(storage[size])}")
        ceiling.close()
        dbs.done(url)
    http: dict[tuple[int, int], dict[str, Any]] = {}
    seed = 1
    for workers in workers_list:
        if not args.no_ceilings:
            with ceiling_server(workers) as server:
                for size in args.sizes:
                    seed += 1
                    quiesce(None)
                    http[workers, size] = run_client(
                        _load_config(args, server.port, size, None, seed)
                    )
                    _say(
                        f"[{kind}] HTTP ceiling, {workers} worker(s), posts of {size:>4}: "
                        f"{_fmt(http[workers, size])}"
                    )
        url = dbs.fresh(kind)
        with billing_server(url, workers, args.reconciler, dbs.tmp) as server:
            for size in args.sizes:
                seed += 1
                quiesce(url)
                load = load_average()
                cpu = tree_cpu_s(server.proc.pid)
                result = run_client(_load_config(args, server.port, size, server.token, seed))
                cpu = tree_cpu_s(server.proc.pid) - cpu
                # CPU over warm-up and measurement, per event of the measurement scaled to both.
                seen = result["events_per_s"] * (args.warmup + result["seconds"])
                result["server_cpu_us_per_event"] = cpu / seen * 1e6 if seen else float("nan")
                result["load_before"] = load
                _say(
                    f"[{kind}] billing serve, {workers} worker(s), posts of {size:>4}: "
                    + _fmt(result)
                    + f"  server CPU {result['server_cpu_us_per_event']:.0f} µs/event"
                    + f"  (load {load:.2f} before)"
                    + (
                        f"  ERRORS {result['errors']} {result['error_samples']}"
                        if result["errors"]
                        else ""
                    )
                )
                rows.append(
                    Row(
                        kind,
                        workers,
                        size,
                        result["concurrency"],
                        result,
                        http.get((workers, size)),
                        storage.get(size),
                    )
                )
        dbs.done(url)
    return rows


def _ratio(a: dict[str, Any], b: dict[str, Any] | None) -> str:
    if b is None or not b["events_per_s"]:
        return "—"
    return f"{a['events_per_s'] / b['events_per_s']:.2f}"


def table(rows: list[Row]) -> str:
    head = (
        "| database | workers | events/post | conns | events/s | p50 ms | p99 ms "
        "| HTTP ceiling ev/s | ÷ HTTP | storage ceiling ev/s | ÷ storage | server CPU µs/ev "
        "| load | errors |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s = r.service
        http = f"{r.http['events_per_s']:,.0f}" if r.http else "—"
        stor = f"{r.storage['events_per_s']:,.0f}" if r.storage else "—"
        lines.append(
            f"| {'SQLite' if r.db == 'sqlite' else 'PostgreSQL'} | {r.workers} | {r.size} "
            f"| {r.concurrency} | {s['events_per_s']:,.0f} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} "
            f"| {http} | {_ratio(s, r.http)} | {stor} | {_ratio(s, r.storage)} "
            f"| {s.get('server_cpu_us_per_event', float('nan')):.0f} "
            f"| {s.get('load_before', float('nan')):.2f} | {s['errors']} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        s = r.service
        if r.size == 100 and r.workers == 1:
            ok = s["events_per_s"] >= TARGET_BATCH100_EVENTS_S
            out.append(
                f"{r.db}: batches of 100 at {s['events_per_s']:,.0f} ev/s "
                f"(target ≥ {TARGET_BATCH100_EVENTS_S:,}): {'OK' if ok else 'BELOW TARGET'}"
            )
        if r.size == 1 and r.workers == 1:
            ratio = s["events_per_s"] / r.http["events_per_s"] if r.http else None
            ok = (
                s["events_per_s"] >= TARGET_SINGLE_EVENTS_S
                and s["p99_ms"] < TARGET_SINGLE_P99_MS
                and (ratio is None or ratio >= TARGET_SINGLE_RATIO)
            )
            out.append(
                f"{r.db}: single posts at {s['events_per_s']:,.0f} ev/s"
                + (f" = {ratio:.0%} of the HTTP ceiling" if ratio is not None else "")
                + f", p99 {s['p99_ms']:.1f} ms (targets ≥ {TARGET_SINGLE_EVENTS_S:,} ev/s, ≥ 60 %, "
                f"p99 < 25 ms): {'OK' if ok else 'BELOW TARGET'}"
            )
    return out


def soak(args: argparse.Namespace, dbs: Databases) -> int:
    kind = args.db[0]
    size = args.sizes[0] if args.sizes_given else 100
    url = dbs.fresh(kind)
    workers = args.workers[0]
    with billing_server(url, workers, args.reconciler, dbs.tmp) as server:
        boot_rss = tree_rss_kb(server.proc.pid)
        config = _load_config(args, server.port, size, server.token, 99)
        config["duration"] = args.soak
        config["warmup"] = 0
        config["report_every"] = 10
        samples: list[tuple[float, int]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not stop.wait(5):
                samples.append((time.monotonic() - t0, tree_rss_kb(server.proc.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = run_client(config, timeout=args.soak + 120)
        stop.set()
        sampler.join()
    warm = next(
        (kb for t, kb in samples if t >= args.soak_warm), samples[0][1] if samples else boot_rss
    )
    end = samples[-1][1] if samples else boot_rss
    peak = max(kb for _, kb in samples) if samples else boot_rss
    growth = (end - warm) / warm
    prog = result["progress"]
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(prog) if b[0] > a[0]]
    print(f"soak: {kind}, {workers} worker(s), posts of {size}, {args.soak:.0f} s; {machine()}")
    print(
        f"  {result['events']:,} events at {result['events_per_s']:,.0f} ev/s "
        f"(10-s windows: min {min(rates, default=0):,.0f}, max {max(rates, default=0):,.0f}), "
        f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, errors {result['errors']}"
    )
    print(
        f"  server RSS: at boot {boot_rss / 1024:.1f} MB, after {args.soak_warm:.0f} s "
        f"{warm / 1024:.1f} MB, at end {end / 1024:.1f} MB (peak {peak / 1024:.1f} MB): "
        f"growth {growth:+.1%} {'OK' if growth < 0.10 else 'OVER 10 %'}"
    )
    print(
        "  RSS samples (s, MB): " + ", ".join(f"{t:.0f}:{kb / 1024:.0f}" for t, kb in samples[::6])
    )
    return 0 if growth < 0.10 and result["errors"] == 0 else 1


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgres", help="sqlite, postgres, or both")
    parser.add_argument("--sizes", default=None, help="events per post (default 1,100,1000)")
    parser.add_argument(
        "--workers", default="1,2", help="uvicorn workers on PostgreSQL (SQLite: 1)"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per run")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of load before measuring"
    )
    parser.add_argument(
        "--concurrency",
        default="",
        help="connections per post size, e.g. 1=32,100=8,1000=3 (those are the defaults)",
    )
    parser.add_argument("--storage-threads", type=int, default=8, help="PostgreSQL storage ceiling")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw")
    parser.add_argument("--reconciler", action="store_true", help="keep background passes on")
    parser.add_argument("--no-ceilings", action="store_true", help="measure billing serve only")
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", PG_DEFAULT))
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--soak", type=float, nargs="?", const=600.0, default=None)
    parser.add_argument("--soak-warm", type=float, default=10.0, help="RSS baseline after (s)")
    parser.add_argument("--_client", help=argparse.SUPPRESS)
    parser.add_argument("--_ceiling-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._client:
        client_main(json.loads(args._client))
        return
    if args._ceiling_server:
        ceiling_server_main(args._ceiling_server, int(args.workers.split(",")[0]))
        return
    args.db = [d.strip() for d in args.db.split(",") if d.strip()]
    if args.db == ["both"]:
        args.db = ["sqlite", "postgres"]
    unknown = sorted(set(args.db) - {"sqlite", "postgres"})
    if unknown:
        parser.error(f"--db: unknown database {', '.join(unknown)} (sqlite, postgres or both)")
    args.sizes_given = args.sizes is not None
    args.sizes = _sizes(args.sizes or "1,100,1000")
    args.workers = [int(w) for w in args.workers.split(",")]
    args.concurrency = {
        int(k): int(v) for k, v in (p.split("=") for p in args.concurrency.split(",") if p)
    }
    dbs = Databases(args.pg_url, args.keep)
    load_at_start = load_average()
    try:
        if args.soak is not None:
            sys.exit(soak(args, dbs))
        rows: list[Row] = []
        for kind in args.db:
            rows += bench_db(args, dbs, kind)
    finally:
        dbs.cleanup()
    print(f"ingest benchmark on {machine()}; load generator, server and database share the cores")
    print(
        f"{args.duration:g} s measured per run after {args.warmup:g} s of warm-up; "
        f"client {args.client}; background reconciler {'on' if args.reconciler else 'off'}; "
        f"1-minute load average {load_at_start:.2f} at the start, {load_average():.2f} at the end"
        + (" (other jobs shared the machine: rerun when quiet)" if load_at_start > 1.5 else "")
    )
    print(table(rows))
    for line in verdicts(rows):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1, default=str))


if __name__ == "__main__":
    main()
