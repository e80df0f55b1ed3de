"""The observability room's statements (both databases): sums of the rollups over their month
rows, the reconciler's oldest waiting call, the webhook outbox by state.

Each reads an index in order or a bounded set of rollup rows (months × models), so a scrape
costs the same however many calls the ledger holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import and_, false, func, or_, select, true
from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.observe.rows import ModelTotals
from billing.rollups.buckets import MONTH
from billing.rollups.rows import BOOKED, CALL_START, DAY, PICO
from billing.storage.models import (
    Call,
    DriftRollup,
    UsageRollupAllKeys,
    WebhookOutbox,
)

_R = UsageRollupAllKeys


def _by_model(session: Session, basis: str) -> dict[str, ModelTotals]:
    query = (
        select(
            _R.model,
            *(func.sum(getattr(_R, name)) for name in TOKEN_FIELDS),
            func.sum(_R.cost_whole_usd),
            func.sum(_R.cost_frac_pusd),
            func.sum(_R.charge_whole_usd),
            func.sum(_R.charge_frac_pusd),
            func.sum(_R.leakage_whole_usd),
            func.sum(_R.leakage_frac_pusd),
            func.sum(_R.unpriced),
        )
        .where(_R.basis == basis, _R.level == MONTH)
        .group_by(_R.model)
    )
    out: dict[str, ModelTotals] = {}
    for model, *sums in session.execute(query):
        values = [int(value or 0) for value in sums]
        tokens = dict(zip(TOKEN_FIELDS, values, strict=False))
        cost_whole, cost_frac, charge_whole, charge_frac, leak_whole, leak_frac, unpriced = values[
            len(TOKEN_FIELDS) :
        ]
        out[model] = ModelTotals(
            tokens=tokens,
            cost_pusd=cost_whole * PICO + cost_frac,
            charge_pusd=charge_whole * PICO + charge_frac,
            leakage_pusd=leak_whole * PICO + leak_frac,
            unpriced_calls=unpriced,
        )
    return out


class SqlObserve:
    """``ObserveRepository`` on both databases."""

    def model_totals(self, session: Session) -> dict[str, ModelTotals]:
        booked = _by_model(session, BOOKED)
        for model, totals in _by_model(session, CALL_START).items():
            booked.setdefault(model, ModelTotals()).unpriced_calls = totals.unpriced_calls
        return booked

    def model_providers(self, session: Session) -> list[tuple[str, str]]:
        query = (
            select(DriftRollup.model, DriftRollup.provider)
            .where(DriftRollup.level == DAY)
            .distinct()
        )
        return [(model, provider) for model, provider in session.execute(query)]

    def oldest_due(
        self, session: Session, cutoff: datetime
    ) -> tuple[datetime | None, datetime | None]:
        pending = select(func.min(Call.last_received_at)).where(Call.pending == true())
        quiet = select(func.min(Call.last_received_at)).where(
            Call.settled == false(), Call.pending == false(), Call.last_received_at <= cutoff
        )
        return session.scalar(pending), session.scalar(quiet)

    def calls_by_status(
        self, session: Session, statuses: Sequence[str], since: datetime, until: datetime
    ) -> dict[str, int]:
        # One count per status, each a range of the calls(status, started_at) index.
        return {
            status: int(
                session.scalar(
                    select(func.count()).where(
                        Call.status == status, Call.started_at >= since, Call.started_at < until
                    )
                )
                or 0
            )
            for status in statuses
        }

    def failing_deliveries(self, session: Session) -> int:
        failing = or_(
            WebhookOutbox.state == "failed",
            and_(WebhookOutbox.state == "pending", WebhookOutbox.attempts > 0),
        )
        return int(session.scalar(select(func.count()).where(failing)) or 0)

    def deliveries_by_state(self, session: Session) -> dict[str, int]:
        query = select(WebhookOutbox.state, func.count()).group_by(WebhookOutbox.state)
        return {state: int(count) for state, count in session.execute(query)}
