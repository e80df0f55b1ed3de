"""Model prices versioned by ``effective_from`` (CONTRACT "Cost"): add, list, look up."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from operator import attrgetter, mul
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.dimensions import Tokens
from billing.errors import PriceConflict
from billing.pricing.money import uusd_per_mtok_to_str
from billing.pricing.rates import RATE_COLUMNS, RATE_FIELDS, RATE_NAMES, RATED_BUCKETS
from billing.pricing.schemas import PriceIn
from billing.storage.models import Price
from billing.timefmt import rfc3339


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """``attrgetter(*names)`` that answers a tuple for a single name too."""
    if len(names) == 1:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    return attrgetter(*names)


#: A ``Tokens``'s billed buckets, in ``RATES`` order.
_rated_tokens = _getter(RATED_BUCKETS)
#: A stored ``Price``'s rates (its columns), in ``RATES`` order.
_stored_rates = _getter(RATE_COLUMNS)
#: A ``PriceIn``'s rates, in ``RATES`` order.
_posted_rates = _getter(RATE_FIELDS)


class PriceRow:
    """A stored price: ``id``, ``model``, ``effective_from`` and its ``rates`` in micro-USD per
    million tokens in ``billing.pricing.rates.RATES`` order, each also an attribute named after
    its rate (``input``, ``output``, ``cache_read``, ``cache_creation``). A value: never changed
    once built. ``PriceRow(id, model, effective_from, *rates)``.
    """

    __slots__ = ("effective_from", "id", "model", "rates", *RATE_NAMES)

    def __init__(self, id: int, model: str, effective_from: datetime, *rates: int) -> None:
        if len(rates) != len(RATE_NAMES):
            raise TypeError(f"a price has {len(RATE_NAMES)} rates ({', '.join(RATE_NAMES)})")
        self.id = id
        self.model = model
        self.effective_from = effective_from
        self.rates: tuple[int, ...] = rates
        for name, rate in zip(RATE_NAMES, rates, strict=True):
            setattr(self, name, rate)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> int:
            """A rate by its name (``price.input``): micro-USD per million tokens."""

    def _key(self) -> tuple[Any, ...]:
        return (self.id, self.model, self.effective_from, self.rates)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PriceRow) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        rates = ", ".join(f"{n}={r}" for n, r in zip(RATE_NAMES, self.rates, strict=True))
        return f"PriceRow(id={self.id}, model={self.model!r}, {self.effective_from}, {rates})"

    def cost_pusd(self, tokens: Tokens) -> int:
        """The exact cost of ``tokens`` at these rates, in picodollars (a rate in micro-USD per
        million tokens is the price of one token in picodollars)."""
        return sum(map(mul, _rated_tokens(tokens), self.rates))

    def as_json(self) -> dict[str, Any]:
        """The API form: rates as decimal strings in USD per million tokens."""
        return {
            "model": self.model,
            "effective_from": rfc3339(self.effective_from),
            **{f: uusd_per_mtok_to_str(r) for f, r in zip(RATE_FIELDS, self.rates, strict=True)},
        }


def _row(price: Price) -> PriceRow:
    return PriceRow(price.id, price.model, price.effective_from, *_stored_rates(price))


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
    rates = _posted_rates(price)
    if existing is not None:
        row = _row(existing)
        if row.rates != rates:
            raise PriceConflict(
                f"a different price for {price.model!r} effective from "
                f"{price.effective_from.isoformat()} exists; prices are versioned: post a new "
                "effective_from instead of changing a past one"
            )
        return row, False
    stored = Price(
        model=price.model,
        effective_from=price.effective_from,
        created_at=now,
        **dict(zip(RATE_COLUMNS, rates, strict=True)),
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
