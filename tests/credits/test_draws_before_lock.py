"""PostgreSQL's draws planned and inserted before the grants are locked
(``CreditsRepository.draws_before_lock``, ``billing.credits.draws.after_step``), with exact
figures: what another transaction commits between a step's first read of the grants and its
locked read either leaves the planned rows as they are (kept) or changes them (rolled back to
the savepoint and planned again from the grants as locked): the rows booked are always those of
the grants as locked (CONTRACT "Prepaid credits (v3)": priority, earliest expiry, oldest;
overdraft when the balance is short). Real PostgreSQL (``BILLING_TEST_DATABASE_URL``); SQLite
has one writer at a time and plans under its lock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.credits.repository import repository
from billing.credits.rows import DRAW, Movement, Owner
from billing.credits.sql.common import PostgresCredits
from billing.settings import Settings
from billing.storage.db import write_transaction
from tests.credits.helpers import (
    JAN,
    PRICE,
    at,
    balance,
    call,
    entries,
    grant,
    ok,
    reconcile,
    remaining,
)

ACME = Owner("acme", None)


@pytest.fixture
def acme(client: TestClient, db_url: str) -> TestClient:
    """A priced model and key_a assigned to customer acme (charged at cost), on PostgreSQL."""
    if not db_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: SQLite draws under its one writer's lock")
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    return client


@pytest.fixture
def meanwhile(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[], None]]]:
    """Work committed by another transaction just before a step's locked read of the grants
    (after its rows were planned from its first read and inserted): append a function."""
    pending: list[Callable[[], None]] = []
    real = PostgresCredits.grants

    def grants(self: PostgresCredits, session: Any, owners: Any, lock: bool = False) -> Any:
        if lock:
            while pending:
                pending.pop(0)()
        return real(self, session, owners, lock)

    monkeypatch.setattr(PostgresCredits, "grants", grants)
    yield pending
    assert not pending, "the step never locked the grants"


def _drawn_elsewhere(app: FastAPI, grant_id: str, amount_pusd: int) -> Callable[[], None]:
    """Another step's draw of ``grant_id`` (its own call), committed at once."""

    def book() -> None:
        with write_transaction(app.state.billing.sessions) as session:
            move = Movement(
                DRAW, at("2026-03-01T10:04:00Z"), ACME, grant_id, amount_pusd, "elsewhere", 1
            )
            repository(session).add(session, [move])

    return book


def test_rows_are_kept_when_the_locked_grant_still_covers_them(
    acme: TestClient, app: FastAPI, settings: Settings, meanwhile: list[Callable[[], None]]
) -> None:
    grant(acme, "g", "0.05")
    call(acme, "r1", "2026-03-01T10:00:00Z", 1000)  # 0.01
    meanwhile.append(_drawn_elsewhere(app, "g", 30_000_000_000))  # 0.03: 0.02 left, enough
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    # r1's draw was inserted before the other step's (its entry id first), and kept.
    assert entries(app)[1:] == [("draw", "g", "0.01", "r1"), ("draw", "g", "0.03", "elsewhere")]
    assert remaining(acme) == {"g": "0.01"}
    assert balance(acme)["overdraft_usd"] == "0"


def test_rows_are_planned_again_when_the_locked_grant_no_longer_covers_them(
    acme: TestClient, app: FastAPI, settings: Settings, meanwhile: list[Callable[[], None]]
) -> None:
    grant(acme, "g", "0.05")
    call(acme, "r1", "2026-03-01T10:00:00Z", 1000)  # 0.01
    meanwhile.append(_drawn_elsewhere(app, "g", 45_000_000_000))  # 0.045: 0.005 left
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    # The planned draw of 0.01 was rolled back: what is left, then an overdraft.
    assert entries(app)[1:] == [
        ("draw", "g", "0.045", "elsewhere"),
        ("draw", "g", "0.005", "r1"),
        ("overdraft", None, "0.005", "r1"),
    ]
    assert remaining(acme) == {"g": "0"}
    assert balance(acme)["overdraft_usd"] == "0.005"


def test_rows_are_planned_again_when_a_grant_drawn_first_is_posted_meanwhile(
    acme: TestClient, app: FastAPI, settings: Settings, meanwhile: list[Callable[[], None]]
) -> None:
    grant(acme, "base", "0.05")  # priority 100
    call(acme, "r1", "2026-03-01T10:00:00Z", 1500)  # 0.015
    call(acme, "r2", "2026-03-01T10:00:00Z", 1000)  # 0.01
    meanwhile.append(lambda: grant(acme, "first", "0.02", priority=1))
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    # As locked, "first" comes first: r1 takes 0.015 of it, r2 its last 0.005, then "base".
    assert entries(app)[2:] == [
        ("draw", "first", "0.015", "r1"),
        ("draw", "first", "0.005", "r2"),
        ("draw", "base", "0.005", "r2"),
    ]
    assert remaining(acme) == {"first": "0", "base": "0.045"}
