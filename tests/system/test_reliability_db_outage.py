"""Database trouble: ingest answers ``503`` with ``Retry-After`` while the database is unavailable
(never a ``500``, never a ``200`` for an event that is not stored) and recovers by itself when the
database is back (CONTRACT "Ingest": "503 with Retry-After when the database is unavailable;
nothing was stored").

- PostgreSQL: the service reaches the (shared) server through ``tests.tcp_proxy.TcpProxy``, which
  the test makes reset every connection and refuse new ones (RST, or the port closed), then
  forward again.
- SQLite: another connection holds the database under an exclusive lock (``BEGIN EXCLUSIVE``),
  with a 150 ms busy timeout; between two requests, and in the middle of a run. (In WAL mode every
  open connection keeps a shared lock on the file, so ``locking_mode=EXCLUSIVE``, which would shut
  out readers too, cannot be taken while the service is connected: not tested.)
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from billing.reconcile.runner import run_pass
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call, Event
from tests.conftest import LiveServer
from tests.invariants import check_invariants, engine_for, stored_event_ids
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
#: The PostgreSQL outages, in order: how the proxy cuts, and for how many seconds.
OUTAGES: list[tuple[Literal["reset", "refuse"], float]] = [
    ("reset", 2.0),
    ("refuse", 2.0),
    ("reset", 0.3),
    ("refuse", 1.0),
]


def batch_of(prefix: str, n: int, size: int = 12) -> list[dict[str, Any]]:
    """A batch of ``size`` fresh events: whole small calls (started, progress, upstream usage)."""
    events: list[dict[str, Any]] = []
    for c in range(size // 3):
        rid = f"{prefix}-{n}-{c}"
        at = (T0 + timedelta(seconds=n)).isoformat()
        events += [
            {
                "event_id": f"{rid}-s",
                "request_id": rid,
                "type": "stream.started",
                "occurred_at": at,
                "api_key_id": "key_outage",
                "model": "m-outage",
                "protocol": "anthropic.messages",
                "input_tokens": 10 + c,
            },
            {
                "event_id": f"{rid}-t",
                "request_id": rid,
                "type": "stream.tokens",
                "occurred_at": at,
                "output_tokens_generated": 40 + c,
                "output_tokens_delivered": 40 + c,
            },
            {
                "event_id": f"{rid}-u",
                "request_id": rid,
                "type": "stream.usage",
                "occurred_at": at,
                "input_tokens": 10 + c,
                "output_tokens": 41 + c,
                "source": "upstream",
            },
        ]
    return events


@dataclass
class Answer:
    """One ``POST /v1/events``: when, what came back, which events."""

    at: float
    status: int | None  # None: no HTTP answer (the connection failed)
    retry_after: str | None
    body: Any
    ids: list[str]
    attempt: int


@dataclass
class Gateway:
    """Threads posting fresh batches in a loop; a batch answered 503 is posted again after
    ``Retry-After`` (as billing.client does), until it is answered 200."""

    url: str
    prefix: str
    threads: int = 3
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: set[str] = field(default_factory=set)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n in range(self.threads):
            worker = threading.Thread(target=self._run, args=(n,), daemon=True)
            worker.start()
            self._workers.append(worker)

    def finish(self, timeout: float = 60) -> None:
        self.stop.set()
        for worker in self._workers:
            worker.join(timeout)
            assert not worker.is_alive(), "a gateway thread is stuck"

    def _run(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            k = 0
            while not self.stop.is_set():
                events = batch_of(f"{self.prefix}{n}", k)
                k += 1
                ids = [e["event_id"] for e in events]
                with self.lock:
                    self.sent.update(ids)
                attempt = 0
                while True:  # until stored: a 503 is retried even after stop
                    attempt += 1
                    try:
                        reply = http.post("/v1/events", json={"events": events})
                    except httpx.TransportError:
                        self._record(Answer(time.monotonic(), None, None, None, ids, attempt))
                        time.sleep(0.2)
                        continue
                    try:
                        body = reply.json()
                    except ValueError:
                        body = reply.text
                    self._record(
                        Answer(
                            time.monotonic(),
                            reply.status_code,
                            reply.headers.get("retry-after"),
                            body,
                            ids,
                            attempt,
                        )
                    )
                    if reply.status_code != 503:
                        break
                    time.sleep(min(float(reply.headers.get("retry-after") or 1), 1.0) / 4)

    def _record(self, answer: Answer) -> None:
        with self.lock:
            self.answers.append(answer)


def _check_answers(answers: list[Answer], stored: set[str], sent: set[str]) -> dict[str, int]:
    """The contract for every answer; returns the figures."""
    statuses = Counter(a.status for a in answers)
    unexpected = [a for a in answers if a.status not in (200, 503)]
    assert not unexpected, [(a.status, a.body) for a in unexpected[:5]]
    for a in answers:
        if a.status == 503:
            assert a.retry_after is not None and a.retry_after.isdigit(), a
            assert int(a.retry_after) >= 1
            assert isinstance(a.body, dict) and "error" in a.body, a.body
        if a.status == 200:
            assert a.body["accepted"] + a.body["duplicates"] == len(a.ids), a.body
    acknowledged = {i for a in answers if a.status == 200 for i in a.ids}
    lost = acknowledged - stored
    assert not lost, f"{len(lost)} events answered 200 are not stored: {sorted(lost)[:5]}"
    assert stored == sent, "every batch was retried until stored"
    # A batch answered 503 whose retry then came back as duplicates had been stored after all
    # (the connection broke while COMMIT was under way: the outcome was unknown to the service).
    stored_anyway = 0
    first_answer: dict[str, Answer] = {}
    for a in answers:
        key = a.ids[0]
        if a.status == 200 and a.attempt > 1 and a.body["duplicates"] == len(a.ids):
            stored_anyway += first_answer.get(key, a).status == 503
        first_answer.setdefault(key, a)
    return {
        "posts": len(answers),
        "200": statuses[200],
        "503": statuses[503],
        "no_answer": statuses[None],
        "503_stored_anyway": stored_anyway,
        "events_sent": len(sent),
        "events_acknowledged": len(acknowledged),
        "events_stored": len(stored),
    }


def _wait_for(condition: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - started


def _answers_since(gateway: Gateway, since: float) -> list[Answer]:
    with gateway.lock:
        return [a for a in gateway.answers if a.at >= since]


def test_postgres_connection_cut_answers_503_with_retry_after_and_recovers(
    db_url: str,
    is_postgres: bool,
) -> None:
    if not is_postgres:
        pytest.skip("cuts a PostgreSQL connection (SQLite: see the exclusive-lock test)")
    target = make_url(db_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        proxied = target.set(host="127.0.0.1", port=proxy.port).render_as_string(
            hide_password=False
        )
        settings = Settings(
            database_url=proxied,
            db_retry_after_s=1,
            reconcile_interval_s=0.2,
            reconcile_batch_size=20,
        )
        app = create_app(settings, background=True)
        with LiveServer(app) as server:
            gateway = Gateway(server.url, "pg")
            gateway.start()
            outages: list[dict[str, Any]] = []
            try:
                for n, (mode, down_s) in enumerate(OUTAGES):
                    time.sleep(0.8)
                    since = time.monotonic()
                    _wait_for(
                        lambda s=since: any(a.status == 200 for a in _answers_since(gateway, s)),
                        15,
                        f"a 200 before outage {n}",
                    )
                    cut_at = time.monotonic()
                    cut = proxy.cut(mode)
                    time.sleep(down_s)
                    during = _answers_since(gateway, cut_at + 0.5)
                    with httpx.Client(base_url=server.url, timeout=30) as http:
                        ready = http.get("/readyz").status_code
                    proxy.resume()
                    back = time.monotonic()
                    try:
                        recovery = _wait_for(
                            lambda s=back: any(a.status == 200 for a in _answers_since(gateway, s)),
                            15,
                            "recovery",
                        )
                    except AssertionError:
                        tail = [
                            (round(a.at - back, 2), a.status, a.body) for a in gateway.answers[-8:]
                        ]
                        raise AssertionError(
                            f"outage {n} ({mode}): no recovery; {outages}, last answers {tail}"
                        ) from None
                    outages.append(
                        {
                            "mode": mode,
                            "cut_connections": cut,
                            "seconds": down_s,
                            "answers_during": dict(Counter(a.status for a in during)),
                            "readyz": ready,
                            "recovered_in_s": round(recovery, 2),
                        }
                    )
                    if down_s >= 1:
                        # Whatever is answered during the outage is a 503. A batch whose COMMIT
                        # was under way at the cut may instead wait for the database to tell
                        # whether it committed (billing/ingest/outcome.py), so an outage can pass
                        # without answers when every gateway thread was in that group.
                        assert all(a.status == 503 for a in during), during[:3]
                        assert ready == 503
                time.sleep(0.5)
            finally:
                gateway.finish()
            # The background reconciler went on by itself too.
            engine = engine_for(db_url)
            try:
                _wait_for(lambda: _no_pending(engine), 30, "the background passes")
            finally:
                engine.dispose()
    engine = engine_for(db_url)
    try:
        stored = stored_event_ids(engine)
        assert len(stored) == len(set(stored))
        figures = _check_answers(gateway.answers, set(stored), gateway.sent)
        check_invariants(engine)
    finally:
        engine.dispose()
    print(f"\npostgres outage figures: {figures}; outages: {outages}")
    assert figures["503"] > 0
    # The outages were seen as 503s (with Retry-After: checked in _check_answers), not waited out.
    assert any(o["answers_during"].get(503) for o in outages), outages


def _no_pending(engine: Any) -> bool:
    with engine.connect() as conn:
        pending = conn.scalar(select(func.count()).where(Call.pending.is_(True)))
        settled = conn.scalar(select(func.count()).where(Call.settled.is_(True)))
        calls = conn.scalar(select(func.count()).select_from(Call))
    return bool(pending == 0 and settled == calls)


def test_sqlite_held_under_exclusive_lock_answers_503_with_retry_after_and_recovers(
    db_url: str,
    is_postgres: bool,
) -> None:
    """The lock is taken between two requests: every post meanwhile is a 503 with Retry-After,
    quickly (the busy timeout), and nothing of it is stored: the same batches are new afterwards."""
    if is_postgres:
        pytest.skip("locks a SQLite file (PostgreSQL: see the connection-cut test)")
    path = Path(make_url(db_url).database or "")
    settings = Settings(
        database_url=db_url,
        sqlite_busy_timeout_ms=150,
        db_retry_after_s=1,
        reconcile_interval_s=0.2,
    )
    app = create_app(settings, background=True)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        first = batch_of("lk", 0)
        assert http.post("/v1/events", json={"events": first}).status_code == 200
        holder = sqlite3.connect(path, isolation_level=None, timeout=10)
        refused: list[list[dict[str, Any]]] = []
        try:
            holder.execute("BEGIN EXCLUSIVE")
            holder.execute(
                "UPDATE calls SET pending = pending WHERE request_id = ?", (first[0]["request_id"],)
            )
            for n in range(1, 6):
                events = batch_of("lk", n)
                started = time.monotonic()
                reply = http.post("/v1/events", json={"events": events})
                took = time.monotonic() - started
                assert reply.status_code == 503, reply.text
                assert reply.headers.get("retry-after") == "1"
                assert "error" in reply.json()
                assert took < 5, f"a 503 took {took:.1f} s (busy timeout 150 ms)"
                refused.append(events)
            stored_now = holder.execute("SELECT count(*) FROM events").fetchone()[0]
        finally:
            if holder.in_transaction:
                holder.rollback()
            holder.close()
        assert stored_now == len(first), "a batch answered 503 was stored"
        # The lock is gone: the same batches are new to the service (nothing of them was stored).
        for events in refused:
            reply = http.post("/v1/events", json={"events": events})
            assert reply.status_code == 200, reply.text
            assert reply.json() == {"accepted": len(events), "duplicates": 0}
        run = make_engine(settings)
        try:
            run_pass(make_sessionmaker(run), settings)
        finally:
            run.dispose()
    engine = engine_for(db_url)
    try:
        check_invariants(engine)
        with engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(Event)) == 6 * len(first)
    finally:
        engine.dispose()
    print(
        f"\nsqlite lock figures: {len(refused)} batches answered 503 with Retry-After, none "
        "stored; all stored once the lock was released"
    )


def test_sqlite_locked_mid_run_by_another_connection_answers_503_and_recovers(
    db_url: str,
    is_postgres: bool,
) -> None:
    """Gateways post all along while another connection takes ``BEGIN EXCLUSIVE`` three times
    for 1.5 s: only 200s and 503s with Retry-After, every 200 stored, the 503s retried until
    stored, and the background reconciler carries on afterwards."""
    if is_postgres:
        pytest.skip("locks a SQLite file (PostgreSQL: see the connection-cut test)")
    path = Path(make_url(db_url).database or "")
    settings = Settings(
        database_url=db_url,
        sqlite_busy_timeout_ms=150,
        db_retry_after_s=1,
        reconcile_interval_s=0.2,
    )
    app = create_app(settings, background=True)
    locks = []
    with LiveServer(app) as server:
        gateway = Gateway(server.url, "sq")
        gateway.start()
        try:
            for _ in range(3):
                time.sleep(0.7)
                holder = sqlite3.connect(path, isolation_level=None, timeout=10)
                try:
                    holder.execute("BEGIN EXCLUSIVE")
                    locked_at = time.monotonic()
                    time.sleep(1.5)
                    during = _answers_since(gateway, locked_at + 0.3)
                    holder.rollback()
                finally:
                    holder.close()
                back = time.monotonic()
                recovery = _wait_for(
                    lambda s=back: any(a.status == 200 for a in _answers_since(gateway, s)),
                    15,
                    "recovery",
                )
                assert during and all(a.status == 503 for a in during), during[:3]
                locks.append(
                    {
                        "answers_during": dict(Counter(a.status for a in during)),
                        "recovered_in_s": round(recovery, 2),
                    }
                )
        finally:
            gateway.finish()
        engine = engine_for(db_url)
        try:
            _wait_for(lambda: _no_pending(engine), 30, "the background passes")
        finally:
            engine.dispose()
    engine = engine_for(db_url)
    try:
        stored = stored_event_ids(engine)
        assert len(stored) == len(set(stored))
        figures = _check_answers(gateway.answers, set(stored), gateway.sent)
        check_invariants(engine)
    finally:
        engine.dispose()
    print(f"\nsqlite mid-run lock figures: {figures}; locks: {locks}")
    assert figures["503_stored_anyway"] == 0


def _post_with_commit_answer_lost(
    db_url: str, events: list[dict[str, Any]], back_after_s: float | None
) -> tuple[httpx.Response, set[str], httpx.Response]:
    """Post ``events`` through a proxy that forwards the COMMIT, drops PostgreSQL's answer and
    cuts every connection; the proxy comes back ``back_after_s`` after the cut (None: only once
    the answer has come). Returns the answer, the ids of ``events`` stored afterwards, and the
    answer to the same batch posted again once the proxy is back."""
    target = make_url(db_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        proxied = target.set(host="127.0.0.1", port=proxy.port).render_as_string(
            hide_password=False
        )
        settings = Settings(database_url=proxied, db_retry_after_s=1)
        with (
            LiveServer(create_app(settings)) as server,
            httpx.Client(base_url=server.url, timeout=60) as http,
        ):
            assert http.post("/v1/events", json={"events": batch_of("lc", 0)}).status_code == 200
            tripped = proxy.cut_after(b"COMMIT", delay_s=0.3)
            timer: threading.Timer | None = None
            if back_after_s is not None:

                def back() -> None:
                    tripped.wait(30)
                    time.sleep(0.3 + back_after_s)
                    proxy.resume()

                timer = threading.Timer(0, back)
                timer.start()
            reply = http.post("/v1/events", json={"events": events})
            assert tripped.is_set(), "the COMMIT never went through the proxy"
            if timer is not None:
                timer.join()
            proxy.resume()
            deadline = time.monotonic() + 30
            while True:
                again = http.post("/v1/events", json={"events": events})
                if again.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    engine = engine_for(db_url)
    try:
        stored = set(stored_event_ids(engine)) & {e["event_id"] for e in events}
    finally:
        engine.dispose()
    return reply, stored, again


def test_a_batch_whose_commit_answer_is_lost_is_answered_200_once_the_database_says_so(
    db_url: str, is_postgres: bool
) -> None:
    """PostgreSQL committed but its answer was lost; the connection comes back 1 s later, within
    the writer's check (billing/ingest/outcome.py): the batch is answered 200, all accepted, and
    posting it again gives duplicates."""
    if not is_postgres:
        pytest.skip("needs a network connection to the database to lose the COMMIT's answer")
    events = batch_of("lc", 1)
    reply, stored, again = _post_with_commit_answer_lost(db_url, events, back_after_s=1.0)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": len(events), "duplicates": 0}
    assert stored == {e["event_id"] for e in events}
    assert again.status_code == 200
    assert again.json() == {"accepted": 0, "duplicates": len(events)}


def test_a_batch_whose_commit_outcome_cannot_be_known_says_so(
    db_url: str, is_postgres: bool
) -> None:
    """The connection stays down past the writer's check: the answer is a 503 with Retry-After
    that says the events may be stored (never "nothing was stored" while they are), and the
    same batch posted again once the database is back is answered as duplicates."""
    if not is_postgres:
        pytest.skip("needs a network connection to the database to lose the COMMIT's answer")
    events = batch_of("lc", 2)
    reply, stored, again = _post_with_commit_answer_lost(db_url, events, back_after_s=None)
    assert reply.status_code == 503, reply.text
    assert reply.headers["Retry-After"] == "1"
    assert "may be stored" in reply.json()["error"]
    assert "nothing was stored" not in reply.text
    assert stored == {e["event_id"] for e in events}  # PostgreSQL did commit
    assert again.status_code == 200
    assert again.json() == {"accepted": 0, "duplicates": len(events)}
