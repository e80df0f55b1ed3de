"""Benchmark of the spend check: ``GET /v1/spend`` at N calls and M budgets while ingest runs,
and ingest throughput with budgets against without, in the same run (CONTRACT "Budgets and
alerts (v2)": p95 under 5 ms at 1,000,000 calls and 10,000 budgets; ingest within 10 %).

Seeds ``--calls`` calls over ``--keys`` keys as ``bench/queries.py`` does (its ``seed``), then,
against one ``billing serve`` in its own process (as a gateway meets the service: the load's
threads and client do not share its GIL; the background reconciler and webhook worker on,
reconciling every 0.5 s; its CPU seconds are reported per phase):

1. ``--budgets`` monthly budgets over the first keys (every fourth in America/New_York), each
   filling its first counter from the ledger;
2. ingest throughput without and with the budgets in force, ``--rounds`` times each,
   alternating (medians compared): ``--writers`` threads posting batches of completed calls
   (``stream.started`` + ``stream.usage``) as fast as they are answered, for ``--seconds``
   (each run starts once the reconciler has drained the previous one's calls; with budgets
   the reconciler keeps their counters);
3. ``GET /v1/spend`` for random budgeted keys over HTTP (httpx, one connection) and in-process
   (``spend_check`` in ``read_transaction``, as the handler runs it), while a thread ingests
   ``--rate`` events a second.

    python bench/spend.py                                      # SQLite in $TMPDIR
    BILLING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/bench python bench/spend.py
    python bench/spend.py --calls 2000 --keys 50 --budgets 20 --iterations 50 --seconds 2  # smoke
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, load_average, tree_cpu_s
from queries import percentiles, seed_arguments, seeded_url

from billing.budgets import service
from billing.budgets.schemas import BudgetIn
from billing.settings import Settings
from billing.storage.db import (
    make_engine,
    make_sessionmaker,
    read_transaction,
    write_transaction,
)

BUDGET_TABLES = ("webhook_outbox", "budget_alerts", "budget_spend", "budget_open_calls", "budgets")
ROOT = Path(__file__).resolve().parents[1]
#: The server's reconciliation interval (``BILLING_RECONCILE_INTERVAL_S``).
RECONCILE_INTERVAL_S = 0.5
#: The server's ``BILLING_SETTLE_AFTER_S``: longer than the seed's open calls are old.
SETTLE_AFTER_S = 400 * 86400


class Serve:
    """``billing serve`` over ``url`` in its own process (this checkout's package first on the
    path), on a free loopback port; ``cpu_s()`` is its CPU seconds so far (user + system)."""

    def __init__(self, url: str) -> None:
        self.port = free_port()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "BILLING_DATABASE_URL": url,
            "BILLING_RECONCILE_INTERVAL_S": str(RECONCILE_INTERVAL_S),
            # The seed's open calls are rows without events (``queries.seed``), days old: with
            # the default the reconciler would take them as timed out at every step and find
            # nothing to settle them on (ingest never makes such a call). Here they stay open,
            # as streams still running, and count as provisional spend.
            "BILLING_SETTLE_AFTER_S": str(SETTLE_AFTER_S),
            "BILLING_LOG_LEVEL": "warning",
        }

    def __enter__(self) -> str:
        command = "from billing.cli import main; main()"
        args = [sys.executable, "-c", command, "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(args, env=self.env, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    return base
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("billing serve did not start")
            time.sleep(0.1)

    def cpu_s(self) -> float:
        return tree_cpu_s(self.proc.pid)

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _events(prefix: str, n_calls: int, keys: list[str]) -> list[dict[str, Any]]:
    at = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out: list[dict[str, Any]] = []
    for i in range(n_calls):
        rid = f"{prefix}-{i}"
        out.append(
            {
                "event_id": f"{rid}-s",
                "request_id": rid,
                "type": "stream.started",
                "occurred_at": at,
                "api_key_id": random.choice(keys),
                "model": "model-00",
                "protocol": "openai.chat_completions",
            }
        )
        out.append(
            {
                "event_id": f"{rid}-u",
                "request_id": rid,
                "type": "stream.usage",
                "occurred_at": at,
                "input_tokens": random.randrange(10, 5000),
                "output_tokens": random.randrange(1, 1000),
                "source": "upstream",
            }
        )
    return out


def throughput(base: str, label: str, keys: list[str], seconds: float, writers: int) -> float:
    """Events a second accepted by ``writers`` threads posting 50-call batches for ``seconds``."""
    accepted = [0] * writers
    stop = time.monotonic() + seconds

    def write(w: int) -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            n = 0
            while time.monotonic() < stop:
                batch = _events(f"{label}-{w}-{n}", 50, keys)
                n += 1
                response = http.post("/v1/events", json={"events": batch})
                if response.status_code == 200:
                    accepted[w] += response.json()["accepted"]

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(accepted) / (time.perf_counter() - began)
    print(f"  ingest {label:<16} {rate:10,.0f} events/s ({sum(accepted):,} events)")
    return rate


def drained(settings: Settings, timeout_s: float = 600.0) -> None:
    """Wait until the background reconciler has no pending call left (the previous phase's
    calls are not reconciled during the next one's measurement)."""
    engine = make_engine(settings)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if not conn.scalar(text("SELECT count(*) FROM calls WHERE pending")):
                    return
            time.sleep(0.2)
        print("  (the reconciler did not drain in time)")
    finally:
        engine.dispose()


def in_force(settings: Settings, on: bool) -> None:
    """Put the benchmark's budgets in force (``on``) or end them, in place (bumping their
    generation, as every write of budgets does: the server's copy of them is then stale)."""
    engine = make_engine(settings)
    with engine.begin() as conn:
        value = "NULL" if on else "created_at"
        conn.execute(text(f"UPDATE budgets SET ended_at = {value}"))
        conn.execute(text("UPDATE budget_generation SET generation = generation + 1"))
    engine.dispose()
    vacuum(settings)


def vacuum(settings: Settings) -> None:
    """On PostgreSQL, ``VACUUM ANALYZE`` the budgets' tables, as autovacuum would after such a
    bulk change (this benchmark rewrites every budget row at once; a machine whose
    ``autovacuum`` is off, as CI machines may have it, would otherwise leave the dead rows to
    the spend check's index scans)."""
    engine = make_engine(settings)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {', '.join(BUDGET_TABLES)}, budget_generation"))
    engine.dispose()


def create_budgets(settings: Settings, n: int) -> list[str]:
    sessions = make_sessionmaker(make_engine(settings))
    keys = [f"key_{rank:04d}" for rank in range(1, n + 1)]
    began = time.perf_counter()
    for first in range(0, n, 500):
        with write_transaction(sessions) as session:
            now = datetime.now(UTC)
            for i, key in enumerate(keys[first : first + 500], first):
                body = BudgetIn.model_validate(
                    {
                        "budget_id": f"bench-{i}",
                        "scope": {"api_key_id": key},
                        "limit_usd": str(random.randrange(50, 5000)),
                        "period": "month",
                        "tz": "America/New_York" if i % 4 == 0 else "UTC",
                    }
                )
                service.create_budget(session, body, now)
    print(f"  {n:,} budgets created in {time.perf_counter() - began:.1f} s")
    return keys


def spend_latency(
    settings: Settings,
    base: str,
    keys: list[str],
    iterations: int,
    rate: float,
    server_cpu: Callable[[], float],
) -> None:
    """The check's percentiles over HTTP (and the server's CPU meanwhile, the steady ingest's
    included) and in-process, for the same random budgeted keys."""
    stop = threading.Event()

    def steady() -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            n = 0
            while not stop.is_set():
                began = time.monotonic()
                http.post("/v1/events", json={"events": _events(f"steady-{n}", 5, keys)})
                n += 1
                stop.wait(max(0.0, 10 / rate - (time.monotonic() - began)))

    feeder = threading.Thread(target=steady, daemon=True)
    feeder.start()
    rng = random.Random(3)
    picks = [rng.choice(keys) for _ in range(iterations)]
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            for key in picks:  # untimed: the pages in memory
                http.get("/v1/spend", params={"api_key_id": key})
            samples = []
            cpu = server_cpu()
            for key in picks:
                began = time.perf_counter()
                response = http.get("/v1/spend", params={"api_key_id": key})
                samples.append(time.perf_counter() - began)
                assert response.status_code == 200, response.text
            cpu = server_cpu() - cpu
        _report("GET /v1/spend over HTTP", samples)
        per_check = cpu / len(picks) * 1000
        print(f"    server CPU {cpu:.2f} s: {per_check:.2f} ms a check (steady ingest included)")
        sessions = make_sessionmaker(make_engine(settings))
        samples = []
        for key in picks:
            began = time.perf_counter()
            with read_transaction(sessions) as session:  # as the handler reads it
                service.spend_check(session, key, datetime.now(UTC))
            samples.append(time.perf_counter() - began)
        _report("spend_check in-process", samples)
    finally:
        stop.set()
        feeder.join(timeout=30)


def _report(label: str, samples: list[float]) -> None:
    p50, p95, p99 = percentiles(samples)
    verdict = "ok" if p95 < 5 else "OVER 5 ms"
    print(f"  {label:<30} p50 {p50:7.2f}  p95 {p95:7.2f}  p99 {p99:7.2f} ms   {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    seed_arguments(parser, iterations=2000)
    parser.set_defaults(keys=10_000)
    parser.add_argument("--budgets", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0, help="each throughput run")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="of without / with budgets")
    parser.add_argument("--rate", type=float, default=500.0, help="events/s beside the check")
    args = parser.parse_args()
    if args.budgets > args.keys:
        parser.error("--budgets must be at most --keys (one budget per key)")
    url = seeded_url("spend", args)
    settings = Settings(
        database_url=url,
        reconcile_interval_s=RECONCILE_INTERVAL_S,
        settle_after_s=SETTLE_AFTER_S,
    )
    engine = make_engine(settings)
    with engine.begin() as conn:
        for table in BUDGET_TABLES:
            conn.execute(text(f"DELETE FROM {table}"))
        if engine.dialect.name == "postgresql":
            # The seed numbers its calls itself: ingest's sequence goes on after them.
            conn.execute(
                text("SELECT setval('calls_call_no_seq', (SELECT max(call_no) FROM calls))")
            )
    engine.dispose()
    keys = [f"key_{rank:04d}" for rank in range(1, args.budgets + 1)]
    print(f"  load average {load_average():.2f}")
    server = Serve(url)
    with server as base:
        create_budgets(settings, args.budgets)
        # Rounds of without / with, so that the machine's drift falls on both alike: "without"
        # ends the budgets for the round (the counters then miss its calls: only the
        # throughput is measured here), "with" puts them back in force.
        rates: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for on in (False, True):
                in_force(settings, on)
                drained(settings)
                label = f"{'with' if on else 'without'} budgets {r + 1}"
                cpu = server.cpu_s()
                rates[on].append(throughput(base, label, keys, args.seconds, args.writers))
                print(f"    server CPU {server.cpu_s() - cpu:.1f} s")
        drained(settings)
        vacuum(settings)
        without, with_budgets = (statistics.median(rates[on]) for on in (False, True))
        print(f"  median: without {without:,.0f}, with {with_budgets:,.0f} events/s")
        change = (with_budgets - without) / without * 100 if without else float("nan")
        verdict = "ok" if change > -10 else "OVER 10 %"
        print(f"  ingest with budgets vs without: {change:+.1f} %   {verdict}")
        spend_latency(settings, base, keys, args.iterations, args.rate, server.cpu_s)
    print(f"  load average {load_average():.2f}")


if __name__ == "__main__":
    main()
