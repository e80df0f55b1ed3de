"""``billing prices load``: load model prices from a JSON file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from billing.cli.common import load_settings, read_objects, store_objects
from billing.pricing.schemas import PriceIn
from billing.pricing.service import record_price

prices_app = typer.Typer(help="Model prices.", no_args_is_help=True)


@prices_app.command("load")
def prices_load(
    file: Annotated[Path, typer.Argument(help="A JSON list of prices (as POST /v1/prices).")],
) -> None:
    """Load prices from FILE; an identical stored price is skipped, a different one fails."""
    settings = load_settings()
    prices = read_objects(file, PriceIn, "price")
    created = store_objects(settings, prices, record_price)
    present = len(prices) - created
    typer.echo(f"billing: {created} price(s) added, {present} already present", err=True)
