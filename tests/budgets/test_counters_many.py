"""The counters of many budgets read at once (``BudgetsRepository.spend``, what the console's
statuses of every budget read): 20,000 pairs, on SQLite and PostgreSQL. In one statement they
went past PostgreSQL's ``max_stack_depth`` (a 503 for the Overview and Budgets pages at 10,000
budgets)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select

from billing.budgets.repository import repository
from billing.storage.models import BudgetSpend
from tests.budgets.helpers import call, create, price, read, reconcile

T0 = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def test_twenty_thousand_counters_are_read_at_once(client: TestClient) -> None:
    price(client)
    create(
        client,
        T0,
        budget_id="b1",
        scope={"api_key_id": "key_b1"},
        limit_usd="1",
        period="total",
        measure="cost",
    )
    # 50,000 input tokens at $1/M and 10,000 output tokens at $2/M: $0.07, settled.
    call(client, "c1", T0 + timedelta(seconds=1), 50_000, 10_000)
    reconcile(client, T0 + timedelta(seconds=2))
    [(row, start)] = read(
        client, lambda s: s.execute(select(BudgetSpend.budget_row, BudgetSpend.period_start)).all()
    )
    # Counters that do not exist around the one that does.
    pairs = [(row + 1 + n, start) for n in range(19_999)]
    pairs.insert(12_345, (row, start))
    found = read(client, lambda s: repository(s).spend(s, pairs))
    assert found == {(row, start): (70_000_000_000, 0)}
