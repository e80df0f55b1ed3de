"""Two reconcilers on one database settle every call exactly once.

On PostgreSQL: two real ``billing serve`` processes, each with background passes, while both are
asked for passes at once. On any database: two in-process reconcilers (threads, each with its own
engine) running passes at the same time.
Source: CONTRACT "Reconciliation" (one settlement per call).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select
from sqlalchemy.pool import NullPool

from billing.reconcile.runner import run_pass
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call, LedgerEntry
from tests.builders import started, usage
from tests.conftest import _free_port

CALLS = 2000
PRICE = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "3",
    "output_usd_per_mtok": "15",
    "cache_read_usd_per_mtok": "0.30",
    "cache_creation_usd_per_mtok": "3.75",
}


def call_events(n: int) -> list[dict[str, Any]]:
    """Two events per call (started and upstream usage: complete), input and output varying."""
    events = []
    for i in range(n):
        rid = f"cc-{i:05d}"
        events.append(started(f"{rid}-s", rid, at=i % 60, key=f"key_{i % 7}"))
        events.append(usage(f"{rid}-u", 1 + i % 97, 1 + i % 113, rid=rid, at=i % 60 + 1))
    return events


def expected_totals(n: int) -> dict[str, int]:
    inputs = sum(1 + i % 97 for i in range(n))
    outputs = sum(1 + i % 113 for i in range(n))
    return {"input": inputs, "output": outputs, "cost": inputs * 3_000_000 + outputs * 15_000_000}


def post_all(
    post: Callable[[dict[str, Any]], httpx.Response], events: list[dict[str, Any]]
) -> None:
    for start in range(0, len(events), 1000):
        response = post({"events": events[start : start + 1000]})
        assert response.status_code == 200, response.text


def assert_settled_once(db_url: str, n: int) -> None:
    """Exactly one settlement entry per call, no adjustment, totals right."""
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            per_call = conn.execute(
                select(LedgerEntry.request_id, LedgerEntry.kind, func.count()).group_by(
                    LedgerEntry.request_id, LedgerEntry.kind
                )
            ).all()
            totals = conn.execute(
                select(
                    func.sum(LedgerEntry.input_tokens),
                    func.sum(LedgerEntry.output_tokens_billed),
                    func.sum(LedgerEntry.cost_pusd),
                )
            ).one()
            settled = conn.scalar(select(func.count()).where(Call.settled.is_(True)))
            calls = conn.execute(
                select(Call.input_tokens, Call.output_tokens_billed, Call.cost_pusd)
            ).all()
    finally:
        engine.dispose()
    assert settled == n
    kinds = {kind for _, kind, _ in per_call}
    assert kinds == {"settlement"}, "no adjustment may be written"
    assert len(per_call) == n
    assert {count for _, _, count in per_call} == {1}
    expected = expected_totals(n)
    assert [int(v) for v in totals] == [expected["input"], expected["output"], expected["cost"]]
    assert sum(c.input_tokens for c in calls) == expected["input"]
    assert sum(c.cost_pusd for c in calls) == expected["cost"]


def wait_until_settled(db_url: str, n: int, timeout: float = 120) -> None:
    engine = create_engine(db_url, poolclass=NullPool)
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as conn:
                settled = conn.scalar(select(func.count()).where(Call.settled.is_(True)))
            if settled == n or time.monotonic() > deadline:
                return
            time.sleep(0.2)
    finally:
        engine.dispose()


# -- two in-process reconcilers (SQLite file, or PostgreSQL) ----------------------------------


@pytest.mark.slow
def test_two_reconcilers_in_process_settle_each_call_once(client: TestClient, db_url: str) -> None:
    assert client.post("/v1/prices", json=PRICE).status_code == 201
    post_all(lambda body: client.post("/v1/events", json=body), call_events(CALLS))
    settings = Settings(database_url=db_url, settle_after_s=100_000, reconcile_batch_size=50)
    barrier = threading.Barrier(2)
    results: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def reconciler(slot: int) -> None:
        engine = make_engine(settings)
        sessions = make_sessionmaker(engine)
        try:
            barrier.wait()
            for _ in range(3):
                results[slot].append(run_pass(sessions, settings).settled)
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=reconciler, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert sum(sum(r) for r in results) == CALLS  # each call counted as settled by one pass
    assert_settled_once(db_url, CALLS)


# -- two `billing serve` processes on PostgreSQL ----------------------------------------------


@contextmanager
def serve(db_url: str, workdir: Path, count: int) -> Iterator[list[str]]:
    """``count`` ``billing serve`` processes on free ports (output in ``workdir/serve-N.log``);
    always killed at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    env.update(
        BILLING_DATABASE_URL=db_url,
        BILLING_RECONCILE_INTERVAL_S="0.2",
        BILLING_SETTLE_AFTER_S="100000",
        BILLING_RECONCILE_BATCH_SIZE="25",
    )
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    logs: list[Path] = []
    try:
        for n in range(count):
            port = _free_port()
            log = workdir / f"serve-{n}.log"
            logs.append(log)
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            "from billing.cli import main; main()",
                            "serve",
                            "--port",
                            str(port),
                        ],
                        env=env,
                        cwd=workdir,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        for proc, url, log in zip(procs, urls, logs, strict=True):
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"billing serve exited with {proc.returncode}: {log.read_text()}")
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"billing serve at {url} not ready: {log.read_text()}")
                time.sleep(0.1)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


@pytest.mark.slow
def test_two_servers_settle_each_call_once(
    client: TestClient, db_url: str, is_postgres: bool, tmp_path: Path
) -> None:
    if not is_postgres:
        pytest.skip("two `billing serve` processes need PostgreSQL; SQLite: the in-process test")
    assert client.post("/v1/prices", json=PRICE).status_code == 201
    events = call_events(CALLS)
    with serve(db_url, tmp_path, 2) as urls, ThreadPoolExecutor(max_workers=8) as pool:
        http = [httpx.Client(base_url=url, timeout=120) for url in urls]
        try:
            # Both servers already pass every 0.2 s; the calls arrive at once (in-process ingest
            # is quicker than a pass), so both find the same backlog of 2,000 due calls.
            post_all(lambda body: client.post("/v1/events", json=body), events)
            # And passes on both at once on request, a few times, while the background runs.
            replies = list(pool.map(lambda c: c.post("/v1/reconcile", json={}), http * 3))
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            assert sum(r.json()["settled"] for r in replies) <= CALLS
            wait_until_settled(db_url, CALLS)
            replies = list(pool.map(lambda c: c.post("/v1/reconcile", json={}), http * 2))
            assert all(r.json() == {"examined": 0, "settled": 0, "adjusted": 0} for r in replies)
        finally:
            for c in http:
                c.close()
    assert_settled_once(db_url, CALLS)
    # No pass failed, in the background or on request (a lost race would log a traceback).
    for log in sorted(tmp_path.glob("serve-*.log")):
        text = log.read_text()
        assert "Traceback" not in text and "pass failed" not in text, text[-3000:]
