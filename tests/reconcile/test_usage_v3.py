"""v3 usage end to end through HTTP and the database, in exact figures (CONTRACT "Non-streaming
calls, hosted-tool fees, provider-reported cost (v3)"): counters are stored and never priced,
cached input is billed at the cache rate, the provider's own cost is kept beside ours, the
inference geo selects a price like the served tier, an estimate's input of 0 is "not known",
and a usage that lowers a count to 0 keeps the largest.

Prices (USD per million tokens) are those of ``test_usage_dimensions_v2``: ``m1`` 3 / 15 / 0.3 /
3.75 (web search 0.01 per request, no fetch price), ``m1`` at tier ``priority`` 5 / 25; here also
``m1`` in geo ``us`` 3.3 / 16.5 and at tier ``priority`` in geo ``us`` 6 / 30.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.builders import started, usage
from tests.reconcile.test_reconcile_late_events import get, post
from tests.reconcile.test_reconcile_scenarios import settle_due
from tests.reconcile.test_usage_dimensions_v2 import FROM, M1, M1_PRIORITY, settle

M1_US = {
    "model": "m1",
    "inference_geo": "us",
    "effective_from": FROM,
    "input_usd_per_mtok": "3.3",
    "output_usd_per_mtok": "16.5",
    "cache_read_usd_per_mtok": "0.33",
    "cache_creation_usd_per_mtok": "4.125",
}
M1_PRIORITY_US = {**M1_PRIORITY, "inference_geo": "us", "input_usd_per_mtok": "6"}
M1_PRIORITY_US["output_usd_per_mtok"] = "30"


@pytest.fixture
def priced(client: TestClient) -> TestClient:
    for price in (M1, M1_PRIORITY, M1_US, M1_PRIORITY_US):
        response = client.post("/v1/prices", json=price)
        assert response.status_code == 201, response.text
    return client


def test_a_web_fetch_counter_without_a_price_is_stored_and_never_unpriced(
    priced: TestClient,
) -> None:
    call = settle(
        priced,
        "wf",
        started("s", "wf"),
        usage(
            "u",
            100,
            50,
            rid="wf",
            at=2,
            units={"web_search_requests": 1},
            counters={"web_fetch_requests": 2},
        ),
    )
    # 100 × 3 + 50 × 15 = 1,050 µ$, plus one search at $0.01; the fetches are free.
    assert call["cost_usd"] == "0.01105"
    assert call["anomalies"] == []
    assert call["counters"] == {"web_fetch_requests": 2}
    assert call["units"] == {"web_search_requests": 1}
    (entry,) = call["ledger_entries"]
    assert entry["units"] == {"web_search_requests": 1}
    assert entry["cost_usd"] == "0.01105"


def test_chat_cached_input_is_billed_at_the_cache_rate(priced: TestClient) -> None:
    # An OpenAI-compatible usage: prompt 2,000 of which 1,200 cached, as the tap posts it
    # (input excludes the cache reads).
    call = settle(
        priced,
        "cc",
        started("s", "cc", protocol="openai.chat_completions"),
        usage("u", 800, 40, rid="cc", at=2, cache_read_input_tokens=1200),
    )
    assert (call["input_tokens"], call["cache_read_input_tokens"]) == (800, 1200)
    assert call["cost_usd"] == "0.00336"  # 800 × 3 + 1,200 × 0.3 + 40 × 15 µ$
    (entry,) = call["ledger_entries"]
    assert entry["cache_read_usd_per_mtok"] == "0.3"


def test_the_providers_own_cost_is_kept_beside_ours_with_the_drift(priced: TestClient) -> None:
    call = settle(
        priced,
        "or",
        started("s", "or", protocol="openai.chat_completions", provider="openrouter"),
        usage("u", 100, 50, rid="or", at=2, provider_cost_usd="0.0012345"),
    )
    assert call["cost_usd"] == "0.00105"
    assert call["provider_cost_usd"] == "0.0012345"
    assert call["cost_drift_usd"] == "0.0001845"
    (entry,) = call["ledger_entries"]
    assert (entry["cost_usd"], entry["provider_cost_usd"]) == ("0.00105", "0.0012345")
    # The same cost: no drift shown.
    same = settle(
        priced,
        "or2",
        started("s2", "or2", protocol="openai.chat_completions"),
        usage("u2", 100, 50, rid="or2", at=2, provider_cost_usd="0.00105"),
    )
    assert (same["provider_cost_usd"], same["cost_drift_usd"]) == ("0.00105", None)


def test_a_later_provider_cost_is_booked_as_an_adjustment(priced: TestClient) -> None:
    settle(
        priced,
        "pa",
        started("s", "pa"),
        usage("u", 100, 50, rid="pa", at=2, provider_cost_usd="0.001"),
    )
    call = settle(priced, "pa", usage("u2", 100, 50, rid="pa", at=3, provider_cost_usd="0.0011"))
    assert call["provider_cost_usd"] == "0.0011"
    assert [e["provider_cost_usd"] for e in call["ledger_entries"]] == ["0.001", "0.0001"]
    assert [e["cost_usd"] for e in call["ledger_entries"]] == ["0.00105", "0"]
    # The adjustment says what changed: the provider's cost, not a new line.
    assert call["ledger_entries"][1]["reason"] == (
        "late events changed the provider-reported cost: provider_cost_usd +0.0001"
    )


def test_a_later_usage_that_changes_tokens_and_provider_cost_names_both(
    priced: TestClient,
) -> None:
    settle(
        priced,
        "pb",
        started("s", "pb"),
        usage("u", 100, 50, rid="pb", at=2, provider_cost_usd="0.001"),
    )
    call = settle(priced, "pb", usage("u2", 100, 60, rid="pb", at=3, provider_cost_usd="0.0009"))
    assert [e["provider_cost_usd"] for e in call["ledger_entries"]] == ["0.001", "-0.0001"]
    assert call["ledger_entries"][1]["reason"] == (
        "late events changed the usage: output_tokens_billed +10, "
        "output_tokens_delivered +10, provider_cost_usd -0.0001"
    )


@pytest.mark.parametrize(
    ("tier", "geo", "cost"),
    [
        (None, "us", "0.001155"),  # 100 × 3.3 + 50 × 16.5 µ$
        (None, "eu", "0.00105"),  # no eu price: the price without a geo
        ("priority", "us", "0.0021"),  # 100 × 6 + 50 × 30 µ$
        ("priority", "eu", "0.00175"),  # the tier's price without a geo: 100 × 5 + 50 × 25
        ("flex", "us", "0.001155"),  # no flex price: the geo's without a tier
    ],
)
def test_the_inference_geo_selects_a_price_like_the_tier(
    priced: TestClient, tier: str | None, geo: str, cost: str
) -> None:
    served = {"inference_geo": geo, **({"service_tier": tier} if tier else {})}
    call = settle(priced, "g", started("s", "g"), usage("u", 100, 50, rid="g", at=2, **served))
    assert call["cost_usd"] == cost
    assert call["inference_geo"] == geo
    assert call["anomalies"] == []


def test_a_geo_price_is_its_own_identity(priced: TestClient) -> None:
    assert priced.post("/v1/prices", json=M1_US).status_code == 200  # the same: a no-op
    changed = {**M1_US, "input_usd_per_mtok": "3.4"}
    assert priced.post("/v1/prices", json=changed).status_code == 409
    listed = priced.get("/v1/prices").json()["data"]
    assert sorted((p["service_tier"] or "", p["inference_geo"] or "") for p in listed) == [
        ("", ""),
        ("", "us"),
        ("priority", ""),
        ("priority", "us"),
    ]
    bad = priced.post("/v1/prices", json={**M1, "inference_geo": ""})
    assert bad.status_code == 422
    assert [e["path"] for e in bad.json()["errors"]] == ["body.inference_geo"]


def test_an_estimates_input_of_0_is_not_known_after_a_started_count(priced: TestClient) -> None:
    post(
        priced,
        started("s", "e0", input_tokens=612),
        usage("u", 0, 33, source="estimate", rid="e0", at=2),
    )
    settle_due(priced)
    call = get(priced, "e0")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (612, 33)
    assert call["cost_usd"] == "0.002331"  # 612 × 3 + 33 × 15 µ$
    assert call["anomalies"] == ["usage_missing"]
    # Without a started count, an estimate's 0 is what there is.
    post(priced, started("s2", "e1"), usage("u2", 0, 33, source="estimate", rid="e1", at=2))
    settle_due(priced)
    alone = get(priced, "e1")
    assert (alone["input_tokens"], alone["cost_usd"]) == (0, "0.000495")


def test_a_later_usage_lowering_a_count_to_0_keeps_the_largest(priced: TestClient) -> None:
    call = settle(
        priced,
        "lo",
        started("s", "lo"),
        usage("u1", 500, 40, rid="lo", at=2, cache_read_input_tokens=100),
        usage("u2", 0, 60, rid="lo", at=3, cache_read_input_tokens=100),
    )
    assert (call["input_tokens"], call["output_tokens_billed"]) == (500, 60)
    assert call["anomalies"] == ["usage_inconsistent"]
    assert call["cost_usd"] == "0.00243"  # 500 × 3 + 100 × 0.3 + 60 × 15 µ$


def test_a_plan_price_may_name_an_inference_geo(priced: TestClient) -> None:
    plan = {
        "plan_id": "geo",
        "effective_from": FROM,
        "markup_pct": "50",
        "prices": [{**{k: v for k, v in M1_US.items() if k != "effective_from"}}],
    }
    plan["prices"][0].update(input_usd_per_mtok="4", output_usd_per_mtok="20")
    created = priced.post("/v1/plans", json=plan)
    assert created.status_code == 201, created.text
    assert created.json()["prices"][0]["inference_geo"] == "us"
    key = priced.put("/v1/keys/key_a", json={"plan_id": "geo", "effective_from": FROM})
    assert key.status_code == 201, key.text
    us = settle(
        priced, "pu", started("s", "pu"), usage("u", 100, 50, rid="pu", at=2, inference_geo="us")
    )
    # Cost at m1's us price: 100 × 3.3 + 50 × 16.5 = 1,155 µ$; charged at the plan's us price:
    # 100 × 4 + 50 × 20 = 1,400 µ$.
    assert (us["cost_usd"], us["charge_usd"]) == ("0.001155", "0.0014")
    # Elsewhere the plan has no price of its own: cost × 1.5.
    eu = settle(
        priced, "pe", started("s2", "pe"), usage("u2", 100, 50, rid="pe", at=2, inference_geo="eu")
    )
    assert (eu["cost_usd"], eu["charge_usd"]) == ("0.00105", "0.001575")
