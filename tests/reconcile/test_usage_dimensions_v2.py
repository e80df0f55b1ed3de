"""Usage dimensions (v2) end to end through HTTP and the database: what each dimension bills,
in exact figures (CONTRACT "Usage dimensions (v2)", "Reconciliation", "Cost").

The streams are written here from the documented shapes (the taps turn Anthropic
``usage.iterations``, ``server_tool_use``, ``cache_creation.ephemeral_1h_input_tokens``, OpenAI
``service_tier`` into the ``stream.usage`` fields posted below). Prices, in USD per million
tokens: ``m1`` 3 / 15 / 0.3 / 3.75 and one-hour writes 6, web search 0.01 per request, above
200,000 context tokens 6 / 22.5 / 0.6 / 7.5 (one-hour 12); ``m1`` at tier ``priority`` 5 / 25 /
0.5 / 6.25; the advisor ``m-adv`` 15 / 75 / 1.5 / 18.75 with no one-hour or unit price;
``m-tier`` has only a ``priority`` price.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.builders import disconnect, started, tokens, usage
from tests.reconcile.test_reconcile_late_events import assert_ledger_is_the_call, get, post
from tests.reconcile.test_reconcile_late_events import reconcile as reconcile_now
from tests.reconcile.test_reconcile_scenarios import settle_due

FROM = "2026-01-01T00:00:00Z"
M1 = {
    "model": "m1",
    "effective_from": FROM,
    "input_usd_per_mtok": "3",
    "output_usd_per_mtok": "15",
    "cache_read_usd_per_mtok": "0.3",
    "cache_creation_usd_per_mtok": "3.75",
    "cache_creation_1h_usd_per_mtok": "6",
    "unit_prices": {"web_search_requests": "0.01"},
    "long_context": {
        "above_input_tokens": 200_000,
        "input_usd_per_mtok": "6",
        "output_usd_per_mtok": "22.5",
        "cache_read_usd_per_mtok": "0.6",
        "cache_creation_usd_per_mtok": "7.5",
        "cache_creation_1h_usd_per_mtok": "12",
    },
}
M1_PRIORITY = {
    "model": "m1",
    "service_tier": "priority",
    "effective_from": FROM,
    "input_usd_per_mtok": "5",
    "output_usd_per_mtok": "25",
    "cache_read_usd_per_mtok": "0.5",
    "cache_creation_usd_per_mtok": "6.25",
}
ADVISOR = {
    "model": "m-adv",
    "effective_from": FROM,
    "input_usd_per_mtok": "15",
    "output_usd_per_mtok": "75",
    "cache_read_usd_per_mtok": "1.5",
    "cache_creation_usd_per_mtok": "18.75",
}
TIER_ONLY = {**M1_PRIORITY, "model": "m-tier"}


@pytest.fixture
def priced(client: TestClient) -> TestClient:
    for price in (M1, M1_PRIORITY, ADVISOR, TIER_ONLY):
        response = client.post("/v1/prices", json=price)
        assert response.status_code == 201, response.text
    return client


def settle(client: TestClient, rid: str, *events: dict[str, Any]) -> dict[str, Any]:
    """Post one call's events, reconcile (the fast path runs first), return the call."""
    post(client, *events)
    reconcile_now(client)
    call = get(client, rid)
    assert call["settled"] is True, call
    assert_ledger_is_the_call(call)
    return call


def lines(call: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(e["model"], e["cost_usd"]) for e in call["ledger_entries"]]


def test_two_compaction_iterations_are_billed_as_their_sum(priced: TestClient) -> None:
    # Iterations: compaction (input 1,800, output 350) and the message (input 240, output 95),
    # both on m1: the usage carries their sum; the top-level counts alone would be the last.
    call = settle(priced, "cmp", started("s", "cmp"), usage("u", 2040, 445, rid="cmp", at=3))
    assert (call["input_tokens"], call["output_tokens_billed"]) == (2040, 445)
    assert call["cost_usd"] == "0.012795"  # 2,040 × 3 + 445 × 15 µ$


