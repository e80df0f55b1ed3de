"""The ``billing`` command line (typer); every command reads the same settings as the server."""

from __future__ import annotations

import sys

import typer

from billing.cli.archive import archive_app
from billing.cli.budgets import budgets_app
from billing.cli.credits import credits_app
from billing.cli.database import migrate, reconcile
from billing.cli.drift import drift
from billing.cli.export import export
from billing.cli.plans import keys_app, plans_app
from billing.cli.prices import prices_app
from billing.cli.providers import providers_app
from billing.cli.replay import replay
from billing.cli.serve import SWITCH_INTERVAL_S, serve, server_app, uvicorn_options
from billing.cli.tokens import tokens_app

__all__ = ["SWITCH_INTERVAL_S", "app", "main", "server_app", "uvicorn_options"]

app = typer.Typer(
    help="Streaming usage and billing accounting for LLM API gateways.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(serve)
app.command()(migrate)
app.add_typer(tokens_app, name="tokens")
app.add_typer(prices_app, name="prices")
app.add_typer(plans_app, name="plans")
app.add_typer(keys_app, name="keys")
app.command()(reconcile)
app.command("export")(export)
app.command()(replay)
app.add_typer(providers_app, name="providers")
app.command()(drift)
app.add_typer(budgets_app, name="budgets")
app.add_typer(archive_app, name="archive")
app.add_typer(credits_app, name="credits")


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
