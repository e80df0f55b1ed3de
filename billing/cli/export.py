"""``billing export``: the ledger as CSV on standard output, or to a file with its manifest."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from sqlalchemy.exc import SQLAlchemyError

from billing.cli.common import fail, load_settings, migrate_or_fail, open_sessions
from billing.cli.times import Period, cli_bounds
from billing.errors import ValidationFailed
from billing.export.focus import focus_chunks, parse_period
from billing.export.params import KINDS, parse_params
from billing.export.service import ExportStats, count_entries, export_chunks, period_label
from billing.settings import Settings

_EXPORT_FLAGS = {
    "query.since": "--since",
    "query.until": "--until",
    "query.group_by": "--group-by",
    "query.tz": "--tz",
    "query.format": "--format",
    "query.customer_id": "--customer",
}


def _write_export(chunks: Iterator[bytes], output: Path | None) -> tuple[int, str]:
    """Write the CSV chunks to ``output`` (atomically) or to standard output; (bytes, sha256)."""
    digest = hashlib.sha256()
    size = 0
    if output is None:
        stream = typer.get_binary_stream("stdout")
        for chunk in chunks:
            stream.write(chunk)
            digest.update(chunk)
            size += len(chunk)
        stream.flush()
        return size, digest.hexdigest()
    partial = output.with_name(output.name + ".partial")
    try:
        with partial.open("wb") as file:
            for chunk in chunks:
                file.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        os.replace(partial, output)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


_Kind = Annotated[
    str,
    typer.Argument(
        help="usage (rows per group), calls (one row per ledger entry) or focus (FOCUS 1.2, "
        "one row per ledger line and token class, of a --period)."
    ),
]
_Since = Annotated[
    str | None,
    typer.Option(help="Period start (inclusive), RFC 3339 with offset, or a date (UTC)."),
]
_Until = Annotated[
    str | None,
    typer.Option(help="Period end (exclusive), RFC 3339 with offset, or a date (UTC)."),
]
_GroupBy = Annotated[
    str | None,
    typer.Option(
        help="usage: comma list of api_key_id, model, hour, day, month "
        "(default day,api_key_id,model)."
    ),
]
_Tz = Annotated[
    str | None, typer.Option(help="usage: IANA zone where buckets begin (default UTC).")
]
_Format = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="v1 (default), v2 (the v2 columns after v1's) or v3 (v2's, then the leakage).",
    ),
]
_Customer = Annotated[
    str | None, typer.Option("--customer", help="usage: only this customer's entries (v2).")
]
_Output = Annotated[
    Path | None,
    typer.Option(help="Write the CSV to FILE and a manifest to FILE.manifest.json."),
]


def export(
    kind: _Kind = "usage",
    since: _Since = None,
    until: _Until = None,
    group_by: _GroupBy = None,
    tz: _Tz = None,
    output: _Output = None,
    format: _Format = None,
    customer: _Customer = None,
    period: Period = None,
) -> None:
    """Export the ledger booked in [since, until) as CSV: the bytes of GET /v1/exports/KIND.csv.

    The CSV goes to standard output, or with --output to FILE plus a manifest FILE.manifest.json.

    The manifest holds the parameters, closed or provisional, rows, token and cost totals, SHA-256.
    """
    settings = load_settings()
    if kind == "focus":
        _focus(settings, period, (since, until, group_by, tz, format, customer), output)
        return
    if kind not in KINDS:
        fail(f"unknown export {kind!r}: use usage, calls or focus")
    since, until = cli_bounds(since, until, period)
    if kind == "calls" and (group_by is not None or tz is not None or customer is not None):
        fail("--group-by, --tz and --customer apply to usage exports only")
    try:
        params = parse_params(
            "calls" if kind == "calls" else "usage",
            since,
            until,
            group_by,
            tz,
            format=format,
            customer_id=customer,
        )
    except ValidationFailed as error:
        fail("; ".join(f"{_EXPORT_FLAGS.get(e.path, e.path)} {e.message}" for e in error.errors))
    migrate_or_fail(settings, create=False)
    sessions = open_sessions(settings)
    now = datetime.now(UTC)
    period = period_label(params, now, settings.close_lag_s)
    stats = ExportStats()
    try:
        if sys.stderr.isatty():
            total = count_entries(sessions, params)
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
            )
            with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task(f"exporting {kind}", total=total)
                chunks = export_chunks(sessions, params, stats, lambda n: bar.advance(task, n))
                size, sha256 = _write_export(chunks, output)
        else:
            size, sha256 = _write_export(export_chunks(sessions, params, stats), output)
    except SQLAlchemyError as error:
        fail(f"export failed: {str(getattr(error, 'orig', error)).strip().splitlines()[0]}")
    except OSError as error:
        fail(f"cannot write {output}: {error.strerror or error}")
    if output is None:
        typer.echo(f"billing: {stats.rows} row(s), {period} period", err=True)
        return
    manifest_path = output.with_name(output.name + ".manifest.json")
    manifest = {
        "file": output.name,
        **params.as_json(),
        "period": period,
        "exported_at": now.isoformat().replace("+00:00", "Z"),
        "close_lag_s": settings.close_lag_s,
        **stats.as_json(),
        "bytes": size,
        "sha256": sha256,
    }
    try:
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        fail(f"cannot write {manifest_path}: {error.strerror or error}")
    typer.echo(
        f"billing: {stats.rows} row(s), {period} period, written to {output} "
        f"(manifest {manifest_path.name}, sha256 {sha256})",
        err=True,
    )


def _focus(
    settings: Settings,
    period: str | None,
    others: tuple[str | None, ...],
    output: Path | None,
) -> None:
    """``billing export focus --period YYYY-MM``: the bytes of ``GET /v1/exports/focus.csv``."""
    if any(value is not None for value in others):
        fail("a focus export takes --period (and --output) only", 2)
    try:
        month = parse_period(period)
    except ValidationFailed as error:
        fail(f"--period {error.errors[0].message}", 2)
    migrate_or_fail(settings, create=False)
    try:
        size, sha256 = _write_export(focus_chunks(open_sessions(settings), month), output)
    except SQLAlchemyError as error:
        fail(f"export failed: {str(getattr(error, 'orig', error)).strip().splitlines()[0]}")
    except OSError as error:
        fail(f"cannot write {output}: {error.strerror or error}")
    where = f", written to {output}" if output is not None else ""
    typer.echo(f"billing: focus {month.label}, {size} bytes{where} (sha256 {sha256})", err=True)
