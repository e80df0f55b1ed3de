"""Two ``billing serve`` processes on one database, each ingesting a shuffled copy of the same
events (with duplicates, out of order) while both reconcile (background passes every 0.2 s and
``POST /v1/reconcile`` on request): per call, the ledger sums are exactly those of one clean run
of the same events, and each call is settled once (CONTRACT "Ingest" idempotency and
"Reconciliation": one settlement entry, adjustments by difference).

On PostgreSQL with 20,000 distinct events; on SQLite a smaller run (8,000) with the two processes
on one database file (WAL, one writer at a time).
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from billing.client import BillingClient, DeliveryError
from billing.reconcile.runner import run_pass
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call, LedgerEntry
from tests.invariants import (
    check_invariants,
    compare_sums,
    engine_for,
    ledger_sums,
    stored_event_ids,
)
from tests.system.test_reliability_crash import (
    PRICES,
    ForkedServe,
    Forkserver,
    announce,
    clean_run,
    forkserver,  # noqa: F401 - the fixture
    post_prices,
    seed_from_env,
    workload,
)

pytestmark = pytest.mark.slow

#: Distinct events per database: (PostgreSQL, SQLite).
EVENTS = {True: 20_000, False: 8_000}


def _settlement_steps(engine: Any) -> dict[str, int]:
    """Per call, in how many reconciliation steps (distinct ``booked_at``) it got settlements."""
    steps: dict[str, set[Any]] = defaultdict(set)
    with engine.connect() as conn:
        for rid, booked in conn.execute(
            select(LedgerEntry.request_id, LedgerEntry.booked_at).where(
                LedgerEntry.kind == "settlement"
            )
        ):
            steps[rid].add(booked)
    return {rid: len(times) for rid, times in steps.items()}


def test_two_servers_ingesting_shuffled_copies_and_reconciling_bill_like_one_clean_run(
    db_url: str,
    is_postgres: bool,
    tmp_path: Path,
    forkserver: Forkserver,  # noqa: F811
) -> None:
    seed = seed_from_env(777)
    announce(seed, "concurrency")
    rng = random.Random(seed)
    target = EVENTS[is_postgres]
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    per_call: list[list[dict[str, Any]]] = []
    count = 0
    while count < target:  # ~50 events per call: many progress snapshots, as long streams send
        (events,) = workload(rng, 1, f"cc-{len(per_call):05d}-", t0, snapshots=(20, 80))
        events = events[: target - count]
        per_call.append(events)
        count += len(events)
    unique = [e for events in per_call for e in events]
    assert len(unique) == target
    copies = []
    for _ in range(2):
        copy = unique + rng.sample(unique, len(unique) // 20)  # and 5% posted twice by one server
        rng.shuffle(copy)
        copies.append(copy)

    settings = Settings(database_url=db_url)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as admin:
        post_prices(admin, PRICES)
    env = {"BILLING_RECONCILE_INTERVAL_S": "0.2", "BILLING_RECONCILE_BATCH_SIZE": "5"}
    servers = [ForkedServe(forkserver, db_url, tmp_path, env=env) for _ in range(2)]
    problems: list[DeliveryError] = []
    statuses: dict[int, int] = defaultdict(int)
    stop = threading.Event()
    started = time.monotonic()

    def hammer() -> None:  # explicit passes on both servers, on top of the background ones
        with httpx.Client(timeout=300) as http:
            turn = 0
            while not stop.is_set():
                reply = http.post(f"{servers[turn % 2].url}/v1/reconcile", json={})
                statuses[reply.status_code] += 1
                turn += 1
                stop.wait(0.3)

    for server in servers:
        server.start(wait=False)
    try:
        for server in servers:
            server.wait_ready(timeout=60)
        clients = [
            BillingClient(
                server.url,
                batch_size=200,
                flush_interval_s=0.02,
                max_retries=10,
                timeout_s=60,
                backoff_base_s=0.1,
                on_error=problems.append,
            )
            for server in servers
        ]
        hammering = threading.Thread(target=hammer, daemon=True)
        hammering.start()
        try:
            for client, copy in zip(clients, copies, strict=True):
                for event in copy:
                    client.send(event)
            flushed = [c.flush(timeout=240) for c in clients]
            stats = [c.stats() for c in clients]
        finally:
            for client in clients:
                client.close(timeout=10)
        ingested = time.monotonic() - started
        assert flushed == [True, True], problems[:5]
        # While the servers still pass in the background (a real clock: only complete calls
        # settle there), two more reconcilers settle the rest at a clock past settle_after, at once.
        fixed = datetime.now(UTC) + timedelta(days=1)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda _: _pass(settings, fixed), range(2)))
        _pass(settings, fixed)
        stop.set()
        hammering.join(timeout=300)
    finally:
        stop.set()
        for server in servers:
            server.stop()
    logs = "".join(server.log.read_text() for server in servers if server.log.exists())
    assert "Traceback" not in logs and "pass failed" not in logs, logs[-3000:]
    assert dict(statuses).keys() <= {200}, dict(statuses)
    assert all(s.rejected == 0 and s.dropped == 0 for s in stats), stats

    engine = engine_for(db_url)
    try:
        stored = stored_event_ids(engine)
        assert len(stored) == len(set(stored)) == len(unique)
        assert set(stored) == {e["event_id"] for e in unique}
        report = check_invariants(engine)
        got = ledger_sums(engine)
        steps = _settlement_steps(engine)
        with engine.connect() as conn:
            open_calls = conn.scalar(select(func.count()).where(Call.settled.is_(False)))
    finally:
        engine.dispose()
    want, _ = clean_run(db_url, tmp_path, [(list(PRICES), unique)], fixed)
    mismatches = compare_sums(got, want)
    accepted = sum(s.accepted for s in stats)
    duplicates = sum(s.duplicates for s in stats)
    print(
        f"\nconcurrency figures: seed {seed}, {len(per_call)} calls, {len(unique)} distinct "
        f"events, {sum(len(c) for c in copies)} posted, {accepted} accepted, {duplicates} "
        f"duplicates, {report.entries} ledger entries ({report.settlements} settlements, "
        f"{report.adjustments} adjustments), {sum(statuses.values())} explicit passes, "
        f"ledger mismatches {len(mismatches)}, ingest {ingested:.1f} s, "
        f"total {time.monotonic() - started:.1f} s"
    )
    assert accepted == len(unique) and duplicates == sum(len(c) for c in copies) - len(unique)
    assert open_calls == 0
    assert not mismatches, "\n".join(mismatches[:20])
    twice = {rid: n for rid, n in steps.items() if n != 1}
    assert not twice, f"calls settled in more than one step: {list(twice.items())[:10]}"
    assert set(steps) == {events[0]["request_id"] for events in per_call}


def _pass(settings: Settings, now: datetime) -> None:
    engine = make_engine(settings)
    try:
        run_pass(make_sessionmaker(engine), settings, now=now)
    finally:
        engine.dispose()
