"""The prices' statements (``billing.pricing.repository``), written with SQLAlchemy on the ORM
tables alike for SQLite and PostgreSQL (one class serves both)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Text, bindparam, cast, func, or_, select, update
from sqlalchemy.orm import Session

from billing.pricing.prices import PriceRow, price_row, unit_prices_text
from billing.rates import RATE_COLUMNS
from billing.storage.models import Call, CallAttempt, Price

_P = Price.__table__.c

#: Every row of the bound ``models`` (an expanding list): Core rows, no ORM objects to load
#: (an authorization's estimate read them each time: 30 % of its CPU as ORM objects).
_OF_MODELS = select(Price.__table__).where(_P.model.in_(bindparam("models", expanding=True)))

#: Per model of the bound ``models`` that has prices: how many rows, and the highest id
#: (``model_versions``: prices are only ever inserted).
_VERSIONS = (
    select(_P.model, func.count(), func.max(_P.id))
    .where(_P.model.in_(bindparam("models", expanding=True)))
    .group_by(_P.model)
)


def _tier(value: str | None) -> str:
    # No tier is stored as '' (a unique constraint treats nulls as distinct).
    return value or ""


class SqlPricing:
    """``PricingRepository`` on either database."""

    def identity_rows(
        self,
        session: Session,
        model: str,
        service_tier: str | None,
        effective_from: datetime,
        inference_geo: str | None = None,
    ) -> list[PriceRow]:
        found = session.scalars(
            select(Price).where(
                Price.model == model,
                Price.service_tier == _tier(service_tier),
                Price.inference_geo == _tier(inference_geo),
                Price.effective_from == effective_from,
            )
        )
        return [price_row(p) for p in found]

    def insert_rows(
        self, session: Session, rows: Sequence[PriceRow], now: datetime
    ) -> list[PriceRow]:
        stored = []
        for row in rows:
            item = Price(
                model=row.model,
                service_tier=_tier(row.service_tier),
                inference_geo=_tier(row.inference_geo),
                effective_from=row.effective_from,
                above_input_tokens=row.above_input_tokens,
                unit_prices=unit_prices_text(row.unit_prices),
                created_at=now,
                **dict(zip(RATE_COLUMNS, row.rates, strict=True)),
            )
            session.add(item)
            stored.append(item)
        session.flush()
        return [price_row(p) for p in stored]

    def all_rows(self, session: Session, model: str | None) -> list[PriceRow]:
        query = select(Price).order_by(
            Price.model,
            Price.effective_from,
            Price.service_tier,
            Price.inference_geo,
            Price.above_input_tokens,
        )
        if model is not None:
            query = query.where(Price.model == model)
        return [price_row(p) for p in session.scalars(query)]

    def rows_by_id(self, session: Session, ids: Sequence[int]) -> dict[int, PriceRow]:
        found = session.scalars(select(Price).where(Price.id.in_(sorted(ids))))
        return {p.id: price_row(p) for p in found}

    def rows_of_models(self, session: Session, models: Sequence[str]) -> list[PriceRow]:
        found = session.connection().execute(_OF_MODELS, {"models": sorted(models)})
        return [price_row(p) for p in found]

    def model_versions(self, session: Session, models: Sequence[str]) -> dict[str, tuple[int, int]]:
        found = session.connection().execute(_VERSIONS, {"models": sorted(models)})
        return {model: (int(count), int(top)) for model, count, top in found}

    def mark_model_pending(self, session: Session, model: str, effective_from: datetime) -> int:
        # An attempt is priced by its own model, which may differ from the call's (a fallback
        # model); a call with one attempt has no attempt row: its attempt's model is the call's.
        with_attempt = select(CallAttempt.request_id).where(CallAttempt.model == model)
        # (v2) A call that billed tokens at this model's rates (``other_models``, JSON text as
        # the reconciler writes it: ``"model": "…"``), with LIKE's wildcards escaped.
        quoted = json.dumps(model).replace("\\", "\\\\").replace("%", "\\%")
        quoted = quoted.replace("_", "\\_")
        as_other = cast(Call.other_models, Text).like(f'%"model": {quoted}%', escape="\\")
        marked = session.execute(
            update(Call)
            .where(
                or_(Call.model == model, Call.request_id.in_(with_attempt), as_other),
                Call.started_at >= effective_from,
            )
            .values(pending=True, change_seq=Call.change_seq + 1)
        )
        return int(getattr(marked, "rowcount", 0) or 0)
