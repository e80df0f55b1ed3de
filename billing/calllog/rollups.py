"""Usage rollups: pre-aggregated totals per UTC bucket, kept by the reconciler, read by /v1/usage.

Two bases (CONTRACT "Call log and usage queries"):

- ``call_start``: every settled call with its current figures, in the buckets of its start, under
  its key and model. When a reconciliation step changes a settled call (late events, a new price,
  a key that became known), the step takes the call's old contribution out and puts the new one in.
- ``booked``: every ledger entry, in the buckets of its ``booked_at``, under the entry's key and
  model; ``calls`` counts settlement entries. Entries are only ever added, and so are these.

Each contribution lands once per level (15 minutes, hour, day, month; UTC) in ``usage_rollups``
(by key and model) and in ``usage_rollups_all_keys`` (by model). A reconciliation step sums its
deltas in memory and writes each table with one upsert (``x = x + excluded.x``), rows in key
order so that concurrent reconcilers lock them in the same order, inside the step's transaction:
the rollups always agree with the ledger and the calls they were committed with. ``rebuild``
recomputes everything from ``calls`` and ``ledger_entries`` with set-based SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    String,
    Table,
    Text,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from billing.calllog.buckets import DAY, HOUR, LEVELS, MONTH, QUARTER, floor
from billing.reconcile.rule import STARTED_MISSING, TOKEN_FIELDS
from billing.storage.models import (
    Call,
    LedgerEntry,
    UsageRollup,
    UsageRollupAllKeys,
    UsageRollupKeyless,
)

CALL_START = "call_start"
BOOKED = "booked"
BASES = (CALL_START, BOOKED)

PICO = 10**12
#: The summed integer columns of a rollup row, in the order of ``Totals.values``.
COUNT_FIELDS = ("members", "calls", *TOKEN_FIELDS, "unpriced")
_KEYED: Table = UsageRollup.__table__  # type: ignore[assignment]
_ALL_KEYS: Table = UsageRollupAllKeys.__table__  # type: ignore[assignment]
_KEYLESS: Table = UsageRollupKeyless.__table__  # type: ignore[assignment]


class Totals:
    """Summed counts (``COUNT_FIELDS``) and the exact cost in picodollars (unbounded int)."""

    __slots__ = ("cost_pusd", "values")

    def __init__(self, values: Sequence[int] | None = None, cost_pusd: int = 0) -> None:
        self.values = list(values) if values is not None else [0] * len(COUNT_FIELDS)
        self.cost_pusd = cost_pusd

    def add(self, other: Totals, sign: int = 1) -> None:
        self.values = [a + sign * b for a, b in zip(self.values, other.values, strict=True)]
        self.cost_pusd += sign * other.cost_pusd

    def is_zero(self) -> bool:
        return self.cost_pusd == 0 and not any(self.values)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Totals)
            and self.values == other.values
            and self.cost_pusd == other.cost_pusd
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Placed:
    """One call's or entry's contribution: where it lands (time, key, model) and what it adds."""

    at: datetime
    api_key_id: str | None
    model: str | None
    totals: Totals


def _totals(row: Any, calls: int, cost: int | None) -> Totals:
    tokens = [getattr(row, name) for name in TOKEN_FIELDS]
    return Totals([1, calls, *tokens, 1 if cost is None else 0], cost or 0)


def place_call(call: Call, keyless_start: datetime | None = None) -> Placed | None:
    """A call's call_start contribution as the reconciler last wrote it (None: not settled).

    A settled call without ``stream.started`` counts under no key and no model; ingest may have
    filled those in since (a late ``stream.started``), so they are not read from the row, and
    its start is ``keyless_start`` when known (see ``UsageRollupKeyless``).
    """
    if not call.settled or call.started_at is None:
        return None
    totals = _totals(call, 1, call.cost_pusd)
    if STARTED_MISSING in (call.anomalies or ()):
        return Placed(keyless_start or call.started_at, None, None, totals)
    return Placed(call.started_at, call.api_key_id, call.model, totals)


def place_entry(entry: LedgerEntry) -> Placed:
    """A ledger entry's booked contribution; ``calls`` counts settlement entries."""
    settlement = 1 if entry.kind == "settlement" else 0
    return Placed(
        entry.booked_at, entry.api_key_id, entry.model, _totals(entry, settlement, entry.cost_pusd)
    )


