"""``billing tokens``: create, list and revoke API tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from billing.auth.tokens import create_token, list_tokens, revoke_token
from billing.cli.common import fail, load_settings, migrate_or_fail, open_sessions
from billing.errors import BillingError
from billing.storage.db import read_transaction, write_transaction
from billing.timefmt import rfc3339

tokens_app = typer.Typer(
    help="API tokens (roles: ingest, read, export, admin).", no_args_is_help=True
)


@tokens_app.command("create")
def tokens_create(
    role: Annotated[str, typer.Option(help="ingest, read, export or admin.")],
    name: Annotated[str | None, typer.Option(help="A label to recognise the token by.")] = None,
) -> None:
    """Create a token; prints the token (once) on stdout and its id on stderr."""
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        with write_transaction(open_sessions(settings)) as session:
            secret, info = create_token(session, role, name, datetime.now(UTC))
    except ValueError as error:
        fail(str(error), 2)
    typer.echo(secret)
    typer.echo(
        f"billing: created token {info.id} (role {info.role}); it is shown only once", err=True
    )


@tokens_app.command("list")
def tokens_list() -> None:
    """List tokens (id, role, name, created, revoked); secrets are never shown."""
    settings = load_settings()
    migrate_or_fail(settings)
    with read_transaction(open_sessions(settings)) as session:
        for info in list_tokens(session):
            revoked = rfc3339(info.revoked_at) or "active"
            typer.echo(
                f"{info.id}\t{info.role}\t{info.name or '-'}\t{rfc3339(info.created_at)}\t{revoked}"
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
