"""``billing archive --before YYYY-MM [--to DIR]`` and ``billing archive restore FILE``: the raw
events of closed months to Parquet and back (``billing.archive.service``); what was done is
printed as JSON on stdout."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from billing.archive.parquet import ArchiveUnavailable
from billing.archive.schemas import Month
from billing.archive.service import ArchiveRefused, archive_before, restore
from billing.cli.common import fail, load_settings, migrate_or_fail, open_sessions

archive_app = typer.Typer(
    help="Move the raw events of closed months to Parquet files, and back.",
    invoke_without_command=True,
)


@archive_app.callback()
def archive(
    ctx: typer.Context,
    before: Annotated[
        str | None, typer.Option(help="archive every month before this one (YYYY-MM)")
    ] = None,
    to: Annotated[Path, typer.Option(help="the archive directory")] = Path("archive"),
) -> None:
    """Write each month before --before to DIR/events-YYYY-MM.parquet (listed with its row count
    and SHA-256 in DIR/manifest.json), then remove its events from the database."""
    if ctx.invoked_subcommand is not None:
        return
    if before is None:
        fail("give --before YYYY-MM (or: billing archive restore FILE)", 2)
    try:
        month = Month.parse(before)
    except ValueError as error:
        fail(f"--before: {error}", 2)
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        done = archive_before(open_sessions(settings), month, to, datetime.now(UTC))
    except (ArchiveRefused, ArchiveUnavailable) as error:
        fail(str(error))
    typer.echo(json.dumps({"archived": [entry.model_dump() for entry in done]}))


@archive_app.command("restore")
def restore_command(
    file: Annotated[Path, typer.Argument(help="an events-YYYY-MM.parquet of an archive")],
) -> None:
    """Put the events of FILE back into the database (checked against the manifest beside it)."""
    if not file.is_file():
        fail(f"{file}: no such file", 2)
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        restored = restore(open_sessions(settings), file)
    except (ArchiveRefused, ArchiveUnavailable) as error:
        fail(str(error))
    typer.echo(
        json.dumps(
            {
                "restored": restored.file,
                "rows": restored.rows,
                "already_stored": restored.already_stored,
            }
        )
    )
