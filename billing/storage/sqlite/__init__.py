"""The SQLite store: every room's repository in SQLite's dialect (one module per room)."""

from __future__ import annotations

from billing.storage.sqlite.reconcile import SqliteReconcile
from billing.storage.store import Store

STORE = Store(
    name="sqlite",
    ingest=None,
    reconcile=SqliteReconcile(),
    rollups=None,
    calllog=None,
    export=None,
)
