"""The PostgreSQL store: every room's repository in PostgreSQL's dialect (one module per room)."""

from __future__ import annotations

from billing.storage.postgres.calllog import PostgresCalllog
from billing.storage.postgres.export import PostgresExport
from billing.storage.postgres.ingest import PostgresIngest
from billing.storage.postgres.reconcile import PostgresReconcile
from billing.storage.postgres.rollups import PostgresRollups
from billing.storage.store import Store

STORE = Store(
    name="postgresql",
    ingest=PostgresIngest(),
    reconcile=PostgresReconcile(),
    rollups=PostgresRollups(),
    calllog=PostgresCalllog(),
    export=PostgresExport(),
)
