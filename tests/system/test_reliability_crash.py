"""Crashes: ``billing serve`` SIGKILLed under load, ``billing reconcile`` SIGKILLed mid-pass.

CONTRACT "Ingest" (an acknowledged event is committed) and "Reconciliation" (one settlement per
call, adjustments by difference, the ledger only grows). Both tests are seeded: the seed is printed
on failure and ``BILLING_TEST_SEED=<seed>`` replays the same workload and kill schedule (the exact
interleaving with the OS scheduler cannot be replayed, the choices can).

The processes are forked from a small fork server (``Forkserver``) that has imported the service's
modules once: each child then runs ``billing.cli.main()`` with ``serve`` or ``reconcile`` exactly as
the console script does, but starts in a fraction of a second instead of ~3 s of imports, so a run
can afford dozens of crashes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from billing.client import BillingClient, DeliveryError
from billing.reconcile.runner import run_pass
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call, LedgerEntry
from tests.client.test_client import ServeProcess
from tests.conftest import _free_port
from tests.invariants import (
    check_invariants,
    compare_sums,
    engine_for,
    ledger_sums,
    scratch_database,
    stored_event_ids,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def seed_from_env(default: int) -> int:
    """The run's seed: ``BILLING_TEST_SEED`` when set, else ``default``."""
    value = os.environ.get("BILLING_TEST_SEED")
    return int(value) if value else default


def announce(seed: int, name: str) -> None:
    """Print the seed (pytest shows it with a failure) and how to replay it."""
    print(f"\n{name}: seed {seed}; replay with BILLING_TEST_SEED={seed}")


# -- the fork server -----------------------------------------------------------------------------

_FORKSERVER = r"""
import json, os, random, signal, sys, time
import billing.cli, billing.server.app, billing.storage.migrate, billing.reconcile.runner
import uvicorn, uvicorn.config, uvicorn.server, uvicorn.main, uvicorn.lifespan.on
import uvicorn.loops.auto, uvicorn.protocols.http.auto, uvicorn.protocols.websockets.auto
try:
    import uvicorn.loops.uvloop, uvicorn.protocols.http.httptools_impl
except ImportError:
    pass
done = {}
live = set()

def reap():
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        done[pid] = os.waitstatus_to_exitcode(status)

def spawn(cmd):
    pid = os.fork()
    if pid:
        live.add(pid)
        return pid
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        random.seed()
        os.environ.clear()
        os.environ.update(cmd["env"])
        os.chdir(cmd["cwd"])
        fd = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = ["billing", *cmd["args"]]
        code = 0
        try:
            billing.cli.main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException:
        import traceback
        traceback.print_exc()
        os._exit(70)

print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    reap()
    op = cmd["op"]
    if op == "spawn":
        reply = {"pid": spawn(cmd)}
    elif op == "poll":
        reply = {"code": done.get(cmd["pid"]), "running": cmd["pid"] in live}
    elif op == "kill":
        pid = cmd["pid"]
        if pid in live:
            os.kill(pid, cmd["sig"])
        deadline = time.monotonic() + cmd.get("wait", 10)
        while pid in live and time.monotonic() < deadline:
            time.sleep(0.005)
            reap()
        reply = {"code": done.get(pid), "running": pid in live}
    else:
        reply = {"error": op}
    print(json.dumps(reply), flush=True)
for pid in list(live):
    os.kill(pid, signal.SIGKILL)
while live:
    time.sleep(0.01)
    reap()
"""


