"""``billing migrate`` and ``billing reconcile``: the schema, and one reconciliation pass now."""

from __future__ import annotations

import json

import typer
from sqlalchemy.exc import SQLAlchemyError

from billing.cli.common import (
    configure_logging,
    fail,
    load_settings,
    migrate_or_fail,
    open_sessions,
    safe_url,
)
from billing.reconcile.runner import run_pass


def migrate() -> None:
    """Bring the database to the newest schema (Alembic upgrade to head)."""
    settings = load_settings()
    migrate_or_fail(settings)
    typer.echo(f"billing: database at migration head ({safe_url(settings.database_url)})", err=True)


def reconcile() -> None:
    """Run one reconciliation pass now and print what it settled and adjusted (JSON)."""
    settings = load_settings()
    configure_logging(settings.log_level)
    migrate_or_fail(settings)
    try:
        result = run_pass(open_sessions(settings), settings)
    except SQLAlchemyError as error:
        fail(f"reconciliation failed: {str(getattr(error, 'orig', error)).strip().splitlines()[0]}")
    typer.echo(
        json.dumps(
            {"examined": result.examined, "settled": result.settled, "adjusted": result.adjusted}
        )
    )
