"""A step's read of its owners' grants (``CreditsRepository.grants``, twice a reconciliation
step on PostgreSQL, and each balance) probes each grant's void by its dedupe key: it never
scans the credit entries, which grow by a draw a call for good. As an ``EXISTS``, PostgreSQL
planned it as a hashed subplan over every credit entry (4 ms at 30,000 entries, a step's draws
of a year: seconds). Real PostgreSQL (``BILLING_TEST_DATABASE_URL``): its planner's choice."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from billing.credits.repository import repository
from billing.credits.rows import DRAW, Owner
from billing.storage.db import write_transaction
from tests.credits.helpers import ok

KEYS = [f"key_{i:03d}" for i in range(600)]
SEEN = text(
    "SELECT seq_scan, seq_tup_read FROM pg_stat_xact_user_tables WHERE relname = 'credit_entries'"
)


def test_the_grants_of_600_owners_are_read_without_a_scan_of_the_entries(
    client: TestClient, db_url: str
) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: its planner's choice for the void of each grant")
    for key in KEYS:
        body = {"grant_id": f"g-{key}", "api_key_id": key, "amount_usd": "5", "kind": "purchased"}
        ok(client.post("/v1/credits/grants", json=body), 201)
    sessions = client.app.state.billing.sessions  # type: ignore[attr-defined]
    booked = datetime(2026, 3, 1, tzinfo=UTC).isoformat()
    with write_transaction(sessions) as session:
        # 50,000 draws (a call each) of the first key's grant, as steps book them.
        rows = [
            (DRAW, booked, None, KEYS[0], f"g-{KEYS[0]}", 1, f"r{i}", 1, None, i + 1)
            for i in range(50_000)
        ]
        repository(session).insert_entries(session, rows)
        session.execute(
            text(
                "UPDATE credit_grants SET remaining_pusd = remaining_pusd - 50000 "
                "WHERE grant_id = :g"
            ),
            {"g": f"g-{KEYS[0]}"},
        )
    with sessions() as session:
        session.connection().exec_driver_sql("ANALYZE credit_grants, credit_entries")
        session.commit()
    owners = [Owner(None, key) for key in KEYS]
    with write_transaction(sessions) as session:
        before = session.execute(SEEN).one()
        grants = repository(session).grants(session, owners, lock=True)
        after = session.execute(SEEN).one()
    assert len(grants) == 600
    assert {g.grant_id: g.remaining_pusd for g in grants}[f"g-{KEYS[0]}"] == 5 * 10**12 - 50_000
    assert not any(g.voided for g in grants)
    assert after == before, "the grants' read scanned credit_entries"
    # A voided grant reads as voided.
    ok(client.post(f"/v1/credits/grants/g-{KEYS[1]}/void", json={}), 200)
    with sessions() as session:
        voided = {g.grant_id: g.voided for g in repository(session).grants(session, owners[:3])}
    assert voided == {f"g-{KEYS[0]}": False, f"g-{KEYS[1]}": True, f"g-{KEYS[2]}": False}
