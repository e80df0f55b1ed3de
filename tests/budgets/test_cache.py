"""The budget versions kept in memory (``billing.budgets.cache``): a budget created, changed or
deleted through another engine (as another process or replica would) is seen by the next
reconciliation step and the next spend check of the app's engine; with the generation's row
missing the versions are read every time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from billing.budgets import cache, service
from billing.budgets.schemas import BudgetChange, BudgetIn
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker, read_transaction, write_transaction
from billing.storage.models import BudgetGeneration
from tests.budgets.helpers import call, price, read, reconcile, state, status

NOV = datetime(2026, 11, 10, tzinfo=UTC)
KEY = {"api_key_id": "key_b1"}


@pytest.fixture
def other(settings: Settings) -> Iterator[sessionmaker[Session]]:
    """Sessions of another engine on the same database (another process's, as it were)."""
    engine = make_engine(settings)
    yield make_sessionmaker(engine)
    engine.dispose()


def _check(client: TestClient, at: datetime) -> dict[str, Any]:
    out: dict[str, Any] = read(client, lambda s: service.spend_check(s, "key_b1", at))
    return out


def _copy_generation(client: TestClient) -> int | None:
    engine = state(client).sessions.kw["bind"]
    return cache._copies[engine].generation


def test_a_budget_created_changed_and_deleted_elsewhere_is_seen_by_the_next_step_and_check(
    client: TestClient, other: sessionmaker[Session]
) -> None:
    price(client)
    # The app's copy is loaded (no budget yet) by a step and a check.
    call(client, "c1", NOV + timedelta(hours=1), 100_000)  # $0.10
    reconcile(client, NOV + timedelta(hours=1, seconds=5))
    assert _check(client, NOV + timedelta(hours=2))["budgets"] == []
    before = _copy_generation(client)

    body = BudgetIn.model_validate(
        {"budget_id": "b1", "scope": KEY, "limit_usd": "1", "period": "month"}
    )
    with write_transaction(other) as session:
        service.create_budget(session, body, NOV + timedelta(hours=2))
    check = _check(client, NOV + timedelta(hours=2))
    assert [(b["budget_id"], b["limit_usd"], b["spent_usd"]) for b in check["budgets"]] == [
        ("b1", "1", "0.1")
    ]
    assert _copy_generation(client) != before
    # Over HTTP too (the handler's read transaction; now is later than November: a new period).
    answer = client.get("/v1/spend", params={"api_key_id": "key_b1"}).json()
    assert [(b["budget_id"], b["spent_usd"]) for b in answer["budgets"]] == [("b1", "0")]
    # The next step counts its call into the new budget (the copy loaded again).
    call(client, "c2", NOV + timedelta(hours=3), 200_000)  # $0.20
    reconcile(client, NOV + timedelta(hours=3, seconds=5))
    assert status(client, "b1", NOV + timedelta(hours=4))["spent_usd"] == "0.3"
    assert _check(client, NOV + timedelta(hours=4))["budgets"][0]["spent_usd"] == "0.3"

    change = BudgetChange.model_validate({"scope": KEY, "limit_usd": "0.25", "period": "month"})
    with write_transaction(other) as session:
        service.update_budget(session, "b1", change, NOV + timedelta(hours=4))
    check = _check(client, NOV + timedelta(hours=4))
    assert check["allowed"] is False
    assert [(b["limit_usd"], b["spent_usd"], b["state"]) for b in check["budgets"]] == [
        ("0.25", "0.3", "exceeded")
    ]
    call(client, "c3", NOV + timedelta(hours=5), 100_000)
    reconcile(client, NOV + timedelta(hours=5, seconds=5))
    assert _check(client, NOV + timedelta(hours=6))["budgets"][0]["spent_usd"] == "0.4"

    with write_transaction(other) as session:
        service.delete_budget(session, "b1", NOV + timedelta(hours=6))
    assert client.get("/v1/spend", params={"api_key_id": "key_b1"}).json()["budgets"] == []
    assert _check(client, NOV + timedelta(hours=6)) == {
        "api_key_id": "key_b1",
        "allowed": True,
        "budgets": [],
        "as_of": "2026-11-10T06:00:00Z",
    }
    # A step after the delete adds to no counter (the ended version's stays as it was).
    call(client, "c4", NOV + timedelta(hours=7), 100_000)
    reconcile(client, NOV + timedelta(hours=7, seconds=5))
    with read_transaction(other) as session:
        ended = service.list_budgets(session, include_ended=True)
    assert [(b["budget_id"], b["version"], b["ended_at"]) for b in ended] == [
        ("b1", 2, "2026-11-10T06:00:00Z")
    ]


def test_without_the_generation_row_the_versions_are_read_every_time(
    client: TestClient, other: sessionmaker[Session]
) -> None:
    price(client)
    with write_transaction(other) as session:
        session.execute(delete(BudgetGeneration))
    assert _check(client, NOV)["budgets"] == []
    assert _copy_generation(client) is None
    body = BudgetIn.model_validate(
        {"budget_id": "b1", "scope": KEY, "limit_usd": "1", "period": "month"}
    )
    with write_transaction(other) as session:
        service.create_budget(session, body, NOV)  # puts the row back: generation 1
        session.execute(delete(BudgetGeneration))
    call(client, "c1", NOV + timedelta(hours=1), 100_000)
    reconcile(client, NOV + timedelta(hours=1, seconds=5))
    assert [b["spent_usd"] for b in _check(client, NOV + timedelta(hours=2))["budgets"]] == ["0.1"]
    with write_transaction(other) as session:
        service.create_budget(session, body.model_copy(update={"budget_id": "b2"}), NOV)
    assert _copy_generation(client) is None
    assert [b["budget_id"] for b in _check(client, NOV + timedelta(hours=2))["budgets"]] == [
        "b1",
        "b2",
    ]
    assert _copy_generation(client) == 1


def test_many_budget_writes_in_one_transaction_bump_the_generation_once(
    client: TestClient, other: sessionmaker[Session]
) -> None:
    price(client)
    generation = select(BudgetGeneration.generation).where(BudgetGeneration.id == 1)
    with read_transaction(other) as session:
        before = session.scalar(generation) or 0
    with write_transaction(other) as session:
        for n in range(3):
            body = BudgetIn.model_validate(
                {"budget_id": f"b{n}", "scope": KEY, "limit_usd": "1", "period": "month"}
            )
            service.create_budget(session, body, NOV)
        service.delete_budget(session, "b2", NOV)
    with read_transaction(other) as session:
        assert session.scalar(generation) == before + 1
    # The app's copy is of that generation, with every version the transaction left in force.
    assert [b["budget_id"] for b in _check(client, NOV)["budgets"]] == ["b0", "b1"]
    assert _copy_generation(client) == before + 1
    with write_transaction(other) as session:
        service.delete_budget(session, "b1", NOV)
    with read_transaction(other) as session:
        assert session.scalar(generation) == before + 2
    assert [b["budget_id"] for b in _check(client, NOV)["budgets"]] == ["b0"]


def test_a_write_after_a_savepoint_rolled_back_bumps_the_generation_again(
    client: TestClient, other: sessionmaker[Session]
) -> None:
    price(client)

    def body(budget_id: str) -> BudgetIn:
        return BudgetIn.model_validate(
            {"budget_id": budget_id, "scope": KEY, "limit_usd": "1", "period": "month"}
        )

    with write_transaction(other) as session:
        service.create_budget(session, body("first"), NOV)
    assert [b["budget_id"] for b in _check(client, NOV)["budgets"]] == ["first"]
    with write_transaction(other) as session:
        nested = session.begin_nested()
        service.create_budget(session, body("gone"), NOV)
        nested.rollback()  # the write and its bump are undone
        service.create_budget(session, body("kept"), NOV)
    assert [b["budget_id"] for b in _check(client, NOV)["budgets"]] == ["first", "kept"]
