"""The ingest benchmark's two ceilings: the HTTP ceiling (parse into the same pydantic models,
store nothing) and the storage ceiling (a plain ``executemany`` of the same rows)."""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from common import percentile
from lifecycles import Lifecycles

HERE = Path(__file__).resolve().parent


def ceiling_app() -> Any:
    """FastAPI app: ``POST /v1/events`` reads the body, runs ``parse_batch``, stores nothing."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    from billing.api.limits import read_within
    from billing.ingest.validation import MAX_BODY_BYTES, parse_batch

    # Annotations are strings here (``from __future__ import annotations``): FastAPI resolves
    # them in this module's globals.
    globals()["Request"], globals()["Response"] = Request, Response
    app = FastAPI()

    @app.post("/v1/events")
    async def post_events(request: Request) -> Response:
        body = await read_within(request.receive, MAX_BODY_BYTES, 30.0, None)
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
        "ingest_ceilings:ceiling_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        workers=workers,
        **uvicorn_options("warning"),
    )


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
            "p50_ms": percentile(lat, 0.5) * 1000,
            "p99_ms": percentile(lat, 0.99) * 1000,
            "errors": errors,
        }

    def close(self) -> None:
        self.engine.dispose()
