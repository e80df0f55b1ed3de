"""The console's customers and charges (issue #43): the Calls page filtered by customer shows
that customer's calls with their exact charges, Usage by customer holds the rows of
``/v1/usage?group_by=customer_id``, the Customers page each customer's exact credit balance
(linking to its Credits page), a call's metadata as a key/value list; no attribute says
``None``; every value escaped. Runs on SQLite, or on PostgreSQL with
``BILLING_TEST_DATABASE_URL``. Source: CONTRACT "Console (v2)", "Observability and standard
exports (v3)"."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from billing.console.people import usd
from billing.dimensions import TOKEN_FIELDS
from tests.console.conftest import BULK_CALLS, BULK_KEY, escaped, table
from tests.console.test_console_http import DAY, sign_in

#: A customer whose id is HTML: it must show as text everywhere.
XSS_CUSTOMER = "<script>x</script>"
#: key_demo's (the seed call's) customer.
ACME = "acme"
#: What the tagged call's gateway sent as metadata.
METADATA = {"tags": "team-a,blue", "user": "<b>u-1</b>"}


def _admin(tokens: dict[str, str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens['admin']}"}


def _customers(client: TestClient, tokens: dict[str, str]) -> None:
    """key_bulk → XSS_CUSTOMER on plan ``pro`` (20 % over cost), key_demo → acme without a
    plan; a tagged call of key_bulk; credit granted to both; reconciled (charges follow)."""
    admin = _admin(tokens)
    plan = {"plan_id": "pro", "effective_from": "2026-01-01T00:00:00Z", "markup_pct": "20"}
    assert client.post("/v1/plans", json=plan, headers=admin).status_code == 201
    for key, body in (
        (BULK_KEY, {"customer_id": XSS_CUSTOMER, "plan_id": "pro"}),
        ("key_demo", {"customer_id": ACME}),
    ):
        body["effective_from"] = "2026-01-01T00:00:00Z"
        made = client.put(f"/v1/keys/{key}", json=body, headers=admin)
        assert made.status_code == 201, made.text
    tagged = [
        {"event_id": "tag-s", "request_id": "req-tagged", "type": "stream.started",
         "occurred_at": "2026-10-16T09:00:00Z", "api_key_id": BULK_KEY,
         "model": "claude-sonnet-5-5", "protocol": "anthropic.messages", "input_tokens": 40,
         "metadata": METADATA},
        {"event_id": "tag-u", "request_id": "req-tagged", "type": "stream.usage",
         "occurred_at": "2026-10-16T09:00:02Z", "input_tokens": 40, "output_tokens": 9,
         "source": "upstream"},
    ]  # fmt: skip
    posted = client.post("/v1/events", json={"events": tagged}, headers=admin)
    assert posted.status_code == 200, posted.text
    assert client.post("/v1/reconcile", json={}, headers=admin).status_code == 200
    for grant_id, customer, amount in (("g-x", XSS_CUSTOMER, "12.345678"), ("g-a", ACME, "0.5")):
        grant = {"grant_id": grant_id, "customer_id": customer, "amount_usd": amount,
                 "kind": "purchased", "effective_at": "2026-01-01T00:00:00Z"}  # fmt: skip
        made = client.post("/v1/credits/grants", json=grant, headers=admin)
        assert made.status_code == 201, made.text


def _no_none_attributes(body: str) -> None:
    assert not re.search(r'="None"', body), re.search(r'.{80}="None".{20}', body)


def test_calls_filtered_by_customer_show_its_calls_with_their_exact_charges(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    _customers(seeded, tokens)
    api = seeded.get(
        "/v1/calls", params={"customer_id": XSS_CUSTOMER, "limit": 1000}, headers=_admin(tokens)
    )
    assert api.status_code == 200, api.text
    expected = [(c["request_id"], c["customer_id"], c["cost_usd"], c["charge_usd"])
                for c in api.json()["data"]]  # fmt: skip
    assert len(expected) == BULK_CALLS + 1
    assert all(charge is not None and cost != charge for _, _, cost, charge in expected)
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/calls", params={"customer_id": XSS_CUSTOMER, "limit": 1000}).text
    assert "not-built" not in body and "does not show them yet" not in body
    assert XSS_CUSTOMER not in body  # escaped everywhere
    assert f'name="customer_id" value="{escaped(XSS_CUSTOMER)}"' in body  # kept in the form
    shown = table(body.replace('<table class="calls">', '<table id="calls">'), "calls")
    assert shown.head[3] == "Customer" and shown.head[10:12] == ["Cost (USD)", "Charge (USD)"]
    assert [(r[1], r[3], r[10], r[11]) for r in shown.rows] == expected
    _no_none_attributes(body)
    # acme's only call: the seed call, charged at cost (no plan)
    body = seeded.get("/console/calls", params={"customer_id": ACME}).text
    rows = table(body.replace('<table class="calls">', '<table id="calls">'), "calls").rows
    (seed_call,) = seeded.get(
        "/v1/calls", params={"customer_id": ACME}, headers=_admin(tokens)
    ).json()["data"]
    assert [(r[1], r[3], r[11]) for r in rows] == [
        (seed_call["request_id"], ACME, seed_call["charge_usd"])
    ]


def test_usage_by_customer_holds_the_rows_of_v1_usage(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    _customers(seeded, tokens)
    query = {**DAY, "group_by": "customer_id"}
    api = seeded.get("/v1/usage", params=query, headers=_admin(tokens))
    assert api.status_code == 200, api.text
    rows: list[dict[str, Any]] = api.json()["data"]
    assert {r["customer_id"] for r in rows} == {XSS_CUSTOMER, ACME, None}
    fields = ["calls", *TOKEN_FIELDS, "cost_usd", "charge_usd"]
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/usage", params=query).text
    assert "not-built" not in body and XSS_CUSTOMER not in body
    shown = table(body, "usage-table")
    assert shown.head == ["customer_id", *fields]
    assert shown.rows == [
        ["(none)" if r["customer_id"] is None else r["customer_id"]]
        + ["unpriced" if r[f] is None else str(r[f]) for f in fields]
        for r in rows
    ]
    charges = re.findall(r'class="bar bar-charge_usd"[^>]* data-period="([^"]+)" '
                         r'data-value="([^"]+)"', body)  # fmt: skip
    assert [(html.unescape(p), v) for p, v in charges] == [
        ("(none)" if r["customer_id"] is None else r["customer_id"], r["charge_usd"])
        for r in rows
        if r["charge_usd"] is not None
    ]
    assert '<option value="customer_id" selected>customer</option>' in body
    _no_none_attributes(body)

    # one customer by hour: the same rows as /v1/usage?customer_id=…&group_by=hour
    one = {**DAY, "group_by": "hour", "customer_id": XSS_CUSTOMER}
    rows = seeded.get("/v1/usage", params=one, headers=_admin(tokens)).json()["data"]
    body = seeded.get("/console/usage", params=one).text
    assert f'name="customer_id" value="{escaped(XSS_CUSTOMER)}"' in body
    assert table(body, "usage-table").rows == [
        [r["hour"]] + ["unpriced" if r[f] is None else str(r[f]) for f in fields] for r in rows
    ]
    assert sum(r["calls"] for r in rows) == BULK_CALLS + 1


def test_the_customers_page_shows_each_customers_exact_credit_balance(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    _customers(seeded, tokens)
    listed = seeded.get("/v1/customers", headers=_admin(tokens)).json()["data"]
    balances = {c["customer_id"]: c["balance"]["balance_usd"] for c in listed}
    # (the grants came after the calls settled: nothing drawn)
    assert balances == {XSS_CUSTOMER: "12.345678", ACME: "0.5"}
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/customers", params=DAY).text
    assert "not-built" not in body and "not shown on this page yet" not in body
    assert XSS_CUSTOMER not in body
    shown = table(body, "customers")
    assert shown.head[-1] == "Credit balance"
    assert {r[0]: r[-1] for r in shown.rows} == {c: usd(b) for c, b in balances.items()}
    for customer, exact in balances.items():
        link = f"/console/credits?customer_id={html.escape(_quoted(customer))}"
        assert f'<td class="num" data-exact="{exact}"><a href="{link}">' in body
    _no_none_attributes(body)


def _quoted(text: str) -> str:
    """``text`` as Jinja2's ``urlencode`` writes it in a link."""
    return quote(text, safe="/")


def test_a_calls_metadata_is_a_key_value_list(seeded: TestClient, tokens: dict[str, str]) -> None:
    _customers(seeded, tokens)
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/calls/req-tagged").text
    pairs = (
        '<dl class="pairs"><div><dt>tags</dt><dd>team-a,blue</dd></div>'
        f"<div><dt>user</dt><dd>{escaped(METADATA['user'])}</dd></div></dl>"
    )
    assert f'<dd id="metadata">{pairs}</dd>' in body  # the call's
    assert f"<dt>metadata</dt><dd>{pairs}</dd>" in body  # the started event's
    assert "{&#39;tags&#39;" not in body and "<b>" not in body
    assert f"<dt>Customer</dt><dd>{escaped(XSS_CUSTOMER)}</dd>" in body
    _no_none_attributes(body)
    for path in ("/console/keys", "/console/overview", "/console/calls", "/console/usage"):
        _no_none_attributes(seeded.get(path, params=DAY if path != "/console/calls" else {}).text)
