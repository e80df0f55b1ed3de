"""``billing prices load``: load model prices from a JSON file."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from billing.cli.common import fail, load_settings, migrate_or_fail, open_sessions
from billing.errors import BillingError
from billing.pricing.schemas import PriceIn
from billing.pricing.service import record_price
from billing.storage.db import write_transaction

prices_app = typer.Typer(help="Model prices.", no_args_is_help=True)


@prices_app.command("load")
def prices_load(
    file: Annotated[Path, typer.Argument(help="A JSON list of prices (as POST /v1/prices).")],
) -> None:
    """Load prices from FILE; an identical stored price is skipped, a different one fails."""
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
        with write_transaction(open_sessions(settings)) as session:
            now = datetime.now(UTC)
            for price in prices:
                created += record_price(session, price, now)[1]
    except BillingError as error:
        fail(str(error))
    present = len(prices) - created
    typer.echo(f"billing: {created} price(s) added, {present} already present", err=True)
