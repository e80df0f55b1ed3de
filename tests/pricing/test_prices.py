"""Prices: ``POST/GET /v1/prices``, versioning by ``effective_from``, unpriced calls priced later,
and ``billing prices load``. Source: CONTRACT "Cost" and "Command line"."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from billing.dimensions import PRICED, Tokens
from billing.pricing.prices import PriceRow
from billing.rates import RATES
from tests.builders import failed, started, tokens, usage
from tests.cli_runs import run_billing, text
from tests.reconcile.test_reconcile_late_events import (
    assert_ledger_is_the_call,
    figures,
    get,
    post,
    reconcile,
)
from tests.reconcile.test_reconcile_scenarios import ledger_sum, settle_due

PRICE = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "0.30",
    "output_usd_per_mtok": "1.200000",
    "cache_read_usd_per_mtok": "0.03",
    "cache_creation_usd_per_mtok": "0",
}
STORED = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "service_tier": None,
    "inference_geo": None,
    "input_usd_per_mtok": "0.3",
    "output_usd_per_mtok": "1.2",
    "cache_read_usd_per_mtok": "0.03",
    "cache_creation_usd_per_mtok": "0",
    # v2: one-hour cache writes cost the cache creation rate when the price names none.
    "cache_creation_1h_usd_per_mtok": "0",
    "unit_prices": None,
    "long_context": None,
}


def listed(client: TestClient) -> list[dict[str, Any]]:
    response = client.get("/v1/prices")
    assert response.status_code == 200
    return list(response.json()["data"])


# -- POST and GET -----------------------------------------------------------------------------


def test_post_then_same_again_is_a_no_op(client: TestClient) -> None:
    response = client.post("/v1/prices", json=PRICE)
    assert response.status_code == 201
    assert response.json() == STORED
    again = client.post("/v1/prices", json=PRICE)
    assert (again.status_code, again.json()) == (200, STORED)
    # The same amounts and instant written differently are the same price.
    same = dict(
        PRICE,
        input_usd_per_mtok="0.3",
        output_usd_per_mtok="1.2",
        effective_from="2026-01-01T02:00:00+02:00",
    )
    assert client.post("/v1/prices", json=same).status_code == 200
    assert listed(client) == [STORED]


def test_different_amounts_for_the_same_model_and_time_is_409(client: TestClient) -> None:
    assert client.post("/v1/prices", json=PRICE).status_code == 201
    response = client.post("/v1/prices", json=dict(PRICE, output_usd_per_mtok="1.25"))
    assert response.status_code == 409
    assert "effective_from" in response.json()["error"]
    assert listed(client) == [STORED]
    assert (
        client.post(
            "/v1/prices", json=dict(PRICE, cache_creation_usd_per_mtok="0.000001")
        ).status_code
        == 409
    )


JSON = {"Content-Type": "application/json"}


def _post_price_with(client: TestClient, field: str, value: object) -> httpx.Response:
    """POST a valid price with ``field`` set to ``value`` (None: left out)."""
    body: dict[str, object] = dict(PRICE)
    if value is None:
        del body[field]
    else:
        body[field] = value
    return client.post("/v1/prices", json=body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("input_usd_per_mtok", 0.3),  # a JSON number: a binary float
        ("input_usd_per_mtok", "0.0000001"),  # 7 decimal places
        # More than 6 places however many zeros (Decimal would round this one to 1).
        ("input_usd_per_mtok", "1.0000000000000000000000000001"),
        ("output_usd_per_mtok", "1.0000000"),
        ("cache_creation_1h_usd_per_mtok", "0.1234567"),
        # Reported once, under its own field: not again under the rate that defaults to it.
        ("cache_creation_usd_per_mtok", "0.1234567"),
        ("unit_prices", {"web_search_requests": "0.0000001"}),
        ("unit_prices", {"Web Search": "0.01"}),
        ("service_tier", ""),
        ("output_usd_per_mtok", "-1"),
        ("cache_read_usd_per_mtok", "abc"),
        ("input_usd_per_mtok", "1_000"),  # Python's Decimal reads it as 1000
        ("input_usd_per_mtok", "1e3"),
        ("input_usd_per_mtok", " 1"),
        ("input_usd_per_mtok", "+1"),
        ("input_usd_per_mtok", "1."),
        ("input_usd_per_mtok", "NaN"),
        ("cache_creation_usd_per_mtok", None),  # missing
        ("effective_from", "2026-01-01T00:00:00"),  # naive: no offset
        ("effective_from", "yesterday"),
        ("model", ""),
    ],
)
def test_invalid_price_is_422_in_the_contract_shape(
    client: TestClient, field: str, value: object
) -> None:
    response = _post_price_with(client, field, value)
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert len(errors) == 1
    (error,) = errors
    assert set(error) == {"index", "path", "message"}
    assert error["index"] is None
    assert field in error["path"]
    assert error["message"]
    assert listed(client) == []


def test_prices_are_listed_by_model_then_effective_from(client: TestClient) -> None:
    posted = [
        dict(PRICE, model="zeta", effective_from="2026-03-01T00:00:00Z"),
        dict(PRICE, model="alpha", effective_from="2026-05-01T00:00:00Z", input_usd_per_mtok="3"),
        dict(
            PRICE,
            model="alpha",
            effective_from="2026-02-01T00:00:00Z",
            input_usd_per_mtok="2.500000",
        ),
    ]
    for body in posted:
        assert client.post("/v1/prices", json=body).status_code == 201
    rows = listed(client)
    assert [(r["model"], r["effective_from"], r["input_usd_per_mtok"]) for r in rows] == [
        ("alpha", "2026-02-01T00:00:00Z", "2.5"),
        ("alpha", "2026-05-01T00:00:00Z", "3"),
        ("zeta", "2026-03-01T00:00:00Z", "0.3"),
    ]


# -- versioning -------------------------------------------------------------------------------


def test_the_price_in_force_at_the_calls_start_applies(client: TestClient) -> None:
    # Calls start at 08:00:00 and 08:01:00; a new price takes effect at 08:00:30.
    old = dict(PRICE, input_usd_per_mtok="1", output_usd_per_mtok="2")
    new = dict(
        old,
        effective_from="2026-10-15T08:00:30Z",
        input_usd_per_mtok="10",
        output_usd_per_mtok="20",
    )
    assert client.post("/v1/prices", json=old).status_code == 201
    assert client.post("/v1/prices", json=new).status_code == 201
    post(
        client,
        started("a1", "before", at=0),
        usage("a2", 1000, 1000, rid="before", at=45),
        started("b1", "after", at=60),
        usage("b2", 1000, 1000, rid="after", at=61),
    )
    assert reconcile(client)["settled"] == 2
    before, after = get(client, "before"), get(client, "after")
    assert before["cost_usd"] == "0.003"  # ended after the change; started before it
    assert after["cost_usd"] == "0.03"
    assert before["ledger_entries"][0]["input_usd_per_mtok"] == "1"
    assert after["ledger_entries"][0]["input_usd_per_mtok"] == "10"


def test_a_price_posted_later_that_covers_the_start_reprices(client: TestClient) -> None:
    assert client.post("/v1/prices", json=dict(PRICE, input_usd_per_mtok="1")).status_code == 201
    post(client, started("a1", "repriced", at=0), usage("a2", 1000, 0, rid="repriced", at=1))
    reconcile(client)
    assert get(client, "repriced")["cost_usd"] == "0.001"
    # A price from a time after the call's start changes nothing.
    future = dict(PRICE, effective_from="2026-10-15T08:00:01Z", input_usd_per_mtok="7")
    assert client.post("/v1/prices", json=future).status_code == 201
    assert reconcile(client)["adjusted"] == 0
    # A correction effective just before the start applies.
    fix = dict(PRICE, effective_from="2026-10-15T07:00:00Z", input_usd_per_mtok="2")
    assert client.post("/v1/prices", json=fix).status_code == 201
    assert reconcile(client)["adjusted"] == 2  # a reversal and the re-priced line
    call = get(client, "repriced")
    assert call["cost_usd"] == "0.002"
    entries = call["ledger_entries"]
    assert [(e["kind"], e["input_tokens"], e["cost_usd"]) for e in entries] == [
        ("settlement", 1000, "0.001"),
        ("adjustment", -1000, "-0.001"),
        ("adjustment", 1000, "0.002"),
    ]
    assert_ledger_is_the_call(call)


# -- unpriced ---------------------------------------------------------------------------------


def test_unpriced_call_is_never_free_and_is_settled_by_adjustment(client: TestClient) -> None:
    post(
        client,
        started("e1", "unpriced", model="m-new", input_tokens=1000),
        tokens("e2", 2000, 1500, rid="unpriced", at=1),
        usage("e3", 1000, 2000, rid="unpriced", at=2, cache_read_input_tokens=3000),
    )
    assert reconcile(client)["settled"] == 1
    call = get(client, "unpriced")
    assert call["settled"] is True
    assert call["cost_usd"] is None
    assert "unpriced" in call["anomalies"]
    (entry,) = call["ledger_entries"]
    assert entry["kind"] == "settlement"
    assert entry["cost_usd"] is None
    assert entry["input_usd_per_mtok"] is None
    tokens_before = figures(call)

    assert client.post("/v1/prices", json=dict(PRICE, model="m-new")).status_code == 201
    result = reconcile(client)
    assert (result["settled"], result["adjusted"]) == (0, 2)
    call = get(client, "unpriced")
    # 1000 × 0.30 + 2000 × 1.2 + 3000 × 0.03 µ$ = 300 + 2400 + 90 µ$
    assert call["cost_usd"] == "0.00279"
    assert "unpriced" not in call["anomalies"]
    assert figures(call) == tokens_before
    entries = call["ledger_entries"]
    assert [e["kind"] for e in entries] == ["settlement", "adjustment", "adjustment"]
    adjustments = ledger_sum(entries[1:])
    assert all(adjustments[name] == 0 for name in tokens_before)  # tokens net unchanged
    assert adjustments["cost_usd"] == Decimal("0.00279")
    assert entries[2]["input_usd_per_mtok"] == "0.3"
    assert_ledger_is_the_call(call)
    assert reconcile(client)["adjusted"] == 0


def test_pricing_a_fallback_attempts_model_later_prices_the_call(client: TestClient) -> None:
    assert client.post("/v1/prices", json=PRICE).status_code == 201
    post(
        client,
        started("a1", "fallback", input_tokens=1000),
        failed("a2", "overloaded_error", rid="fallback", at=1),
        started("b1", "fallback", at=2, attempt=2, model="m-fallback", input_tokens=1000),
        usage("b2", 1000, 0, rid="fallback", at=3, attempt=2),
    )
    settle_due(client)
    call = get(client, "fallback")
    assert (call["model"], call["cost_usd"], call["attempts"]) == ("m1", None, 2)
    assert "unpriced" in call["anomalies"]
    body = dict(PRICE, model="m-fallback", input_usd_per_mtok="5")
    assert client.post("/v1/prices", json=body).status_code == 201
    assert reconcile(client)["adjusted"] == 2
    call = get(client, "fallback")
    assert call["cost_usd"] == "0.0053"  # 1000 × 0.30 + 1000 × 5 µ$
    assert "unpriced" not in call["anomalies"]
    assert_ledger_is_the_call(call)


# -- billing prices load ----------------------------------------------------------------------


def run_cli(
    db_url: str, cwd: Path, *args: str, way: str = "subprocess"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    env["BILLING_DATABASE_URL"] = db_url
    return text(run_billing(way, args, env, cwd))


def test_prices_load_from_the_command_line(
    client: TestClient, db_url: str, tmp_path: Path, cli_way: str
) -> None:
    good = tmp_path / "prices.json"
    second = dict(PRICE, model="m2", output_usd_per_mtok="15")
    good.write_text(json.dumps([PRICE, second]))
    first = run_cli(db_url, tmp_path, "prices", "load", str(good), way=cli_way)
    assert first.returncode == 0, first.stderr
    assert "2 price(s) added" in first.stderr
    again = run_cli(db_url, tmp_path, "prices", "load", str(good), way=cli_way)
    assert again.returncode == 0, again.stderr
    assert "0 price(s) added, 2 already present" in again.stderr
    assert [r["model"] for r in listed(client)] == ["m1", "m2"]

    conflicting = tmp_path / "conflict.json"
    third = dict(PRICE, model="m3")
    conflicting.write_text(json.dumps([third, dict(second, output_usd_per_mtok="16")]))
    failed_run = run_cli(db_url, tmp_path, "prices", "load", str(conflicting), way=cli_way)
    assert failed_run.returncode != 0
    lines = failed_run.stderr.strip().splitlines()
    assert len(lines) == 1, failed_run.stderr
    assert lines[0].startswith("billing:")
    assert "m2" in lines[0]
    # Nothing of the refused file was stored.
    assert [r["model"] for r in listed(client)] == ["m1", "m2"]
    assert listed(client)[1]["output_usd_per_mtok"] == "15"

    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps([dict(PRICE, input_usd_per_mtok=0.3)]))
    bad = run_cli(db_url, tmp_path, "prices", "load", str(invalid), way=cli_way)
    assert bad.returncode != 0
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "effective_from",
            "2026-01-01T00:00:00",
            "has no UTC offset; send an RFC 3339 timestamp with an offset, "
            "such as 2026-10-15T08:00:00Z or 2026-10-15T10:00:00+02:00",
        ),
        (
            "effective_from",
            "yesterday",
            "must be an RFC 3339 timestamp string such as 2026-10-15T08:00:00Z",
        ),
        ("cache_creation_usd_per_mtok", None, "is required"),
        ("currency", "USD", "is not a field of this request; remove it"),
        (
            "input_usd_per_mtok",
            "1.5x",
            "'1.5x' is not a plain decimal number; send digits with an optional fraction "
            'such as "0.30"',
        ),
        ("output_usd_per_mtok", "-1", "must not be negative"),
    ],
)
def test_a_bad_price_is_told_in_the_services_own_words(
    client: TestClient, field: str, value: object, message: str
) -> None:
    """The same sentences as ``POST /v1/events`` for timestamps; no pydantic wording
    ("Input should have timezone info", "Field required", "Value error, …")."""
    response = _post_price_with(client, field, value)
    assert response.status_code == 422, response.text
    assert response.json() == {
        "errors": [{"index": None, "path": f"body.{field}", "message": message}]
    }


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "text/plain"}])
def test_a_body_not_sent_as_json_is_415(client: TestClient, headers: dict[str, str]) -> None:
    response = client.post("/v1/prices", content=json.dumps(PRICE).encode(), headers=headers)
    assert response.status_code == 415, response.text
    assert "Content-Type: application/json" in response.json()["error"]
    assert listed(client) == []


@pytest.mark.parametrize(
    ("content", "headers", "path", "message"),
    [
        (
            b'{"model": "x",',
            JSON,
            "body",
            "is not valid JSON (Expecting property name enclosed in double quotes)",
        ),
        (b"[]", JSON, "body", "must be a JSON object"),
        (b"null", JSON, "body", "must be a JSON object"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_told_so(
    client: TestClient, content: bytes, headers: dict[str, str], path: str, message: str
) -> None:
    response = client.post("/v1/prices", content=content, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json() == {"errors": [{"index": None, "path": path, "message": message}]}
    assert listed(client) == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model", "", "must not be empty"),
        ("model", "m" * 257, "is too long: at most 256 characters"),
        ("input_usd_per_mtok", True, 'must be a decimal string such as "0.30", not true or false'),
    ],
)
def test_lengths_and_booleans_in_a_price(
    client: TestClient, field: str, value: object, message: str
) -> None:
    response = _post_price_with(client, field, value)
    assert response.status_code == 422, response.text
    assert response.json() == {
        "errors": [{"index": None, "path": f"body.{field}", "message": message}]
    }


@pytest.mark.parametrize(
    ("query", "path", "message"),
    [
        ("?model=a&model=b", "query.model", "is given 2 times; give it once"),
        ("?modle=a", "query.modle", "is not a known query parameter; the known ones are model"),
    ],
)
def test_listing_prices_refuses_unknown_and_repeated_parameters(
    client: TestClient, query: str, path: str, message: str
) -> None:
    response = client.get(f"/v1/prices{query}")
    assert response.status_code == 422, response.text
    assert response.json() == {"errors": [{"index": None, "path": path, "message": message}]}


def _whole(rate: Any, whole: dict[str, int]) -> int | None:
    """The position in RATES of the rate of the bucket that ``rate``'s bucket is a part of."""
    if rate.bucket.part_of is None:
        return None
    return next(i for i, r in enumerate(RATES) if r.bucket.name == rate.bucket.part_of)


