"""(#43) The Overview's budgets near their limit: ``BudgetsRepository.fullest``, the versions in
force ranked by their latest counter at or before ``now`` (settled + provisional over the
limit), fullest first, then by id; a version without such a counter, or ended, is left out."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from billing.budgets.repository import repository
from billing.storage.models import Budget, BudgetSpend

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC)
OCT, NOV, DEC = (datetime(2026, m, 1, tzinfo=UTC) for m in (10, 11, 12))
PICO = 10**12


@pytest.fixture
def session(client: TestClient) -> Iterator[Session]:
    with client.app.state.billing.sessions() as session:  # type: ignore[attr-defined]
        yield session
        session.rollback()


def _budget(session: Session, name: str, limit: str, ended: bool = False) -> int:
    row = Budget(
        budget_id=name,
        version=1,
        api_key_id=f"key-{name}",
        measure="cost",
        period="month",
        tz="UTC",
        limit_usd=limit,
        thresholds="[]",
        webhook_secret="s",
        tracked_from=OCT,
        created_at=OCT,
        ended_at=NOW if ended else None,
    )
    session.add(row)
    session.flush()
    return row.id


def _spend(session: Session, row: int, start: datetime, settled: int, held: int = 0) -> None:
    session.add(BudgetSpend(budget_row=row, period_start=start, settled_pusd=settled,
                            provisional_pusd=held))  # fmt: skip
    session.flush()


def test_the_fullest_versions_by_their_latest_counter_up_to_now(session: Session) -> None:
    half = _budget(session, "b-half", "10")
    _spend(session, half, OCT, 9 * PICO)  # an older period: not the latest
    _spend(session, half, NOV, 4 * PICO, 1 * PICO)
    over = _budget(session, "b-over", "2")
    _spend(session, over, NOV, 3 * PICO)
    # Equal fractions: by id.
    for name in ("b-tie-b", "b-tie-a"):
        _spend(session, _budget(session, name, "4"), NOV, 2 * PICO)
    future = _budget(session, "b-future", "1")
    _spend(session, future, OCT, PICO // 10)
    _spend(session, future, DEC, 5 * PICO)  # after now: not counted
    _budget(session, "b-none", "1")  # no counter: left out
    ended = _budget(session, "b-ended", "1", ended=True)
    _spend(session, ended, NOV, 9 * PICO)
    zero = _budget(session, "b-zero", "0")  # no fraction: last
    _spend(session, zero, NOV, PICO)
    repo = repository(session)
    found = [b.budget_id for b in repo.fullest(session, NOW, 10)]
    assert found == ["b-over", "b-half", "b-tie-a", "b-tie-b", "b-future", "b-zero"]
    assert [b.budget_id for b in repo.fullest(session, NOW, 3)] == found[:3]