def test_an_advisor_iteration_is_priced_at_its_own_model_in_a_second_line(
    priced: TestClient,
) -> None:
    advisor = {"model": "m-adv", "input_tokens": 900, "output_tokens": 60}
    advisor["cache_read_input_tokens"] = 100
    call = settle(
        priced,
        "adv",
        started("s", "adv"),
        usage("u", 500, 120, rid="adv", at=2, other_models=[advisor]),
    )
    # m1: 500 × 3 + 120 × 15 = 3,300 µ$; m-adv: 900 × 15 + 60 × 75 + 100 × 1.5 = 18,150 µ$.
    assert sorted(lines(call)) == [("m-adv", "0.01815"), ("m1", "0.0033")]
    assert call["cost_usd"] == "0.02145"
    assert call["other_models"] == [
        {
            "model": "m-adv",
            "input_tokens": 900,
            "output_tokens": 60,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 0,
        }
    ]
    # v3: the call's top-level figures are those billed at its model; the advisor's tokens
    # appear only under other_models (and in the cost).
    assert (call["input_tokens"], call["output_tokens_billed"]) == (500, 120)
    assert (call["output_tokens_delivered"], call["output_tokens_undelivered"]) == (120, 0)


def test_three_web_search_requests_at_one_cent_each(priced: TestClient) -> None:
    units = {"web_search_requests": 3}
    call = settle(
        priced, "ws", started("s", "ws"), usage("u", 100, 50, rid="ws", at=2, units=units)
    )
    # 100 × 3 + 50 × 15 = 1,050 µ$, plus 3 × $0.01.
    assert call["cost_usd"] == "0.03105"
    assert call["units"] == units
    (entry,) = call["ledger_entries"]
    assert entry["units"] == units
    assert entry["unit_prices"] == {"web_search_requests": "0.01"}


def test_one_hour_cache_writes_at_their_price_five_minute_ones_at_the_default(
    priced: TestClient,
) -> None:
    call = settle(
        priced,
        "c1h",
        started("s", "c1h"),
        usage(
            "u",
            10,
            20,
            rid="c1h",
            at=2,
            cache_creation_input_tokens=3000,
            cache_creation_1h_input_tokens=1000,
        ),
    )
    # 10 × 3 + 20 × 15 + 2,000 × 3.75 (five minutes) + 1,000 × 6 (one hour) µ$.
    assert call["cost_usd"] == "0.01383"
    assert (call["cache_creation_input_tokens"], call["cache_creation_1h_input_tokens"]) == (
        3000,
        1000,
    )
    (entry,) = call["ledger_entries"]
    assert (entry["cache_creation_usd_per_mtok"], entry["cache_creation_1h_usd_per_mtok"]) == (
        "3.75",
        "6",
    )
    # A price without a one-hour rate bills them at its cache creation rate.
    adv = settle(
        priced,
        "c1h-adv",
        started("s2", "c1h-adv", model="m-adv"),
        usage(
            "u2",
            0,
            0,
            rid="c1h-adv",
            at=2,
            cache_creation_input_tokens=1000,
            cache_creation_1h_input_tokens=400,
        ),
    )
    assert adv["cost_usd"] == "0.01875"  # 1,000 × 18.75 µ$


@pytest.mark.parametrize(
    ("tier", "cost"),
    [("priority", "0.0075"), ("default", "0.0045"), (None, "0.0045"), ("flex", "0.0045")],
)
def test_the_priority_price_applies_only_when_the_response_says_priority(
    priced: TestClient, tier: str | None, cost: str
) -> None:
    # 1,000 × 3 + 100 × 15 = 4,500 µ$ at the price without a tier; 1,000 × 5 + 100 × 25 at
    # priority. The tier the response served decides, never the one asked for.
    call = settle(
        priced, "t", started("s", "t"), usage("u", 1000, 100, rid="t", at=2, service_tier=tier)
    )
    assert (call["service_tier"], call["cost_usd"]) == (tier, cost)


