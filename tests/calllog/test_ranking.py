"""(#43) The Overview's ranking of keys and customers by cost: the pruned ranking
(``Ranking.pruned_ranking``, bounds from coarser rollup buckets) gives the same values in the
same order as the full one (``Ranking.full_ranking``, every rollup row of the period), over
many keys with skewed costs, ties (equal costs, split differently over rows), keys busy only at
a period's edges or just outside it, re-priced calls, zero costs, and periods off month, day
and 15-minute edges given with non-UTC offsets; and ``booked`` is never pruned."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from billing.calllog import buckets
from billing.calllog.repository import repository
from billing.calllog.rows import RollupSlice
from billing.calllog.usage import UsageQuery, usage_rows, usage_top
from billing.rollups.buckets import MONTH, Run, cover
from billing.rollups.rows import BOOKED, CALL_START, COUNT_FIELDS, PICO
from billing.rollups.service import Deltas, Placed, Totals

#: Keys: an id's case and punctuation vary so that ties are broken by the database's own order.
KEYS = [f"{'kK'[i % 2]}{'-_.'[i % 3]}{i:04d}" for i in range(600)]
CUSTOMERS = [f"c{'-_'[i % 2]}{i:03d}" for i in range(150)]
FIRST = datetime(2026, 10, 1, tzinfo=UTC)


def _placed(at: datetime, key: str, cost: int, customer: str) -> Placed:
    values = [1, 1, *([7] * (len(COUNT_FIELDS) - 4)), 0, 0]
    return Placed(at, key, "m1", Totals(values, cost, cost), customer)


def _seed(session: Session) -> None:
    """Calls of every key over 1 October to 31 December 2026 (call_start, and their entries on
    booked), written to every rollup table by the reconciler's own ``Deltas``."""
    rng = random.Random(43)
    deltas = Deltas()

    def add(at: datetime, key: str, cost: int, sign: int = 1) -> None:
        customer = CUSTOMERS[KEYS.index(key) % len(CUSTOMERS)] if key else ""
        for basis in (CALL_START, BOOKED):
            deltas.add(basis, _placed(at, key, cost, customer), sign)

    def anywhen() -> datetime:
        return FIRST + timedelta(seconds=rng.randrange(92 * 86400))

    for i, key in enumerate(KEYS[:400]):
        # Skewed: a few keys cost most; costs in picodollars, not whole cents.
        total = PICO * 300 // (i + 1) ** 2 + rng.randrange(PICO)
        for part in range(3):
            add(anywhen(), key, total // 3 + part)
    for key in KEYS[400:460]:
        # Ties: 60 keys of one cost (as one call, or two halves), most of them in November.
        at = datetime(2026, 11, 10, 12, tzinfo=UTC) + timedelta(hours=KEYS.index(key))
        if KEYS.index(key) % 2:
            add(at, key, 3 * PICO + 250)
        else:
            add(at, key, 3 * PICO // 2 + 125)
            add(at + timedelta(minutes=20), key, 3 * PICO // 2 + 125)
    for j, key in enumerate(KEYS[460:520]):
        # Busy at a period's edges only: the first and last quarter hours of November, and
        # large calls just outside it (in the months that bound it).
        add(datetime(2026, 11, 1, 0, 3, tzinfo=UTC), key, PICO * (40 + j))
        add(datetime(2026, 11, 30, 23, 59, tzinfo=UTC), key, PICO * (40 + j) + j)
        add(datetime(2026, 10, 31, 23, 50, tzinfo=UTC), key, PICO * 900)
        add(datetime(2026, 12, 1, 0, 10, tzinfo=UTC), key, PICO * 900)
    for j, key in enumerate(KEYS[520:560]):
        # Re-priced: a call's first cost taken out and a lower one put in (rows whose whole
        # dollars and picodollars were carried in both directions).
        at = anywhen()
        add(at, key, PICO * 30 + 999_999_999_999)
        add(at, key, PICO * 30 + 999_999_999_999, -1)
        add(at, key, PICO * (25 + j % 3) + 1)
    for key in KEYS[560:]:
        add(anywhen(), key, 0)  # unpriced: no cost
    add(datetime(2026, 11, 15, tzinfo=UTC), "", PICO * 12)  # a call without stream.started
    deltas.write(session)
    session.commit()


@pytest.fixture
def seeded(client: TestClient) -> Iterator[Session]:
    with client.app.state.billing.sessions() as session:  # type: ignore[attr-defined]
        _seed(session)
        yield session
        session.rollback()


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


#: Periods: a month, 30 days across two months (as the Overview's default), off the
#: 15-minute grid, in +05:30 and -08:00, three months, a day, hours, the edges' quarter hours.
PERIODS = [
    ("2026-11-01T00:00:00+00:00", "2026-12-01T00:00:00+00:00"),
    ("2026-10-29T00:00:00+00:00", "2026-11-28T00:00:00+00:00"),
    ("2026-10-20T05:07:13+00:00", "2026-11-20T17:52:01+00:00"),
    ("2026-11-01T00:00:00+05:30", "2026-12-01T00:00:00+05:30"),
    ("2026-10-31T16:00:00-08:00", "2026-11-30T16:00:00-08:00"),
    ("2026-11-01T00:00:00-08:00", "2026-11-30T23:59:59-08:00"),
    ("2026-10-01T00:00:00+00:00", "2026-12-31T00:00:00+00:00"),
    ("2026-11-10T00:00:00+00:00", "2026-11-11T00:00:00+00:00"),
    ("2026-11-10T09:30:00+05:30", "2026-11-13T17:45:00+05:30"),
    ("2026-11-01T00:15:00+00:00", "2026-11-30T23:45:00+00:00"),
    ("2026-11-01T00:00:00+00:00", "2026-11-30T23:45:00+00:00"),
]


def _runs(since: str, until: str) -> list[Run]:
    segments = buckets.segments(None, _at(since), _at(until), ZoneInfo("UTC"))
    runs, _windows = cover([(s.start, s.end) for s in segments])
    return runs


@pytest.mark.parametrize("dim", ["api_key_id", "customer_id"])
def test_the_pruned_ranking_is_the_full_ranking(seeded: Session, dim: str) -> None:
    repo = repository(seeded)
    rows = RollupSlice(True, CALL_START, None, None, (dim,))
    pruned_runs = 0
    for since, until in PERIODS:
        runs = _runs(since, until)
        for limit in (1, 5, 15, 40):
            full = repo.full_ranking(seeded, runs, rows, limit)
            assert full, (since, until, limit)
            pruned = repo.pruned_ranking(seeded, runs, rows, limit)
            if pruned is not None:
                pruned_runs += 1
                assert pruned == full, (since, until, limit)
            # What the Overview reads: the same ranking (pruned where it applies).
            ranked = [value for value, *_sums in repo.rollup_ranking(seeded, runs, rows, limit)]
            assert ranked == full, (since, until, limit)
    # Pruned in most of those (not the whole months: their bound is the sum itself).
    assert pruned_runs >= (25 if dim == "api_key_id" else 12), pruned_runs


def test_ties_past_the_first_batch_are_ranked_as_the_full_ranking(seeded: Session) -> None:
    # Most of November (off the 15-minute grid): a limit of 40 ends among the 60 tied keys
    # (3.00000000025 USD each, as one call or two halves), which the database orders by id;
    # the keys busy only at November's edges have large bounds (their calls just outside the
    # period) and no cost in it.
    repo = repository(seeded)
    rows = RollupSlice(True, CALL_START, None, None, ("api_key_id",))
    runs = _runs("2026-11-01T00:07:00+00:00", "2026-11-30T22:00:00+00:00")
    full = repo.full_ranking(seeded, runs, rows, 40)
    pruned = repo.pruned_ranking(seeded, runs, rows, 40)
    assert pruned is not None and pruned == full
    assert not set(full) & set(KEYS[460:520])
    tied = [key for key in full if key in KEYS[400:460]]
    assert tied and len(tied) < 60


def test_booked_is_never_pruned_and_the_overview_rows_are_usage_rows(seeded: Session) -> None:
    repo = repository(seeded)
    runs = _runs("2026-10-29T00:00:00+00:00", "2026-11-28T00:00:00+00:00")
    booked = RollupSlice(True, BOOKED, None, None, ("api_key_id",))
    assert repo.pruned_ranking(seeded, runs, booked, 5) is None
    # The rows of the ranked keys are /v1/usage's rows of those keys, to the picodollar.
    query = UsageQuery(_at("2026-10-29T00:00:00+00:00"), _at("2026-11-28T00:00:00+00:00"))
    top = usage_top(seeded, query, "api_key_id", 15)
    every = {
        row.group[0][1]: row
        for row in usage_rows(
            seeded, UsageQuery(query.since, query.until, group_by=("api_key_id",))
        )
    }
    assert [row.as_json() for row in top] == [every[row.group[0][1]].as_json() for row in top]
    costs = sorted((row.cost_pusd or 0 for row in every.values()), reverse=True)
    assert sorted((row.cost_pusd or 0 for row in top), reverse=True) == costs[:15]


def test_the_bound_is_the_months_that_cover_the_period() -> None:
    from billing.calllog.sql.common import bounding_run

    runs = _runs("2026-10-29T00:00:00+00:00", "2026-11-28T00:00:00+00:00")
    assert bounding_run(runs) == Run(0, MONTH, FIRST, datetime(2026, 12, 1, tzinfo=UTC))
    assert bounding_run(_runs("2026-11-01T00:00:00+00:00", "2026-12-01T00:00:00+00:00")) is None


@pytest.mark.parametrize("basis", [CALL_START, BOOKED])
def test_a_list_of_keys_sums_are_those_keys_rows_of_the_whole_sums(
    seeded: Session, basis: str
) -> None:
    # A list of keys' sums (the ranked keys, a page of keys: on SQLite ``INDEXED BY`` the key
    # index) are, to the picodollar, those keys' rows of the sums of every key.
    repo = repository(seeded)
    every = RollupSlice(True, basis, None, None, ("api_key_id",))
    listed = (KEYS[0], KEYS[7], KEYS[401], KEYS[470], KEYS[530], KEYS[580], "no-such-key")
    only = replace(every, api_key_ids=listed)

    def exact(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
        return sorted((seg, key, *(int(v) for v in sums)) for seg, key, *sums in rows)

    found = 0
    for since, until in PERIODS:
        runs = _runs(since, until)
        whole = exact(row for row in repo.rollup_sums(seeded, runs, every) if row[1] in listed)
        assert exact(repo.rollup_sums(seeded, runs, only)) == whole, (since, until)
        found += len(whole)
    assert found > 20
