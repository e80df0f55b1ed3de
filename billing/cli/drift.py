"""``billing drift``: our calls against the providers' reports, as CSV (the bytes of
``GET /v1/exports/drift.csv`` for the same query) or JSON (the body of ``GET /v1/drift``);
``--calls``: the calls whose provider-reported cost is not ours (every page of
``GET /v1/drift/calls``), as CSV (``billing.drift.csv.calls_csv``) or JSON (``{"data": […]}``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from billing.cli.common import fail, load_settings, migrate_or_fail, open_sessions
from billing.cli.times import Period, cli_bounds
from billing.drift.csv import calls_csv, drift_csv
from billing.drift.schemas import parse_call_query, parse_query
from billing.drift.service import drift_rows, every_call_drift
from billing.errors import ValidationFailed
from billing.storage.db import read_transaction


def drift(
    since: Annotated[
        str | None, typer.Option(help="calls started from, RFC 3339 or a date (UTC)")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="up to (exclusive), RFC 3339 or a date (UTC)")
    ] = None,
    provider: Annotated[str | None, typer.Option(help="openai or anthropic")] = None,
    group_by: Annotated[
        str | None, typer.Option(help="day|hour, model, upstream_account, service_tier")
    ] = None,
    tolerance_pct: Annotated[str | None, typer.Option(help="percent (default 1)")] = None,
    output_format: Annotated[str, typer.Option("--format", help="csv or json")] = "csv",
    output: Annotated[Path | None, typer.Option(help="write to FILE")] = None,
    period: Period = None,
    calls: Annotated[
        bool,
        typer.Option(
            "--calls", help="per call: those whose provider-reported cost is not ours, newest first"
        ),
    ] = False,
) -> None:
    """The drift rows, mismatches first (``--calls``: the calls whose cost differs)."""
    if output_format not in ("csv", "json"):
        fail("--format must be csv or json", 2)
    if calls and group_by is not None:
        fail("--group-by is not for --calls (each row is a call)", 2)
    since, until = cli_bounds(since, until, period)
    items = [(name, value) for name, value in (("since", since), ("until", until)) if value]
    for name, value in (
        ("provider", provider),
        ("group_by", group_by),
        ("tolerance_pct", tolerance_pct),
    ):
        if value is not None:
            items.append((name, value))
    try:
        if calls:
            call_query = parse_call_query(items)
        else:
            query = parse_query(items)
    except ValidationFailed as error:
        first = error.errors[0]
        fail(f"--{first.path.removeprefix('query.').replace('_', '-')}: {first.message}", 2)
    settings = load_settings()
    migrate_or_fail(settings, create=False)
    with read_transaction(open_sessions(settings)) as session:
        rows = every_call_drift(session, call_query) if calls else drift_rows(session, query)
    if calls:
        body = calls_csv(rows) if output_format == "csv" else _json({"data": rows})
    else:
        body = drift_csv(query, rows) if output_format == "csv" else _json({"data": rows})
    if output is None:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    else:
        output.write_bytes(body)


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
