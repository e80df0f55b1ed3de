"""The counters equal their definition after every step: settled = the ledger's amounts of the
key's calls started in the period, provisional = the current cost of its open calls started in
the period, for every budget and period kept, through the SQL fast path and the rule, late
``stream.started`` (a key-less call getting its key), new events on open calls and reprices."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.budgets.periods import period_start
from billing.storage.models import Budget, BudgetSpend, Call, LedgerEntry
from tests.budgets.helpers import MODEL, call, create, price, read, reconcile, usage
from tests.builders import post

NOV = datetime(2026, 11, 10, tzinfo=UTC)


def _defined(session: Session) -> dict[tuple[int, datetime], tuple[int, int]]:
    budgets = list(session.scalars(select(Budget).where(Budget.ended_at.is_(None))))
    out: dict[tuple[int, datetime], list[int]] = defaultdict(lambda: [0, 0])
    for b in budgets:
        for e in session.scalars(select(LedgerEntry).where(LedgerEntry.api_key_id == b.api_key_id)):
            if e.call_started_at is None or e.cost_pusd is None:
                continue
            start = period_start(b.period, b.tz, e.call_started_at)
            if start >= b.tracked_from:
                out[(b.id, start)][0] += e.cost_pusd
        for c in session.scalars(select(Call).where(Call.api_key_id == b.api_key_id)):
            if c.settled or c.started_at is None or c.cost_pusd is None:
                continue
            start = period_start(b.period, b.tz, c.started_at)
            if start >= b.tracked_from:
                out[(b.id, start)][1] += c.cost_pusd
    return {k: (v[0], v[1]) for k, v in out.items() if any(v)}


def _kept(session: Session) -> dict[tuple[int, datetime], tuple[int, int]]:
    return {
        (r.budget_row, r.period_start): (r.settled_pusd, r.provisional_pusd)
        for r in session.scalars(select(BudgetSpend))
        if r.settled_pusd or r.provisional_pusd
    }


def _check(client: TestClient) -> None:
    kept, defined = read(client, lambda s: (_kept(s), _defined(s)))
    assert kept == defined


def _ts(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _started(rid: str, at: datetime, key: str, input_tokens: int) -> dict[str, Any]:
    return {
        "event_id": f"{rid}-s",
        "request_id": rid,
        "type": "stream.started",
        "occurred_at": _ts(at),
        "api_key_id": key,
        "model": MODEL,
        "protocol": "openai.chat_completions",
        "input_tokens": input_tokens,
    }


def test_the_counters_equal_their_definition_after_every_step(client: TestClient) -> None:
    price(client)
    for tz in ("UTC", "America/New_York", "Asia/Kolkata"):
        for period in ("day", "week", "month", "total"):
            create(
                client,
                NOV,
                budget_id=f"a-{period}-{tz}",
                scope={"api_key_id": "key_a"},
                limit_usd="1",
                period=period,
                tz=tz,
            )
    create(client, NOV, budget_id="b", scope={"api_key_id": "key_b"}, limit_usd="1", period="month")
    t = NOV + timedelta(hours=20)  # near midnight in some zones
    for i in range(12):
        call(client, f"s{i}", t + timedelta(minutes=37 * i), 10_000 * (i + 1), 1_000, key="key_a")
    call(client, "o1", t, 50_000, key="key_a", settled=False, generated=1_000)
    call(client, "o2", t + timedelta(hours=5), 70_000, key="key_b", settled=False, generated=10)
    # A key-less call: its usage first, its stream.started later.
    usage(client, "late", t + timedelta(hours=1), 30_000, 3_000)
    step = NOV + timedelta(days=2)
    reconcile(client, step)
    _check(client)
    post(client, [_started("late", t + timedelta(hours=1), "key_a", 30_000)])
    call(client, "o1", t, 50_000, key="key_a", settled=False, generated=5_000)
    reconcile(client, step + timedelta(seconds=1))
    _check(client)
    usage(client, "o1", t + timedelta(minutes=1), 50_000, 6_000)
    usage(client, "o2", t + timedelta(hours=5, minutes=1), 70_000, 20)
    reconcile(client, step + timedelta(seconds=2))
    _check(client)
    # A reprice: every call is booked again (adjustments).
    price(client, effective_from="2026-11-05T00:00:00Z", input_usd_per_mtok="0.25")
    reconcile(client, step + timedelta(seconds=3))
    _check(client)
    kept = read(client, _kept)
    assert len(kept) > 12 and all(settled > 0 for settled, _ in kept.values())


def test_budgets_made_while_steps_run_miss_and_double_nothing(client: TestClient) -> None:
    """A budget's first counter (read from the ledger) and the steps' counter updates are
    ordered (PostgreSQL: the advisory lock), so budgets created while calls are being settled
    hold exactly their definition."""
    import threading
    import time

    from billing.reconcile.runner import run_pass
    from tests.budgets.helpers import state

    price(client)
    st = state(client)
    errors: list[BaseException] = []
    done = threading.Event()

    def settle() -> None:
        try:
            while not done.is_set():
                run_pass(st.sessions, st.settings)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def ingest() -> None:
        try:
            now = datetime.now(UTC) - timedelta(minutes=2)
            for i in range(60):
                call(client, f"x{i}", now + timedelta(seconds=i), 1_000 * (i + 1), key="key_c")
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    workers = [threading.Thread(target=settle), threading.Thread(target=ingest)]
    for w in workers:
        w.start()
    for i in range(8):
        create(
            client,
            datetime.now(UTC),
            budget_id=f"c{i}",
            scope={"api_key_id": "key_c"},
            limit_usd="1",
            period="total" if i % 2 else "month",
        )
        time.sleep(0.05)
    workers[1].join()
    done.set()
    workers[0].join()
    assert errors == []
    run_pass(st.sessions, st.settings)
    _check(client)
    spent = read(client, _kept)
    assert len(spent) >= 1
