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
import asyncio
import contextlib
import itertools
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432"

TARGET_BATCH100_EVENTS_S = 30_000
TARGET_SINGLE_EVENTS_S = 2_500
TARGET_SINGLE_RATIO = 0.60
TARGET_SINGLE_P99_MS = 25.0

#: Concurrent connections (gateways) per post size.
DEFAULT_CONCURRENCY = {1: 32, 100: 8, 1000: 3}

# --- realistic stream lifecycles ---------------------------------------------------------------

KEYS = [f"key_{i:04x}" for i in range(500)]
MODELS = [
    ("claude-sonnet-5-5", "anthropic.messages"),
    ("claude-haiku-5", "anthropic.messages"),
    ("claude-opus-5", "anthropic.messages"),
    ("gpt-5.6-sol", "openai.responses"),
    ("gpt-5.6-mini", "openai.responses"),
    ("gpt-5.6-sol", "openai.chat_completions"),
    ("gpt-5.6-nano", "openai.chat_completions"),
    ("o9-reasoner", "openai.responses"),
]
TEAMS = ["search", "support", "ads", "growth", "infra", "research"]


class Lifecycles:
    """An endless, interleaved stream of lifecycle events for ``inflight`` concurrent calls.

    Each event is returned as its JSON bytes. Request ids are random (as a gateway's are); event ids
    are ``<request_id>-<n>``, unique across the run.
    """

    def __init__(self, seed: int, inflight: int = 64) -> None:
        self.rng = random.Random(seed)
        self.inflight = inflight
        self.active: list[list[dict[str, Any]]] = []
        self.count = 0
        self._stamp = ""
        self._refresh()

    def _refresh(self) -> None:
        now = datetime.now(UTC)
        self._stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"

    def _plan(self) -> list[dict[str, Any]]:
        rng = self.rng
        request_id = "req_" + secrets.token_hex(10)
        key = KEYS[int(rng.paretovariate(1.2)) % len(KEYS)]
        model, protocol = MODELS[rng.randrange(len(MODELS))]
        plan: list[dict[str, Any]] = []
        retried = rng.random() < 0.02
        for attempt in (1, 2) if retried else (1,):
            started: dict[str, Any] = {
                "event_id": "",
                "request_id": request_id,
                "type": "stream.started",
                "api_key_id": key,
                "model": model,
                "protocol": protocol,
                "input_tokens": rng.randrange(20, 20_000),
            }
            if attempt > 1:
                started["attempt"] = attempt
            if rng.random() < 0.3:
                started["metadata"] = {"team": rng.choice(TEAMS), "user": f"u{rng.randrange(9999)}"}
            plan.append(started)
            generated = delivered = 0
            for _ in range(rng.randrange(2, 9)):
                generated += rng.randrange(10, 200)
                delivered = max(delivered, generated - rng.randrange(0, 8))
                plan.append(
                    {
                        "type": "stream.tokens",
                        "output_tokens_generated": generated,
                        "output_tokens_delivered": delivered,
                    }
                )
            if attempt == 1 and retried:
                plan.append(
                    {
                        "type": "stream.failed",
                        "error_type": "overloaded_error",
                        "message": "Overloaded",
                        "output_tokens_generated": generated,
                    }
                )
                continue
            if rng.random() < 0.05:
                plan.append(
                    {
                        "type": "stream.client_disconnected",
                        "output_tokens_delivered": delivered,
                        "output_tokens_generated": generated,
                    }
                )
                generated += rng.randrange(50, 500)  # the upstream keeps generating
            upstream = rng.random() >= 0.05
            usage: dict[str, Any] = {
                "type": "stream.usage",
                "input_tokens": started["input_tokens"],
                "output_tokens": generated,
                "source": "upstream" if upstream else "estimate",
            }
            if protocol == "anthropic.messages":
                usage["cache_read_input_tokens"] = rng.choice((0, 0, 1024, 4096))
                usage["stop_reason"] = "end_turn"
            else:
                usage["reasoning_tokens"] = generated // 3 if model.startswith("o9") else 0
                usage["stop_reason"] = "stop"
            plan.append(usage)
        # Number and address every event.
        current = 1
        for n, event in enumerate(plan):
            if event["type"] == "stream.started":
                current = event.get("attempt", 1)
            event["event_id"] = f"{request_id}-{n}"
            event["request_id"] = request_id
            if current > 1:
                event["attempt"] = current
        plan.reverse()  # pop() from the end
        return plan

    def next(self) -> bytes:
        """The next event of a random in-flight call, as JSON bytes."""
        active = self.active
        while len(active) < self.inflight:
            active.append(self._plan())
        i = self.rng.randrange(len(active))
        plan = active[i]
        event = plan.pop()
        if not plan:
            active[i] = self._plan()
        self.count += 1
        if self.count % 500 == 0:
            self._refresh()
        event["occurred_at"] = self._stamp
        return orjson.dumps(event)

    def body(self, size: int) -> bytes:
        return b'{"events":[' + b",".join(self.next() for _ in range(size)) + b"]}"


