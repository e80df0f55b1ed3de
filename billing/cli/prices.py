"""``billing prices load`` (model prices from a JSON file) and ``billing prices list``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from billing.cli.common import (
    load_settings,
    migrate_or_fail,
    open_sessions,
    read_objects,
    store_objects,
)
from billing.pricing.schemas import PriceIn
from billing.pricing.service import list_prices, record_price
from billing.rates import RATES
from billing.storage.db import read_transaction

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


#: ``billing prices list``'s columns: the identity, the rates (USD per million tokens, as
#: ``POST /v1/prices`` names them), the long-context threshold and the unit prices.
PRICE_LIST_COLUMNS = (
    "model",
    "service_tier",
    "effective_from",
    *(r.field for r in RATES),
    "long_context_above_input_tokens",
    "unit_prices",
)


@prices_app.command("list")
def prices_list(
    model: Annotated[str | None, typer.Option(help="Only this model's prices.")] = None,
) -> None:
    """List the prices (as GET /v1/prices): a header line, then one tab-separated line per
    price, by model and effective_from; ``-`` for no value."""
    settings = load_settings()
    migrate_or_fail(settings, create=False)
    with read_transaction(open_sessions(settings)) as session:
        prices = [p.as_json() for p in list_prices(session, model)]
    typer.echo("\t".join(PRICE_LIST_COLUMNS))
    for price in prices:
        long_context = price["long_context"]
        units = price["unit_prices"]
        cells = [
            price["model"],
            price["service_tier"] or "-",
            price["effective_from"],
            *(price[r.field] or "-" for r in RATES),
            str(long_context["above_input_tokens"]) if long_context else "-",
            json.dumps(units, separators=(",", ":"), sort_keys=True) if units else "-",
        ]
        typer.echo("\t".join(cells))
