"""Usage rollups: pre-aggregated totals per UTC bucket, kept by the reconciler, read by /v1/usage.

Two bases (CONTRACT "Call log and usage queries"):

- ``call_start``: every settled call with its current figures, in the buckets of its start, under
  its key and model. When a reconciliation step changes a settled call (late events, a new price,
  a key that became known), the step takes the call's old contribution out and puts the new one in.
- ``booked``: every ledger entry, in the buckets of its ``booked_at``, under the entry's key and
  model; ``calls`` counts settlement entries. Entries are only ever added, and so are these.

Each contribution lands once per level (15 minutes, hour, day, month; UTC) in ``usage_rollups``
(by key and model), in ``usage_rollups_all_keys`` (by model) and (0021) in
``usage_rollups_by_key`` (by key and customer, every model summed) and
``usage_rollups_by_customer`` (by customer, every key and model summed); a settled call also counts
under its status in ``call_status_rollups`` (call_start only). A reconciliation step sums its
deltas in memory and writes each table with one upsert (``x = x + excluded.x``), rows in key
order so that concurrent reconcilers lock them in the same order, inside the step's transaction:
the rollups always agree with the ledger and the calls they were committed with. ``rebuild``
recomputes everything from ``calls`` and ``ledger_entries`` with set-based SQL. The statements are
the repository's (``billing.rollups.repository``).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.anomalies import STARTED_MISSING
from billing.dimensions import TOKEN_FIELDS
from billing.rollups import drift as drift_rollup
from billing.rollups.buckets import LEVELS, QUARTER, floor
from billing.rollups.repository import repository
from billing.rollups.rows import BOOKED, CALL_START, COUNT_FIELDS, PICO, Statuses
from billing.storage.models import (
    CallStatusRollup,
    UsageRollup,
    UsageRollupAllKeys,
    UsageRollupByCustomer,
    UsageRollupByKey,
    UsageRollupKeyless,
)

#: A row's buckets, in ``TOKEN_FIELDS`` order.
_tokens = operator.attrgetter(*TOKEN_FIELDS)


class Totals:
    """Summed counts (``COUNT_FIELDS``), the exact cost, (v2) charge and (v3) leakage in
    picodollars (unbounded ints)."""

    __slots__ = ("charge_pusd", "cost_pusd", "leakage_pusd", "values")

    def __init__(
        self,
        values: Sequence[int] | None = None,
        cost_pusd: int = 0,
        charge_pusd: int = 0,
        leakage_pusd: int = 0,
    ) -> None:
        self.values = list(values) if values is not None else [0] * len(COUNT_FIELDS)
        self.cost_pusd = cost_pusd
        self.charge_pusd = charge_pusd
        self.leakage_pusd = leakage_pusd

    def add(self, other: Totals, sign: int = 1) -> None:
        self.values = [a + sign * b for a, b in zip(self.values, other.values, strict=True)]
        self.cost_pusd += sign * other.cost_pusd
        self.charge_pusd += sign * other.charge_pusd
        self.leakage_pusd += sign * other.leakage_pusd

    def amounts(self) -> tuple[int, int, int]:
        """The cost, the charge and the leakage."""
        return (self.cost_pusd, self.charge_pusd, self.leakage_pusd)

    def is_zero(self) -> bool:
        return not any(self.amounts()) and not any(self.values)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Totals)
            and self.values == other.values
            and self.amounts() == other.amounts()
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(slots=True)
class Placed:
    """One call's or entry's contribution: where it lands (time, key, model, customer) and what
    it adds."""

    at: datetime
    api_key_id: str | None
    model: str | None
    totals: Totals
    customer_id: str | None = None
    #: (0021) A settled call's status, counted once (``call_status_rollups``); the fast path's
    #: groups count several. Entries count none.
    statuses: Statuses = ()


def _totals(row: Any, calls: int, cost: int | None, charge: int | None) -> Totals:
    flags = [1 if cost is None else 0, 1 if charge is None else 0]
    # (v3) A row stored before the leakage (or a new entry without one) left nothing uncharged.
    leakage = getattr(row, "leakage_pusd", None) or 0
    return Totals([1, calls, *_tokens(row), *flags], cost or 0, charge or 0, leakage)


class CallLike(Protocol):
    """What ``place_call`` reads of a call: a ``Call`` row, or the reconciler's own record; and
    one integer attribute per bucket of ``billing.dimensions.TOKEN_FIELDS``."""

    request_id: str
    settled: bool
    status: str
    started_at: datetime | None
    api_key_id: str | None
    model: str | None
    anomalies: list[str]
    cost_pusd: int | None
    customer_id: str | None
    charge_pusd: int | None


class EntryLike(Protocol):
    """What ``place_entry`` reads of a ledger entry: a ``LedgerEntry`` row, or a new entry; and
    one integer attribute per bucket of ``billing.dimensions.TOKEN_FIELDS``."""

    kind: str
    booked_at: datetime
    api_key_id: str | None
    model: str | None
    cost_pusd: int | None
    customer_id: str | None
    charge_pusd: int | None


def place_call(call: CallLike, keyless_start: datetime | None = None) -> Placed | None:
    """A call's call_start contribution as the reconciler last wrote it (None: not settled).

    A settled call without ``stream.started`` counts under no key and no model; ingest may have
    filled those in since (a late ``stream.started``), so they are not read from the row, and
    its start is ``keyless_start`` when known (see ``UsageRollupKeyless``).
    """
    if not call.settled or call.started_at is None:
        return None
    totals = _totals(call, 1, call.cost_pusd, call.charge_pusd)
    statuses = ((call.status, 1),)
    if STARTED_MISSING in (call.anomalies or ()):
        return Placed(keyless_start or call.started_at, None, None, totals, None, statuses)
    return Placed(call.started_at, call.api_key_id, call.model, totals, call.customer_id, statuses)


def place_entry(entry: EntryLike) -> Placed:
    """A ledger entry's booked contribution; ``calls`` counts settlement entries."""
    settlement = 1 if entry.kind == "settlement" else 0
    return Placed(
        entry.booked_at,
        entry.api_key_id,
        entry.model,
        _totals(entry, settlement, entry.cost_pusd, entry.charge_pusd),
        entry.customer_id,
    )


