"""The ``billing`` command line (typer); every command reads the same settings as the server."""

from __future__ import annotations

import ipaddress
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import uvicorn
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from billing.auth.tokens import active_token_count, create_token, list_tokens, revoke_token
from billing.errors import BillingError
from billing.pricing.prices import PriceIn
from billing.pricing.service import record_price
from billing.reconcile.runner import run_pass

from billing.settings import Settings, SettingsError, get_settings
from billing.storage.db import make_engine, make_sessionmaker, read_transaction, write_transaction
from billing.storage.migrate import upgrade_to_head
from billing.timefmt import rfc3339

app = typer.Typer(
    help="Streaming usage and billing accounting for LLM API gateways.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear line to standard error and exit non-zero."""
    typer.echo(f"billing: {message}", err=True)
    raise typer.Exit(code)


def load_settings() -> Settings:
    """The settings, or exit 2 with one line naming the bad setting."""
    try:
        return get_settings()
    except SettingsError as error:
        fail(str(error), 2)


def migrate_or_fail(settings: Settings) -> None:
    """Bring the database to the migration head, or exit 1 with one line saying why."""
    try:
        upgrade_to_head(settings.database_url)
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
        fail(f"cannot migrate the database at {_safe(settings.database_url)}: {reason}")


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _safe(url: str) -> str:
    """The URL without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return url


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.")] = 1,
) -> None:
    """Apply migrations, then serve the HTTP API with uvicorn (reconciling in the background)."""
    settings = load_settings()
    migrate_or_fail(settings)
    with read_transaction(_open(settings)) as session:
        tokens = active_token_count(session)
    if tokens == 0:
        if not _is_loopback(host):
            fail(
                f"refusing to listen on {host} without API tokens: create one with "
                "`billing tokens create --role admin`, or listen on 127.0.0.1"
            )
        typer.echo(
            "billing: no API tokens configured: serving UNAUTHENTICATED on loopback only "
            "(create one with `billing tokens create --role admin`)",
            err=True,
        )
    typer.echo(
        f"billing: serving on http://{host}:{port} with database {_safe(settings.database_url)}",
        err=True,
    )
    uvicorn.run(
        "billing.api.server:app",
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level,
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )


@app.command()
def migrate() -> None:
    """Bring the database to the newest schema (Alembic upgrade to head)."""
    settings = load_settings()
    migrate_or_fail(settings)
    typer.echo(f"billing: database at migration head ({_safe(settings.database_url)})", err=True)


tokens_app = typer.Typer(help="API tokens (roles: ingest, read, export, admin).", no_args_is_help=True)
app.add_typer(tokens_app, name="tokens")


@tokens_app.command("create")
def tokens_create(
    role: Annotated[str, typer.Option(help="ingest, read, export or admin.")],
    name: Annotated[str | None, typer.Option(help="A label to recognise the token by.")] = None,
) -> None:
    """Create a token; prints the token (once) on stdout and its id on stderr."""
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        with write_transaction(_open(settings)) as session:
            secret, info = create_token(session, role, name, datetime.now(UTC))
    except ValueError as error:
        fail(str(error), 2)
    typer.echo(secret)
    typer.echo(f"billing: created token {info.id} (role {info.role}); it is shown only once", err=True)


@tokens_app.command("list")
def tokens_list() -> None:
    """List tokens (id, role, name, created, revoked); secrets are never shown."""
    settings = load_settings()
    migrate_or_fail(settings)
    with read_transaction(_open(settings)) as session:
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
        with write_transaction(_open(settings)) as session:
            info = revoke_token(session, token_id, datetime.now(UTC))
    except BillingError as error:
        fail(str(error))
    typer.echo(f"billing: token {info.id} revoked", err=True)


prices_app = typer.Typer(help="Model prices.", no_args_is_help=True)
app.add_typer(prices_app, name="prices")


def _open(settings: Settings) -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(settings))


@prices_app.command("load")
def prices_load(
    file: Annotated[Path, typer.Argument(help="A JSON list of price objects (as POST /v1/prices).")],
) -> None:
    """Load prices from FILE; an identical price already stored is skipped, a different one fails."""
    settings = load_settings()
    try:
        document = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        fail(f"cannot read {file}: {error}")
    if not isinstance(document, list):
        fail(f"{file} must hold a JSON list of price objects")
    try:
        prices = [PriceIn.model_validate(item) for item in document]
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"{file}: price {where}: {first['msg']}")
    migrate_or_fail(settings)
    created = 0
    try:
        with write_transaction(_open(settings)) as session:
            now = datetime.now(UTC)
            for price in prices:
                created += record_price(session, price, now)[1]
    except BillingError as error:
        fail(str(error))
    typer.echo(f"billing: {created} price(s) added, {len(prices) - created} already present", err=True)


@app.command()
def reconcile() -> None:
    """Run one reconciliation pass now and print what it settled and adjusted (JSON)."""
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        result = run_pass(_open(settings), settings)
    except SQLAlchemyError as error:
        fail(f"reconciliation failed: {str(getattr(error, 'orig', error)).strip().splitlines()[0]}")
    typer.echo(
        json.dumps(
            {"examined": result.examined, "settled": result.settled, "adjusted": result.adjusted}
        )
    )


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
