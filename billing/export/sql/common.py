"""What both databases' export statements share: the columns they read, derived once from the
dimensions and the rates (the v1 exports' columns; a v2 export adds ledger columns by name), and
``SqlExport``, the repository over a database's statements, period and cursor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, aliased

from billing.dimensions import V1_TOKEN_FIELDS
from billing.rates import RATES, V1_RATES
from billing.storage.models import Call, LedgerEntry
from billing.storage.rawcursor import fetch_chunks

#: The token columns of the v1 exports, and as decimal text (the database writes integers faster
#: than Python does).
EXPORT_TOKENS = ", ".join(V1_TOKEN_FIELDS)
TOKENS_AS_TEXT = ", ".join(f"CAST({name} AS TEXT)" for name in V1_TOKEN_FIELDS)
#: The sums of the v1 exports' token columns.
EXPORT_TOKEN_SUMS = ", ".join(f"sum({name})" for name in V1_TOKEN_FIELDS)
#: The ledger's price columns of the v1 exports (micro-USD per million tokens), in the order of
#: the CSV's.
LEDGER_PRICES = ", ".join(r.column for r in V1_RATES)


def extra_columns(sources: Sequence[str]) -> str:
    """``, a, b`` for the ledger columns ``sources`` a v2 export adds (empty for none)."""
    return "".join(f", {name}" for name in sources)


class SqlExport:
    """``ExportRepository`` over a database's statements (``COUNT``, ``TOTALS``, and ``CALLS`` /
    ``USAGE`` with their ``{extra}`` columns), its parameters of a period (``period``), the
    DB-API cursor its chunked reads use (``cursor``) and how the chunks are handed on (``read``,
    as they are unless a database reads ahead)."""

    COUNT: ClassVar[str]
    TOTALS: ClassVar[str]
    CALLS: ClassVar[str]
    USAGE: ClassVar[str]

    def period(self, since: datetime, until: datetime) -> Any:
        raise NotImplementedError

    def cursor(self, driver: Any) -> Any:
        raise NotImplementedError

    def read(self, chunks: Iterator[list[Any]]) -> Iterator[list[Any]]:
        return chunks

    def count(self, session: Session, since: datetime, until: datetime) -> int:
        bound = self.period(since, until)
        return int(session.connection().exec_driver_sql(self.COUNT, bound).one()[0])

    def totals(self, session: Session, since: datetime, until: datetime) -> Sequence[Any]:
        return session.connection().exec_driver_sql(self.TOTALS, self.period(since, until)).one()

    def calls_chunks(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        size: int,
        extra: Sequence[str] = (),
    ) -> Iterator[list[Any]]:
        statement = self.CALLS.replace("{extra}", extra_columns(extra))
        return self.read(self._chunks(session, statement, since, until, size))

    def usage_chunks(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        size: int,
        extra: Sequence[str] = (),
    ) -> Iterator[list[Any]]:
        statement = self.USAGE.replace("{extra}", extra_columns(extra))
        return self.read(self._chunks(session, statement, since, until, size))

    def focus_chunks(
        self, session: Session, since: datetime, until: datetime, size: int
    ) -> Iterator[list[Any]]:
        result = session.execute(focus_query(since, until).execution_options(yield_per=size))
        for part in result.partitions():
            yield [tuple(row) for row in part]

    def _chunks(
        self, session: Session, statement: str, since: datetime, until: datetime, size: int
    ) -> Iterator[list[Any]]:
        bound = self.period(since, until)
        return fetch_chunks(session.connection(), self.cursor, statement, bound, size)


#: (v3) The ledger's token buckets a FOCUS row bills (``billing.export.focus``), in order.
FOCUS_TOKENS = tuple(r.bucket.name for r in RATES)
#: Their rate columns (micro-USD per million tokens), in the same order.
FOCUS_RATES = tuple(r.column for r in RATES)


def focus_query(since: datetime, until: datetime) -> Select[Any]:
    """(v3) The FOCUS export's ledger lines booked in ``[since, until)``, by ``booked_at`` then
    ``entry_id``: ``entry_id``, ``kind``, ``booked_at``, ``request_id``, ``api_key_id``,
    ``model``, the call's ``provider``, ``customer_id``, ``price_id``, the ``FOCUS_TOKENS``, the
    ``FOCUS_RATES``, ``cost_pusd``, ``units``, ``unit_prices`` and ``correction``: whether the
    call has a line booked before ``since`` (this line then corrects a closed period). The
    correction's probe reads the ledger's unique ``(request_id, seq)`` index."""
    e = LedgerEntry
    earlier = aliased(LedgerEntry)
    correction = (
        select(earlier.entry_id)
        .where(earlier.request_id == e.request_id, earlier.booked_at < since)
        .exists()
    )
    return (
        select(
            e.entry_id,
            e.kind,
            e.booked_at,
            e.request_id,
            e.api_key_id,
            e.model,
            Call.provider,
            e.customer_id,
            e.price_id,
            *(getattr(e, name) for name in FOCUS_TOKENS),
            *(getattr(e, name) for name in FOCUS_RATES),
            e.cost_pusd,
            e.units,
            e.unit_prices,
            correction.label("correction"),
        )
        .outerjoin(Call, Call.request_id == e.request_id)
        .where(e.booked_at >= since, e.booked_at < until)
        .order_by(e.booked_at, e.entry_id)
    )
