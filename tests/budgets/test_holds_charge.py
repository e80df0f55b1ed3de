"""A hold reserves what its call can cost in every measure it is counted in (issue #39; CONTRACT
"Authorizations and holds (v3)", "Budgets and alerts (v2)", "Plans (v2)"): the larger of the
estimate's cost and its charge under the key's plan in force. Under a 20 % markup a token
estimate holds its charge and a charge budget admits only as many holds as their charges fit;
under a discount it holds its cost. An open call not yet stepped counts at its charge in a
charge budget, as after the step. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from billing.budgets import authorize
from billing.budgets.schemas import AuthorizationIn
from tests.budgets.helpers import MODEL, call, create, price, reconcile, status, write

T0 = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
KEY = "key_h39"
SINCE = "2026-01-01T00:00:00Z"
#: 50,000 input tokens at $1/M and 25,000 output tokens at $2/M: $0.10 of cost.
TENTH = {"input_tokens": 50_000, "max_output_tokens": 25_000}


def _plan(client: TestClient, plan_id: str, markup: str) -> None:
    body = {"plan_id": plan_id, "effective_from": SINCE, "markup_pct": markup}
    out = client.post("/v1/plans", json=body)
    assert out.status_code in (200, 201), out.text
    assign = {"customer_id": "acme", "plan_id": plan_id, "effective_from": SINCE}
    out = client.put(f"/v1/keys/{KEY}", json=assign)
    assert out.status_code in (200, 201), out.text


def _budget(client: TestClient, measure: str, limit: str = "1", budget_id: str = "b1") -> None:
    create(
        client,
        T0,
        budget_id=budget_id,
        scope={"customer_id": "acme"},
        limit_usd=limit,
        period="total",
        measure=measure,
    )


def _auth(client: TestClient, rid: str, at: datetime = T0, **more: Any) -> dict[str, Any]:
    body = {"request_id": rid, "api_key_id": KEY, "model": MODEL, "estimate": TENTH, **more}
    parsed = AuthorizationIn.model_validate(body)
    out: dict[str, Any] = write(client, lambda s: authorize.authorize(s, parsed, at))
    return out


def test_a_markup_plan_holds_the_charge_of_the_estimate(client: TestClient) -> None:
    price(client)
    _plan(client, "plus20", "20")
    _budget(client, "charge")
    _budget(client, "cost", budget_id="b2")
    out = _auth(client, "r1")
    assert (out["decision"], out["hold_usd"]) == ("allow", "0.12")
    # One stored amount, counted alike in both measures: never below either.
    assert status(client, "b1", T0)["held_usd"] == "0.12"
    assert status(client, "b2", T0)["held_usd"] == "0.12"
    # Over HTTP too (the wall clock): the answer's hold is the charge.
    http = {"request_id": "r2", "api_key_id": KEY, "model": MODEL, "estimate": TENTH}
    answer = client.post("/v1/authorizations", json=http)
    assert (answer.status_code, answer.json()["hold_usd"]) == (200, "0.12")


def test_a_charge_budget_of_a_dollar_admits_eight_holds_of_a_twelve_cent_charge(
    client: TestClient,
) -> None:
    price(client)
    _plan(client, "plus20", "20")
    _budget(client, "charge")
    answers = [_auth(client, f"r{i}") for i in range(10)]
    decisions = [(a["decision"], a["reason"], a["hold_usd"]) for a in answers]
    assert decisions == [("allow", None, "0.12")] * 8 + [("deny", "insufficient_headroom", "0")] * 2
    s = status(client, "b1", T0)
    assert (s["held_usd"], s["spent_usd"], s["remaining_usd"]) == ("0.96", "0.96", "0.04")


def test_a_discount_plan_holds_the_cost(client: TestClient) -> None:
    price(client)
    _plan(client, "minus20", "-20")
    _budget(client, "cost")
    answers = [_auth(client, f"r{i}") for i in range(11)]
    assert [a["hold_usd"] for a in answers[:10]] == ["0.1"] * 10
    assert (answers[10]["decision"], answers[10]["reason"]) == ("deny", "insufficient_headroom")
    assert status(client, "b1", T0)["held_usd"] == "1"


def test_a_key_without_a_plan_holds_the_cost(client: TestClient) -> None:
    price(client)
    out = client.put(f"/v1/keys/{KEY}", json={"customer_id": "acme", "effective_from": SINCE})
    assert out.status_code in (200, 201), out.text
    _budget(client, "charge")
    assert _auth(client, "r1")["hold_usd"] == "0.1"


def test_an_open_call_not_yet_stepped_counts_at_its_charge_in_a_charge_budget(
    client: TestClient,
) -> None:
    price(client)
    _plan(client, "plus20", "20")
    _budget(client, "charge")
    _budget(client, "cost", budget_id="b2")
    # 250 input tokens at $1/M: $0.00025 of cost, $0.0003 of charge; no authorization.
    call(client, "c1", T0, 250, key=KEY, settled=False)
    later = T0 + timedelta(seconds=1)
    assert status(client, "b1", later)["provisional_usd"] == "0.0003"
    assert status(client, "b2", later)["provisional_usd"] == "0.00025"
    reconcile(client, T0 + timedelta(seconds=2))
    after = T0 + timedelta(seconds=3)
    assert status(client, "b1", after)["provisional_usd"] == "0.0003"
    assert status(client, "b2", after)["provisional_usd"] == "0.00025"


# The key's plan is read by the spend check's statement and its versions kept per process
# (``billing.plans.cache``): a change committed after an authorization is used by the next.


def test_a_plan_assigned_after_a_first_authorization_holds_the_next_at_its_charge(
    client: TestClient,
) -> None:
    price(client)
    out = client.put(f"/v1/keys/{KEY}", json={"customer_id": "acme", "effective_from": SINCE})
    assert out.status_code in (200, 201), out.text
    body = {"plan_id": "plus20", "effective_from": SINCE, "markup_pct": "20"}
    assert client.post("/v1/plans", json=body).status_code in (200, 201)
    _budget(client, "charge")
    assert _auth(client, "r1")["hold_usd"] == "0.1"
    assign = {"customer_id": "acme", "plan_id": "plus20", "effective_from": "2026-11-01T00:00:00Z"}
    out = client.put(f"/v1/keys/{KEY}", json=assign)
    assert out.status_code in (200, 201), out.text
    assert _auth(client, "r2")["hold_usd"] == "0.12"
    # Back to no plan, from a later time: the next one holds the cost again.
    back = {"customer_id": "acme", "effective_from": "2026-11-05T00:00:00Z"}
    assert client.put(f"/v1/keys/{KEY}", json=back).status_code in (200, 201)
    assert _auth(client, "r3")["hold_usd"] == "0.1"
    assert status(client, "b1", T0)["held_usd"] == "0.32"


def test_a_plan_version_added_after_a_first_authorization_is_the_next_ones(
    client: TestClient,
) -> None:
    price(client)
    _plan(client, "plus20", "20")
    _budget(client, "charge", limit="10")
    assert _auth(client, "r1")["hold_usd"] == "0.12"
    body = {"plan_id": "plus20", "effective_from": "2026-11-01T00:00:00Z", "markup_pct": "50"}
    assert client.post("/v1/plans", json=body).status_code in (200, 201)
    assert _auth(client, "r2")["hold_usd"] == "0.15"
    # A version from after the authorization's time is not in force at it, though loaded.
    later = T0 + timedelta(hours=1)
    body = {"plan_id": "plus20", "effective_from": "2026-11-10T12:30:00Z", "markup_pct": "100"}
    assert client.post("/v1/plans", json=body).status_code in (200, 201)
    assert _auth(client, "r3")["hold_usd"] == "0.15"
    assert _auth(client, "r4", at=later)["hold_usd"] == "0.2"
    # Its own price for the model, in a version after those: the plan's price is the charge.
    own = {
        "plan_id": "plus20",
        "effective_from": "2026-11-10T12:45:00Z",
        "markup_pct": "0",
        "prices": [
            {
                "model": MODEL,
                "input_usd_per_mtok": "3",
                "output_usd_per_mtok": "0",
                "cache_read_usd_per_mtok": "0",
                "cache_creation_usd_per_mtok": "0",
            }
        ],
    }
    out = client.post("/v1/plans", json=own)
    assert out.status_code in (200, 201), out.text
    # 50,000 input tokens at $3/M: $0.15 of charge against $0.10 of cost.
    assert _auth(client, "r5", at=later)["hold_usd"] == "0.15"
