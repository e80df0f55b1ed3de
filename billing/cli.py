"""The ``billing`` command line (typer); every command reads the same settings as the server."""

from __future__ import annotations

import sys
from typing import Annotated, NoReturn

import typer
import uvicorn
from sqlalchemy.exc import SQLAlchemyError

from billing.settings import Settings, SettingsError, get_settings
from billing.storage.migrate import upgrade_to_head

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


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