class Deltas:
    """Changes to the rollups, summed per row (basis, key, level, bucket, model) in memory."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, int, datetime, str], Totals] = {}

    def add(self, basis: str, placed: Placed, sign: int = 1) -> None:
        key = placed.api_key_id or ""
        model = placed.model or ""
        for level in LEVELS:
            row = (basis, key, level, floor(level, placed.at), model)
            self.rows.setdefault(row, Totals()).add(placed.totals, sign)

    def write(self, session: Session) -> None:
        """Apply the deltas: one upsert into each rollup table."""
        all_keys: dict[tuple[str, int, datetime, str], Totals] = {}
        for (basis, _key, level, start, model), totals in self.rows.items():
            all_keys.setdefault((basis, level, start, model), Totals()).add(totals)
        _upsert(
            session, _KEYED, ("basis", "api_key_id", "level", "bucket_start", "model"), self.rows
        )
        _upsert(session, _ALL_KEYS, ("basis", "level", "bucket_start", "model"), all_keys)


def _insert(session: Session, table: Any) -> postgresql.Insert | sqlite.Insert:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def _upsert(
    session: Session, table: Table, names: Sequence[str], rows: Mapping[tuple[Any, ...], Totals]
) -> None:
    params = []
    for row in sorted(rows):  # one lock order for every reconciler: no deadlocks
        totals = rows[row]
        if totals.is_zero():  # e.g. a call that moved between keys of one bucket
            continue
        whole, frac = divmod(totals.cost_pusd, PICO)
        params.append(
            {
                **dict(zip(names, row, strict=True)),
                **dict(zip(COUNT_FIELDS, totals.values, strict=True)),
                "cost_whole_usd": whole,
                "cost_frac_pusd": frac,
            }
        )
    if not params:
        return
    statement = _insert(session, table)
    new = statement.excluded
    frac_sum = table.c.cost_frac_pusd + new.cost_frac_pusd
    updates: dict[str, Any] = {name: table.c[name] + new[name] for name in COUNT_FIELDS}
    updates["cost_frac_pusd"] = frac_sum % PICO
    updates["cost_whole_usd"] = table.c.cost_whole_usd + new.cost_whole_usd + frac_sum // PICO
    session.execute(
        statement.on_conflict_do_update(index_elements=list(names), set_=updates), params
    )


# --- the reconciler's hooks -----------------------------------------------------------------------


def before_step(session: Session, calls: Iterable[Call]) -> dict[str, Placed]:
    """What the call_start rollups hold for each of a step's calls, read before the step
    changes them (``after_step`` takes it back out where the call changed)."""
    calls = list(calls)
    keyless_ids = [
        c.request_id for c in calls if c.settled and STARTED_MISSING in (c.anomalies or ())
    ]
    starts: dict[str, datetime] = {}
    if keyless_ids:
        rows = session.execute(
            select(UsageRollupKeyless.request_id, UsageRollupKeyless.started_at).where(
                UsageRollupKeyless.request_id.in_(keyless_ids)
            )
        )
        starts = {request_id: started_at for request_id, started_at in rows}
    placed = {c.request_id: place_call(c, starts.get(c.request_id)) for c in calls}
    return {rid: p for rid, p in placed.items() if p is not None}


def after_step(
    session: Session,
    before: Mapping[str, Placed],
    calls: Iterable[Call],
    entries: Iterable[LedgerEntry],
) -> None:
    """Bring the rollups up to date with a step: the calls' new call_start contributions replace
    their old ones, and every new ledger entry is booked. Runs in the step's transaction."""
    deltas = Deltas()
    keyless: list[dict[str, Any]] = []
    gone: list[str] = []
    for call in calls:
        old = before.get(call.request_id)
        new = place_call(call)
        if new is not None and new.api_key_id is None:
            keyless.append({"request_id": call.request_id, "started_at": new.at})
        elif old is not None and old.api_key_id is None:
            gone.append(call.request_id)
        if old == new:
            continue
        if old is not None:
            deltas.add(CALL_START, old, -1)
        if new is not None:
            deltas.add(CALL_START, new)
    for entry in entries:
        deltas.add(BOOKED, place_entry(entry))
    deltas.write(session)
    _remember_keyless(session, keyless, gone)


def _remember_keyless(session: Session, rows: list[dict[str, Any]], gone: list[str]) -> None:
    if gone:
        session.execute(delete(UsageRollupKeyless).where(UsageRollupKeyless.request_id.in_(gone)))
    if rows:
        statement = _insert(session, UsageRollupKeyless)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["request_id"], set_={"started_at": statement.excluded.started_at}
            ),
            rows,
        )


# --- rebuilding from the source tables --------------------------------------------------------


def floor_sql(level: int, column: Any, dialect: str) -> ColumnElement[Any]:
    """SQL for ``floor(level, column)`` (a UTC timestamp column) on ``dialect``."""
    if dialect == "postgresql":
        if level == QUARTER:
            return func.date_bin(
                literal_column("interval '15 minutes'"),
                column,
                literal_column("timestamptz '2000-01-01 00:00:00+00'"),
            )
        unit = {HOUR: "'hour'", DAY: "'day'", MONTH: "'month'"}[level]
        return func.date_trunc(literal_column(unit), column, literal_column("'UTC'"))
    # SQLite keeps UTC timestamps as text 'YYYY-MM-DD HH:MM:SS.ffffff' (billing.storage.types).
    text = cast(column, String)
    if level == QUARTER:
        minute = func.substr(text, 15, 2)
        quarter = case(
            (minute < "15", "00"), (minute < "30", "15"), (minute < "45", "30"), else_="45"
        )
        return func.substr(text, 1, 14) + quarter + ":00.000000"
    if level == HOUR:
        return func.substr(text, 1, 13) + ":00:00.000000"
    if level == DAY:
        return func.substr(text, 1, 10) + " 00:00:00.000000"
    return func.substr(text, 1, 7) + "-01 00:00:00.000000"


