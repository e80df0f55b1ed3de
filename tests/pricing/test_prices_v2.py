"""Prices of v2 (CONTRACT "Usage dimensions (v2)"): a served tier, one-hour cache writes, unit
prices and long-context prices, through ``POST/GET /v1/prices`` and ``billing prices load``;
identity (model, service_tier, effective_from) for the no-op / 409 rule."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from tests.pricing.test_prices import PRICE, listed, run_cli

V2 = {
    **PRICE,
    "cache_creation_usd_per_mtok": "3.75",
    "cache_creation_1h_usd_per_mtok": "6",
    "unit_prices": {"web_search_requests": "0.010", "code_execution_seconds": "0.00005"},
    "long_context": {
        "above_input_tokens": 200000,
        "input_usd_per_mtok": "0.6",
        "output_usd_per_mtok": "2.4",
        "cache_read_usd_per_mtok": "0.06",
        "cache_creation_usd_per_mtok": "7.5",
    },
}
V2_STORED = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "service_tier": None,
    "inference_geo": None,
    "input_usd_per_mtok": "0.3",
    "output_usd_per_mtok": "1.2",
    "cache_read_usd_per_mtok": "0.03",
    "cache_creation_usd_per_mtok": "3.75",
    "cache_creation_1h_usd_per_mtok": "6",
    "unit_prices": {"code_execution_seconds": "0.00005", "web_search_requests": "0.01"},
    "long_context": {
        "above_input_tokens": 200000,
        "input_usd_per_mtok": "0.6",
        "output_usd_per_mtok": "2.4",
        "cache_read_usd_per_mtok": "0.06",
        "cache_creation_usd_per_mtok": "7.5",
        # Not given: at the long-context cache creation rate.
        "cache_creation_1h_usd_per_mtok": "7.5",
    },
}


def test_a_v2_price_round_trips_and_is_a_no_op_the_second_time(client: TestClient) -> None:
    first = client.post("/v1/prices", json=V2)
    assert (first.status_code, first.json()) == (201, V2_STORED)
    again = client.post("/v1/prices", json=V2)
    assert (again.status_code, again.json()) == (200, V2_STORED)
    assert listed(client) == [V2_STORED]


def test_the_identity_is_model_tier_and_effective_from(client: TestClient) -> None:
    assert client.post("/v1/prices", json=V2).status_code == 201
    priority = {**PRICE, "service_tier": "priority", "input_usd_per_mtok": "0.5"}
    assert client.post("/v1/prices", json=priority).status_code == 201  # another identity
    for changed in (
        {**V2, "unit_prices": {"web_search_requests": "0.02"}},
        {**V2, "long_context": None},
        {**V2, "cache_creation_1h_usd_per_mtok": "7"},
        {**priority, "input_usd_per_mtok": "0.6"},
    ):
        response = client.post("/v1/prices", json=changed)
        assert response.status_code == 409, changed
    tiers = [(p["service_tier"], p["input_usd_per_mtok"]) for p in listed(client)]
    assert tiers == [(None, "0.3"), ("priority", "0.5")]


def test_prices_load_carries_the_v2_fields(
    client: TestClient, db_url: str, tmp_path: Path, cli_way: str
) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps([V2, {**PRICE, "service_tier": "flex"}]))
    run = run_cli(db_url, tmp_path, "prices", "load", str(path), way=cli_way)
    assert run.returncode == 0, run.stderr
    assert "2 price(s) added" in run.stderr
    assert listed(client)[0] == V2_STORED
    assert listed(client)[1]["service_tier"] == "flex"
