"""(0021) ``usage_rollups_by_key`` and ``call_status_rollups``, as the reconciler keeps them,
equal sums made here from ``calls`` and ``ledger_entries`` after settles (fast path and rule),
failed and disconnected calls, late usages (adjustments), a late price (re-priced calls) and a
key given a customer afterwards (re-rated calls); and the Overview's statuses are those of
``calls``."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.anomalies import STARTED_MISSING
from billing.calllog.queries import STATUSES
from billing.console.overview import overview_view
from billing.dimensions import TOKEN_FIELDS
from billing.rollups.buckets import LEVELS, floor
from billing.rollups.rows import PICO
from billing.rollups.service import dump
from billing.storage.models import Call, LedgerEntry, UsageRollupByCustomer, UsageRollupByKey
from tests.calllog.test_calls_query import call_events, post, reconcile_at
from tests.calllog.test_usage import busy, priced, session  # noqa: F401  (fixtures)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _add(sums: dict[tuple[Any, ...], list[int]], row: tuple[Any, ...], values: list[int]) -> None:
    old = sums.get(row)
    sums[row] = values if old is None else [a + b for a, b in zip(old, values, strict=True)]


def _values(source: Any, calls: int) -> list[int]:
    tokens = [getattr(source, name) for name in TOKEN_FIELDS]
    flags = [int(source.cost_pusd is None), int(source.charge_pusd is None)]
    money = (source.cost_pusd or 0, source.charge_pusd or 0, source.leakage_pusd or 0)
    return [1, calls, *tokens, *flags, *money]


def _by_key_from_scratch(db: Session) -> set[tuple[Any, ...]]:
    """``usage_rollups_by_key``'s rows (those that count something) summed from the source
    rows: the settled calls at their start, the entries at their booking."""
    sums: dict[tuple[Any, ...], list[int]] = {}
    for call in db.scalars(select(Call).where(Call.settled.is_(True))):
        if call.started_at is None:
            continue
        keyless = STARTED_MISSING in (call.anomalies or [])
        key = "" if keyless else call.api_key_id or ""
        customer = "" if keyless else call.customer_id or ""
        for level in LEVELS:
            row = ("call_start", key, level, floor(level, call.started_at), customer)
            _add(sums, row, _values(call, 1))
    for entry in db.scalars(select(LedgerEntry)):
        for level in LEVELS:
            row = (
                "booked",
                entry.api_key_id or "",
                level,
                floor(level, entry.booked_at),
                entry.customer_id or "",
            )
            _add(sums, row, _values(entry, int(entry.kind == "settlement")))
    rows = set()
    for row, values in sums.items():
        *counts, cost, charge, leakage = values
        money = (part for amount in (cost, charge, leakage) for part in divmod(amount, PICO))
        if counts[0]:
            rows.add((*row, *counts[:-2], *money, *counts[-2:]))
    return rows


def _by_key_dumped(db: Session) -> set[tuple[Any, ...]]:
    """The table's rows as ``dump`` gives them, in ``_by_key_from_scratch``'s column order: the
    key, the counts, the three amounts (whole, picodollars), then unpriced and uncharged."""
    rows = set()
    for row in dump(db)["usage_rollups_by_key"]:
        named = dict(zip(_BY_KEY_COLUMNS, row, strict=True))
        named["bucket_start"] = named["bucket_start"].astimezone(UTC)
        rows.add(tuple(named[name] for name in _ORDER))
    return rows


#: The columns in ``_by_key_from_scratch``'s order.
_ORDER = (
    "basis",
    "api_key_id",
    "level",
    "bucket_start",
    "customer_id",
    "members",
    "calls",
    *TOKEN_FIELDS,
    "cost_whole_usd",
    "cost_frac_pusd",
    "charge_whole_usd",
    "charge_frac_pusd",
    "leakage_whole_usd",
    "leakage_frac_pusd",
    "unpriced",
    "uncharged",
)
_BY_KEY_COLUMNS = [column.name for column in UsageRollupByKey.__table__.columns]


def _by_customer_of(by_key: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """``usage_rollups_by_customer``'s rows from ``usage_rollups_by_key``'s (as
    ``_by_key_from_scratch`` gives them): every key summed, the picodollars carried."""
    sums: dict[tuple[Any, ...], list[int]] = {}
    for basis, _key, level, start, customer, *values in by_key:
        width = 2 + len(TOKEN_FIELDS)
        counts = values[:width] + values[width + 6 :]
        money = [values[width + i] * PICO + values[width + i + 1] for i in (0, 2, 4)]
        _add(sums, (basis, level, start, customer), [*counts, *money])
    rows = set()
    for row, values in sums.items():
        *counts, cost, charge, leakage = values
        split = (part for amount in (cost, charge, leakage) for part in divmod(amount, PICO))
        rows.add((*row, *counts[: 2 + len(TOKEN_FIELDS)], *split, *counts[-2:]))
    return rows


def _by_customer_dumped(db: Session) -> set[tuple[Any, ...]]:
    columns = [column.name for column in UsageRollupByCustomer.__table__.columns]
    order = ("basis", "level", "bucket_start", "customer_id", *_ORDER[5:])
    rows = set()
    for row in dump(db)["usage_rollups_by_customer"]:
        named = dict(zip(columns, row, strict=True))
        named["bucket_start"] = named["bucket_start"].astimezone(UTC)
        rows.add(tuple(named[name] for name in order))
    return rows


def _statuses_from_scratch(db: Session) -> set[tuple[Any, ...]]:
    counted: Counter[tuple[Any, ...]] = Counter()
    settled = select(Call.started_at, Call.status).where(
        Call.settled.is_(True), Call.started_at.is_not(None)
    )
    for started_at, status in db.execute(settled):
        for level in LEVELS:
            counted[level, floor(level, started_at), status] += 1
    return {(*row, n) for row, n in counted.items()}


def _statuses_dumped(db: Session) -> set[tuple[Any, ...]]:
    return {
        (level, start.astimezone(UTC), status, calls)
        for level, start, status, calls in dump(db)["call_status_rollups"]
    }


def test_the_rollups_by_key_and_by_status_equal_the_source_rows(
    busy: TestClient,  # noqa: F811
    session: Session,  # noqa: F811
) -> None:
    # key_b charged to a customer from October: its calls since are rated again (their charge
    # and customer move); a call of each status more, one of them without stream.started.
    ok = busy.put(
        "/v1/keys/key_b",
        json={"customer_id": "beta", "effective_from": "2026-10-01T00:00:00Z"},
    )
    assert ok.status_code in (200, 201), ok.text
    events = call_events("x-fail", _at("2026-10-24T08:00:00Z"), key="key_b", status="failed")
    events += call_events(
        "x-gone", _at("2026-10-24T08:07:00Z"), key="key_b", status="client_disconnected"
    )
    keyless = call_events("x-keyless", _at("2026-10-24T09:00:00Z"), key="key_a")
    events += [event for event in keyless if event["type"] != "stream.started"]
    post(busy, events)
    reconcile_at(busy, datetime(2026, 11, 2, 6, 0, tzinfo=UTC))
    session.expire_all()
    assert session.scalar(select(func.count()).where(Call.customer_id == "beta")) > 10
    by_key = _by_key_from_scratch(session)
    assert _by_key_dumped(session) == by_key
    assert _by_customer_dumped(session) == _by_customer_of(by_key)
    statuses = _statuses_dumped(session)
    assert statuses == _statuses_from_scratch(session)
    assert {status for _, _, status, _ in statuses} == {
        "completed",
        "client_disconnected",
        "failed",
    }


def test_the_overview_counts_the_statuses_of_calls(
    busy: TestClient,  # noqa: F811
    session: Session,  # noqa: F811
) -> None:
    # One call left open (no end), in the period.
    open_call = call_events("x-open", _at("2026-10-24T10:00:00Z"), key="key_a")
    post(busy, [e for e in open_call if e["type"] == "stream.started"])
    for since, until in (
        ("2026-03-01T00:00:00Z", "2026-11-01T00:00:00Z"),
        # Off the 15-minute grid at both ends, and a range of whole hours.
        ("2026-03-06T03:07:11Z", "2026-10-30T17:53:02Z"),
        ("2026-10-23T05:00:00Z", "2026-10-25T13:00:00Z"),
    ):
        items = [("since", since), ("until", until)]
        view = overview_view(session, items, datetime(2026, 11, 2, tzinfo=UTC))
        lo, hi = _at(since), _at(until)
        counted = dict.fromkeys(STATUSES, 0)
        for (status,) in session.execute(
            select(Call.status).where(Call.started_at >= lo, Call.started_at < hi)
        ):
            counted[status] += 1
        assert view["statuses"] == counted, (since, until)
        assert view["started"] == sum(counted.values())
    assert counted["open"] == 1
    assert all(counted[s] for s in STATUSES)