class Deltas:
    """Changes to the rollups, summed per row (basis, key, level, bucket, model, customer) in
    memory.

    Contributions are summed per 15-minute bucket first (every coarser UTC bucket is a union of
    whole quarters), and spread over the coarser levels once, when written.
    """

    def __init__(self) -> None:
        self.quarters: dict[tuple[str, str, datetime, str, str], list[int]] = {}
        #: (0021) Settled calls per (quarter, status): ``call_status_rollups``.
        self.statuses: dict[tuple[datetime, str], int] = {}
        self._floors: dict[datetime, datetime] = {}

    def add(self, basis: str, placed: Placed, sign: int = 1) -> None:
        quarter = self._floors.get(placed.at)
        if quarter is None:
            quarter = self._floors[placed.at] = floor(QUARTER, placed.at)
        row = (
            basis,
            placed.api_key_id or "",
            quarter,
            placed.model or "",
            placed.customer_id or "",
        )
        if placed.statuses and basis == CALL_START:
            for status, count in placed.statuses:
                self.statuses[quarter, status] = (
                    self.statuses.get((quarter, status), 0) + sign * count
                )
        totals = placed.totals
        values = [*totals.values, *totals.amounts()]
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
        all_keys: dict[tuple[Any, ...], list[int]] = {}
        by_key: dict[tuple[Any, ...], list[int]] = {}
        by_customer: dict[tuple[Any, ...], list[int]] = {}
        starts: dict[datetime, list[tuple[int, datetime]]] = {}
        add = operator.add

        def levels_of(quarter: datetime) -> list[tuple[int, datetime]]:
            levels = starts.get(quarter)
            if levels is None:
                levels = starts[quarter] = list(
                    zip(LEVELS, [quarter, *(floor(lv, quarter) for lv in LEVELS[1:])], strict=True)
                )
            return levels

        # Every quarter's values go to its row at each level, in the three tables, in one loop
        # (it runs for each of a step's groups and levels). The lists are never changed in
        # place, so a row may start as the quarter's own list.
        for (basis, key, quarter, model, customer), values in self.quarters.items():
            for level, start in levels_of(quarter):
                row: tuple[Any, ...] = (basis, key, level, start, model, customer)
                summed = keyed.get(row)
                keyed[row] = values if summed is None else list(map(add, summed, values))
                row = (basis, level, start, model)
                summed = all_keys.get(row)
                all_keys[row] = values if summed is None else list(map(add, summed, values))
                row = (basis, key, level, start, customer)
                summed = by_key.get(row)
                by_key[row] = values if summed is None else list(map(add, summed, values))
                row = (basis, level, start, customer)
                summed = by_customer.get(row)
                by_customer[row] = values if summed is None else list(map(add, summed, values))
        statuses: dict[tuple[Any, ...], int] = {}
        for (quarter, status), count in self.statuses.items():
            for level, start in levels_of(quarter):
                statuses[level, start, status] = statuses.get((level, start, status), 0) + count
        repository(session).add(
            session,
            _rows(keyed),
            _rows(all_keys),
            _rows(by_key),
            _rows(by_customer),
            [(*row, statuses[row]) for row in sorted(statuses) if statuses[row]],
        )


