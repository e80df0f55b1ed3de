"""Model prices versioned by ``effective_from`` (CONTRACT "Cost"): add, list, look up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.dimensions import Tokens
from billing.errors import PriceConflict
from billing.ingest.schemas import ModelName, Timestamp
from billing.pricing.money import parse_price, uusd_per_mtok_to_str
from billing.storage.models import Price

PRICE_FIELDS = (
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "cache_read_usd_per_mtok",
    "cache_creation_usd_per_mtok",
)


class PriceIn(BaseModel):
    """A price as posted (``POST /v1/prices``, ``billing prices load``); prices in USD per Mtok.

    Each price field is a decimal string (or integer) with at most 6 decimal places; it is held
    here as micro-USD per million tokens.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelName
    effective_from: Timestamp
    input_usd_per_mtok: int
    output_usd_per_mtok: int
    cache_read_usd_per_mtok: int
    cache_creation_usd_per_mtok: int

    @field_validator(*PRICE_FIELDS, mode="before")
    @classmethod
    def _exact(cls, value: object) -> int:
        return parse_price(value)


@dataclass(frozen=True)
class PriceRow:
    """A stored price: its id and the four rates in micro-USD per million tokens."""

    id: int
    model: str
    effective_from: datetime
    input: int
    output: int
    cache_read: int
    cache_creation: int

    def cost_pusd(self, tokens: Tokens) -> int:
        """The exact cost of ``tokens`` at these rates, in picodollars."""
        return (
            tokens.input_tokens * self.input
            + tokens.cache_read_input_tokens * self.cache_read
            + tokens.cache_creation_input_tokens * self.cache_creation
            + tokens.output_tokens_billed * self.output
        )

    def as_json(self) -> dict[str, Any]:
        """The API form: prices as decimal strings in USD per million tokens."""
        return {
            "model": self.model,
            "effective_from": self.effective_from.isoformat().replace("+00:00", "Z"),
            "input_usd_per_mtok": uusd_per_mtok_to_str(self.input),
            "output_usd_per_mtok": uusd_per_mtok_to_str(self.output),
            "cache_read_usd_per_mtok": uusd_per_mtok_to_str(self.cache_read),
            "cache_creation_usd_per_mtok": uusd_per_mtok_to_str(self.cache_creation),
        }


def _row(price: Price) -> PriceRow:
    return PriceRow(
        price.id,
        price.model,
        price.effective_from,
        price.input_uusd_per_mtok,
        price.output_uusd_per_mtok,
        price.cache_read_uusd_per_mtok,
        price.cache_creation_uusd_per_mtok,
    )


def add_price(session: Session, price: PriceIn, now: datetime) -> tuple[PriceRow, bool]:
    """Store a price; returns ``(row, created)``.

    The same (model, effective_from) with the same rates is a no-op (``created`` False); with
    different rates it raises ``PriceConflict`` (409). The caller commits.
    """
    existing = session.scalar(
        select(Price).where(
            Price.model == price.model, Price.effective_from == price.effective_from
        )
    )
    rates = (
        price.input_usd_per_mtok,
        price.output_usd_per_mtok,
        price.cache_read_usd_per_mtok,
        price.cache_creation_usd_per_mtok,
    )
    if existing is not None:
        row = _row(existing)
        if (row.input, row.output, row.cache_read, row.cache_creation) != rates:
            raise PriceConflict(
                f"a different price for {price.model!r} effective from "
                f"{price.effective_from.isoformat()} exists; prices are versioned: post a new "
                "effective_from instead of changing a past one"
            )
        return row, False
    stored = Price(
        model=price.model,
        effective_from=price.effective_from,
        input_uusd_per_mtok=rates[0],
        output_uusd_per_mtok=rates[1],
        cache_read_uusd_per_mtok=rates[2],
        cache_creation_uusd_per_mtok=rates[3],
        created_at=now,
    )
    session.add(stored)
    session.flush()
    return _row(stored), True


def list_prices(session: Session, model: str | None = None) -> list[PriceRow]:
    """Every price, by model then ``effective_from``."""
    query = select(Price).order_by(Price.model, Price.effective_from)
    if model is not None:
        query = query.where(Price.model == model)
    return [_row(p) for p in session.scalars(query)]


def prices_by_id(session: Session, ids: set[int]) -> dict[int, PriceRow]:
    """The stored prices with the given ids, by id."""
    return {p.id: _row(p) for p in session.scalars(select(Price).where(Price.id.in_(sorted(ids))))}


class PriceBook:
    """Prices loaded for a set of models, answering "the price in force at time t" in memory."""

    def __init__(self, rows: Sequence[PriceRow]) -> None:
        self._by_model: dict[str, list[PriceRow]] = {}
        for row in sorted(rows, key=lambda r: r.effective_from):
            self._by_model.setdefault(row.model, []).append(row)

    @classmethod
    def load(cls, session: Session, models: set[str]) -> PriceBook:
        """Load the prices of ``models`` from the database."""
        if not models:
            return cls([])
        found = session.scalars(select(Price).where(Price.model.in_(sorted(models))))
        return cls([_row(p) for p in found])

    def at(self, model: str | None, when: datetime | None) -> PriceRow | None:
        """The price of ``model`` in force at ``when`` (latest ``effective_from`` ≤ when)."""
        if model is None or when is None:
            return None
        found = None
        for row in self._by_model.get(model, ()):
            if row.effective_from <= when:
                found = row
            else:
                break
        return found
