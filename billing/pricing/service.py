"""Recording a price and re-reconciling the calls it may now apply to."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.pricing.prices import PriceVersion, add_price
from billing.pricing.schemas import PriceIn
from billing.reconcile.service import mark_model_pending


def record_price(session: Session, price: PriceIn, now: datetime) -> tuple[PriceVersion, bool]:
    """Store ``price`` (see ``add_price``); when it is new, mark the model's calls started since
    ``effective_from`` for re-reconciliation, so an unpriced call is settled through an adjustment
    (CONTRACT "Cost"). Returns ``(row, created)``; raises ``PriceConflict``."""
    row, created = add_price(session, price, now)
    if created:
        mark_model_pending(session, price.model, price.effective_from)
    return row, created
