"""The charge policy for failed calls (CONTRACT "Charge policy for failed calls (v3)"): a plan's
``failure_charges`` sets what a failed call is charged; its cost never changes, and the cost the
policy left uncharged is its ``leakage_usd``, on calls, ledger entries, usage rows and the v3
exports. Real SQLite or PostgreSQL (``BILLING_TEST_DATABASE_URL``), exact figures.

``m1`` costs 3 / 15 USD per million tokens; the plan ``pf`` charges 20 % over cost, voids
upstream errors and charges a disconnected call's output only as far as delivered.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.dimensions import Tokens
from billing.plans.charges import failure_categories, failure_charge, policy_charge
from billing.pricing.prices import PriceRow
from billing.settings import Settings
from tests.plans.test_plans import SONNET, call, ev, ok, post, reconcile

JAN = "2026-01-01T00:00:00Z"
PF = {
    "plan_id": "pf",
    "effective_from": JAN,
    "markup_pct": "20",
    "failure_charges": {"upstream_error": "void", "client_disconnected": "bill_delivered"},
}
DAY = "2026-03-10"


def events(rid: str, minute: int, *middle: dict[str, Any], inp: int = 70, out: int = 260) -> list:
    """A call on key_a at 12:mm: started, ``middle``, then the upstream usage."""
    at = f"{DAY}T12:{minute:02d}:00Z"
    later = f"{DAY}T12:{minute:02d}:05Z"
    return [
        ev(f"{rid}-s", rid, "stream.started", at, api_key_id="key_a", model="m1",
           protocol="anthropic.messages"),
        *middle,
        ev(f"{rid}-u", rid, "stream.usage", later, input_tokens=inp, output_tokens=out,
           source="upstream"),
    ]  # fmt: skip


@pytest.fixture
def charged(client: TestClient, app: FastAPI, settings: Settings) -> TestClient:
    ok(client.post("/v1/prices", json=SONNET), 201)
    plan = ok(client.post("/v1/plans", json=PF), 201)
    assert plan["failure_charges"] == {
        "client_disconnected": "bill_delivered",
        "upstream_error": "void",
        "stalled": "bill",
        "estimated": "bill",
    }
    ok(client.put("/v1/keys/key_a", json={"plan_id": "pf", "effective_from": JAN}), 201)
    at = f"{DAY}T12:01:02Z"
    post(
        client,
        [
            # completed: 70 × 3 + 260 × 15 = 4,110 µ$, charged × 1.2.
            *events("ok", 1),
            # disconnected after 90 delivered: charged 70 × 3 + 90 × 15 = 1,560 µ$ × 1.2.
            *events(
                "gone", 2, ev("gone-d", "gone", "stream.client_disconnected", at,
                              output_tokens_delivered=90)
            ),
            # an upstream error: void.
            *events("err", 3, ev("err-f", "err", "stream.failed", at, error_type="api_error")),
            # stalled: billed (the default).
            *events("stall", 4, ev("stall-f", "stall", "stream.failed", at, error_type="stalled")),
        ],
    )  # fmt: skip
    reconcile(app, settings, f"{DAY}T13:00:00Z")
    return client


def test_the_policy_sets_the_charge_and_the_leakage_and_never_the_cost(
    charged: TestClient,
) -> None:
    figures = {
        rid: (c["status"], c["cost_usd"], c["charge_usd"], c["leakage_usd"])
        for rid in ("ok", "gone", "err", "stall")
        for c in [call(charged, rid)]
    }
    assert figures == {
        "ok": ("completed", "0.00411", "0.004932", "0"),
        "gone": ("client_disconnected", "0.00411", "0.001872", "0.00255"),
        "err": ("failed", "0.00411", "0", "0.00411"),
        "stall": ("failed", "0.00411", "0.004932", "0"),
    }
    gone = call(charged, "gone")
    (entry,) = gone["ledger_entries"]
    assert (entry["failure_charge"], entry["charge_usd"], entry["leakage_usd"]) == (
        "bill_delivered",
        "0.001872",
        "0.00255",
    )
    assert entry["cost_usd"] == "0.00411"
    assert [e["failure_charge"] for e in call(charged, "ok")["ledger_entries"]] == [None]
    assert [e["failure_charge"] for e in call(charged, "err")["ledger_entries"]] == ["void"]


def test_usage_rows_carry_the_leakage(charged: TestClient) -> None:
    for basis in ("call_start", "booked"):
        response = charged.get(
            "/v1/usage",
            params={"since": f"{DAY}T00:00:00Z", "until": "2026-03-11T00:00:00Z",
                    "group_by": "day", "basis": basis},
        )  # fmt: skip
        (row,) = ok(response, 200)["data"]
        # 4 × 4,110 µ$; charged 4,932 + 1,872 + 0 + 4,932; left 2,550 + 4,110.
        assert (row["calls"], row["cost_usd"], row["charge_usd"], row["leakage_usd"]) == (
            4,
            "0.01644",
            "0.011736",
            "0.00666",
        ), basis


def test_metrics_carry_the_cost_the_charge_and_the_leakage(charged: TestClient) -> None:
    """``/metrics`` (CONTRACT "Observability and standard exports (v3)"): the same totals as
    the usage rows, by model."""
    lines = charged.get("/metrics").text.splitlines()

    def sample(name: str) -> str:
        (line,) = [x for x in lines if x.startswith(f"{name}{{") and 'model="m1"' in x]
        return line.rsplit(" ", 1)[1]

    kinds = ("cost", "charge", "leakage")
    assert [sample(f"billing_{kind}_usd_total") for kind in kinds] == [
        "0.01644",
        "0.011736",
        "0.00666",
    ]


def test_the_v3_exports_carry_the_leakage_and_v2_stays_as_it_was(charged: TestClient) -> None:
    period = {"since": f"{DAY}T00:00:00Z", "until": "2026-03-11T00:00:00Z"}
    v2 = charged.get("/v1/exports/usage.csv", params={**period, "format": "v2"})
    assert v2.status_code == 200
    assert "leakage_usd" not in v2.text.splitlines()[0]
    usage = charged.get("/v1/exports/usage.csv", params={**period, "format": "v3"})
    assert usage.status_code == 200, usage.text
    (row,) = csv.DictReader(io.StringIO(usage.text))
    assert (row["cost_usd"], row["charge_usd"], row["leakage_usd"]) == (
        "0.01644",
        "0.011736",
        "0.00666",
    )
    calls = charged.get("/v1/exports/calls.csv", params={**period, "format": "v3"})
    assert calls.status_code == 200, calls.text
    rows = {r["request_id"]: r for r in csv.DictReader(io.StringIO(calls.text))}
    assert {rid: (r["failure_charge"], r["charge_usd"], r["leakage_usd"]) for rid, r in
            rows.items()} == {
        "ok": ("", "0.004932", "0"),
        "gone": ("bill_delivered", "0.001872", "0.00255"),
        "err": ("void", "0", "0.00411"),
        "stall": ("", "0.004932", "0"),
    }  # fmt: skip
    bad = charged.get("/v1/exports/calls.csv", params={**period, "format": "v4"})
    assert bad.status_code == 422


def test_a_bad_policy_is_a_422_and_nothing_is_stored(client: TestClient) -> None:
    bad = {**PF, "plan_id": "bad", "failure_charges": {"upstream_error": "refund"}}
    response = client.post("/v1/plans", json=bad)
    assert response.status_code == 422, response.text
    assert "failure_charges" in response.text
    unknown = {**PF, "plan_id": "bad", "failure_charges": {"timeout": "void"}}
    assert client.post("/v1/plans", json=unknown).status_code == 422
    assert ok(client.get("/v1/plans"), 200)["data"] == []


def test_another_policy_for_the_same_version_is_a_409(client: TestClient) -> None:
    ok(client.post("/v1/plans", json=PF), 201)
    ok(client.post("/v1/plans", json=PF), 200)
    other = {**PF, "failure_charges": {"upstream_error": "bill"}}
    assert client.post("/v1/plans", json=other).status_code == 409


def test_the_console_call_page_shows_the_charge_and_the_leakage(charged: TestClient) -> None:
    page = charged.get("/console/calls/gone")
    assert page.status_code == 200, page.text
    assert '<dd id="charge">0.001872</dd>' in page.text
    assert '<dd id="leakage">0.00255</dd>' in page.text
    assert "<td>bill_delivered</td>" in page.text


# --- the policy, pure ----------------------------------------------------------------------


@pytest.mark.nodb
@pytest.mark.parametrize(
    ("status", "error_type", "source", "categories"),
    [
        ("completed", None, "upstream", []),
        ("client_disconnected", None, "upstream", ["client_disconnected"]),
        ("failed", "api_error", "upstream", ["upstream_error"]),
        ("failed", "stalled", "estimate", ["stalled", "estimated"]),
        ("completed", None, "estimate", ["estimated"]),
    ],
)
def test_a_call_falls_in_the_categories_of_its_status_and_usage(
    status: str, error_type: str | None, source: str, categories: list[str]
) -> None:
    assert failure_categories(status, error_type, source) == categories


@pytest.mark.nodb
def test_the_policy_that_charges_least_applies() -> None:
    policy = {"client_disconnected": "bill_delivered", "estimated": "void"}
    assert failure_charge(policy, ["client_disconnected"]) == "bill_delivered"
    assert failure_charge(policy, ["client_disconnected", "estimated"]) == "void"
    assert failure_charge(policy, ["upstream_error"]) is None  # bill
    assert failure_charge(policy, []) is None


@pytest.mark.nodb
def test_bill_delivered_at_a_plan_price_charges_the_delivered_output_at_it() -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    price = PriceRow(1, "m1", when, 3_000_000, 15_000_000, 300_000, 3_750_000, 3_750_000)
    plan = PriceRow(2, "m1", when, 2_000_000, 10_000_000, 200_000, 2_500_000, 2_500_000)
    tokens = Tokens(
        input_tokens=70,
        output_tokens_billed=260,
        output_tokens_delivered=90,
        output_tokens_undelivered=170,
    )
    cost = 4_110_000_000  # 70 × 3 + 260 × 15 µ$
    assert price.cost_pusd(tokens) == cost
    # 70 × 2 + 90 × 10 = 1,040 µ$ charged; 4,110 − (70 × 3 + 90 × 15) = 2,550 µ$ left.
    assert policy_charge(tokens, None, cost, price, plan, None, "bill_delivered") == (
        1_040_000_000,
        2_550_000_000,
    )
    assert policy_charge(tokens, None, cost, price, plan, None, "void") == (0, cost)
    # bill: 70 × 2 + 260 × 10 = 2,740 µ$ at the plan's price.
    assert policy_charge(tokens, None, cost, price, plan, None, None) == (2_740_000_000, 0)
    # Unpriced: void still charges nothing; the leakage is not known.
    assert policy_charge(tokens, None, None, None, None, "20", "void") == (0, None)
    assert policy_charge(tokens, None, None, None, None, "20", "bill_delivered") == (None, None)


def test_a_new_policy_from_a_past_time_re_rates_the_settled_calls(
    charged: TestClient, app: FastAPI, settings: Settings
) -> None:
    kinder = {**PF, "effective_from": "2026-02-01T00:00:00Z"}
    kinder["failure_charges"] = {"upstream_error": "bill_delivered"}
    ok(charged.post("/v1/plans", json=kinder), 201)
    reconcile(app, settings, f"{DAY}T14:00:00Z")
    err = call(charged, "err")
    # Under bill_delivered now; with no disconnect and no delivered count it delivered what it
    # generated, so it is billed in full.
    assert (err["cost_usd"], err["charge_usd"], err["leakage_usd"]) == ("0.00411", "0.004932", "0")
    entries = [
        (e["kind"], e["failure_charge"], e["charge_usd"], e["leakage_usd"])
        for e in err["ledger_entries"]
    ]
    assert entries == [
        ("settlement", "void", "0", "0.00411"),
        ("adjustment", "void", "0", "-0.00411"),
        ("adjustment", "bill_delivered", "0.004932", "0"),
    ]
    gone = call(charged, "gone")  # disconnects are now billed in full
    assert (gone["charge_usd"], gone["leakage_usd"]) == ("0.004932", "0")
