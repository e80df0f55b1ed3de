"""Storing prices, reading them back, and re-reconciling the calls a new price may apply to
(CONTRACT "Cost", "Usage dimensions (v2)")."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.orm import Session

from billing.errors import PriceConflict
from billing.pricing.prices import (
    PriceBook,
    PriceRow,
    PriceVersion,
    posted_rows,
    shape,
    versions_of,
)
from billing.pricing.repository import repository
from billing.pricing.schemas import PriceIn


def add_price(session: Session, price: PriceIn, now: datetime) -> tuple[PriceVersion, bool]:
    """Store a price; returns ``(version, created)``.

    The same (model, service_tier, effective_from) with the same rates, unit prices and long
    context is a no-op (``created`` False); with different ones it raises ``PriceConflict``
    (409). A price with ``long_context`` is stored as two rows: the price, and its long-context
    prices (``above_input_tokens`` > 0). The caller commits.
    """
    repo = repository(session)
    found = repo.identity_rows(
        session, price.model, price.service_tier, price.effective_from, price.inference_geo
    )
    posted = posted_rows(price)
    if found:
        (existing,) = versions_of(found)
        if shape(existing) != shape(PriceVersion(*posted)):
            tier = f" at tier {price.service_tier!r}" if price.service_tier else ""
            tier += f" in geo {price.inference_geo!r}" if price.inference_geo else ""
            raise PriceConflict(
                f"a different price for {price.model!r}{tier} effective from "
                f"{price.effective_from.isoformat()} exists; prices are versioned: post a new "
                "effective_from instead of changing a past one"
            )
        return existing, False
    stored = repo.insert_rows(session, [row for row in posted if row is not None], now)
    (version,) = versions_of(stored)
    return version, True


def record_price(session: Session, price: PriceIn, now: datetime) -> tuple[PriceVersion, bool]:
    """Store ``price`` (see ``add_price``); when it is new, mark the model's calls started since
    ``effective_from`` for re-reconciliation, so an unpriced call is settled through an adjustment
    (CONTRACT "Cost"). Returns ``(row, created)``; raises ``PriceConflict``."""
    row, created = add_price(session, price, now)
    if created:
        repository(session).mark_model_pending(session, price.model, price.effective_from)
    return row, created


def list_prices(session: Session, model: str | None = None) -> list[PriceVersion]:
    """Every price, by model, then ``effective_from``, then tier (none first)."""
    return versions_of(repository(session).all_rows(session, model))


def prices_by_id(session: Session, ids: Iterable[int]) -> dict[int, PriceRow]:
    """The stored prices with the given ids, by id."""
    return repository(session).rows_by_id(session, sorted(set(ids)))


def price_book(session: Session, models: Iterable[str]) -> PriceBook:
    """The prices of ``models``, loaded for lookups in memory (``PriceBook.at``)."""
    wanted = sorted(set(models))
    return PriceBook(repository(session).rows_of_models(session, wanted) if wanted else [])