def test_a_long_context_attempt_is_priced_whole_at_the_long_context_prices(
    priced: TestClient,
) -> None:
    # 150,000 + 60,000 cache reads = 210,000 > 200,000: every token at the long-context prices.
    # (A plain usage: the SQL fast path must leave it to the rule.)
    long = settle(
        priced,
        "lc",
        started("s", "lc"),
        usage("u", 150_000, 1000, rid="lc", at=2, cache_read_input_tokens=60_000),
    )
    assert long["cost_usd"] == "0.9585"  # 150,000 × 6 + 60,000 × 0.6 + 1,000 × 22.5 µ$
    assert long["ledger_entries"][0]["input_usd_per_mtok"] == "6"
    # Exactly at the threshold is not above it.
    at = settle(
        priced,
        "lc2",
        started("s2", "lc2"),
        usage("u2", 150_000, 1000, rid="lc2", at=2, cache_read_input_tokens=50_000),
    )
    assert at["cost_usd"] == "0.48"  # 150,000 × 3 + 50,000 × 0.3 + 1,000 × 15 µ$


def test_usage_inconsistent_is_passed_through_with_the_valid_parts_billed(
    priced: TestClient,
) -> None:
    # OpenAI reported prompt_tokens 500 with cached_tokens 800: the tap clamps the cache read to
    # the prompt (input 0) and flags it; the rest of the usage is billed.
    call = settle(
        priced,
        "inc",
        started("s", "inc"),
        usage(
            "u",
            0,
            40,
            rid="inc",
            at=2,
            cache_read_input_tokens=500,
            anomalies=["usage_inconsistent"],
        ),
    )
    assert call["anomalies"] == ["usage_inconsistent"]
    assert call["cost_usd"] == "0.00075"  # 500 × 0.3 + 40 × 15 µ$


def test_an_estimate_without_input_falls_back_to_the_gateways_count(priced: TestClient) -> None:
    post(
        priced,
        started("s", "est", input_tokens=612),
        tokens("t", 33, 33, rid="est", at=1),
        {
            "event_id": "u",
            "request_id": "est",
            "type": "stream.usage",
            "occurred_at": "2026-10-15T08:00:02Z",
            "output_tokens": 33,
            "source": "estimate",
        },
    )
    settle_due(priced)
    call = get(priced, "est")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (612, 33)
    assert call["cost_usd"] == "0.002331"  # 612 × 3 + 33 × 15 µ$
    assert call["anomalies"] == ["usage_missing"]


def test_a_normal_end_without_delivered_counts_has_nothing_undelivered(
    priced: TestClient,
) -> None:
    call = settle(priced, "n", started("s", "n"), usage("u", 70, 260, rid="n", at=2))
    assert call["status"] == "completed"
    assert (call["output_tokens_delivered"], call["output_tokens_undelivered"]) == (260, 0)
    # With a disconnect, what the client had is what was delivered.
    gone = settle(
        priced,
        "g",
        started("s2", "g"),
        disconnect("d", 90, rid="g", at=1),
        usage("u2", 70, 260, rid="g", at=2),
    )
    assert (gone["output_tokens_delivered"], gone["output_tokens_undelivered"]) == (90, 170)


def test_a_unit_without_a_price_makes_the_call_unpriced(priced: TestClient) -> None:
    call = settle(
        priced,
        "nu",
        started("s", "nu", model="m-adv"),
        usage("u", 10, 10, rid="nu", at=2, units={"web_search_requests": 2}),
    )
    assert call["cost_usd"] is None
    assert "unpriced" in call["anomalies"]
    # A unit counted 0 is nothing to bill.
    zero = settle(
        priced,
        "nu0",
        started("s2", "nu0", model="m-adv"),
        usage("u2", 10, 10, rid="nu0", at=2, units={"web_search_requests": 0}),
    )
    assert zero["cost_usd"] == "0.0009"  # 10 × 15 + 10 × 75 µ$


def test_a_tier_without_a_price_makes_the_call_unpriced(priced: TestClient) -> None:
    flex = settle(
        priced,
        "tf",
        started("s", "tf", model="m-tier"),
        usage("u", 10, 10, rid="tf", at=2, service_tier="flex"),
    )
    assert flex["cost_usd"] is None
    assert "unpriced" in flex["anomalies"]
    served = settle(
        priced,
        "tp",
        started("s2", "tp", model="m-tier"),
        usage("u2", 10, 10, rid="tp", at=2, service_tier="priority"),
    )
    assert served["cost_usd"] == "0.0003"  # 10 × 5 + 10 × 25 µ$


