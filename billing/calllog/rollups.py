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

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

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
from billing.dimensions import TOKEN_FIELDS
from billing.reconcile.rule import STARTED_MISSING
from billing.storage.models import (
    Call,
    LedgerEntry,
    UsageRollup,
    UsageRollupAllKeys,
    UsageRollupKeyless,
)
from billing.storage.types import cached_sqlite_text

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


@dataclass(slots=True)
class Placed:
    """One call's or entry's contribution: where it lands (time, key, model) and what it adds."""

    at: datetime
    api_key_id: str | None
    model: str | None
    totals: Totals


def _totals(row: Any, calls: int, cost: int | None) -> Totals:
    return Totals(
        [
            1,
            calls,
            row.input_tokens,
            row.cache_read_input_tokens,
            row.cache_creation_input_tokens,
            row.output_tokens_billed,
            row.output_tokens_delivered,
            row.output_tokens_undelivered,
            row.reasoning_tokens,
            1 if cost is None else 0,
        ],
        cost or 0,
    )


class CallLike(Protocol):
    """What ``place_call`` reads of a call: a ``Call`` row, or the reconciler's own record."""

    request_id: str
    settled: bool
    started_at: datetime | None
    api_key_id: str | None
    model: str | None
    anomalies: list[str]
    cost_pusd: int | None
    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    output_tokens_billed: int
    output_tokens_delivered: int
    output_tokens_undelivered: int
    reasoning_tokens: int


class EntryLike(Protocol):
    """What ``place_entry`` reads of a ledger entry: a ``LedgerEntry`` row, or a new entry."""

    kind: str
    booked_at: datetime
    api_key_id: str | None
    model: str | None
    cost_pusd: int | None
    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    output_tokens_billed: int
    output_tokens_delivered: int
    output_tokens_undelivered: int
    reasoning_tokens: int


def place_call(call: CallLike, keyless_start: datetime | None = None) -> Placed | None:
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


def place_entry(entry: EntryLike) -> Placed:
    """A ledger entry's booked contribution; ``calls`` counts settlement entries."""
    settlement = 1 if entry.kind == "settlement" else 0
    return Placed(
        entry.booked_at, entry.api_key_id, entry.model, _totals(entry, settlement, entry.cost_pusd)
    )


class Deltas:
    """Changes to the rollups, summed per row (basis, key, level, bucket, model) in memory.

    Contributions are summed per 15-minute bucket first (every coarser UTC bucket is a union of
    whole quarters), and spread over the coarser levels once, when written.
    """

    def __init__(self) -> None:
        self.quarters: dict[tuple[str, str, datetime, str], list[int]] = {}
        self._floors: dict[datetime, datetime] = {}

    def add(self, basis: str, placed: Placed, sign: int = 1) -> None:
        quarter = self._floors.get(placed.at)
        if quarter is None:
            quarter = self._floors[placed.at] = floor(QUARTER, placed.at)
        row = (basis, placed.api_key_id or "", quarter, placed.model or "")
        totals = placed.totals
        values = [*totals.values, totals.cost_pusd]
        summed = self.quarters.get(row)
        if summed is None:
            self.quarters[row] = values if sign == 1 else [-v for v in values]
        else:
            self.quarters[row] = list(
                map(operator.add if sign == 1 else operator.sub, summed, values)
            )

    def write(self, session: Session) -> None:
        """Apply the deltas: one upsert into each rollup table."""
        keyed: dict[tuple[Any, ...], list[int]] = {}
        starts: dict[datetime, list[datetime]] = {}
        for (basis, key, quarter, model), values in self.quarters.items():
            levels = starts.get(quarter)
            if levels is None:
                levels = starts[quarter] = [quarter, *(floor(lv, quarter) for lv in LEVELS[1:])]
            for level, start in zip(LEVELS, levels, strict=True):
                _sum_into(keyed, (basis, key, level, start, model), values)
        all_keys: dict[tuple[Any, ...], list[int]] = {}
        for (basis, _key, level, start, model), values in keyed.items():
            _sum_into(all_keys, (basis, level, start, model), values)
        _upsert(session, _KEYED, ("basis", "api_key_id", "level", "bucket_start", "model"), keyed)
        _upsert(session, _ALL_KEYS, ("basis", "level", "bucket_start", "model"), all_keys)


def _sum_into(
    rows: dict[tuple[Any, ...], list[int]], row: tuple[Any, ...], values: list[int]
) -> None:
    summed = rows.get(row)
    rows[row] = list(values) if summed is None else list(map(operator.add, summed, values))


def _insert(session: Session, table: Any) -> postgresql.Insert | sqlite.Insert:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


_SUMMED = (*COUNT_FIELDS, "cost_whole_usd", "cost_frac_pusd")


def _upsert(
    session: Session,
    table: Table,
    names: Sequence[str],
    rows: Mapping[tuple[Any, ...], list[int]],
) -> None:
    """Add ``rows`` (``COUNT_FIELDS`` then the cost in picodollars, per key ``names``) into
    ``table``: one statement on the raw driver, rows in key order."""
    conn = session.connection()
    postgres = conn.dialect.name == "postgresql"
    time_at = names.index("bucket_start")
    params = []
    for row in sorted(rows):  # one lock order for every reconciler: no deadlocks
        values = rows[row]
        if not any(values):  # e.g. a call that moved between keys of one bucket
            continue
        whole, frac = divmod(values[-1], PICO)
        key = list(row)
        if not postgres:
            key[time_at] = cached_sqlite_text(key[time_at])
        params.append((*key, *values[:-1], whole, frac))
    if not params:
        return
    name = table.name
    frac_sum = f"({name}.cost_frac_pusd + excluded.cost_frac_pusd)"
    mod = "%%" if postgres else "%"
    updates = [f"{c} = {name}.{c} + excluded.{c}" for c in COUNT_FIELDS]
    updates.append(f"cost_frac_pusd = {frac_sum} {mod} {PICO}")
    updates.append(
        f"cost_whole_usd = {name}.cost_whole_usd + excluded.cost_whole_usd + {frac_sum} / {PICO}"
    )
    columns = ", ".join((*names, *_SUMMED))
    conflict = f" ON CONFLICT ({', '.join(names)}) DO UPDATE SET {', '.join(updates)}"
    if postgres:
        types = {"level": "int2", "bucket_start": "timestamptz"}
        arrays = ", ".join(
            f"%b::{types.get(n, 'varchar' if n in names else 'int8')}[]" for n in (*names, *_SUMMED)
        )
        conn.exec_driver_sql(
            f"INSERT INTO {name} ({columns}) SELECT * FROM unnest({arrays}){conflict}",
            tuple(list(column) for column in zip(*params, strict=True)),
        )
    else:
        marks = ", ".join("?" * (len(names) + len(_SUMMED)))
        conn.exec_driver_sql(f"INSERT INTO {name} ({columns}) VALUES ({marks}){conflict}", params)


# --- the reconciler's hooks -----------------------------------------------------------------------


def before_step(session: Session, calls: Iterable[CallLike]) -> dict[str, Placed]:
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
    calls: Iterable[CallLike],
    entries: Iterable[EntryLike],
    deltas: Deltas | None = None,
) -> None:
    """Bring the rollups up to date with a step: the calls' new call_start contributions replace
    their old ones, and every new ledger entry is booked; ``deltas`` holds the step's other
    contributions, if any (the calls the database settled, ``billing.reconcile.common``). Runs in
    the step's transaction."""
    if deltas is None:
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