# --- the load generator (its own process) -------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


async def _raw_worker(
    host: str, port: int, headers: bytes, gen: Lifecycles, size: int, state: dict[str, Any]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat: list[float] = state["lat"]
    try:
        while not state["stop"]:
            body = gen.body(size)
            request = headers + b"Content-Length: %d\r\n\r\n" % len(body) + body
            started = time.perf_counter()
            writer.write(request)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            reply = await reader.readexactly(length) if length else b""
            elapsed = time.perf_counter() - started
            status = int(status_line.split()[1]) if status_line else 0
            if not state["measuring"]:
                continue
            lat.append(elapsed)
            if status == 200 and orjson.loads(reply).get("accepted") == size:
                state["events"] += size
                state["requests"] += 1
            else:
                state["errors"] += 1
                if len(state["samples"]) < 5:
                    state["samples"].append(f"{status} {reply[:200]!r}")
    finally:
        writer.close()


async def _httpx_worker(
    client: Any,
    url: str,
    headers: dict[str, str],
    gen: Lifecycles,
    size: int,
    state: dict[str, Any],
) -> None:
    lat: list[float] = state["lat"]
    while not state["stop"]:
        body = gen.body(size)
        started = time.perf_counter()
        reply = await client.post(url, content=body, headers=headers)
        elapsed = time.perf_counter() - started
        if not state["measuring"]:
            continue
        lat.append(elapsed)
        if reply.status_code == 200 and reply.json().get("accepted") == size:
            state["events"] += size
            state["requests"] += 1
        else:
            state["errors"] += 1
            if len(state["samples"]) < 5:
                state["samples"].append(f"{reply.status_code} {reply.text[:200]}")


async def _load(config: dict[str, Any]) -> dict[str, Any]:
    host, port, size = config["host"], config["port"], config["size"]
    token = config.get("token")
    state: dict[str, Any] = {
        "stop": False,
        "measuring": False,
        "events": 0,
        "requests": 0,
        "errors": 0,
        "lat": [],
        "samples": [],
    }
    seed = config.get("seed", 1)
    workers = []
    client = None
    if config.get("client") == "httpx":
        import httpx

        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=config["concurrency"]), timeout=60
        )
        hdrs = {"Content-Type": "application/json"}
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        url = f"http://{host}:{port}/v1/events"
        for i in range(config["concurrency"]):
            gen = Lifecycles(seed * 1000 + i, inflight=max(8, min(64, size // 2 + 8)))
            workers.append(_httpx_worker(client, url, hdrs, gen, size, state))
    else:
        head = b"POST /v1/events HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n" % (
            host.encode(),
            port,
        )
        if token:
            head += b"Authorization: Bearer " + token.encode() + b"\r\n"
        for i in range(config["concurrency"]):
            gen = Lifecycles(seed * 1000 + i, inflight=max(8, min(64, size // 2 + 8)))
            workers.append(_raw_worker(host, port, head, gen, size, state))
    tasks = [asyncio.ensure_future(w) for w in workers]
    await asyncio.sleep(config["warmup"])
    state["measuring"] = True
    started = time.perf_counter()
    per_interval: list[tuple[float, int]] = []
    interval = config.get("report_every") or 0
    deadline = started + config["duration"]
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        step = min(deadline - now, interval or deadline - now)
        await asyncio.sleep(step)
        if interval:
            per_interval.append((round(time.perf_counter() - started, 1), state["events"]))
            print(json.dumps({"progress": per_interval[-1]}), file=sys.stderr, flush=True)
    state["measuring"] = False
    elapsed = time.perf_counter() - started
    state["stop"] = True
    done, pending = await asyncio.wait(tasks, timeout=30)
    for task in pending:
        task.cancel()
    for task in done:
        if task.exception() is not None and not state["samples"]:
            state["samples"].append(repr(task.exception()))
    if client is not None:
        await client.aclose()
    lat = sorted(state["lat"])
    return {
        "size": size,
        "concurrency": config["concurrency"],
        "events": state["events"],
        "requests": state["requests"],
        "errors": state["errors"],
        "error_samples": state["samples"],
        "seconds": elapsed,
        "events_per_s": state["events"] / elapsed,
        "p50_ms": _percentile(lat, 0.50) * 1000,
        "p99_ms": _percentile(lat, 0.99) * 1000,
        "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
        "progress": per_interval,
    }


def client_main(config: dict[str, Any]) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    result = asyncio.run(_load(config))
    print(json.dumps(result))


def run_client(config: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Run the load generator in its own process; returns its result."""
    proc = subprocess.run(
        [sys.executable, __file__, "--_client", json.dumps(config)],
        check=False,
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --- the HTTP ceiling: parse into the same pydantic models, store nothing ------------------------


def ceiling_app() -> Any:
    """FastAPI app: ``POST /v1/events`` reads the body, runs ``parse_batch``, stores nothing."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    from billing.api.events import read_body
    from billing.ingest.validation import parse_batch

    # Annotations are strings here (``from __future__ import annotations``): FastAPI resolves
    # them in this module's globals.
    globals()["Request"], globals()["Response"] = Request, Response
    app = FastAPI()

    @app.post("/v1/events")
    async def post_events(request: Request) -> Response:
        body = await read_body(request, 30.0)
        batch = parse_batch(body, datetime.now(UTC))
        return Response(
            orjson.dumps({"accepted": len(batch), "duplicates": 0}),
            media_type="application/json",
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def ceiling_server_main(port: int, workers: int) -> None:
    import uvicorn

    from billing.cli import uvicorn_options

    sys.path.insert(0, str(HERE))
    uvicorn.run(
        "ingest:ceiling_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        workers=workers,
        **uvicorn_options("warning"),
    )


# --- servers as subprocesses --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become healthy")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def tree_rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` and its descendants, in KiB."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its descendants."""
    ticks = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    return os.getloadavg()[0]


#: Seconds of calm before each measured run (after the flushes of ``quiesce``).
QUIESCE_S = 2.0


def quiesce(url: str | None) -> None:
    """Let the writes of the previous run reach the disk before the next run is measured, so no
    run pays for another's: the kernel's write-back (``sync``) and, on PostgreSQL, a
    ``CHECKPOINT`` (skipped for a role that may not run one). Ceilings and the service alike."""
    os.sync()
    if url and url.startswith("postgresql"):
        from sqlalchemy import create_engine, exc, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text("CHECKPOINT"))
        except exc.DBAPIError:
            pass
        finally:
            engine.dispose()
    time.sleep(QUIESCE_S)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    token: str | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _billing_env(url: str, reconciler: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["BILLING_DATABASE_URL"] = url
    env["BILLING_LOG_LEVEL"] = "warning"
    if not reconciler:
        env["BILLING_RECONCILE_INTERVAL_S"] = "86400"
    return env


def _billing_exe() -> str:
    exe = Path(sys.executable).with_name("billing")
    return str(exe) if exe.exists() else "billing"


@contextmanager
def billing_server(url: str, workers: int, reconciler: bool, cwd: str) -> Iterator[Server]:
    env = _billing_env(url, reconciler)
    created = subprocess.run(
        [_billing_exe(), "tokens", "create", "--role", "ingest", "--name", "bench"],
        env=env,
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    token = created.stdout.strip()
    port = free_port()
    proc = subprocess.Popen(
        [_billing_exe(), "serve", "--port", str(port), "--workers", str(workers)],
        env=env,
        cwd=cwd,
        stderr=subprocess.DEVNULL,
    )
    server = Server(proc, port, token)
    try:
        _wait_healthy(port, proc)
        yield server
    finally:
        server.stop()


@contextmanager
def ceiling_server(workers: int) -> Iterator[Server]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--_ceiling-server", str(port), "--workers", str(workers)],
        stderr=subprocess.DEVNULL,
    )
    server = Server(proc, port)
    try:
        _wait_healthy(port, proc)
        yield server
    finally:
        server.stop()


# --- databases ----------------------------------------------------------------------------------


class Databases:
    """Fresh databases for one run: SQLite files in a temporary directory, PostgreSQL databases."""

    def __init__(self, pg_base: str, keep: bool) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-ingest-")
        self.pg_base = pg_base.rstrip("/")
        self.keep = keep
        self.created: list[str] = []
        self.n = 0

    def fresh(self, kind: str) -> str:
        from billing.storage.migrate import upgrade_to_head

        self.n += 1
        if kind == "sqlite":
            url = f"sqlite:///{self.tmp}/bench-{self.n}.db"
        else:
            from sqlalchemy import create_engine, text

            name = f"billing_bench_{os.getpid()}_{self.n}"
            admin = create_engine(f"{self.pg_base}/postgres", isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
                conn.execute(text(f"CREATE DATABASE {name}"))
            admin.dispose()
            self.created.append(name)
            url = f"{self.pg_base}/{name}"
        upgrade_to_head(url)
        return url

    def done(self, url: str) -> None:
        """Drop one database as soon as its runs are over (unless ``--keep``): PostgreSQL's
        autovacuum would otherwise work on it during the next runs."""
        if self.keep:
            return
        if url.startswith("sqlite"):
            path = url.removeprefix("sqlite:///")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path + suffix)
            return
        from sqlalchemy import create_engine, text

        name = url.rsplit("/", 1)[1]
        admin = create_engine(f"{self.pg_base}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
        self.created.remove(name)

    def cleanup(self) -> None:
        if self.keep:
            print(f"kept: {self.tmp} {' '.join(self.created)}")
            return
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.created:
            from sqlalchemy import create_engine, text

            admin = create_engine(f"{self.pg_base}/postgres", isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                for name in self.created:
                    conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            admin.dispose()


# --- the storage ceiling: a plain executemany of the same rows ----------------------------------

_EVENT_COLUMNS = (
    "event_id",
    "request_id",
    "attempt",
    "type",
    "occurred_at",
    "received_at",
    "content_hash",
    "body",
    "output_tokens_delivered",
    "output_tokens_generated",
    "call_no",
)
_CALL_COLUMNS = (
    "call_no",
    "request_id",
    "first_received_at",
    "last_received_at",
    "change_seq",
    "pending",
    "status",
    "settled",
    "attempts",
    "anomalies",
    "api_key_id",
    "model",
    "protocol",
    "started_at",
    "metadata",
)


def _template_rows(count: int) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """``count`` events as (events row, stream.started fields or None), validated by the service's
    own ``parse_batch`` and hashed by its own ``content_hash``."""
    from billing.ingest.schemas import StreamStarted
    from billing.ingest.service import content_hash
    from billing.ingest.validation import parse_batch

    gen = Lifecycles(7, inflight=64)
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    now = datetime.now(UTC)
    while len(out) < count:
        for parsed in parse_batch(gen.body(1000), now):
            event = parsed.event
            row = {
                "event_id": event.event_id,
                "request_id": event.request_id,
                "attempt": event.attempt,
                "type": event.type,
                "occurred_at": event.occurred_at,
                "content_hash": content_hash(parsed),
                "body": orjson.dumps(parsed.raw).decode(),
                "output_tokens_delivered": getattr(event, "output_tokens_delivered", None)
                if event.type == "stream.tokens"
                else None,
                "output_tokens_generated": getattr(event, "output_tokens_generated", None)
                if event.type == "stream.tokens"
                else None,
            }
            started = None
            if isinstance(event, StreamStarted):
                started = {
                    "api_key_id": event.api_key_id,
                    "model": event.model,
                    "protocol": event.protocol,
                    "started_at": event.occurred_at,
                    "metadata": event.metadata,
                }
            out.append((row, started))
    return out[:count]


class StorageCeiling:
    """Plain executemany of events rows and the calls upsert, one transaction per post."""

    def __init__(self, url: str) -> None:
        from billing.settings import Settings
        from billing.storage.db import make_engine

        self.engine = make_engine(Settings(database_url=url))
        self.sqlite = url.startswith("sqlite")
        self.templates = _template_rows(20_000)
        mark = "?" if self.sqlite else "%s"
        cols = ", ".join(_EVENT_COLUMNS)
        self.insert_events = (
            f"INSERT INTO events ({cols}) VALUES ({', '.join([mark] * len(_EVENT_COLUMNS))})"
        )
        ccols = ", ".join(_CALL_COLUMNS)
        self.upsert_calls = (
            f"INSERT INTO calls ({ccols}) VALUES ({', '.join([mark] * len(_CALL_COLUMNS))}) "
            "ON CONFLICT (request_id) DO UPDATE SET last_received_at = excluded.last_received_at, "
            "change_seq = calls.change_seq + 1, pending = excluded.pending"
        )
        self.cycle = 0
        self.numbers: dict[str, int] = {}
        self.lock = threading.Lock()
        self.cursor_pos = 0

    def _next_batch(self, size: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        with self.lock:
            if self.cursor_pos + size > len(self.templates):
                self.cursor_pos = 0
                self.cycle += 1
            start, cycle = self.cursor_pos, self.cycle
            self.cursor_pos += size
        now = datetime.now(UTC)
        suffix = f"~{os.getpid()}.{cycle}"
        from billing.storage.types import sqlite_text

        t = sqlite_text if self.sqlite else (lambda v: v)
        received = t(now)
        events = []
        calls: dict[str, tuple[Any, ...]] = {}
        numbers = self.numbers
        for row, started in self.templates[start : start + size]:
            rid = row["request_id"] + suffix
            # The call's number, given in the order calls are first seen (as the service does).
            call_no = numbers.get(rid)
            if call_no is None:
                with self.lock:
                    call_no = numbers.setdefault(rid, len(numbers) + 1)
            events.append(
                (
                    row["event_id"] + suffix,
                    rid,
                    row["attempt"],
                    row["type"],
                    t(row["occurred_at"]),
                    received,
                    row["content_hash"],
                    row["body"],
                    row["output_tokens_delivered"],
                    row["output_tokens_generated"],
                    call_no,
                )
            )
            if rid not in calls or started is not None:
                s = started or {}
                meta = s.get("metadata")
                calls[rid] = (
                    call_no,
                    rid,
                    received,
                    received,
                    1,
                    True,
                    "open",
                    False,
                    0,
                    "[]",
                    s.get("api_key_id"),
                    s.get("model"),
                    s.get("protocol"),
                    t(s["started_at"]) if started else None,
                    orjson.dumps(meta).decode() if meta is not None else None,
                )
        events.sort()
        return events, [calls[k] for k in sorted(calls)]

    def run(self, size: int, threads: int, duration: float, warmup: float) -> dict[str, Any]:
        state: dict[str, Any] = {"stop": False, "measuring": False, "events": 0, "lat": []}
        errors: list[str] = []

        def worker() -> None:
            raw = self.engine.raw_connection()
            try:
                dbapi = raw.driver_connection
                assert dbapi is not None
                while not state["stop"]:
                    events, calls = self._next_batch(size)
                    started = time.perf_counter()
                    cur = dbapi.cursor()
                    if self.sqlite:
                        cur.execute("BEGIN IMMEDIATE")
                    cur.executemany(self.insert_events, events)
                    cur.executemany(self.upsert_calls, calls)
                    dbapi.commit() if not self.sqlite else cur.execute("COMMIT")
                    cur.close()
                    elapsed = time.perf_counter() - started
                    if state["measuring"]:
                        state["lat"].append(elapsed)
                        state["events"] += len(events)
            except Exception as error:  # pragma: no cover - reported
                errors.append(repr(error))
            finally:
                raw.close()

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for th in pool:
            th.start()
        time.sleep(warmup)
        state["measuring"] = True
        started = time.perf_counter()
        time.sleep(duration)
        state["measuring"] = False
        elapsed = time.perf_counter() - started
        state["stop"] = True
        for th in pool:
            th.join()
        lat = sorted(state["lat"])
        return {
            "size": size,
            "threads": threads,
            "events": state["events"],
            "seconds": elapsed,
            "events_per_s": state["events"] / elapsed,
            "p50_ms": _percentile(lat, 0.5) * 1000,
            "p99_ms": _percentile(lat, 0.99) * 1000,
            "errors": errors,
        }

    def close(self) -> None:
        self.engine.dispose()


# --- orchestration ------------------------------------------------------------------------------


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


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}); Python {sys.version.split()[0]}"


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