def test_the_v2_exports_carry_the_dimensions_and_v1_stays_as_it_was(priced: TestClient) -> None:
    settle(
        priced,
        "ws",
        started("s", "ws"),
        usage(
            "u",
            100,
            50,
            rid="ws",
            at=2,
            units={"web_search_requests": 3, "code_execution": 1},
            cache_creation_input_tokens=30,
            cache_creation_1h_input_tokens=10,
        ),
    )
    period = {"since": "2020-01-01T00:00:00Z", "until": "2030-01-01T00:00:00Z"}
    v1 = priced.get("/v1/exports/calls.csv", params=period).content
    header_v1 = v1.split(b"\r\n")[0]
    assert b"units" not in header_v1 and b"1h" not in header_v1
    v2 = priced.get("/v1/exports/calls.csv", params={**period, "format": "v2"}).content
    (row,) = list(csv.DictReader(io.StringIO(v2.decode())))
    assert v2.split(b"\r\n")[0] == header_v1 + (
        # Keys, customers and plans (v2): the charge, the plan's prices used, the markup, the
        # customer and the plan first.
        b",charge_usd,plan_input_usd_per_mtok,plan_output_usd_per_mtok,"
        b"plan_cache_read_usd_per_mtok,plan_cache_creation_usd_per_mtok,"
        b"plan_cache_creation_1h_usd_per_mtok,plan_unit_prices,markup_pct,customer_id,plan_id"
        b",cache_creation_1h_input_tokens,units,cache_creation_1h_usd_per_mtok,unit_prices"
    )
    assert (row["charge_usd"], row["customer_id"], row["markup_pct"]) == ("", "", "")
    # code_execution has no price: the entry is unpriced, its cells empty.
    assert row["units"] == '{"code_execution":1,"web_search_requests":3}'
    assert (row["cache_creation_1h_input_tokens"], row["cost_usd"]) == ("10", "")
    usage_v2 = priced.get(
        "/v1/exports/usage.csv", params={**period, "format": "v2", "group_by": "model"}
    )
    # v2: no customer, no plan (before the totals); no cost and no charge (after cost_usd).
    assert usage_v2.content.split(b"\r\n")[1] == (
        b'm1,,,1,100,0,30,50,50,0,0,,,10,"{""code_execution"":1,""web_search_requests"":3}"'
    )
    bad = priced.get("/v1/exports/usage.csv", params={**period, "format": "v4"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["path"] == "query.format"


def test_an_other_model_priced_later_settles_the_cost_through_an_adjustment(
    priced: TestClient,
) -> None:
    helper = {"model": "m_new%", "input_tokens": 1000, "output_tokens": 10}
    call = settle(
        priced,
        "late",
        started("s", "late"),
        usage("u", 100, 10, rid="late", at=2, other_models=[helper]),
    )
    assert call["cost_usd"] is None
    assert "unpriced" in call["anomalies"]
    price = {**ADVISOR, "model": "m_new%", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2"}
    assert priced.post("/v1/prices", json=price).status_code == 201
    reconcile_now(priced)
    call = get(priced, "late")
    assert_ledger_is_the_call(call)
    # m1: 100 × 3 + 10 × 15 = 450 µ$; m_new%: 1,000 × 1 + 10 × 2 = 1,020 µ$.
    assert call["cost_usd"] == "0.00147"
    assert "unpriced" not in call["anomalies"]


def test_usage_rows_sum_the_units_on_both_bases(priced: TestClient) -> None:
    for n, searches in enumerate((3, 4)):
        rid = f"u{n}"
        settle(
            priced,
            rid,
            started(f"s{n}", rid),
            usage(f"e{n}", 10, 1, rid=rid, at=2, units={"web_search_requests": searches}),
        )
    settle(priced, "plain", started("sp", "plain"), usage("ep", 10, 1, rid="plain", at=2))
    now = "2030-01-01T00:00:00Z"
    for basis, since in (
        ("call_start", "2026-10-15T00:00:00Z"),
        ("booked", "2020-01-01T00:00:00Z"),
    ):
        response = priced.get(
            "/v1/usage", params={"since": since, "until": now, "group_by": "model", "basis": basis}
        )
        assert response.status_code == 200, response.text
        (row,) = response.json()["data"]
        assert (row["calls"], row["units"]) == (3, {"web_search_requests": 7})
        # 3 × (10 × 3 + 1 × 15) µ$ + 7 × $0.01
        assert row["cost_usd"] == "0.070135"
