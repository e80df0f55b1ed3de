"""credits.csv and its manifest: a month with grants, draws, an expiry and an overdraft, then a
late re-rating booked into the next month; a closed month's bytes never change (CONTRACT
"Prepaid credits (v3)", "Export")."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.settings import Settings
from tests.credits.helpers import JAN, PRICE, call, grant, ok, reconcile


def export(client: TestClient, period: str) -> tuple[bytes, dict[str, object]]:
    response = client.get("/v1/exports/credits.csv", params={"period": period})
    assert response.status_code == 200, response.text
    assert response.headers["x-billing-period"] == "closed"
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    manifest = ok(client.get("/v1/exports/credits.manifest.json", params={"period": period}), 200)
    return response.content, manifest


def test_a_month_of_credits_and_a_late_adjustment_in_the_next_month(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    march = "2026-03-01T00:00:00Z"
    grant(client, "a", "0.02", march, priority=1, expires_at="2026-03-20T00:00:00Z")
    grant(client, "b", "0.01", march)
    call(client, "c1", "2026-03-02T10:00:00Z", 1000)  # 0.01: from a
    reconcile(app, settings, "2026-03-02T10:05:00Z")
    call(client, "c2", "2026-03-25T10:00:00Z", 1500)  # 0.015: b's 0.01, 0.005 overdrawn
    reconcile(app, settings, "2026-03-25T10:05:00Z")  # a's 0.01 expires first, at 03-20
    grant(client, "c", "1", "2026-03-26T00:00:00Z")
    body, manifest = export(client, "2026-03")
    assert body == (
        b"entry_id,kind,booked_at,customer_id,api_key_id,grant_id,amount_usd,request_id,ledger_seq\r\n"
        b"1,grant,2026-03-01T00:00:00Z,acme,,a,0.02,,\r\n"
        b"2,grant,2026-03-01T00:00:00Z,acme,,b,0.01,,\r\n"
        b"3,draw,2026-03-02T10:05:00Z,acme,,a,0.01,c1,1\r\n"
        b"4,expiry,2026-03-20T00:00:00Z,acme,,a,0.01,,\r\n"
        b"5,draw,2026-03-25T10:05:00Z,acme,,b,0.01,c2,1\r\n"
        b"6,overdraft,2026-03-25T10:05:00Z,acme,,,0.005,c2,1\r\n"
        b"7,grant,2026-03-26T00:00:00Z,acme,,c,1,,\r\n"
    )
    assert {k: v for k, v in manifest.items() if k != "sha256"} == {
        "export": "credits",
        "period": "2026-03",
        "since": "2026-03-01T00:00:00Z",
        "until": "2026-04-01T00:00:00Z",
        "status": "closed",
        "rows": 7,
        "to_date": {"grants_usd": "1.03", "draws_usd": "0.02", "expiries_usd": "0.01",
                    "voids_usd": "0", "overdrafts_usd": "0.005", "balances_usd": "1"},
        "in_period": {"grants_usd": "1.03", "draws_usd": "0.02", "expiries_usd": "0.01",
                      "voids_usd": "0", "overdrafts_usd": "0.005"},
        "opening_balance_usd": "0",
        "closing_balance_usd": "1",
        "identity": "grants - draws - expiries - voids = balances at the period's end",
        "identity_holds": True,
    }  # fmt: skip
    # A plan of 50 % over cost from January on, put in April: both calls are re-rated in April.
    ok(client.post("/v1/plans", json={"plan_id": "gold", "effective_from": JAN,
                                      "markup_pct": "50"}), 201)  # fmt: skip
    key = {"customer_id": "acme", "plan_id": "gold", "effective_from": "2026-02-01T00:00:00Z"}
    ok(client.put("/v1/keys/key_a", json=key), 201)
    reconcile(app, settings, "2026-04-02T00:00:00Z")
    again, same = export(client, "2026-03")
    assert (again, same) == (body, manifest)  # a closed month never changes
    april, manifest = export(client, "2026-04")
    assert april == (
        b"entry_id,kind,booked_at,customer_id,api_key_id,grant_id,amount_usd,request_id,ledger_seq\r\n"
        # c1 (now 0.015): a's 0.01 given back (a has expired: it ends again), then drawn of c.
        b"8,reversal,2026-04-02T00:00:00Z,acme,,a,-0.01,c1,3\r\n"
        b"9,expiry,2026-04-02T00:00:00Z,acme,,a,0.01,c1,3\r\n"
        b"10,draw,2026-04-02T00:00:00Z,acme,,c,0.015,c1,3\r\n"
        # c2 (now 0.0225): b's 0.01 and the overdraft given back, drawn of b then c.
        b"11,reversal,2026-04-02T00:00:00Z,acme,,,-0.005,c2,3\r\n"
        b"12,reversal,2026-04-02T00:00:00Z,acme,,b,-0.01,c2,3\r\n"
        b"13,draw,2026-04-02T00:00:00Z,acme,,b,0.01,c2,3\r\n"
        b"14,draw,2026-04-02T00:00:00Z,acme,,c,0.0125,c2,3\r\n"
    )
    assert manifest["in_period"] == {"grants_usd": "0", "draws_usd": "0.0175",
                                     "expiries_usd": "0.01", "voids_usd": "0",
                                     "overdrafts_usd": "-0.005"}  # fmt: skip
    assert (manifest["opening_balance_usd"], manifest["closing_balance_usd"]) == ("1", "0.9725")
    assert manifest["to_date"] == {"grants_usd": "1.03", "draws_usd": "0.0375",
                                   "expiries_usd": "0.02", "voids_usd": "0",
                                   "overdrafts_usd": "0", "balances_usd": "0.9725"}  # fmt: skip
    assert manifest["identity_holds"] is True


def test_a_period_must_be_a_month(client: TestClient) -> None:
    months = ({}, {"period": "2026-13"}, {"period": "2026-03-01"}, {"period": "0000-01"})
    for params in (*months, {"period": "9999-12"}, {"period": "x", "y": "1"}):
        response = client.get("/v1/exports/credits.csv", params=params)
        assert response.status_code == 422, (params, response.text)


def test_a_period_is_ascii_digits_and_the_manifest_names_it_canonically(
    client: TestClient,
) -> None:
    # "２026-03" (a full-width digit) was read as 2026-03 and echoed as the manifest's period.
    for path in ("/v1/exports/credits.csv", "/v1/exports/credits.manifest.json"):
        response = client.get(path, params={"period": "\uff12026-03"})
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["path"] == "query.period"
    manifest = ok(client.get("/v1/exports/credits.manifest.json", params={"period": " 2026-03 "}))
    assert (manifest["period"], manifest["since"]) == ("2026-03", "2026-03-01T00:00:00Z")


def test_grants_beyond_a_64_bit_sum_of_picodollars_export_exactly(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    """Three grants of 9,000,000 USD (9 * 10**18 picodollars each: their sum is past 2**63,
    where SQLite's integer ``sum`` raised "integer overflow" and both the CSV and its manifest
    answered 500): the totals and balances are exact."""
    ok(client.post("/v1/prices", json=PRICE), 201)
    march = "2026-03-01T00:00:00Z"
    for n in range(3):
        grant(client, f"big{n}", "9000000", march, api_key_id=f"key_{n}")
    grant(client, "small", "0.000001", march, api_key_id="key_0", priority=1)
    call(client, "c1", "2026-03-02T10:00:00Z", 1000, key="key_0")  # 0.01: 0.000001 of small
    reconcile(app, settings, "2026-03-02T10:05:00Z")
    body, manifest = export(client, "2026-03")
    assert body.count(b"\r\n") == 7  # the header, four grants, two draws
    assert b"4,grant,2026-03-01T00:00:00Z,,key_0,small,0.000001,,\r\n" in body
    assert b"6,draw,2026-03-02T10:05:00Z,,key_0,big0,0.009999,c1,1\r\n" in body
    assert manifest["to_date"] == {
        "grants_usd": "27000000.000001", "draws_usd": "0.01", "expiries_usd": "0",
        "voids_usd": "0", "overdrafts_usd": "0", "balances_usd": "26999999.990001",
    }  # fmt: skip
    assert manifest["in_period"] == {k: v for k, v in manifest["to_date"].items()
                                     if k != "balances_usd"}  # fmt: skip
    assert manifest["opening_balance_usd"] == "0"
    assert manifest["closing_balance_usd"] == "26999999.990001"
    assert manifest["identity_holds"] is True
