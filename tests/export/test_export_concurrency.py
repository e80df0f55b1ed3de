"""Exports streamed on several threads at once give the bytes of a serial export (issue #23: a
module-level buffer shared by the threads once put one export's cell text into another's).
On a real database, through the same generator that serves the HTTP and CLI exports."""

from __future__ import annotations

import io
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from fastapi.testclient import TestClient

from billing.export.params import ExportParams
from billing.export.service import export_chunks
from tests.builders import started, usage
from tests.reconcile.test_reconcile_late_events import SONNET, post, reconcile

CALLS = 1000
THREADS = 8
SINCE = datetime.fromisoformat("2020-01-01T00:00:00+00:00")
UNTIL = datetime.fromisoformat("2030-01-01T00:00:00+00:00")


def test_concurrent_exports_equal_a_serial_export(client: TestClient) -> None:
    assert client.post("/v1/prices", json=SONNET).status_code == 201
    # Every key needs quoting (a comma, a double quote) and differs: each export quotes many
    # distinct cells, interleaved with the other threads'.
    events = []
    for i in range(CALLS):
        rid = f"cc-{i}"
        key = f'team,{i} "{"x" * (i % 7)}"'
        events += [started(f"{rid}-s", rid, key=key), usage(f"{rid}-u", 10 + i, i, rid=rid, at=1)]
    for start in range(0, len(events), 500):
        post(client, *events[start : start + 500])
    reconcile(client)
    sessions = client.app.state.billing.sessions  # type: ignore[attr-defined]
    kinds = [
        ExportParams("calls", SINCE, UNTIL),
        ExportParams("usage", SINCE, UNTIL, ("api_key_id", "model")),
        ExportParams("calls", SINCE, UNTIL, format="v2"),
    ]

    def one(params: ExportParams) -> bytes:
        return b"".join(export_chunks(sessions, params))

    serial = [one(params) for params in kinds]
    assert serial[0].count(b"\r\n") == CALLS + 1
    assert b'"team,8 ""x""",' in serial[0]
    # Threads switch as often as the interpreter allows, so that any state shared between
    # exports is shared mid-cell.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            jobs = [pool.submit(one, kinds[n % len(kinds)]) for n in range(THREADS * 6)]
            results = [job.result() for job in jobs]
    finally:
        sys.setswitchinterval(interval)
    for n, result in enumerate(results):
        assert result == serial[n % len(kinds)]


def test_the_csv_writer_keeps_no_buffer_or_writer_at_module_level() -> None:
    import billing.export.csvwriter as module

    shared = [
        name
        for name, value in vars(module).items()
        if isinstance(value, io.IOBase) or type(value).__name__ == "writer"
    ]
    assert shared == []
