"""Authorizations and holds (CONTRACT "Authorizations and holds (v3)"): the decision and its
reasons, a hold counted once, replaced by its call, gone at expiry or release; on SQLite and
PostgreSQL, over HTTP and through the service at a chosen instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from billing.budgets import authorize
from billing.budgets.repository import repository as budgets_repository
from billing.budgets.schemas import AuthorizationIn
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.models import BudgetHold
from tests.budgets.helpers import MODEL, call, create, price, read, reconcile, status, usage, write

T0 = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
KEY = "key_b1"
#: 50,000 input tokens at $1/M and 25,000 output tokens at $2/M: $0.10.
TENTH = {"input_tokens": 50_000, "max_output_tokens": 25_000}


def body(rid: str, estimate: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "request_id": rid,
        "api_key_id": KEY,
        "model": MODEL,
        "estimate": TENTH if estimate is None else estimate,
        **more,
    }


def auth_at(client: TestClient, at: datetime, **fields: Any) -> dict[str, Any]:
    parsed = AuthorizationIn.model_validate(body(**fields))
    out: dict[str, Any] = write(client, lambda s: authorize.authorize(s, parsed, at))
    return out


def release_at(client: TestClient, rid: str, at: datetime) -> dict[str, Any]:
    out: dict[str, Any] = write(client, lambda s: authorize.release(s, rid, at))
    return out


def held(client: TestClient, budget_id: str, at: datetime) -> tuple[str, str, str, str]:
    s = status(client, budget_id, at)
    return s["settled_usd"], s["provisional_usd"], s["held_usd"], s["spent_usd"]


def holds_stored(client: TestClient) -> int:
    return int(read(client, lambda s: s.scalar(select(func.count()).select_from(BudgetHold))))


def dollar_budget(client: TestClient, **more: Any) -> None:
    create(
        client,
        T0,
        **{"budget_id": "b1", "scope": {"api_key_id": KEY}, "limit_usd": "1", "period": "total"}
        | more,
    )


def test_an_allowed_hold_counts_once_and_a_repeat_gets_the_first_answer(
    client: TestClient,
) -> None:
    price(client)
    created = client.post(
        "/v1/budgets",
        json={"budget_id": "b1", "scope": {"api_key_id": KEY}, "limit_usd": "1", "period": "total"},
    )
    assert created.status_code == 201, created.text
    first = client.post("/v1/authorizations", json=body("r1", ttl_s=120))
    assert first.status_code == 200, first.text
    out = first.json()
    assert list(out) == [
        "request_id",
        "decision",
        "reason",
        "retryable",
        "retry_after_s",
        "hold_usd",
        "expires_at",
        "binding_budget_id",
        "budgets",
        "as_of",
    ]
    assert (out["decision"], out["reason"], out["retryable"], out["retry_after_s"]) == (
        "allow",
        None,
        False,
        None,
    )
    assert (out["hold_usd"], out["binding_budget_id"]) == ("0.1", "b1")
    expires = datetime.fromisoformat(out["expires_at"])
    assert expires - datetime.fromisoformat(out["as_of"]) == timedelta(seconds=120)
    [b] = out["budgets"]
    assert (b["held_usd"], b["spent_usd"], b["remaining_usd"], b["settled_usd"]) == (
        "0.1",
        "0.1",
        "0.9",
        "0",
    )
    again = client.post("/v1/authorizations", json=body("r1", ttl_s=120))
    assert again.status_code == 200 and again.json() == out
    spend = client.get("/v1/spend", params={"api_key_id": KEY}).json()
    [s] = spend["budgets"]
    assert (s["held_usd"], s["spent_usd"], spend["allowed"]) == ("0.1", "0.1", True)
    other = client.post("/v1/authorizations", json=body("r1", ttl_s=121))
    assert other.status_code == 409, other.text
    assert "another body" in other.json()["error"]
    assert client.get("/v1/budgets/b1").json()["held_usd"] == "0.1"
    assert holds_stored(client) == 1


def test_a_hold_is_replaced_by_its_call_from_its_first_event(client: TestClient) -> None:
    price(client)
    dollar_budget(client)
    assert auth_at(client, T0, rid="c1")["decision"] == "allow"
    assert held(client, "b1", T0) == ("0", "0", "0.1", "0.1")
    # The call's first event: no reconciliation yet, the hold stands for the call's figure.
    call(client, "c1", T0 + timedelta(seconds=1), 50_000, settled=False)
    assert held(client, "b1", T0 + timedelta(seconds=2)) == ("0", "0.1", "0", "0.1")
    # A step read the call: its own figure (50,000 input tokens: $0.05), and while it is open
    # the rest of its live hold ($0.05) is still held: it counts at no less than its hold.
    reconcile(client, T0 + timedelta(seconds=3))
    assert held(client, "b1", T0 + timedelta(seconds=4)) == ("0", "0.05", "0.05", "0.1")
    # Its hold gone (expired), the open call counts at its own figure alone.
    assert held(client, "b1", T0 + timedelta(seconds=700)) == ("0", "0.05", "0", "0.05")
    usage(client, "c1", T0 + timedelta(seconds=5), 50_000, 10_000)
    reconcile(client, T0 + timedelta(seconds=6))
    assert held(client, "b1", T0 + timedelta(seconds=7)) == ("0.07", "0", "0", "0.07")
    assert release_at(client, "c1", T0 + timedelta(seconds=8))["state"] == "converted"
    assert held(client, "b1", T0 + timedelta(seconds=9)) == ("0.07", "0", "0", "0.07")


def settled_marks(client: TestClient) -> dict[str, datetime | None]:
    rows = read(client, lambda s: s.execute(select(BudgetHold.request_id, BudgetHold.settled_at)))
    return dict(rows.all())


def test_the_holds_read_are_those_that_still_count(client: TestClient) -> None:
    # The step that settles a hold's call marks the hold settled: it is not read from then on,
    # though live until its TTL (an owner has thousands of those after thousands of calls); a
    # hold without a call, or whose call is open, is.
    price(client)
    dollar_budget(client)
    for rid in ("settles", "opens", "waits"):
        assert auth_at(client, T0, rid=rid)["decision"] == "allow"
    call(client, "settles", T0 + timedelta(seconds=1), 50_000, 10_000)
    call(client, "opens", T0 + timedelta(seconds=1), 50_000, settled=False)
    reconcile(client, T0 + timedelta(seconds=2))
    at = T0 + timedelta(seconds=3)
    found = read(client, lambda s: budgets_repository(s).live_holds(s, at, [KEY], [], False))
    assert sorted((h.request_id, h.call, h.hold_pusd, h.beyond_call("cost")) for h in found) == [
        ("opens", "open", 10**11, 5 * 10**10),
        ("waits", None, 10**11, 0),
    ]
    # settled $0.07; the open call's $0.05 and the rest of its hold, $0.05; the waiting $0.10.
    assert held(client, "b1", at) == ("0.07", "0.05", "0.15", "0.27")
    assert settled_marks(client) == {
        "settles": T0 + timedelta(seconds=2),
        "opens": None,
        "waits": None,
    }
    # The open call settles: its hold too (the waiting one has no call).
    usage(client, "opens", T0 + timedelta(seconds=4), 50_000, 10_000)
    reconcile(client, T0 + timedelta(seconds=5))
    assert settled_marks(client) == {
        "settles": T0 + timedelta(seconds=2),
        "opens": T0 + timedelta(seconds=5),
        "waits": None,
    }
    at = T0 + timedelta(seconds=6)
    found = read(client, lambda s: budgets_repository(s).live_holds(s, at, [KEY], [], False))
    assert [(h.request_id, h.call) for h in found] == [("waits", None)]
    assert held(client, "b1", at) == ("0.14", "0", "0.1", "0.24")


def test_expired_and_released_holds_stop_counting_at_once(client: TestClient) -> None:
    price(client)
    dollar_budget(client)
    auth_at(client, T0, rid="r-exp", ttl_s=10)
    auth_at(client, T0, rid="r-del", ttl_s=600, estimate={"amount_usd": "0.25"})
    assert held(client, "b1", T0 + timedelta(seconds=9)) == ("0", "0", "0.35", "0.35")
    assert held(client, "b1", T0 + timedelta(seconds=10)) == ("0", "0", "0.25", "0.25")
    released = release_at(client, "r-del", T0 + timedelta(seconds=11))
    assert released == {
        "request_id": "r-del",
        "state": "released",
        "hold_usd": "0.25",
        "expires_at": "2026-11-10T12:10:00Z",
        "released_at": "2026-11-10T12:00:11Z",
    }
    assert held(client, "b1", T0 + timedelta(seconds=11)) == ("0", "0", "0", "0")
    assert release_at(client, "r-del", T0 + timedelta(seconds=20)) == released
    assert release_at(client, "r-exp", T0 + timedelta(seconds=20))["state"] == "expired"
    # A call that comes after its hold was released counts only itself ($0.10, not $0.25).
    call(client, "r-del", T0 + timedelta(seconds=30), 100_000, settled=False)
    assert held(client, "b1", T0 + timedelta(seconds=31)) == ("0", "0.1", "0", "0.1")
    assert client.delete("/v1/authorizations/nope").status_code == 404


def test_denials_say_whether_to_retry(client: TestClient) -> None:
    price(client)
    dollar_budget(client)
    first = auth_at(client, T0, rid="a1", ttl_s=30, estimate={"amount_usd": "0.6"})
    assert (first["decision"], first["hold_usd"]) == ("allow", "0.6")
    busy = auth_at(client, T0 + timedelta(seconds=5), rid="a2", estimate={"amount_usd": "0.6"})
    assert {k: busy[k] for k in list(busy)[:8]} == {
        "request_id": "a2",
        "decision": "deny",
        "reason": "insufficient_headroom",
        "retryable": True,
        "retry_after_s": 25,
        "hold_usd": "0",
        "expires_at": None,
        "binding_budget_id": "b1",
    }
    assert busy["budgets"][0]["held_usd"] == "0.6"
    big = auth_at(client, T0 + timedelta(seconds=5), rid="a3", estimate={"amount_usd": "1.5"})
    assert (big["reason"], big["retryable"], big["retry_after_s"]) == (
        "estimate_exceeds_limit",
        False,
        None,
    )
    # Once the first hold expired, the second one fits: the retry decides again.
    retried = auth_at(client, T0 + timedelta(seconds=30), rid="a2", estimate={"amount_usd": "0.6"})
    assert (retried["decision"], retried["hold_usd"]) == ("allow", "0.6")
    # Spent (not held) reaching the limit is final.
    call(client, "c-big", T0 + timedelta(seconds=40), 1_000_000)
    reconcile(client, T0 + timedelta(seconds=41))
    spent = auth_at(client, T0 + timedelta(seconds=42), rid="a4", estimate={"amount_usd": "0"})
    assert (spent["reason"], spent["retryable"], spent["binding_budget_id"]) == (
        "budget_exceeded",
        False,
        "b1",
    )
    assert holds_stored(client) == 2


def test_an_unpriced_model_holds_nothing_unless_a_budget_denies_it(client: TestClient) -> None:
    dollar_budget(client)
    out = auth_at(client, T0, rid="u1")
    assert (out["decision"], out["reason"], out["hold_usd"], out["binding_budget_id"]) == (
        "allow",
        "unpriced",
        "0",
        "b1",
    )
    # A USD estimate needs no price to hold.
    priced = auth_at(client, T0, rid="u0", estimate={"amount_usd": "0.2"})
    assert (priced["decision"], priced["reason"], priced["hold_usd"]) == ("allow", None, "0.2")
    create(
        client,
        T0,
        budget_id="b2",
        scope={"all": True},
        limit_usd="5",
        period="day",
        unpriced="deny",
    )
    denied = auth_at(client, T0, rid="u2")
    assert (denied["decision"], denied["reason"], denied["retryable"]) == (
        "deny",
        "unpriced",
        False,
    )
    assert denied["binding_budget_id"] == "b2"
    assert [b["budget_id"] for b in denied["budgets"]] == ["b1", "b2"]
    # But its call would book no cost: a budget that denies unpriced models denies it too.
    amount = auth_at(client, T0, rid="u3", estimate={"amount_usd": "0.2"})
    assert (amount["decision"], amount["reason"], amount["binding_budget_id"]) == (
        "deny",
        "unpriced",
        "b2",
    )


def test_the_long_context_price_prices_an_estimate_that_crosses_it(client: TestClient) -> None:
    price(
        client,
        long_context={  # type: ignore[arg-type]
            "above_input_tokens": 200_000,
            "input_usd_per_mtok": "2",
            "output_usd_per_mtok": "3",
            "cache_read_usd_per_mtok": "0",
            "cache_creation_usd_per_mtok": "0",
        },
    )
    short = auth_at(
        client, T0, rid="l1", estimate={"input_tokens": 200_000, "max_output_tokens": 0}
    )
    long = auth_at(
        client, T0, rid="l2", estimate={"input_tokens": 200_001, "max_output_tokens": 1_000}
    )
    # 200,000 × $1/M; 200,001 × $2/M + 1,000 × $3/M.
    assert (short["hold_usd"], long["hold_usd"]) == ("0.2", "0.403002")


def test_the_spend_check_right_after_the_first_event_counts_the_call_not_its_hold(
    client: TestClient,
) -> None:
    price(client)
    dollar_budget(client)
    assert client.post("/v1/authorizations", json=body("h1")).json()["hold_usd"] == "0.1"
    now = datetime.now(UTC)
    call(client, "h1", now, 50_000, settled=False)
    [s] = client.get("/v1/spend", params={"api_key_id": KEY}).json()["budgets"]
    assert (s["settled_usd"], s["provisional_usd"], s["held_usd"], s["spent_usd"]) == (
        "0",
        "0.1",
        "0",
        "0.1",
    )
    reconcile(client, datetime.now(UTC))
    [s] = client.get("/v1/spend", params={"api_key_id": KEY}).json()["budgets"]
    assert (s["provisional_usd"], s["held_usd"], s["spent_usd"]) == ("0.05", "0.05", "0.1")


def test_the_spend_check_right_after_an_ingest_counts_a_call_no_step_has_read(
    client: TestClient,
) -> None:
    price(client)
    dollar_budget(client)
    create(client, T0, budget_id="b-all", scope={"all": True}, limit_usd="5", period="total")
    create(
        client,
        T0,
        budget_id="b-other",
        scope={"api_key_id": "key_x"},
        limit_usd="1",
        period="total",
    )
    # 300,000 input tokens at $1/M and 10,000 generated at $2/M: $0.32, before any step.
    call(client, "o1", datetime.now(UTC), 300_000, settled=False, generated=10_000)
    check = client.get("/v1/spend", params={"api_key_id": KEY}).json()
    assert [
        (b["budget_id"], b["settled_usd"], b["provisional_usd"], b["spent_usd"])
        for b in check["budgets"]
    ] == [("b-all", "0", "0.32", "0.32"), ("b1", "0", "0.32", "0.32")]
    assert client.get("/v1/budgets/b-other").json()["spent_usd"] == "0"
    # The authorization right after sees it too: $0.32 + $0.10 held.
    out = client.post("/v1/authorizations", json=body("o2")).json()
    assert [(b["budget_id"], b["spent_usd"]) for b in out["budgets"]] == [
        ("b-all", "0.42"),
        ("b1", "0.42"),
    ]
    # A step reads the call: its own figure replaces the estimate (the same here), never both.
    reconcile(client, datetime.now(UTC))
    [s] = client.get("/v1/spend", params={"api_key_id": KEY}).json()["budgets"][1:]
    assert (s["provisional_usd"], s["held_usd"], s["spent_usd"]) == ("0.32", "0.1", "0.42")


def test_an_unreachable_database_is_a_503_with_retry_after(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = app.state.billing

    def unreachable(*args: Any) -> None:
        raise OperationalError("SELECT budget_holds", {}, Exception("connection reset by peer"))

    repo = budgets_repository(state.sessions.kw["bind"])
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        dollar_budget(client)
        monkeypatch.setattr(repo, "spend_reads", unreachable)
        for reply in (
            client.post("/v1/authorizations", json=body("down", estimate={"amount_usd": "0.1"})),
            client.get("/v1/spend", params={"api_key_id": KEY}),
        ):
            assert reply.status_code == 503, reply.text
            assert int(reply.headers["Retry-After"]) >= 1
        monkeypatch.setattr(repo, "hold", unreachable)
        reply = client.delete("/v1/authorizations/down")
        assert reply.status_code == 503 and int(reply.headers["Retry-After"]) >= 1
        monkeypatch.undo()
        assert holds_stored(client) == 0


def test_a_customer_budget_counts_its_keys_calls_from_their_ingest(client: TestClient) -> None:
    price(client)
    for key in (KEY, "key_b2"):
        assigned = client.put(
            f"/v1/keys/{key}",
            json={"customer_id": "acme", "effective_from": "2026-01-01T00:00:00Z"},
        )
        assert assigned.status_code in (200, 201), assigned.text
    create(
        client, T0, budget_id="b-acme", scope={"customer_id": "acme"}, limit_usd="1", period="total"
    )
    now = datetime.now(UTC)
    call(client, "k2-call", now, 200_000, settled=False, key="key_b2")  # $0.20, not stepped
    call(client, "other", now, 400_000, settled=False, key="key_nobody")  # no customer
    [s] = client.get("/v1/spend", params={"api_key_id": KEY}).json()["budgets"]
    assert (s["budget_id"], s["provisional_usd"], s["spent_usd"]) == ("b-acme", "0.2", "0.2")
    reconcile(client, datetime.now(UTC))
    [s] = client.get("/v1/spend", params={"api_key_id": KEY}).json()["budgets"]
    assert (s["provisional_usd"], s["spent_usd"]) == ("0.2", "0.2")


def test_a_hold_survives_a_restart_of_the_service(settings: Settings) -> None:
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as first:
        price(first)
        dollar_budget(first)
        out = first.post("/v1/authorizations", json=body("r-restart"))
        assert out.json()["hold_usd"] == "0.1"
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as second:
        assert second.get("/v1/budgets/b1").json()["held_usd"] == "0.1"
        assert second.post("/v1/authorizations", json=body("r-restart")).json() == out.json()


def test_a_repeat_gets_its_first_answer_though_it_would_now_be_denied(
    client: TestClient,
) -> None:
    price(client)
    dollar_budget(client)
    whole = {"input_tokens": 1_000_000, "max_output_tokens": 0}  # $1: the whole budget
    first = client.post("/v1/authorizations", json=body("r-all", whole))
    assert (first.status_code, first.json()["decision"], first.json()["hold_usd"]) == (
        200,
        "allow",
        "1",
    )
    # Decided again now it would be denied (no headroom left): the first answer instead.
    again = client.post("/v1/authorizations", json=body("r-all", whole))
    assert (again.status_code, again.json()) == (200, first.json())
    other = client.post("/v1/authorizations", json=body("r-all", TENTH))
    assert other.status_code == 409, other.text
    denied = client.post("/v1/authorizations", json=body("r-next", TENTH)).json()
    assert (denied["decision"], denied["reason"], denied["retryable"]) == (
        "deny",
        "insufficient_headroom",
        True,
    )
    assert holds_stored(client) == 1