@pytest.mark.nodb
def test_a_price_row_bills_each_priced_bucket_at_its_own_rate() -> None:
    # The rates come from billing.dimensions: each priced bucket at the rate its `price` names.
    assert {r.bucket.name for r in RATES} == {b.name for b in PRICED}
    assert [r.field for r in RATES] == [
        "input_usd_per_mtok",
        "output_usd_per_mtok",
        "cache_read_usd_per_mtok",
        "cache_creation_usd_per_mtok",
        "cache_creation_1h_usd_per_mtok",
    ]
    rates = [7 + 1000 * i for i in range(len(RATES))]
    row = PriceRow(1, "m1", datetime(2026, 1, 1, tzinfo=UTC), *rates)
    # The one-hour cache writes are a part of the cache writes: billed at their own rate instead
    # of the cache creation rate.
    whole = {r.bucket.part_of: i for i, r in enumerate(RATES) if r.bucket.part_of}
    for i, rate in enumerate(RATES):
        assert getattr(row, rate.name) == rates[i]
        alone = Tokens(**{rate.bucket.name: 3})
        taken_back = 3 * rates[whole_i] if (whole_i := _whole(rate, whole)) is not None else 0
        assert row.cost_pusd(alone) == 3 * rates[i] - taken_back
    assert (
        row.cost_pusd(Tokens(cache_creation_input_tokens=10, cache_creation_1h_input_tokens=4))
        == 6 * row.cache_creation + 4 * row.cache_creation_1h
    )
    assert list(row.as_json()) == [
        "model",
        "effective_from",
        "service_tier",
        "inference_geo",
        *(r.field for r in RATES),
        "unit_prices",
        "long_context",
    ]
    assert row == PriceRow(1, "m1", datetime(2026, 1, 1, tzinfo=UTC), *rates)
