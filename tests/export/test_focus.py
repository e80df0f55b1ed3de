"""(v3) ``GET /v1/exports/focus.csv?period=`` (CONTRACT "Observability and standard exports
(v3)"): one row per ledger line and token class in FOCUS 1.2 columns, exact decimals whose
``BilledCost`` sums to the ledger of the month, corrections of closed months as
``ChargeClass`` ``Correction``; validated by the ``focus-validator`` package."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.settings import Settings
from tests.export.focus_validator import problems, validator
from tests.export.test_export import (
    SONNET_PRICE,
    export,
    ledger,
    post,
    price,
    reconcile,
    rows_of,
    started,
    usage_ev,
)

TOOLS_PRICE = {
    **SONNET_PRICE,
    "model": "m-tools",
    "cache_creation_1h_usd_per_mtok": "6",
    "unit_prices": {"web_search_requests": "0.01"},
}
MARCH = {"since": "2026-03-01T00:00:00Z", "until": "2026-04-01T00:00:00Z"}


@pytest.fixture
def months(client: TestClient, app: FastAPI, settings: Settings) -> TestClient:
    """req-1 settled in February and corrected in March; req-2 (unpriced) and req-3 (one-hour
    cache writes and a hosted tool) settled in March."""
    price(client, SONNET_PRICE)
    price(client, TOOLS_PRICE)
    post(client, [
        started("req-1", "2026-02-27T10:00:00Z"),
        usage_ev("req-1-u", "req-1", "2026-02-27T10:00:01Z", 22, 750,
                 cache_read_input_tokens=100, cache_creation_input_tokens=50),
    ])  # fmt: skip
    reconcile(app, settings, "2026-02-27T10:01:00Z")
    post(client, [
        started("req-2", "2026-03-01T10:05:00Z", key="key_b", model="gpt-x",
                protocol="openai.chat_completions"),
        usage_ev("req-2-u", "req-2", "2026-03-01T10:05:02Z", 10, 5),
        started("req-3", "2026-03-02T09:00:00Z", model="m-tools"),
        usage_ev("req-3-u", "req-3", "2026-03-02T09:00:01Z", 10, 20,
                 cache_creation_input_tokens=100, cache_creation_1h_input_tokens=40,
                 units={"web_search_requests": 2}),
        usage_ev("req-1-u2", "req-1", "2026-02-27T10:00:04Z", 30, 700,
                 cache_read_input_tokens=100, cache_creation_input_tokens=50),
    ])  # fmt: skip
    reconcile(app, settings, "2026-03-05T12:00:00Z")
    return client


def focus(client: TestClient, period: str) -> bytes:
    response = client.get("/v1/exports/focus.csv", params={"period": period})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    assert response.headers["x-billing-period"] == "closed"
    return response.content


def pick(row: dict[str, str]) -> tuple[str, ...]:
    names = ("ResourceId", "x_TokenClass", "ChargeClass", "ConsumedQuantity", "PricingQuantity",
             "PricingUnit", "ListUnitPrice", "BilledCost", "x_Unpriced")  # fmt: skip
    return tuple(row[n] for n in names)


def test_one_row_per_line_and_token_class_summing_to_the_ledger(
    months: TestClient, app: FastAPI
) -> None:
    assert months.get("/v1/calls/req-3").json()["cost_usd"] == "0.020795"
    rows = rows_of(focus(months, "2026-03"))
    assert [pick(r) for r in rows] == [
        # req-1's adjustment corrects February, a closed month.
        ("req-1", "input", "Correction", "8", "0.000008", "1000000 Tokens", "3", "0.000024",
         "false"),
        ("req-1", "output", "Correction", "-50", "-0.000050", "1000000 Tokens", "15", "-0.00075",
         "false"),
        # req-2, unpriced: its tokens at no known price.
        ("req-2", "input", "", "10", "0.000010", "1000000 Tokens", "", "0", "true"),
        ("req-2", "output", "", "5", "0.000005", "1000000 Tokens", "", "0", "true"),
        # req-3: the one-hour writes at their own rate, out of the cache writes' row; the tool.
        ("req-3", "input", "", "10", "0.000010", "1000000 Tokens", "3", "0.00003", "false"),
        ("req-3", "output", "", "20", "0.000020", "1000000 Tokens", "15", "0.0003", "false"),
        ("req-3", "cache_creation", "", "60", "0.000060", "1000000 Tokens", "3.75", "0.000225",
         "false"),
        ("req-3", "cache_creation_1h", "", "40", "0.000040", "1000000 Tokens", "6", "0.00024",
         "false"),
        ("req-3", "unit:web_search_requests", "", "2", "2.000000", "Units", "0.01", "0.02",
         "false"),
    ]  # fmt: skip
    assert {r["BillingPeriodStart"] for r in rows} == {"2026-03-01T00:00:00Z"}
    assert {r["BillingPeriodEnd"] for r in rows} == {"2026-04-01T00:00:00Z"}
    # Every line was booked by the pass at 12:00 on the 5th: the hour of its booking.
    assert {r["ChargePeriodStart"] for r in rows} == {"2026-03-05T12:00:00Z"}
    assert {r["ChargePeriodEnd"] for r in rows} == {"2026-03-05T13:00:00Z"}
    # BilledCost sums to the ledger of the month, and to calls.csv's cost, exactly.
    billed = sum(Decimal(r["BilledCost"]) for r in rows)
    booked = [e for e in ledger(app) if e.booked_at.month == 3 and e.cost_pusd is not None]
    assert billed == Decimal(sum(e.cost_pusd for e in booked)) / 10**12 == Decimal("0.020069")
    calls = rows_of(export(months, "calls", **MARCH).content)
    assert billed == sum(Decimal(r["cost_usd"] or 0) for r in calls)
    # February: the settlement, a usage line (no correction).
    february = rows_of(focus(months, "2026-02"))
    assert [(r["x_TokenClass"], r["ChargeClass"], r["BilledCost"]) for r in february] == [
        ("input", "", "0.000066"),
        ("output", "", "0.01125"),
        ("cache_read", "", "0.00003"),
        ("cache_creation", "", "0.0001875"),
    ]
    assert sum(Decimal(r["BilledCost"]) for r in february) == Decimal("0.0115335")


def test_an_empty_month_is_the_header_alone(client: TestClient) -> None:
    body = focus(client, "2025-01")
    assert body.startswith(b"BilledCost,BillingAccountId,") and body.count(b"\r\n") == 1


@pytest.mark.parametrize(
    ("query", "path"),
    [
        ("", "query.period"),
        ("period=2026-13", "query.period"),
        ("period=0000-01", "query.period"),
        ("period=2026-3", "query.period"),
        ("period=%EF%BC%92026-03", "query.period"),  # a full-width digit
        ("period=2026-03-01", "query.period"),
        ("period=2026-03&since=2026-03-01T00:00:00Z", "query.since"),
        ("period=2026-03&period=2026-04", "query.period"),
    ],
)
def test_a_bad_period_is_a_422_naming_it(client: TestClient, query: str, path: str) -> None:
    response = client.get(f"/v1/exports/focus.csv?{query}")
    assert response.status_code == 422, response.text
    assert path in [e["path"] for e in response.json()["errors"]]


def test_the_focus_validator_passes_both_months(months: TestClient, tmp_path: Path) -> None:
    exe = validator()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("no Python 3.12 for focus-validator (.ci/run makes its venv)")
        pytest.skip("no Python 3.12 for focus-validator")
    for period in ("2026-02", "2026-03"):
        data = tmp_path / f"focus-{period}.csv"
        data.write_bytes(focus(months, period))
        assert problems(exe, data, tmp_path / f"report-{period}.xml") == []
