"""The PostgreSQL store: every room's repository in PostgreSQL's dialect (one module per room)."""

from __future__ import annotations

from billing.storage.postgres.reconcile import PostgresReconcile
from billing.storage.store import Store

STORE = Store(
    name="postgresql",
    ingest=None,
    reconcile=PostgresReconcile(),
    rollups=None,
    calllog=None,
    export=None,
)
