"""``billing providers import`` and ``billing providers pull``: provider report pages into the
database (CONTRACT "Provider reports and drift")."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

from billing.calllog.params import parse_timestamp
from billing.cli.common import (
    configure_logging,
    fail,
    load_settings,
    migrate_or_fail,
    open_sessions,
)
from billing.cli.times import Period, cli_bounds
from billing.errors import ValidationFailed
from billing.providers.pull import KEY_VARIABLES, PullError, PullRequest, fetch_pages
from billing.providers.schemas import (
    KINDS,
    MAX_REPORT_BYTES,
    PROVIDERS,
    ReportBucket,
    parse_page,
)
from billing.providers.service import import_buckets
from billing.storage.db import write_transaction

providers_app = typer.Typer(help="Provider usage and cost reports.", no_args_is_help=True)

_Provider = Annotated[str, typer.Option("--provider", help="openai or anthropic")]
_Kind = Annotated[str, typer.Option("--kind", help="usage or cost")]


def _check(provider: str, kind: str) -> None:
    if provider not in PROVIDERS:
        fail(f"--provider must be one of {', '.join(PROVIDERS)}, not {provider!r}", 2)
    if kind not in KINDS:
        fail(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}", 2)


def _problem(error: ValidationFailed) -> str:
    first = error.errors[0]
    more = f" (and {len(error.errors) - 1} more)" if len(error.errors) > 1 else ""
    return f"{first.path}: {first.message}{more}"


def _totals(results: list[Any]) -> dict[str, int]:
    totals = {"buckets": 0, "new": 0, "changed": 0, "unchanged": 0}
    for result in results:
        for name in totals:
            totals[name] += getattr(result, name)
    return totals


@providers_app.command("import")
def providers_import(
    files: Annotated[list[Path], typer.Argument(help="JSON pages, as the provider answered.")],
    provider: _Provider,
    kind: _Kind,
) -> None:
    """Store report pages from FILEs (as POST /v1/provider-reports); prints the counts as JSON."""
    _check(provider, kind)
    settings = load_settings()
    pages: list[tuple[ReportBucket, ...]] = []
    for file in files:
        try:
            document = json.loads(read_page_file(file), parse_float=Decimal)
        except (OSError, ValueError) as error:
            fail(f"cannot read {file}: {error}")
        try:
            pages.append(parse_page(provider, kind, document).buckets)
        except ValidationFailed as error:
            fail(f"{file}: {_problem(error)}")
    migrate_or_fail(settings)
    with write_transaction(open_sessions(settings)) as session:
        now = datetime.now(UTC)
        results = [import_buckets(session, provider, kind, page, now) for page in pages]
    typer.echo(json.dumps(_totals(results)))


def read_page_file(file: Path) -> bytes:
    """The bytes of a regular file of at most ``MAX_REPORT_BYTES``; ``ValueError`` for anything
    else (a device such as ``/dev/zero``, a FIFO, a directory, a larger file), read no further
    than the bound. The file is opened without blocking (a FIFO with no writer) and checked
    through its descriptor, so the file checked is the file read."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_REPORT_BYTES:
            raise ValueError(f"larger than {MAX_REPORT_BYTES} bytes (a provider page is smaller)")
        data = handle.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"larger than {MAX_REPORT_BYTES} bytes (a provider page is smaller)")
    return data


def _when(name: str, text: str) -> datetime:
    try:
        return parse_timestamp(text)
    except ValueError as error:
        fail(f"--{name}: {error}", 2)


@providers_app.command("pull")
def providers_pull(
    provider: _Provider,
    kind: _Kind,
    since: Annotated[
        str | None, typer.Option(help="first bucket start, RFC 3339 or a date (UTC)")
    ] = None,
    until: Annotated[str | None, typer.Option(help="end (exclusive), RFC 3339 or a date")] = None,
    bucket_width: Annotated[str, typer.Option(help="1d or 1h (cost reports: 1d)")] = "1d",
    account: Annotated[
        str, typer.Option(help="group by the api key (key) or the project / workspace (project)")
    ] = "project",
    base_url: Annotated[str | None, typer.Option(help="the provider API's base URL")] = None,
    period: Period = None,
) -> None:
    """Fetch the report pages from the provider's admin API and store them; the admin key is
    read from OPENAI_ADMIN_KEY or ANTHROPIC_ADMIN_KEY. Prints the counts as JSON."""
    _check(provider, kind)
    if bucket_width not in ("1d", "1h") or (kind == "cost" and bucket_width != "1d"):
        fail("--bucket-width must be 1d or 1h (cost reports come by day: 1d)", 2)
    if account not in ("key", "project"):
        fail("--account must be key or project", 2)
    since, until = cli_bounds(since, until, period)
    if since is None or until is None:
        fail("give --since and --until, or --period", 2)
    start, end = _when("since", since), _when("until", until)
    if end <= start:
        fail("--until must be after --since", 2)
    variable = KEY_VARIABLES[provider]
    key = os.environ.get(variable, "").strip()
    if not key:
        fail(f"set {variable} to the provider's admin key (it is read from there only)", 2)
    settings = load_settings()
    configure_logging(settings.log_level)
    migrate_or_fail(settings)
    sessions = open_sessions(settings)
    request = PullRequest(provider, kind, start, end, bucket_width, account, base_url)
    results = []
    try:
        with _progress(f"pulling {provider} {kind}", end - start) as advance:
            for number, (_document, page) in enumerate(fetch_pages(request, key), 1):
                # Each page in its own transaction: a failure later keeps the pages stored so
                # far (pulling again is idempotent).
                with write_transaction(sessions) as session:
                    now = datetime.now(UTC)
                    result = import_buckets(session, provider, kind, page.buckets, now)
                results.append(result)
                if page.buckets:
                    advance(max(b.end for b in page.buckets) - start)
                typer.echo(
                    f"billing: page {number}: {result.buckets} bucket(s), {result.new} new, "
                    f"{result.changed} changed, {result.unchanged} unchanged",
                    err=True,
                )
    except PullError as error:
        fail(str(error))
    except ValidationFailed as error:
        fail(f"the provider's answer is not the expected page: {_problem(error)}")
    typer.echo(json.dumps({"pages": len(results), **_totals(results)}))


@contextmanager
def _progress(what: str, span: timedelta) -> Iterator[Callable[[timedelta], None]]:
    """A ``rich`` bar of the time covered so far (on a terminal only; a pull of months takes
    many pages): yields ``advance(covered)``, the time from ``--since`` to the latest bucket."""
    if not sys.stderr.isatty():
        yield lambda _covered: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=span.total_seconds())
        yield lambda covered: bar.update(task, completed=min(covered, span).total_seconds())
