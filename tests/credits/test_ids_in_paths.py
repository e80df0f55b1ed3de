"""Customer and grant ids are free text (1–128 printable characters, slashes included, as a
key's `customer_id` or a grant's `grant_id` accepts them): each is reached back percent-encoded
as one path segment (CONTRACT "Prepaid credits (v3)"), through a real server, since the test
client decodes a path twice."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest

IDS = ["team/a", "/leading", "trailing/", "a%2Fb", "ünï/ß"]


@pytest.mark.parametrize("customer_id", IDS)
def test_a_customer_named_with_a_slash_is_put_and_read_back(
    http: httpx.Client, customer_id: str
) -> None:
    path = f"/v1/customers/{quote(customer_id, safe='')}"
    put = http.put(path, json={"credit_required": True, "low_balance_usd": "2"})
    assert put.status_code == 201, put.text
    assert put.json()["customer_id"] == customer_id
    got = http.get(path)
    assert got.status_code == 200, got.text
    assert (got.json()["customer_id"], got.json()["credit_required"]) == (customer_id, True)
    missing = http.get(f"/v1/customers/{quote(customer_id + '/x', safe='')}")
    assert missing.status_code == 404 and "customer" in missing.json()["error"]


@pytest.mark.parametrize("grant_id", IDS)
def test_a_grant_named_with_a_slash_can_be_voided(http: httpx.Client, grant_id: str) -> None:
    grant = {"grant_id": grant_id, "api_key_id": "key_1", "amount_usd": "3", "kind": "purchased"}
    assert http.post("/v1/credits/grants", json=grant).status_code == 201
    voided = http.post(f"/v1/credits/grants/{quote(grant_id, safe='')}/void", json={})
    assert voided.status_code == 200, voided.text
    assert (voided.json()["grant_id"], voided.json()["state"]) == (grant_id, "voided")
    balance = http.get("/v1/credits/balance", params={"api_key_id": "key_1"}).json()
    assert balance["balance_usd"] == "0"
    missing = http.post(f"/v1/credits/grants/{quote(grant_id + '/x', safe='')}/void", json={})
    assert missing.status_code == 404 and "grant" in missing.json()["error"]