def _rows(rows: Mapping[tuple[Any, ...], list[int]]) -> list[tuple[Any, ...]]:
    """``rows`` (key → ``COUNT_FIELDS`` then the cost, the charge and the leakage in
    picodollars) as the store adds them: in key order, one lock order for every reconciler (no
    deadlocks), the amounts split, rows that change nothing left out (e.g. a call that moved
    between keys of one bucket)."""
    result = []
    for row in sorted(rows):
        values = rows[row]
        if any(values):
            split = (part for amount in values[-3:] for part in divmod(amount, PICO))
            result.append((*row, *values[:-3], *split))
    return result


# --- the reconciler's hooks -----------------------------------------------------------------------


def before_step(session: Session, calls: Iterable[CallLike]) -> dict[str, Placed]:
    """What the call_start rollups hold for each of a step's calls, read before the step
    changes them (``after_step`` takes it back out where the call changed)."""
    calls = list(calls)
    keyless_ids = [
        c.request_id for c in calls if c.settled and STARTED_MISSING in (c.anomalies or ())
    ]
    starts = repository(session).keyless_starts(session, keyless_ids) if keyless_ids else {}
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
    contributions, if any (the calls the database settled, ``billing.reconcile.fastpath``). Runs in
    the step's transaction."""
    if deltas is None:
        deltas = Deltas()
    keyless: list[tuple[str, datetime]] = []
    gone: list[str] = []
    for call in calls:
        old = before.get(call.request_id)
        new = place_call(call)
        if new is not None and new.api_key_id is None:
            keyless.append((call.request_id, new.at))
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
    store = repository(session)
    if gone:
        store.forget_keyless(session, gone)
    if keyless:
        store.keep_keyless(session, keyless)


def rebuild(session: Session) -> None:
    """Recompute every rollup from ``calls`` (settled) and ``ledger_entries``, set-based (the
    drift's too, ``billing.rollups.drift``).

    For a repair, or seeding a benchmark; the reconciler keeps them up to date incrementally.
    Runs in the caller's transaction.
    """
    repository(session).rebuild(session)
    drift_rollup.rebuild(session)


def dump(session: Session) -> dict[str, set[tuple[Any, ...]]]:
    """Every rollup row that counts something (for checks: incremental == rebuilt)."""
    result: dict[str, set[tuple[Any, ...]]] = {}
    for model in (UsageRollup, UsageRollupAllKeys, UsageRollupByKey, UsageRollupByCustomer):
        rows = session.execute(select(model.__table__).where(model.members != 0))
        result[model.__tablename__] = {tuple(row) for row in rows}
    table = CallStatusRollup.__table__
    rows = session.execute(select(table).where(CallStatusRollup.calls != 0))
    result[CallStatusRollup.__tablename__] = {tuple(row) for row in rows}
    rows = session.execute(select(UsageRollupKeyless.__table__))
    result[UsageRollupKeyless.__tablename__] = {tuple(row) for row in rows}
    return result
