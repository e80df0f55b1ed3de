"""Keys, customers and plans: the charge beside the cost on every call and ledger entry, exact;
re-rating through adjustments; the keys and plans API and its roles. Source: CONTRACT "Keys,
customers and plans (v2)". Real SQLite or PostgreSQL (``BILLING_TEST_DATABASE_URL``)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.auth.tokens import create_token
from billing.dimensions import Tokens
from billing.plans.charges import apply_markup, line_charge
from billing.pricing.prices import PriceRow
from billing.reconcile.runner import run_pass
from billing.settings import Settings
from billing.storage.db import write_transaction

SONNET = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "3",
    "output_usd_per_mtok": "15",
    "cache_read_usd_per_mtok": "0.30",
    "cache_creation_usd_per_mtok": "3.75",
}
HAIKU = dict(SONNET, model="m2", input_usd_per_mtok="1", output_usd_per_mtok="5")
PRO = {"plan_id": "pro", "effective_from": "2026-01-01T00:00:00Z", "markup_pct": "20"}
GOLD = {"plan_id": "gold", "effective_from": "2026-01-01T00:00:00Z", "markup_pct": "50"}
#: A plan price of its own for m2 (and 20 % over cost for every other model).
OWN_M2 = {
    "model": "m2",
    "input_usd_per_mtok": "2",
    "output_usd_per_mtok": "10",
    "cache_read_usd_per_mtok": "0.2",
    "cache_creation_usd_per_mtok": "2.5",
}
WITH_PRICE = dict(PRO, plan_id="pro-own", prices=[OWN_M2])


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ev(eid: str, rid: str, kind: str, occurred: str, **fields: Any) -> dict[str, Any]:
    return {"event_id": eid, "request_id": rid, "type": kind, "occurred_at": occurred, **fields}


def call_events(
    rid: str, occurred: str, key: str = "key_a", model: str = "m1", inp: int = 22, out: int = 750
) -> list[dict[str, Any]]:
    """One call: started, then the upstream usage a second later (22 in, 750 out: at 3 / 15 USD
    per million tokens it costs 0.011316)."""
    later = occurred.replace(":00Z", ":01Z")
    return [
        ev(f"{rid}-s", rid, "stream.started", occurred, api_key_id=key, model=model,
           protocol="anthropic.messages"),
        ev(f"{rid}-u", rid, "stream.usage", later, input_tokens=inp, output_tokens=out,
           source="upstream"),
    ]  # fmt: skip


def ok(response: Any, *codes: int) -> dict[str, Any]:
    assert response.status_code in (codes or (200, 201)), response.text
    return dict(response.json())


def post(client: TestClient, events: list[dict[str, Any]]) -> None:
    ok(client.post("/v1/events", json={"events": events}), 200)


def reconcile(app: FastAPI, settings: Settings, now: str) -> None:
    run_pass(app.state.billing.sessions, settings, now=at(now))


def call(client: TestClient, rid: str) -> dict[str, Any]:
    return ok(client.get(f"/v1/calls/{rid}"), 200)


def charges(entries: list[dict[str, Any]]) -> Decimal:
    return sum((Decimal(e["charge_usd"]) for e in entries), Decimal(0))


@pytest.fixture
def priced(client: TestClient) -> TestClient:
    ok(client.post("/v1/prices", json=SONNET), 201)
    ok(client.post("/v1/prices", json=HAIKU), 201)
    return client


# --- the charge, exact ---------------------------------------------------------------------


def test_a_20_pct_markup_on_0_011316_charges_0_0135792(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(priced.post("/v1/plans", json=PRO), 201)
    key = {"customer_id": "acme", "plan_id": "pro", "effective_from": "2026-01-01T00:00:00Z"}
    ok(priced.put("/v1/keys/key_a", json=key), 201)
    post(priced, call_events("r1", "2026-03-01T10:00:00Z"))
    reconcile(app, settings, "2026-03-01T10:01:00Z")
    found = call(priced, "r1")
    assert (found["cost_usd"], found["charge_usd"]) == ("0.011316", "0.0135792")
    assert (found["customer_id"], found["plan_id"]) == ("acme", "pro")
    (entry,) = found["ledger_entries"]
    assert entry["kind"] == "settlement"
    assert (entry["cost_usd"], entry["charge_usd"], entry["markup_pct"]) == (
        "0.011316",
        "0.0135792",
        "20",
    )
    assert (entry["customer_id"], entry["plan_id"], entry["plan_prices"]) == ("acme", "pro", None)
    listed = ok(priced.get("/v1/calls", params={"customer_id": "acme"}), 200)["data"]
    assert [c["request_id"] for c in listed] == ["r1"]
    assert ok(priced.get("/v1/calls", params={"customer_id": "other"}), 200)["data"] == []


def test_picodollars_carry_the_markup_exactly() -> None:
    assert apply_markup(11_316_000_000, "20") == 13_579_200_000
    assert apply_markup(11_316_000_000, "12.5") == 12_730_500_000
    assert apply_markup(11_316_000_000, "-100") == 0
    assert apply_markup(-11_316_000_000, "20") == -13_579_200_000
    # A sub-picodollar remainder (a rate of 1 picodollar per token) rounds half to even.
    assert apply_markup(5, "10") == 6  # 5.5 → 6
    assert apply_markup(15, "10") == 16  # 16.5 → 16
    price = PriceRow(7, "m", at("2026-01-01T00:00:00Z"), 2_000_000, 10_000_000, 0, 0, 0)
    tokens = Tokens(input_tokens=22, output_tokens_billed=750)
    # A plan price bills the tokens at its own rates; no cost needed.
    assert line_charge(tokens, {}, None, price, None) == 22 * 2_000_000 + 750 * 10_000_000
    assert line_charge(tokens, {}, None, None, "20") is None  # no cost, no plan price: unknown
    assert line_charge(tokens, {}, 100, None, None) == 100  # no plan: the cost


def test_a_plan_price_overrides_the_markup_for_its_model_only(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(priced.post("/v1/plans", json=WITH_PRICE), 201)
    ok(priced.put("/v1/keys/key_a", json={"plan_id": "pro-own", **_SINCE_JAN}), 201)
    post(priced, call_events("on-m1", "2026-03-01T10:00:00Z", model="m1"))
    post(priced, call_events("on-m2", "2026-03-01T10:02:00Z", model="m2"))
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    m1, m2 = call(priced, "on-m1"), call(priced, "on-m2")
    assert (m1["cost_usd"], m1["charge_usd"]) == ("0.011316", "0.0135792")  # 20 % over cost
    # m2: cost 22 × 1 + 750 × 5 µ$ = 0.003772; charge at the plan's 2 / 10: 0.007544.
    assert (m2["cost_usd"], m2["charge_usd"]) == ("0.003772", "0.007544")
    (entry,) = m2["ledger_entries"]
    assert entry["markup_pct"] is None
    assert entry["plan_prices"]["input_usd_per_mtok"] == "2"
    assert entry["plan_prices"]["output_usd_per_mtok"] == "10"
    (entry,) = m1["ledger_entries"]
    assert (entry["markup_pct"], entry["plan_prices"]) == ("20", None)


_SINCE_JAN = {"effective_from": "2026-01-01T00:00:00Z"}


def test_unpriced_without_a_plan_price_has_no_charge_never_0(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(priced.post("/v1/plans", json=WITH_PRICE), 201)
    ok(priced.put("/v1/keys/key_a", json={"plan_id": "pro-own", **_SINCE_JAN}), 201)
    ok(priced.put("/v1/keys/key_b", json={"customer_id": "beta", **_SINCE_JAN}), 201)
    post(priced, call_events("no-price", "2026-03-01T10:00:00Z", model="m-new"))
    post(priced, call_events("no-plan", "2026-03-01T10:00:00Z", key="key_b", model="m-new"))
    post(priced, call_events("implicit", "2026-03-01T10:00:00Z", key="key_c", model="m-new"))
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    for rid in ("no-price", "no-plan", "implicit"):
        found = call(priced, rid)
        assert (found["cost_usd"], found["charge_usd"]) == (None, None), rid
        assert found["ledger_entries"][0]["charge_usd"] is None
    assert call(priced, "no-plan")["customer_id"] == "beta"
    assert call(priced, "implicit")["customer_id"] is None
    # A key with no plan is charged its cost; a key seen only in events too.
    post(priced, call_events("at-cost", "2026-03-01T11:00:00Z", key="key_b"))
    post(priced, call_events("implicit-cost", "2026-03-01T11:00:00Z", key="key_c"))
    reconcile(app, settings, "2026-03-01T11:05:00Z")
    for rid in ("at-cost", "implicit-cost"):
        found = call(priced, rid)
        assert (found["cost_usd"], found["charge_usd"]) == ("0.011316", "0.011316"), rid


def test_an_amount_no_entry_can_hold_is_unpriced_and_the_call_settles(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    """A cost or a charge beyond a BIGINT of picodollars (about 9.2 million USD) is none: the
    call settles ``unpriced`` (never pending forever, never a partial amount)."""
    dear = dict(SONNET, model="m-dear", input_usd_per_mtok="0", output_usd_per_mtok="100000")
    ok(priced.post("/v1/prices", json=dear), 201)
    big = {"plan_id": "big", "effective_from": "2026-01-01T00:00:00Z", "markup_pct": "100000"}
    ok(priced.post("/v1/plans", json=big), 201)
    ok(priced.put("/v1/keys/key_big", json={"plan_id": "big", **_SINCE_JAN}), 201)
    # 10,000,000 output tokens at 100,000 USD per million: 1,000,000 USD; charged 1,001 times.
    post(priced, call_events("big-charge", "2026-03-01T10:00:00Z", "key_big", "m-dear", 0, 10**7))
    # 100,000,000 output tokens: 10,000,000 USD, beyond 9,223,372.036854775807.
    post(priced, call_events("big-cost", "2026-03-01T10:00:00Z", "key_x", "m-dear", 0, 10**8))
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    charged = call(priced, "big-charge")
    assert (charged["status"], charged["cost_usd"], charged["charge_usd"]) == (
        "completed",
        "1000000",
        None,
    )
    dear_call = call(priced, "big-cost")
    assert (dear_call["status"], dear_call["cost_usd"], dear_call["charge_usd"]) == (
        "completed",
        None,
        None,
    )
    assert "unpriced" in dear_call["anomalies"]
    assert dear_call["output_tokens_billed"] == 10**8


# --- re-rating -----------------------------------------------------------------------------


def test_moving_a_key_to_another_plan_from_a_past_time_re_rates_through_adjustments(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(priced.post("/v1/plans", json=PRO), 201)
    ok(priced.post("/v1/plans", json=GOLD), 201)
    ok(priced.put("/v1/keys/key_a", json={"customer_id": "acme", "plan_id": "pro", **_SINCE_JAN}))
    post(priced, call_events("r1", "2026-03-01T10:00:00Z"))
    post(priced, call_events("r0", "2026-02-01T10:00:00Z"))  # before the move: stays at pro
    reconcile(app, settings, "2026-03-01T10:01:00Z")
    assert call(priced, "r1")["charge_usd"] == "0.0135792"
    moved = {"customer_id": "acme", "plan_id": "gold", "effective_from": "2026-03-01T00:00:00Z"}
    body = ok(priced.put("/v1/keys/key_a", json=moved), 201)
    assert [v["plan_id"] for v in body["history"]] == ["pro", "gold"]
    assert ok(priced.put("/v1/keys/key_a", json=moved), 200) == body  # the same again: a no-op
    reconcile(app, settings, "2026-03-05T12:00:00Z")
    found = call(priced, "r1")
    # 0.011316 × 1.5 = 0.016974, through a reversal and a re-rated line; the cost nets to itself.
    assert (found["cost_usd"], found["charge_usd"], found["plan_id"]) == (
        "0.011316",
        "0.016974",
        "gold",
    )
    entries = found["ledger_entries"]
    assert [(e["kind"], e["plan_id"], e["markup_pct"], e["charge_usd"]) for e in entries] == [
        ("settlement", "pro", "20", "0.0135792"),
        ("adjustment", "pro", "20", "-0.0135792"),
        ("adjustment", "gold", "50", "0.016974"),
    ]
    assert charges(entries) == Decimal("0.016974")
    assert sum(Decimal(e["cost_usd"]) for e in entries) == Decimal("0.011316")
    assert entries[2]["reason"].startswith("re-rated:")
    before = call(priced, "r0")
    assert (before["plan_id"], before["charge_usd"], len(before["ledger_entries"])) == (
        "pro",
        "0.0135792",
        1,
    )
    # Nothing more to book.
    reconcile(app, settings, "2026-03-05T13:00:00Z")
    assert len(call(priced, "r1")["ledger_entries"]) == 3


def test_a_new_plan_version_from_a_past_time_re_rates_its_keys_calls(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(priced.post("/v1/plans", json=PRO), 201)
    ok(priced.put("/v1/keys/key_a", json={"plan_id": "pro", **_SINCE_JAN}))
    post(priced, call_events("r1", "2026-03-01T10:00:00Z"))
    reconcile(app, settings, "2026-03-01T10:01:00Z")
    version = dict(PRO, effective_from="2026-02-01T00:00:00Z", markup_pct="12.5")
    ok(priced.post("/v1/plans", json=version), 201)
    reconcile(app, settings, "2026-03-02T10:00:00Z")
    found = call(priced, "r1")
    assert found["charge_usd"] == "0.0127305"  # 0.011316 × 1.125
    assert charges(found["ledger_entries"]) == Decimal("0.0127305")


# --- the API -------------------------------------------------------------------------------


def test_plans_are_versioned_same_body_no_op_different_409(priced: TestClient) -> None:
    first = ok(priced.post("/v1/plans", json=WITH_PRICE), 201)
    assert first["markup_pct"] == "20"
    assert first["prices"][0]["model"] == "m2"
    assert first["prices"][0]["input_usd_per_mtok"] == "2"
    assert ok(priced.post("/v1/plans", json=WITH_PRICE), 200) == first
    conflict = priced.post("/v1/plans", json=dict(WITH_PRICE, markup_pct="21"))
    assert conflict.status_code == 409
    assert "pro-own" in conflict.json()["error"]
    other_price = dict(WITH_PRICE, prices=[dict(OWN_M2, input_usd_per_mtok="3")])
    assert priced.post("/v1/plans", json=other_price).status_code == 409
    assert ok(priced.get("/v1/plans"), 200)["data"] == [first]
    assert ok(priced.get("/v1/plans", params={"plan_id": "none"}), 200)["data"] == []


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        (dict(PRO, markup_pct="1.00001"), "markup_pct", "decimal places"),
        (dict(PRO, markup_pct=20.5), "markup_pct", "floats"),
        (dict(PRO, markup_pct="-101"), "markup_pct", "between"),
        (dict(PRO, markup_pct="twenty"), "markup_pct", "plain decimal"),
        (dict(PRO, prices=[OWN_M2, OWN_M2]), "body", "second price"),
        ({"plan_id": "pro"}, "effective_from", "required"),
    ],
)
def test_a_bad_plan_is_422_naming_the_field(
    client: TestClient, body: dict[str, Any], path: str, words: str
) -> None:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 422, response.text
    problems = response.json()["errors"]
    assert any(path in p["path"] and words in p["message"] for p in problems), problems


def test_keys_put_get_list_and_bad_input(priced: TestClient) -> None:
    unknown = priced.put("/v1/keys/key_a", json={"plan_id": "nope"})
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["path"] == "body.plan_id"
    assert "'nope'" in unknown.json()["errors"][0]["message"]
    assert priced.get("/v1/keys/key_never").status_code == 404
    ok(priced.post("/v1/plans", json=PRO), 201)
    for i in range(5):
        body = {"customer_id": f"c{i}", "plan_id": "pro", "name": f"Key {i}", **_SINCE_JAN}
        ok(priced.put(f"/v1/keys/key_{i}", json=body), 201)
    one = ok(priced.get("/v1/keys/key_3"), 200)
    assert {k: one[k] for k in ("api_key_id", "customer_id", "plan_id", "name")} == {
        "api_key_id": "key_3",
        "customer_id": "c3",
        "plan_id": "pro",
        "name": "Key 3",
    }
    assert one["effective_from"] == "2026-01-01T00:00:00Z"
    conflict = priced.put("/v1/keys/key_3", json={"customer_id": "other", **_SINCE_JAN})
    assert conflict.status_code == 409
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = ok(priced.get("/v1/keys", params=params), 200)
        seen += [k["api_key_id"] for k in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"key_{i}" for i in range(5)]
    bad = priced.get("/v1/keys", params={"cursor": "zzz", "limit": "0", "x": "1"})
    assert bad.status_code == 422
    assert {p["path"] for p in bad.json()["errors"]} == {"query.cursor", "query.limit", "query.x"}
    # A key seen only in events exists implicitly, with no customer and no plan.
    post(priced, call_events("r1", "2026-03-01T10:00:00Z", key="key_seen"))
    seen_only = ok(priced.get("/v1/keys/key_seen"), 200)
    assert (seen_only["customer_id"], seen_only["plan_id"], seen_only["history"]) == (
        None,
        None,
        [],
    )
    # ... and is listed among the assigned keys, in order, across pages.
    post(priced, call_events("r2", "2026-03-01T10:00:00Z", key="key_2b"))
    listed: list[str] = []
    cursor = None
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        page = ok(priced.get("/v1/keys", params=params), 200)
        listed += [k["api_key_id"] for k in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert listed == ["key_0", "key_1", "key_2", "key_2b", "key_3", "key_4", "key_seen"]
    assert ok(priced.get("/v1/keys"), 200)["data"][3]["plan_id"] is None
    secret = priced.put("/v1/keys/sk-ant-api03-" + "a" * 40, json={})
    assert secret.status_code == 422
    assert secret.json()["errors"][0]["path"] == "path.api_key_id"


def test_roles_admin_writes_read_and_export_read(app: FastAPI, client: TestClient) -> None:
    now = datetime.now(UTC)
    made: dict[str, str] = {}
    with write_transaction(app.state.billing.sessions) as session:
        for role in ("admin", "read", "export", "ingest"):
            made[role], _ = create_token(session, role, f"t-{role}", now)

    def auth(role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {made[role]}"}

    assert client.post("/v1/plans", json=PRO, headers=auth("admin")).status_code == 201
    key = {"plan_id": "pro", **_SINCE_JAN}
    assert client.put("/v1/keys/key_a", json=key, headers=auth("admin")).status_code == 201
    for role in ("read", "export", "ingest"):
        assert client.post("/v1/plans", json=GOLD, headers=auth(role)).status_code == 403
        assert client.put("/v1/keys/key_b", json=key, headers=auth(role)).status_code == 403
    for role in ("read", "export", "admin"):
        for path in ("/v1/plans", "/v1/keys", "/v1/keys/key_a"):
            assert client.get(path, headers=auth(role)).status_code == 200, (role, path)
    for path in ("/v1/plans", "/v1/keys", "/v1/keys/key_a"):
        assert client.get(path, headers=auth("ingest")).status_code == 403
        assert client.get(path).status_code == 401


# --- usage and exports ---------------------------------------------------------------------

MARCH = {"since": "2026-03-01T00:00:00Z", "until": "2026-04-01T00:00:00Z"}
DAY1 = {"since": "2026-03-01T00:00:00Z", "until": "2026-03-02T00:00:00Z"}


def usage(client: TestClient, **params: str) -> list[dict[str, Any]]:
    return list(ok(client.get("/v1/usage", params={**MARCH, **params}), 200)["data"])


def test_a_customers_usage_groups_every_key_assigned_to_it(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(priced.post("/v1/plans", json=PRO), 201)
    for key in ("key_a", "key_b"):
        body = {"customer_id": "acme", "plan_id": "pro", **_SINCE_JAN}
        ok(priced.put(f"/v1/keys/{key}", json=body), 201)
    ok(priced.put("/v1/keys/key_c", json={"customer_id": "beta", **_SINCE_JAN}), 201)
    post(priced, call_events("a1", "2026-03-01T10:00:00Z", key="key_a"))
    post(priced, call_events("b1", "2026-03-02T10:07:00Z", key="key_b"))
    post(priced, call_events("c1", "2026-03-02T10:00:00Z", key="key_c"))
    post(priced, call_events("d1", "2026-03-02T10:00:00Z", key="key_d"))
    reconcile(app, settings, "2026-03-03T00:00:00Z")
    for basis in ("call_start", "booked"):
        rows = usage(priced, group_by="customer_id", basis=basis)
        found = {r["customer_id"]: (r["calls"], r["cost_usd"], r["charge_usd"]) for r in rows}
        assert found == {
            None: (1, "0.011316", "0.011316"),
            "acme": (2, "0.022632", "0.0271584"),  # 2 × 0.0135792
            "beta": (1, "0.011316", "0.011316"),
        }, basis
        (acme,) = usage(priced, customer_id="acme", basis=basis)
        assert (acme["calls"], acme["charge_usd"]) == (2, "0.0271584")
        by_key = usage(priced, customer_id="acme", group_by="api_key_id", basis=basis)
        assert [(r["api_key_id"], r["charge_usd"]) for r in by_key] == [
            ("key_a", "0.0135792"),
            ("key_b", "0.0135792"),
        ]
    # usage.csv groups and filters by customer too (the booked basis: the same figures).
    body = export(priced, "usage", **MARCH, group_by="customer_id")
    assert [(r["customer_id"], r["calls"], r["cost_usd"]) for r in csv_rows(body)] == [
        ("", "1", "0.011316"),
        ("acme", "2", "0.022632"),
        ("beta", "1", "0.011316"),
    ]
    assert body.decode().split("\r\n")[0].startswith("customer_id,calls,input_tokens,")
    only = csv_rows(export(priced, "usage", **MARCH, group_by="api_key_id", customer_id="acme"))
    assert [(r["api_key_id"], r["cost_usd"]) for r in only] == [
        ("key_a", "0.011316"),
        ("key_b", "0.011316"),
    ]
    v2 = csv_rows(export(priced, "usage", **MARCH, group_by="customer_id", format="v2"))
    assert [(r["customer_id"], r["plan_id"], r["charge_usd"]) for r in v2] == [
        ("", "", "0.011316"),
        ("acme", "pro", "0.0271584"),
        ("beta", "", "0.011316"),
    ]
    # A period off the quarter-hour grid reads the edges from the calls: the same figures.
    (acme,) = usage(
        priced, since="2026-03-01T10:00:00Z", until="2026-03-02T10:07:00.5Z", customer_id="acme"
    )
    assert (acme["calls"], acme["charge_usd"]) == (2, "0.0271584")


def export(client: TestClient, kind: str, **params: str) -> bytes:
    response = client.get(f"/v1/exports/{kind}.csv", params=params)
    assert response.status_code == 200, response.text
    return response.content


def test_a_closed_periods_exports_keep_their_bytes_and_v2_recomputes_the_charge(
    priced: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(priced.post("/v1/plans", json=PRO), 201)
    ok(priced.post("/v1/plans", json=dict(GOLD, prices=[OWN_M2])), 201)
    ok(priced.put("/v1/keys/key_a", json={"customer_id": "acme", "plan_id": "pro", **_SINCE_JAN}))
    post(priced, call_events("r1", "2026-03-01T10:00:00Z"))
    post(priced, call_events("r2", "2026-03-01T10:02:00Z", model="m2"))
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    kinds = [(kind, fmt) for kind in ("calls", "usage") for fmt in ("v1", "v2")]
    before = {(k, f): export(priced, k, **DAY1, format=f) for k, f in kinds}
    v2 = before[("calls", "v2")].decode()
    header = v2.split("\r\n")[0].split(",")
    at = header.index("cost_usd")
    assert header[at + 1 : at + 3] == ["charge_usd", "plan_input_usd_per_mtok"]
    assert "markup_pct" in header and "customer_id" in header
    # Move the key to gold (50 %, its own price for m2) from before the calls: re-rated, booked
    # in a later period.
    moved = {"customer_id": "acme", "plan_id": "gold", "effective_from": "2026-02-01T00:00:00Z"}
    ok(priced.put("/v1/keys/key_a", json=moved), 201)
    reconcile(app, settings, "2026-03-05T12:00:00Z")
    for k, f in kinds:
        assert export(priced, k, **DAY1, format=f) == before[(k, f)], (k, f)
    later = {"since": "2026-03-05T00:00:00Z", "until": "2026-03-06T00:00:00Z"}
    rows = csv_rows(export(priced, "calls", **later, format="v2"))
    assert [(r["request_id"], r["plan_id"], r["charge_usd"]) for r in rows] == [
        ("r1", "pro", "-0.0135792"),
        ("r1", "gold", "0.016974"),
        ("r2", "pro", "-0.0045264"),  # 0.003772 × 1.2
        ("r2", "gold", "0.007544"),  # gold's own m2 price: 22 × 2 + 750 × 10 µ$
    ]
    for row in [*rows, *csv_rows(before[("calls", "v2")])]:
        assert recomputed(row) == Decimal(row["charge_usd"]), row
    usage_rows = csv_rows(export(priced, "usage", **later, format="v2", group_by="model"))
    assert [(r["model"], r["plan_id"], r["charge_usd"]) for r in usage_rows] == [
        ("m1", "gold", "0.016974"),
        ("m1", "pro", "-0.0135792"),
        ("m2", "gold", "0.007544"),
        ("m2", "pro", "-0.0045264"),
    ]


def csv_rows(body: bytes) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(body.decode(), newline="")))


def recomputed(row: dict[str, str]) -> Decimal:
    """A v2 calls.csv row's charge from its own cells (CONTRACT "Keys, customers and plans")."""
    if row["plan_input_usd_per_mtok"]:
        buckets = (
            ("input_tokens", "input"),
            ("cache_read_input_tokens", "cache_read"),
            ("cache_creation_input_tokens", "cache_creation"),
            ("output_tokens_billed", "output"),
        )
        total = sum(
            Decimal(row[tokens]) * Decimal(row[f"plan_{rate}_usd_per_mtok"])
            for tokens, rate in buckets
        )
        return total / 1_000_000
    if row["markup_pct"]:
        return Decimal(row["cost_usd"]) * (1 + Decimal(row["markup_pct"]) / 100)
    return Decimal(row["cost_usd"])
