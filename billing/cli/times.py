"""The times a command takes: ``--since`` / ``--until`` as RFC 3339 or a date alone
(``2026-12-01``: its midnight UTC), or ``--period 2026-11`` (the month in UTC) instead of both."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from billing.cli.common import fail
from billing.timefmt import month_bounds, rfc3339

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

Period = Annotated[
    str | None,
    typer.Option(help="A month in UTC, YYYY-MM: --since its first day, --until the next month's."),
]


def cli_time(text: str | None) -> str | None:
    """A date alone (``2026-12-01``) → its midnight UTC as RFC 3339; anything else as it is (the
    command's own parsing judges it)."""
    if text is not None and _DATE.fullmatch(text.strip()):
        return text.strip() + "T00:00:00Z"
    return text


def cli_bounds(
    since: str | None, until: str | None, period: str | None
) -> tuple[str | None, str | None]:
    """``(since, until)`` as RFC 3339 text, from ``--period`` or the two options (dates alone
    allowed); exits 2 with one line for a bad month or ``--period`` given with either."""
    if period is None:
        return cli_time(since), cli_time(until)
    if since is not None or until is not None:
        fail("give --period, or --since and --until, not both", 2)
    try:
        start, end = month_bounds(period)
    except ValueError as error:
        fail(f"--period: {error}", 2)
    return rfc3339(start), rfc3339(end)
