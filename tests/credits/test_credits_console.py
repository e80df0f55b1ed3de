"""The console's Credits page: the customers with their balances, and one owner's balance,
grants and latest draws (rendered from the same services as the API)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.settings import Settings
from tests.credits.helpers import JAN, PRICE, call, grant, ok, reconcile


def test_the_credits_page_shows_balances_grants_and_draws(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    empty = client.get("/console/credits")
    assert empty.status_code == 200
    assert "No customer yet." in empty.text
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    grant(client, "g<1>", "0.5", priority=7)
    call(client, "r1", "2026-03-01T10:00:00Z", 1000)
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    listed = client.get("/console/credits").text
    assert (
        '<a href="/console/credits?customer_id=acme"><span class="ident" title="acme">acme</span>'
        "</a>" in listed
    )
    assert '<td class="num" title="0.49">$0.49</td>' in listed
    page = client.get("/console/credits", params={"customer_id": "acme"})
    assert page.status_code == 200
    html = page.text
    assert '<h2 class="long">Customer acme</h2>' in html
    assert (
        '<dd class="num" id="balance-available" data-exact="0.49" title="0.49 USD">'
        "<strong>$0.49</strong></dd>" in html
    )
    assert '<span class="ident" title="g&lt;1&gt;">g&lt;1&gt;</span>' in html  # escaped
    assert "<td>draw</td>" in html and '<td class="num" title="0.01">$0.01</td>' in html
    assert '<a href="/console/calls/r1"><span class="ident" title="r1">r1</span></a>' in html
    assert 'href="/console/credits"' in html  # in the navigation
    # A key with a customer shows its customer's entries beside its customer's balance (the
    # entries were the key's own: none, under the customer's balance).
    by_key = client.get("/console/credits", params={"api_key_id": "key_a"}).text
    assert '<h2 class="long">Customer acme</h2>' in by_key
    assert "<td>draw</td>" in by_key and "No entry." not in by_key
