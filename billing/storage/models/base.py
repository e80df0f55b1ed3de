"""The tables' base: naming convention, id and count columns, and the column groups derived
from the dimensions and the rates (token buckets, a price's rates)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    MetaData,
    text,
)
from sqlalchemy.orm import DeclarativeBase, MappedColumn, mapped_column

from billing.dimensions import TOKEN_FIELDS
from billing.rates import PLAN_RATE_COLUMNS, RATE_COLUMNS

BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with a naming convention, so migrations name constraints alike."""

    metadata = MetaData(naming_convention=NAMING)


def counter(**kw: Any) -> MappedColumn[int]:
    """A count that is never null and starts at 0 (tokens, calls, picodollars)."""
    return mapped_column(BigInteger, nullable=False, default=0, server_default=text("0"), **kw)


#: ``sort_order`` of a table's columns that come after its token columns (the others have 0 and
#: come before them; the mixin's columns follow a table's own columns of the same order).
AFTER_TOKENS = 1


class TokenColumns:
    """One column per token bucket (``billing.dimensions.TOKEN_FIELDS``, in its order): calls,
    call attempts, ledger entries and both rollup tables carry them. ``BIGINT NOT NULL DEFAULT
    0``; read and write them together with ``tokens_of`` / ``set_tokens``, or by name."""


for _name in TOKEN_FIELDS:
    setattr(TokenColumns, _name, counter())


class PriceRates:
    """One column per rate of a price (``billing.rates.RATE_COLUMNS``, in its order):
    micro-USD per million tokens, ``BIGINT NOT NULL``; read them with ``PriceRow``."""


class EntryRates:
    """The rates a ledger entry was booked at (``RATE_COLUMNS``), after its ``price_id``; null
    when the entry is unpriced."""


class EntryPlanRates:
    """(v2) The plan's own rates a ledger entry was charged at (``plan_`` + ``RATE_COLUMNS``),
    after its ``plan_price_id``; null when no plan price applied (CONTRACT "Keys, customers and
    plans (v2)")."""


for _name in RATE_COLUMNS:
    setattr(PriceRates, _name, mapped_column(BigInteger, nullable=False))
    setattr(EntryRates, _name, mapped_column(BigInteger, sort_order=AFTER_TOKENS + 1))
for _name in PLAN_RATE_COLUMNS:
    setattr(EntryPlanRates, _name, mapped_column(BigInteger, sort_order=AFTER_TOKENS + 5))
del _name


def row_dict(obj: Any) -> dict[str, Any]:
    """A mapped object's column values by attribute name (for tests and serialisers)."""
    return {c.key: getattr(obj, c.key) for c in obj.__mapper__.column_attrs}
