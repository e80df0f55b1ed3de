"""``billing tokens``: create, list and revoke API tokens."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from billing.auth.tokens import create_token, list_tokens, revoke_token
from billing.cli.common import fail, load_settings, migrate_or_fail, open_sessions
from billing.errors import BillingError
from billing.fields import LATEST
from billing.storage.db import read_transaction, write_transaction
from billing.timefmt import rfc3339

tokens_app = typer.Typer(
    help="API tokens (roles: ingest, read, export, admin).", no_args_is_help=True
)


_DURATION = re.compile(r"([0-9]+)\s*([smhdw])")  # ASCII digits
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` (whole numbers) as a timedelta; ``ValueError``
    otherwise (a zero duration too)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or int(match[1]) == 0:
        raise ValueError(
            f"--expires-in {text!r}: give a positive whole number and a unit s, m, h, d or w "
            "(such as 90d)"
        )
    try:
        return timedelta(seconds=int(match[1]) * _UNIT_S[match[2]])
    except OverflowError:  # beyond timedelta's range
        raise ValueError(_too_long(text)) from None


def _too_long(text: str) -> str:
    return f"--expires-in {text!r} is too long: the token would expire after {LATEST:%Y-%m-%d}"


@tokens_app.command("create")
def tokens_create(
    role: Annotated[str, typer.Option(help="ingest, read, export or admin.")],
    name: Annotated[str | None, typer.Option(help="A label to recognise the token by.")] = None,
    expires_in: Annotated[
        str | None,
        typer.Option(help="The token stops working after this long (90d, 12h, 30m, 2w)."),
    ] = None,
) -> None:
    """Create a token; prints the token (once) on stdout and its id on stderr."""
    now = datetime.now(UTC)
    try:
        expires_at = None if expires_in is None else now + parse_duration(expires_in)
    except ValueError as error:
        fail(str(error), 2)
    except OverflowError:  # past year 9999
        fail(_too_long(str(expires_in)), 2)
    if expires_at is not None and expires_at > LATEST:  # the service's range of instants
        fail(_too_long(str(expires_in)), 2)
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        with write_transaction(open_sessions(settings)) as session:
            secret, info = create_token(session, role, name, now, expires_at)
    except ValueError as error:
        fail(str(error), 2)
    typer.echo(secret)
    until = f", expires {rfc3339(info.expires_at)}" if info.expires_at else ""
    typer.echo(
        f"billing: created token {info.id} (role {info.role}{until}); it is shown only once",
        err=True,
    )


#: ``billing tokens list``'s columns.
TOKEN_LIST_COLUMNS = ("id", "role", "name", "created", "status", "expires", "last_used")


@tokens_app.command("list")
def tokens_list() -> None:
    """List tokens: a header line, then one tab-separated line per token (id, role, name,
    created, status: active, revoked or expired, expires, last used); secrets are never shown."""
    settings = load_settings()
    migrate_or_fail(settings, create=False)
    now = datetime.now(UTC)
    with read_transaction(open_sessions(settings)) as session:
        tokens = list_tokens(session)
    typer.echo("\t".join(TOKEN_LIST_COLUMNS))
    for info in tokens:
        if info.revoked_at is not None:
            status = f"revoked {rfc3339(info.revoked_at)}"
        elif info.expires_at is not None and info.expires_at <= now:
            status = "expired"
        else:
            status = "active"
        typer.echo(
            f"{info.id}\t{info.role}\t{info.name or '-'}\t{rfc3339(info.created_at)}\t{status}"
            f"\t{rfc3339(info.expires_at) or 'never'}\t{rfc3339(info.last_used_at) or '-'}"
        )


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[str, typer.Argument(help="The token's id (tok_…).")]) -> None:
    """Revoke a token by id; it stops working within a few seconds."""
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        with write_transaction(open_sessions(settings)) as session:
            info = revoke_token(session, token_id, datetime.now(UTC))
    except BillingError as error:
        fail(str(error))
    typer.echo(f"billing: token {info.id} revoked", err=True)
