"""The SQLite store: every room's repository in SQLite's dialect (one module per room)."""

from __future__ import annotations

from billing.storage.sqlite.calllog import SqliteCalllog
from billing.storage.sqlite.export import SqliteExport
from billing.storage.sqlite.ingest import SqliteIngest
from billing.storage.sqlite.reconcile import SqliteReconcile
from billing.storage.sqlite.rollups import SqliteRollups
from billing.storage.store import Store

STORE = Store(
    name="sqlite",
    ingest=SqliteIngest(),
    reconcile=SqliteReconcile(),
    rollups=SqliteRollups(),
    calllog=SqliteCalllog(),
    export=SqliteExport(),
)