def _split_cost(total: Any) -> tuple[Any, Any]:
    """(whole USD, picodollars 0 <= x < 10**12) of a signed picodollar sum, in portable SQL."""
    pico = literal_column(str(PICO), BigInteger)
    rest = ((total % pico) + pico) % pico
    return (total - rest) // pico, rest


def rebuild(session: Session) -> None:
    """Recompute every rollup from ``calls`` (settled) and ``ledger_entries``, set-based.

    For a migration backfill, a repair, or seeding a benchmark; the reconciler keeps them up to
    date incrementally. Runs in the caller's transaction.
    """
    dialect = session.get_bind().dialect.name
    for table in (_KEYED, _ALL_KEYS, _KEYLESS):
        session.execute(delete(table))
    keyless = cast(Call.anomalies, Text).like(f'%"{STARTED_MISSING}"%')
    calls = (
        select(
            literal(CALL_START).label("basis"),
            Call.started_at.label("at"),
            case((keyless, ""), else_=func.coalesce(Call.api_key_id, "")).label("api_key_id"),
            case((keyless, ""), else_=func.coalesce(Call.model, "")).label("model"),
            literal(1).label("calls"),
            *(getattr(Call, name) for name in TOKEN_FIELDS),
            Call.cost_pusd,
        )
        .where(Call.settled.is_(True), Call.started_at.is_not(None))
        .subquery()
    )
    entries = select(
        literal(BOOKED).label("basis"),
        LedgerEntry.booked_at.label("at"),
        func.coalesce(LedgerEntry.api_key_id, "").label("api_key_id"),
        func.coalesce(LedgerEntry.model, "").label("model"),
        case((LedgerEntry.kind == "settlement", 1), else_=0).label("calls"),
        *(getattr(LedgerEntry, name) for name in TOKEN_FIELDS),
        LedgerEntry.cost_pusd,
    ).subquery()
    columns = [
        "basis",
        "api_key_id",
        "level",
        "bucket_start",
        "model",
        *COUNT_FIELDS,
        "cost_whole_usd",
        "cost_frac_pusd",
    ]
    for source in (calls, entries):
        c = source.c
        bucket = floor_sql(QUARTER, c.at, dialect)
        whole, frac = _split_cost(func.sum(func.coalesce(c.cost_pusd, 0)))
        session.execute(
            insert(_KEYED).from_select(
                columns,
                select(
                    c.basis,
                    c.api_key_id,
                    literal(QUARTER),
                    bucket,
                    c.model,
                    func.count(),
                    func.sum(c.calls),
                    *(func.sum(c[name]) for name in TOKEN_FIELDS),
                    func.sum(case((c.cost_pusd.is_(None), 1), else_=0)),
                    whole,
                    frac,
                ).group_by(c.basis, c.api_key_id, bucket, c.model),
            )
        )
    r = _KEYED.c
    for level in (HOUR, DAY, MONTH):
        bucket = floor_sql(level, r.bucket_start, dialect)
        session.execute(
            insert(_KEYED).from_select(
                columns,
                _summed(
                    _KEYED,
                    [r.basis, r.api_key_id, literal(level), bucket, r.model],
                    [r.basis, r.api_key_id, bucket, r.model],
                    r.level == QUARTER,
                ),
            )
        )
    session.execute(
        insert(_ALL_KEYS).from_select(
            [c for c in columns if c != "api_key_id"],
            _summed(
                _KEYED,
                [r.basis, r.level, r.bucket_start, r.model],
                [r.basis, r.level, r.bucket_start, r.model],
                literal(True),
            ),
        )
    )
    session.execute(
        insert(UsageRollupKeyless).from_select(
            ["request_id", "started_at"],
            select(Call.request_id, Call.started_at).where(
                Call.settled.is_(True), Call.started_at.is_not(None), keyless
            ),
        )
    )


def _summed(table: Table, head: list[Any], groups: list[Any], where: Any) -> Any:
    """Rollup rows of ``table`` summed per ``groups`` (with exact cost carry)."""
    c = table.c
    frac = func.sum(c.cost_frac_pusd)
    rest = frac % literal_column(str(PICO), BigInteger)
    whole = func.sum(c.cost_whole_usd) + (frac - rest) // literal_column(str(PICO), BigInteger)
    return (
        select(*head, *(func.sum(c[name]) for name in COUNT_FIELDS), whole, rest)
        .where(where)
        .group_by(*groups)
    )


def dump(session: Session) -> dict[str, set[tuple[Any, ...]]]:
    """Every rollup row that counts something (for checks: incremental == rebuilt)."""
    result: dict[str, set[tuple[Any, ...]]] = {}
    for table in (_KEYED, _ALL_KEYS):
        rows = session.execute(select(table).where(table.c.members != 0))
        result[table.name] = {tuple(row) for row in rows}
    rows = session.execute(select(_KEYLESS))
    result[_KEYLESS.name] = {tuple(row) for row in rows}
    return result
