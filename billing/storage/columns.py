"""What the SQL of both databases shares: column lists derived once from the dimensions, the
rollups' upsert arithmetic, and the rollup rows a usage query reads (a table and its
conditions)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Table, select
from sqlalchemy.orm import Session

from billing.calllog.repository import RollupSlice
from billing.dimensions import TOKEN_FIELDS, V1_TOKEN_FIELDS
from billing.rates import V1_RATES
from billing.rollups.repository import CALL_START, COUNT_FIELDS, PICO
from billing.storage.models import Call, LedgerEntry, UsageRollup, UsageRollupAllKeys

#: The token columns.
TOKENS = ", ".join(TOKEN_FIELDS)
#: The token columns of the v1 exports, and as decimal text (the database writes integers faster
#: than Python does).
EXPORT_TOKENS = ", ".join(V1_TOKEN_FIELDS)
TOKENS_AS_TEXT = ", ".join(f"CAST({name} AS TEXT)" for name in V1_TOKEN_FIELDS)
#: The sums of the v1 exports' token columns.
EXPORT_TOKEN_SUMS = ", ".join(f"sum({name})" for name in V1_TOKEN_FIELDS)
#: The sums of the token columns.
TOKEN_SUMS = ", ".join(f"sum({name})" for name in TOKEN_FIELDS)
#: The ledger's price columns of the v1 exports (micro-USD per million tokens), in the order of
#: the CSV's.
LEDGER_PRICES = ", ".join(r.column for r in V1_RATES)


def extra_columns(sources: Sequence[str]) -> str:
    """``, a, b`` for the ledger columns ``sources`` a v2 export adds (empty for none)."""
    return "".join(f", {name}" for name in sources)


#: The summed columns of a rollup row.
ROLLUP_SUMMED = (
    *COUNT_FIELDS,
    "cost_whole_usd",
    "cost_frac_pusd",
    "charge_whole_usd",
    "charge_frac_pusd",
)
#: The sums of a rollup row's counts.
COUNT_SUMS = ", ".join(f"sum({name})" for name in COUNT_FIELDS)


def added_on_conflict(table: str, mod: str) -> str:
    """The ``SET`` list of an upsert that adds a row into the rollup ``table``: every count
    summed, the cost with its carry into whole dollars; ``mod`` is SQL's ``%`` as the driver
    wants it written."""
    counts = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in COUNT_FIELDS)
    money = []
    for name in ("cost", "charge"):
        frac = f"({table}.{name}_frac_pusd + excluded.{name}_frac_pusd)"
        money.append(
            f"{name}_frac_pusd = {frac} {mod} {PICO}, {name}_whole_usd = "
            f"{table}.{name}_whole_usd + excluded.{name}_whole_usd + {frac} / {PICO}"
        )
    return f"{counts}, {', '.join(money)}"


_KEYED: Table = UsageRollup.__table__  # type: ignore[assignment]
_ALL_KEYS: Table = UsageRollupAllKeys.__table__  # type: ignore[assignment]


def rollup_slice(rows: RollupSlice) -> tuple[Table, list[ColumnElement[Any]]]:
    """The rollup table ``rows`` reads and its conditions other than the bucket range."""
    table = _KEYED if rows.by_key else _ALL_KEYS
    where = [table.c.basis == rows.basis]
    if rows.api_key_id is not None:
        where.append(table.c.api_key_id == rows.api_key_id)
    if rows.model is not None:
        where.append(table.c.model == rows.model)
    if rows.customer_id is not None:
        where.append(table.c.customer_id == rows.customer_id)
    return table, where


class UnitsIn:
    """``CalllogRepository.units_in``, the same SQLAlchemy query on both databases (a base of
    each database's calllog repository)."""

    def units_in(
        self,
        session: Session,
        basis: str,
        since: datetime,
        until: datetime,
        api_key_id: str | None,
        model: str | None,
        customer_id: str | None = None,
    ) -> list[Any]:
        query: Any
        at: Any
        if basis == CALL_START:
            at = Call.started_at
            query = select(at, Call.api_key_id, Call.model, Call.units, Call.customer_id).where(
                Call.units.is_not(None), Call.settled.is_(True)
            )
            key, named, customer = Call.api_key_id, Call.model, Call.customer_id
        else:
            at = LedgerEntry.booked_at
            query = select(
                at,
                LedgerEntry.api_key_id,
                LedgerEntry.model,
                LedgerEntry.units,
                LedgerEntry.customer_id,
            ).where(LedgerEntry.units.is_not(None))
            key, named, customer = (
                LedgerEntry.api_key_id,
                LedgerEntry.model,
                LedgerEntry.customer_id,
            )
        query = query.where(at >= since, at < until)
        if api_key_id is not None:
            query = query.where(key == api_key_id)
        if model is not None:
            query = query.where(named == model)
        if customer_id is not None:
            query = query.where(customer == customer_id)
        return list(session.execute(query))
