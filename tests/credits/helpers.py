"""Helpers of the credits tests: a priced model, calls posted over HTTP, reconciliation at a
chosen instant, and the credit entries as booked."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.pool import NullPool

from billing.credits.schemas import GrantIn
from billing.credits.service import post_grant
from billing.reconcile.runner import run_pass
from billing.settings import Settings
from billing.storage.db import read_transaction, write_transaction
from billing.storage.models import CreditEntry

#: 1 USD per million input tokens, 10 USD per million output tokens: 1,000 output tokens cost
#: 0.01 USD, 1,500 cost 0.015.
PRICE = {
    "model": "m-credit",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "1",
    "output_usd_per_mtok": "10",
    "cache_read_usd_per_mtok": "0",
    "cache_creation_usd_per_mtok": "0",
}
JAN = "2026-01-01T00:00:00Z"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ok(response: Any, *codes: int) -> dict[str, Any]:
    assert response.status_code in (codes or (200, 201)), response.text
    return dict(response.json())


def call(client: TestClient, rid: str, started: str, out: int, key: str = "key_a") -> None:
    """One settled call of ``key``: started, then its upstream usage (0 input, ``out`` output)."""
    later = started.replace(":00Z", ":01Z")
    events = [
        {"event_id": f"{rid}-s", "request_id": rid, "type": "stream.started",
         "occurred_at": started, "api_key_id": key, "model": "m-credit",
         "protocol": "anthropic.messages"},
        {"event_id": f"{rid}-u", "request_id": rid, "type": "stream.usage", "occurred_at": later,
         "input_tokens": 0, "output_tokens": out, "source": "upstream"},
    ]  # fmt: skip
    ok(client.post("/v1/events", json={"events": events}), 200)


def reconcile(app: FastAPI, settings: Settings, now: str) -> None:
    run_pass(app.state.billing.sessions, settings, now=at(now))


def grant(
    client: TestClient, grant_id: str, amount: str, now: str | None = None, **fields: Any
) -> dict[str, Any]:
    """Post a grant (of acme unless an owner is given) over HTTP; with ``now``, through the
    service at that instant instead (the HTTP clock is the wall clock)."""
    body = {"grant_id": grant_id, "amount_usd": amount, "kind": "purchased",
            "effective_at": JAN, **fields}  # fmt: skip
    if "api_key_id" not in body and "customer_id" not in body:
        body["customer_id"] = "acme"
    if now is None:
        return ok(client.post("/v1/credits/grants", json=body), 201)
    state = client.app.state.billing  # type: ignore[attr-defined]
    with write_transaction(state.sessions) as session:
        answer, created = post_grant(session, GrantIn.model_validate(body), at(now))
    assert created
    return answer


def balance(client: TestClient, **owner: str) -> dict[str, Any]:
    return ok(client.get("/v1/credits/balance", params=owner or {"customer_id": "acme"}), 200)


def remaining(client: TestClient, **owner: str) -> dict[str, str]:
    return {g["grant_id"]: g["remaining_usd"] for g in balance(client, **owner)["grants"]}


def entries(app: FastAPI) -> list[tuple[str, str | None, str, str | None]]:
    """Every credit entry: (kind, grant, amount in USD, call), in booking order."""
    from billing.money import pusd_to_str

    with read_transaction(app.state.billing.sessions) as session:
        rows = session.scalars(select(CreditEntry).order_by(CreditEntry.entry_id))
        return [(r.kind, r.grant_id, str(pusd_to_str(r.amount_pusd)), r.request_id) for r in rows]


def kept_sums(url: str) -> tuple[dict[str, int], dict[str, int]]:
    """The remainders and overdrafts the database keeps (``credit_grants.remaining_pusd``,
    ``credit_overdrafts``), each checked equal to the sum of its credit entries (the proof): by
    grant, and by owner (``customer:<id>`` / ``key:<id>``) of the entries of no grant."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:

            def pairs(sql: str) -> dict[str, int]:
                return {str(k): int(v) for k, v in conn.execute(text(sql))}

            kept = pairs("SELECT grant_id, remaining_pusd FROM credit_grants")
            summed = pairs(
                "SELECT g.grant_id, coalesce(sum(CASE WHEN e.kind = 'grant' THEN "
                "e.amount_pusd ELSE -e.amount_pusd END), 0) FROM credit_grants g "
                "LEFT JOIN credit_entries e ON e.grant_id = g.grant_id GROUP BY g.grant_id"
            )

            def joined(sql: str) -> dict[str, int]:
                # Sums past 2**63 in two parts (SQLite's integers overflow), joined here.
                return {
                    str(k): int(high) * 10**12 + int(low)
                    for k, high, low in conn.execute(text(sql))
                }

            overdrafts = joined(
                "SELECT owner, overdraft_whole_usd, overdraft_pusd FROM credit_overdrafts"
            )
            owed = joined(
                "SELECT CASE WHEN customer_id IS NOT NULL THEN 'customer:' || customer_id "
                "ELSE 'key:' || api_key_id END, sum(amount_pusd / 1000000000000), "
                "sum(amount_pusd % 1000000000000) FROM credit_entries "
                "WHERE grant_id IS NULL GROUP BY 1"
            )
    finally:
        engine.dispose()
    assert kept == summed
    assert overdrafts == owed
    return kept, overdrafts