class Forkserver:
    """A process that imported the service once and forks children that run ``billing.cli``.

    Every child is a child of the fork server, which reaps it; ``kill`` and ``poll`` go through the
    fork server, so a pid is never signalled after it was reaped. Closing the fork server (or its
    stdin reaching EOF because the test process died) SIGKILLs the children it still has.
    """

    def __init__(self, workdir: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.workdir = workdir
        self._lock = threading.Lock()
        with open(workdir / "forkserver.log", "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _FORKSERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=workdir,
            )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fork server failed: {(workdir / 'forkserver.log').read_text()}")

    def _call(self, **cmd: Any) -> dict[str, Any]:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps(cmd).encode() + b"\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def spawn(self, args: list[str], env: dict[str, str], log: Path) -> int:
        full = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
        full.update(env)
        reply = self._call(op="spawn", args=args, env=full, cwd=str(self.workdir), log=str(log))
        return int(reply["pid"])

    def poll(self, pid: int) -> int | None:
        """None while running, else the exit code (negative: killed by that signal)."""
        reply = self._call(op="poll", pid=pid)
        return None if reply["running"] else reply["code"]

    def kill(self, pid: int, sig: int = signal.SIGKILL, wait: float = 15) -> int | None:
        """Signal the child (if it still runs) and wait for it; its exit code or None."""
        reply = self._call(op="kill", pid=pid, sig=int(sig), wait=wait)
        return None if reply["running"] else reply["code"]

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


@pytest.fixture
def forkserver(tmp_path: Path) -> Iterator[Forkserver]:
    server = Forkserver(tmp_path)
    try:
        yield server
    finally:
        server.close()


class _Forked:
    """The part of ``subprocess.Popen`` that ``ServeProcess`` uses, for a forked child."""

    def __init__(self, forkserver: Forkserver, pid: int) -> None:
        self.forkserver = forkserver
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.forkserver.poll(self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.returncode = self.forkserver.kill(self.pid, sig, wait=15)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("billing", timeout or 0)
            time.sleep(0.02)
        return self.returncode


class ForkedServe(ServeProcess):
    """``tests.client.test_client.ServeProcess``, its ``billing serve`` forked from a
    ``Forkserver``."""

    def __init__(
        self,
        forkserver: Forkserver,
        db_url: str,
        workdir: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        super().__init__(db_url, workdir, port or _free_port())
        self.forkserver = forkserver
        self.env = env or {}

    def start(self, wait: bool = True) -> None:
        env = {"BILLING_DATABASE_URL": self.db_url, "BILLING_LOG_LEVEL": "warning", **self.env}
        self.starts += 1
        pid = self.forkserver.spawn(["serve", "--port", str(self.port)], env, self.log)
        self.proc = _Forked(self.forkserver, pid)  # type: ignore[assignment]
        if wait:
            self.wait_ready()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# -- a gateway workload --------------------------------------------------------------------------

#: (model, protocol); the last model has no price (its calls are unpriced).
MODELS = (
    ("claude-sonnet-5-5", "anthropic.messages"),
    ("gpt-5.1", "openai.chat_completions"),
    ("o4-mini", "openai.responses"),
    ("local-llama-3", "openai.chat_completions"),
)
PRICES = (
    {
        "model": "claude-sonnet-5-5",
        "effective_from": "2020-01-01T00:00:00Z",
        "input_usd_per_mtok": "3",
        "output_usd_per_mtok": "15",
        "cache_read_usd_per_mtok": "0.3",
        "cache_creation_usd_per_mtok": "3.75",
    },
    {
        "model": "gpt-5.1",
        "effective_from": "2020-01-01T00:00:00Z",
        "input_usd_per_mtok": "1.25",
        "output_usd_per_mtok": "10",
        "cache_read_usd_per_mtok": "0.125",
        "cache_creation_usd_per_mtok": "0",
    },
    {
        "model": "o4-mini",
        "effective_from": "2020-01-01T00:00:00Z",
        "input_usd_per_mtok": "1.1",
        "output_usd_per_mtok": "4.4",
        "cache_read_usd_per_mtok": "0.275",
        "cache_creation_usd_per_mtok": "0.000001",
    },
)
LATE_PRICE = {
    "model": "local-llama-3",
    "effective_from": "2020-01-01T00:00:00Z",
    "input_usd_per_mtok": "0.05",
    "output_usd_per_mtok": "0.123456",
    "cache_read_usd_per_mtok": "0",
    "cache_creation_usd_per_mtok": "0",
}


def _at(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def call_lifecycle(
    rng: random.Random,
    rid: str,
    start: datetime,
    *,
    started_missing: float = 0.0,
    snapshots: tuple[int, int] = (0, 4),
) -> list[dict[str, Any]]:
    """One call's events in the order a gateway emits them: per attempt ``stream.started``,
    progress snapshots, maybe a client disconnect (the upstream goes on), then upstream usage,
    an estimate or nothing, or a failure and a retry; sometimes the same usage twice under two
    event ids. Event ids are ``<rid>-<n>``."""
    key = f"key_{rng.randrange(16):02d}"
    model, protocol = rng.choice(MODELS)
    attempts = 1 if rng.random() < 0.85 else rng.randint(2, 3)
    skip_started = rng.random() < started_missing
    events: list[dict[str, Any]] = []
    t = start

    def add(type_: str, attempt: int, **fields: Any) -> dict[str, Any]:
        nonlocal t
        t += timedelta(milliseconds=rng.randint(5, 3000))
        event = {
            "event_id": f"{rid}-{len(events)}",
            "request_id": rid,
            "type": type_,
            "occurred_at": _at(t),
            "attempt": attempt,
            **fields,
        }
        events.append(event)
        return event

    for attempt in range(1, attempts + 1):
        last = attempt == attempts
        attempt_model = model if attempt == 1 or rng.random() < 0.7 else rng.choice(MODELS)[0]
        if not skip_started:
            started: dict[str, Any] = {
                "api_key_id": key,
                "model": attempt_model,
                "protocol": protocol,
            }
            if rng.random() < 0.7:
                started["input_tokens"] = rng.randint(1, 8000)
            if rng.random() < 0.2:
                started["metadata"] = {"team": rng.choice(["a", "b"]), "env": "prod"}
            add("stream.started", attempt, **started)
        generated = delivered = 0
        gone = last and rng.random() < 0.25
        for _ in range(rng.randint(*snapshots)):
            generated += rng.randint(1, 300)
            delivered = generated - rng.randint(0, min(generated, 8))
            add(
                "stream.tokens",
                attempt,
                output_tokens_generated=generated,
                output_tokens_delivered=delivered,
            )
        if gone:
            add(
                "stream.client_disconnected",
                attempt,
                output_tokens_delivered=delivered,
                **({"output_tokens_generated": generated} if rng.random() < 0.5 else {}),
            )
            generated += rng.randint(0, 500)  # the upstream goes on until the cancel arrives
        if not last:
            add(
                "stream.failed",
                attempt,
                error_type=rng.choice(["stalled", "upstream_disconnect"]),
                output_tokens_generated=generated,
            )
            continue
        roll = rng.random()
        if roll < 0.75:
            source = "upstream" if roll < 0.65 else "estimate"
            usage: dict[str, Any] = {
                "input_tokens": rng.randint(0, 9000),
                "output_tokens": max(generated + rng.randint(-3, 20), 0),
                "cache_read_input_tokens": rng.choice([0, 0, rng.randint(0, 4000)]),
                "cache_creation_input_tokens": rng.choice([0, 0, rng.randint(0, 2000)]),
                "source": source,
            }
            usage["reasoning_tokens"] = rng.randint(0, usage["output_tokens"])
            if rng.random() < 0.5:
                usage["stop_reason"] = rng.choice(["end_turn", "stop", "max_tokens"])
            if rng.random() < 0.15:  # a running total first (an earlier, smaller snapshot)
                add(
                    "stream.usage",
                    attempt,
                    **{**usage, "output_tokens": usage["output_tokens"] // 2},
                )
            first = add("stream.usage", attempt, **usage)
            if rng.random() < 0.1:  # the same usage reported twice, under another event id
                again = dict(first, event_id=f"{rid}-{len(events)}")
                events.append(again)
        if rng.random() < 0.05:
            add("stream.failed", attempt, error_type="api_error", message="overloaded")
    if not events:  # no stream.started and nothing else: the gateway saw at least a first chunk
        add("stream.tokens", 1, output_tokens_generated=0, output_tokens_delivered=0)
    return events


def workload(
    rng: random.Random,
    calls: int,
    prefix: str,
    start: datetime,
    *,
    started_missing: float = 0.0,
    snapshots: tuple[int, int] = (0, 4),
) -> list[list[dict[str, Any]]]:
    """``calls`` calls' event lists (see ``call_lifecycle``), their starts spread over an hour."""
    return [
        call_lifecycle(
            rng,
            f"{prefix}{i:05d}",
            start + timedelta(seconds=rng.uniform(0, 3600)),
            started_missing=started_missing,
            snapshots=snapshots,
        )
        for i in range(calls)
    ]


def interleave(rng: random.Random, per_call: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """All events, each call's in its own order, calls interleaved at random (as a gateway
    serving many calls at once posts them)."""
    queues = [list(reversed(events)) for events in per_call if events]
    out: list[dict[str, Any]] = []
    active: list[list[dict[str, Any]]] = []
    pending = list(queues)
    rng.shuffle(pending)
    while pending or active:
        while pending and (len(active) < 64 or not active):
            active.append(pending.pop())
        queue = active[rng.randrange(len(active))]
        out.append(queue.pop())
        if not queue:
            active.remove(queue)
    return out


def post_events(client: TestClient, events: list[dict[str, Any]], batch: int = 1000) -> None:
    for i in range(0, len(events), batch):
        reply = client.post("/v1/events", json={"events": events[i : i + batch]})
        assert reply.status_code == 200, reply.text


def post_prices(client: TestClient, prices: Any) -> None:
    for price in prices:
        reply = client.post("/v1/prices", json=price)
        assert reply.status_code in (200, 201), reply.text


def clean_run(
    db_url: str,
    workdir: Path,
    phases: list[tuple[list[Any], list[dict[str, Any]]]],
    now: datetime,
    settle_after_s: float = 300.0,
) -> tuple[dict[str, Any], list[Any]]:
    """A second database fed ``phases`` (prices, events) without faults, one reconciliation pass
    at ``now`` after each phase; returns its ledger sums and entries (for comparisons)."""
    with scratch_database(db_url, workdir, "clean") as url:
        settings = Settings(database_url=url, settle_after_s=settle_after_s)
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
            for prices, events in phases:
                post_prices(client, prices)
                post_events(client, events)
                engine = make_engine(settings)
                try:
                    run_pass(make_sessionmaker(engine), settings, now=now)
                finally:
                    engine.dispose()
        engine = engine_for(url)
        try:
            check_invariants(engine)
            return ledger_sums(engine), ledger_entries(engine)
        finally:
            engine.dispose()


def ledger_entries(engine: Any) -> list[tuple[Any, ...]]:
    """Every ledger entry as (call, seq, kind, reason, key, model, rates, tokens, cost): what two
    runs of the same events and passes must agree on (ids and booking times aside)."""
    columns = (
        "request_id",
        "seq",
        "kind",
        "reason",
        "api_key_id",
        "model",
        "input_uusd_per_mtok",
        "output_uusd_per_mtok",
        "cache_read_uusd_per_mtok",
        "cache_creation_uusd_per_mtok",
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens_billed",
        "output_tokens_delivered",
        "output_tokens_undelivered",
        "reasoning_tokens",
        "cost_pusd",
    )
    with engine.connect() as conn:
        rows = conn.execute(
            select(*(getattr(LedgerEntry, c) for c in columns)).order_by(
                LedgerEntry.request_id, LedgerEntry.seq
            )
        )
        return [tuple(row) for row in rows]


# -- acknowledged ids, seen on the wire ----------------------------------------------------------


class AckRecorder(httpx.BaseTransport):
    """An httpx transport that records, for every ``POST /v1/events`` answered ``200``, the event
    ids of the batch: exactly the events the service acknowledged as stored."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.acknowledged: set[str] = set()
        self.statuses: dict[int, int] = {}
        self.errors = 0
        self.mismatched: list[str] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = self.inner.handle_request(request)
            response.read()
        except Exception:
            with self._lock:
                self.errors += 1
            raise
        if request.url.path == "/v1/events":
            with self._lock:
                self.statuses[response.status_code] = self.statuses.get(response.status_code, 0) + 1
            if response.status_code == 200:
                ids = [e["event_id"] for e in orjson.loads(request.content)["events"]]
                body = response.json()
                with self._lock:
                    self.acknowledged.update(ids)
                    if body.get("accepted", 0) + body.get("duplicates", 0) != len(ids):
                        self.mismatched.append(f"{len(ids)} posted, answer {body}")
        return response

    def close(self) -> None:
        self.inner.close()


# -- test: billing serve killed under load -------------------------------------------------------

KILLS = 22
CRASH_CALLS = 500


@dataclass
class CrashFigures:
    seed: int
    kills: int = 0
    kills_soon_after_restart: int = 0
    events_sent: int = 0
    events_acknowledged: int = 0
    events_stored: int = 0
    ledger_mismatches: int = 0
    posts: dict[int, int] = field(default_factory=dict)
    client: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def test_serve_killed_under_load_loses_no_acknowledged_event_and_bills_like_a_clean_run(
    db_url: str, tmp_path: Path, forkserver: Forkserver
) -> None:
    """A gateway (``BillingClient`` with a spool) posts ~2,500 events of 500 calls while
    ``billing serve`` (background passes every 0.25 s) is SIGKILLed 22 times at random moments,
    sometimes while still starting, and restarted each time. At the end: every acknowledged event
    is stored, every event once, and per call the ledger equals a clean run's."""
    seed = seed_from_env(20261129)
    announce(seed, "crash")
    rng = random.Random(seed)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    per_call = workload(rng, CRASH_CALLS, "crash-", t0)
    events = interleave(rng, per_call)
    figures = CrashFigures(seed=seed, events_sent=len(events))
    settings = Settings(database_url=db_url)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as admin:
        post_prices(admin, PRICES)

    server = ForkedServe(
        forkserver,
        db_url,
        tmp_path,
        env={
            "BILLING_RECONCILE_INTERVAL_S": "0.25",
            "BILLING_RECONCILE_BATCH_SIZE": "40",
            "BILLING_DB_RETRY_AFTER_S": "1",
        },
    )
    server.start()
    transport = AckRecorder()
    problems: list[DeliveryError] = []
    client = BillingClient(
        server.url,
        batch_size=60,
        flush_interval_s=0.02,
        spool_path=tmp_path / "spool.jsonl",
        max_retries=4,
        timeout_s=5,
        backoff_base_s=0.05,
        backoff_max_s=0.4,
        max_retry_after_s=1,
        on_error=problems.append,
        transport=transport,
    )
    kill_rng = random.Random(seed + 1)
    schedule = [kill_rng.uniform(0.1, 0.6) for _ in range(KILLS)]
    while_starting = [kill_rng.random() < 0.2 for _ in range(KILLS)]
    stop = threading.Event()
    killer_error: list[BaseException] = []

    def killer() -> None:
        try:
            for delay, early in zip(schedule, while_starting, strict=True):
                if stop.is_set():
                    return
                if early:  # kill while it migrates / binds: a crash at start-up
                    time.sleep(delay / 4)
                    figures.kills_soon_after_restart += server.running()
                else:
                    server.wait_ready()
                    time.sleep(delay)
                server.kill(signal.SIGKILL)
                figures.kills += 1
                server.start(wait=False)
            server.wait_ready()
        except BaseException as error:  # reported in the test's thread
            killer_error.append(error)

    thread = threading.Thread(target=killer, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        # Spread the sends over the kill schedule (~8 s), so that every crash finds work.
        span = sum(schedule) + 0.3 * KILLS
        for i, event in enumerate(events):
            client.send(event)
            ahead = started + span * (i + 1) / len(events) - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        thread.join(timeout=120)
        assert not thread.is_alive(), "the killer thread is stuck"
        assert not killer_error, killer_error
        server.wait_ready()
        figures.seconds["load"] = round(time.monotonic() - started, 1)
        assert client.flush(timeout=120) is True, problems[-5:]
        figures.seconds["flush"] = round(time.monotonic() - started, 1)
        stats = client.stats()
    finally:
        stop.set()
        client.close(timeout=10)
        transport.close()
        server.stop()
    figures.posts = dict(transport.statuses)
    figures.client = {
        "acknowledged": stats.acknowledged,
        "spooled": stats.spooled,
        "replayed": stats.replayed,
        "requests": stats.requests,
        "retries": stats.retries,
    }
    figures.events_acknowledged = len(transport.acknowledged)
    assert figures.kills >= 20
    assert stats.sent == len(events) and stats.rejected == 0 and stats.dropped == 0, stats
    assert not transport.mismatched, transport.mismatched[:5]
    # Never a 500, crash or not: only answers, 503s (retried), or no answer at all.
    assert set(transport.statuses) <= {200, 503}, (
        f"{transport.statuses}; server log: {_tracebacks(server.log)}"
    )

    engine = engine_for(db_url)
    try:
        stored = stored_event_ids(engine)
        figures.events_stored = len(stored)
        missing = transport.acknowledged - set(stored)
        assert not missing, (
            f"{len(missing)} acknowledged events are not stored: {sorted(missing)[:5]}"
        )
        assert len(stored) == len(set(stored)), "an event is stored twice"
        assert set(stored) == {e["event_id"] for e in events}
        # One more pass at a fixed clock past settle_after settles every call, as in the clean run.
        fixed = datetime.now(UTC) + timedelta(days=1)
        engine_rw = make_engine(settings)
        try:
            run_pass(make_sessionmaker(engine_rw), settings, now=fixed)
        finally:
            engine_rw.dispose()
        report = check_invariants(engine)
        got = ledger_sums(engine)
    finally:
        engine.dispose()
    want, _ = clean_run(db_url, tmp_path, [(list(PRICES), events)], fixed)
    mismatches = compare_sums(got, want)
    figures.ledger_mismatches = len(mismatches)
    figures.seconds["checked"] = round(time.monotonic() - started, 1)
    print(
        f"\ncrash figures: {figures}; ledger: {report.entries} entries "
        f"({report.settlements} settlements, {report.adjustments} adjustments) for "
        f"{report.calls} calls; log lines: {_log_tail(server.log)}"
    )
    assert not mismatches, "\n".join(mismatches[:20])
    assert report.settled == report.calls == CRASH_CALLS
    assert all(row["settlements"] >= 1 for row in got.values())


def _tracebacks(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    start = text.find("Traceback")
    return text[start : start + 4000] if start >= 0 else "(no traceback)"


def _log_tail(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    tracebacks = text.count("Traceback")
    return f"{len(text.splitlines())} ({tracebacks} tracebacks)"


# -- test: billing reconcile killed mid-pass -----------------------------------------------------

RECONCILE_CALLS = 1000


def _pending(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).where(Call.pending.is_(True))) or 0)


def _kill_reconcilers(
    forkserver: Forkserver,
    tmp_path: Path,
    db_url: str,
    rng: random.Random,
    kills: int,
    env: dict[str, str],
) -> tuple[int, int]:
    """Run ``billing reconcile`` and SIGKILL it after a random delay, ``kills`` times, checking the
    invariants after every kill; then let one run to its end. Returns (kills mid-pass, passes)."""
    mid_pass = 0
    engine = engine_for(db_url)
    log = tmp_path / "reconcile.log"
    try:
        for _ in range(kills):
            before = _pending(engine)
            # Kill once the pass has done a random part of what is left (whole steps commit),
            # give or take a step: a kill mid-pass, at a moment the test does not choose exactly.
            stop_at = before - max(1, int(before * rng.uniform(0.05, 0.35)))
            pid = forkserver.spawn(["reconcile"], env, log)
            deadline = time.monotonic() + 60
            while (
                forkserver.poll(pid) is None
                and _pending(engine) > stop_at
                and time.monotonic() < deadline
            ):
                time.sleep(0.003)
            if forkserver.poll(pid) is None:
                mid_pass += 1
            forkserver.kill(pid, signal.SIGKILL)
            check_invariants(engine)  # no call half-settled, whatever step the kill hit
        pid = forkserver.spawn(["reconcile"], env, log)
        code = forkserver.kill(pid, 0, wait=300)  # signal 0: just wait for it to end
        assert code == 0, log.read_text()[-3000:]
        assert _pending(engine) == 0
        check_invariants(engine)
    finally:
        engine.dispose()
    return mid_pass, kills + 1


def test_reconcile_killed_mid_pass_settles_each_call_once(
    db_url: str, tmp_path: Path, forkserver: Forkserver
) -> None:
    """1,000 calls (some without ``stream.started``, one model unpriced) are settled by
    ``billing reconcile`` (steps of 5 calls) SIGKILLed 6 times mid-pass, then run to the end;
    then late events arrive (usage changes, the missing ``stream.started``, a price for the unpriced
    model) and the adjustments are written by passes killed 6 more times. After every kill: no call
    is half-settled. At the end the ledger holds, entry for entry, what a clean run writes: no
    settlement and no adjustment twice."""
    seed = seed_from_env(4242)
    announce(seed, "reconcile crash")
    rng = random.Random(seed)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=5)
    per_call = workload(rng, RECONCILE_CALLS, "rk-", t0, started_missing=0.05)
    phase_a = [e for events in per_call for e in events]
    late: list[dict[str, Any]] = []
    for events in per_call:
        rid = events[0]["request_id"]
        if events[0]["type"] != "stream.started" and rng.random() < 0.7:
            late.append(
                {
                    "event_id": f"{rid}-late-started",
                    "request_id": rid,
                    "type": "stream.started",
                    "occurred_at": events[0]["occurred_at"],
                    "attempt": 1,
                    "api_key_id": "key_late",
                    "model": MODELS[0][0],
                    "protocol": MODELS[0][1],
                }
            )
        elif rng.random() < 0.25:
            last = events[-1]
            late.append(
                {
                    "event_id": f"{rid}-late-usage",
                    "request_id": rid,
                    "type": "stream.usage",
                    "attempt": last["attempt"],
                    "occurred_at": _at(
                        datetime.fromisoformat(last["occurred_at"]) + timedelta(seconds=30)
                    ),
                    "input_tokens": rng.randint(0, 5000),
                    "output_tokens": rng.randint(0, 900),
                    "source": "upstream",
                }
            )
    settle_after = 0.05
    env = {
        "BILLING_DATABASE_URL": db_url,
        "BILLING_SETTLE_AFTER_S": str(settle_after),
        "BILLING_RECONCILE_BATCH_SIZE": "5",
        "BILLING_LOG_LEVEL": "warning",
    }
    settings = Settings(database_url=db_url, settle_after_s=settle_after)
    started = time.monotonic()
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        post_prices(client, PRICES)
        post_events(client, phase_a)
    time.sleep(settle_after * 2)
    killed_a, passes_a = _kill_reconcilers(forkserver, tmp_path, db_url, rng, 6, env)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        post_prices(client, [LATE_PRICE])
        post_events(client, late)
    time.sleep(settle_after * 2)
    killed_b, passes_b = _kill_reconcilers(forkserver, tmp_path, db_url, rng, 6, env)
    elapsed = time.monotonic() - started

    engine = engine_for(db_url)
    try:
        report = check_invariants(engine)
        got_sums = ledger_sums(engine)
        got_entries = ledger_entries(engine)
        with engine.connect() as conn:
            settled = conn.scalar(select(func.count()).where(Call.settled.is_(True)))
    finally:
        engine.dispose()
    fixed = datetime.now(UTC) + timedelta(days=1)
    want_sums, want_entries = clean_run(
        db_url,
        tmp_path,
        [(list(PRICES), phase_a), ([LATE_PRICE], late)],
        fixed,
        settle_after_s=settle_after,
    )
    mismatches = compare_sums(got_sums, want_sums)
    print(
        f"\nreconcile crash figures: seed {seed}, {killed_a + killed_b} kills mid-pass "
        f"({passes_a + passes_b} passes started), {len(phase_a)} + {len(late)} late events, "
        f"{report.entries} entries ({report.settlements} settlements, {report.adjustments} "
        f"adjustments), ledger mismatches {len(mismatches)}, {elapsed:.1f} s"
    )
    assert settled == RECONCILE_CALLS
    assert killed_a >= 5 and killed_b >= 5, (killed_a, killed_b)
    assert not mismatches, "\n".join(mismatches[:20])
    if got_entries != want_entries:
        have, want = set(got_entries), set(want_entries)
        raise AssertionError(
            f"ledger differs from a clean run: {len(have - want)} unexpected entries "
            f"{sorted(have - want)[:3]}, {len(want - have)} missing {sorted(want - have)[:3]}"
        )
