"""The SQL of the prices, as a ``Protocol``, and ``repository(session)``, which gives its
implementation (``billing.pricing.sql.common``: the same statements on both databases). Every
method runs in the session's transaction.

Table (``billing.storage.models``): ``prices``, a row per price version and its long-context
prices (``above_input_tokens`` > 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from billing.pricing.prices import PriceRow
from billing.pricing.sql.common import SqlPricing
from billing.storage.dialects import ByDialect


class PricingRepository(Protocol):
    """The prices' statements on one database."""

    def identity_rows(
        self,
        session: Session,
        model: str,
        service_tier: str | None,
        effective_from: datetime,
        inference_geo: str | None = None,
    ) -> list[PriceRow]:
        """The stored rows of one price identity (model, served tier, inference geo,
        effective_from)."""
        ...

    def insert_rows(
        self, session: Session, rows: Sequence[PriceRow], now: datetime
    ) -> list[PriceRow]:
        """Insert the rows of a new price (their ids are not read); returns them stored."""
        ...

    def all_rows(self, session: Session, model: str | None) -> list[PriceRow]:
        """Every row (of ``model``, or all), by model, ``effective_from``, tier, threshold."""
        ...

    def rows_by_id(self, session: Session, ids: Sequence[int]) -> dict[int, PriceRow]:
        """The rows with the given ids, by id."""
        ...

    def rows_of_models(self, session: Session, models: Sequence[str]) -> list[PriceRow]:
        """Every row of the given models."""
        ...

    def model_versions(self, session: Session, models: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Per model of ``models`` with prices: (how many rows, the highest id), one statement.
        Prices are only ever inserted (a new ``effective_from``, never a change or a
        deletion), so a row committed since, in any order of ids, changes its model's pair
        (``billing.pricing.cache``)."""
        ...

    def mark_model_pending(self, session: Session, model: str, effective_from: datetime) -> int:
        """Mark pending the calls with an attempt on ``model``, or tokens billed at its rates
        (``other_models``, v2), started at or after ``effective_from``; returns how many."""
        ...


_REPOSITORIES: ByDialect[PricingRepository] = ByDialect(
    sqlite=SqlPricing(), postgresql=SqlPricing()
)


def repository(session: Session) -> PricingRepository:
    """The prices' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
