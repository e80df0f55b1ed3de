"""(#43) What a person reads on the console: shares as percentages (``90 %``, not ``0.9``), money
as dollars, chart axes without scientific notation; the Overview's cards only for the roles that
may read what they show; "failing alert deliveries" counts the webhooks whose latest attempt
failed (still retrying or given up). Through the real HTTP client, on SQLite or PostgreSQL
(``BILLING_TEST_DATABASE_URL``). Source: CONTRACT "Console (v2)", "Observability and standard
exports (v3)", "Budgets and alerts", "Who may do what"."""

from __future__ import annotations

import re
import socket
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from billing import destinations
from billing.console.chart import bar_chart
from billing.console.people import change, count, percent, share, usd
from billing.settings import Settings
from tests.budgets.helpers import call, create, deliver, price, receiving, reconcile
from tests.console.conftest import KOLKATA_USAGE
from tests.console.test_console_http import sign_in


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Webhooks go to 127.0.0.1 here: private destinations allowed."""
    return Settings(database_url=db_url, webhook_allow_private=True)


@pytest.mark.nodb
def test_one_way_of_writing_percentages_money_and_counts() -> None:
    assert [percent(f) for f in ("0.9", "0.10756", "0.8", "1", "0", "12.5")] == [
        "90 %",
        "10.8 %",
        "80 %",
        "100 %",
        "0 %",
        "1,250 %",
    ]
    assert percent(None) == "—"
    assert [share(1, 3), share(1, 2), share(0, 5), share(1, 0)] == ["33.3 %", "50 %", "0 %", "—"]
    assert [change("90", "100"), change("112.5", "100"), change("1", "0")] == [
        "−10 %",
        "+12.5 %",
        "new",
    ]
    assert [usd("0.5"), usd("0.011534"), usd("4100"), usd("1234.567"), usd("-0.25")] == [
        "$0.50",
        "$0.01153",
        "$4,100.00",
        "$1,234.57",
        "−$0.25",
    ]
    assert [count(104260), count("4100"), count(0), count(None)] == ["104,260", "4,100", "0", "—"]


@pytest.mark.nodb
def test_a_chart_axis_is_labelled_for_people_never_in_scientific_notation() -> None:
    # the label by the series: dollars for amounts (*_usd), else a count
    tokens = bar_chart("Tokens", ["d1", "d2"], [("input_tokens", {"d1": 104260, "d2": 7})])
    assert (tokens.axis_max, tokens.axis_exact) == ("104,260", "104260")
    cost = bar_chart("Cost", ["d1"], [("cost_usd", {"d1": "4100"})])
    assert (cost.axis_max, cost.axis_exact) == ("$4,100.00", "4100")
    assert bar_chart("Empty", ["d1"], [("cost_usd", {})]).axis_max == "$0.00"


def _closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (a webhook there fails: "connection failed")."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_budgets_and_alerts_in_percent_and_failing_deliveries_counted(
    client: TestClient, tokens: dict[str, str]
) -> None:
    client.headers["Authorization"] = f"Bearer {tokens['admin']}"
    price(client)
    now = datetime.now(UTC).replace(microsecond=0)
    old = now - timedelta(days=20)
    dead = f"http://127.0.0.1:{_closed_port()}/hook"
    with receiving([200]) as receiver:
        with destinations.allowing_private(True):
            # retrying: its one attempt failed, the 24 hours of retries are not over
            create(client, now - timedelta(minutes=10), budget_id="b-retrying",
                   scope={"api_key_id": "k-retry"}, limit_usd="1", period="total",
                   webhook_url=dead)  # fmt: skip
            # given up: made 20 days ago, its attempt fails past the retries' end
            create(client, old - timedelta(minutes=10), budget_id="b-given-up",
                   scope={"api_key_id": "k-old"}, limit_usd="1", period="total",
                   webhook_url=dead)  # fmt: skip
            # delivered at the first attempt
            create(client, now - timedelta(minutes=10), budget_id="b-delivered",
                   scope={"api_key_id": "k-ok"}, limit_usd="1", period="total",
                   webhook_url=receiver.url)  # fmt: skip
        # $0.90 of a $1 budget each: 90 % used, the 0.8 threshold crossed (an alert each)
        # (the alert is made when its call settles: the old one 20 days ago)
        call(client, "r-old", old - timedelta(minutes=5), 900_000, key="k-old")
        reconcile(client, old)
        call(client, "r-retry", now - timedelta(minutes=5), 900_000, key="k-retry")
        call(client, "r-ok", now - timedelta(minutes=5), 900_000, key="k-ok")
        reconcile(client, now - timedelta(minutes=3))
        assert deliver(client) == 3  # one attempt each
    del client.headers["Authorization"]
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    listed = client.get("/v1/alerts", headers=admin).json()["data"]
    deliveries = {a["budget_id"]: a["delivery"] for a in listed}
    assert {b: (d["state"], d["attempts"]) for b, d in deliveries.items()} == {
        "b-retrying": ("pending", 1),
        "b-given-up": ("failed", 1),
        "b-delivered": ("delivered", 1),
    }
    assert deliveries["b-retrying"]["last_error"] == "connection failed"
    assert {a["threshold"] for a in listed} == {"0.8"}

    sign_in(client, tokens["read"])
    overview = client.get("/console/overview").text
    # the two whose latest attempt failed: the one still retrying counts too
    assert '<dd class="big" id="fig-failed">2</dd>' in overview
    assert "latest attempt failed (retrying or given up); 1 delivered" in overview
    assert "Budgets near or over their limit" in overview
    near = re.findall(
        r'<th scope="row" class="name" title="([^"]+)">[^<]+</th><td>warning</td>'
        r'<td class="num">\$0\.90</td><td class="num">\$1\.00</td>'
        r'<td class="num" title="0\.9">90 %</td>',
        overview,
    )
    assert sorted(near) == ["b-delivered", "b-given-up", "b-retrying"]
    assert "0.9<" not in overview

    alerts = client.get("/console/alerts").text
    thresholds = re.findall(r'<td class="num" title="([^"]+)">([^<]+)</td>', alerts)
    assert thresholds == [("0.8", "80 %")] * 3

    budgets = client.get("/console/budgets").text
    assert budgets.count('<progress max="1" value="0.9">90 %</progress>') == 3
    assert budgets.count("<td>80 %</td>") == 3  # the thresholds crossed

    # export may read the Overview but neither /v1/budgets nor /v1/alerts: no such card
    export = {"Authorization": f"Bearer {tokens['export']}"}
    assert client.get("/v1/alerts", headers=export).status_code == 403
    sign_in(client, tokens["export"])
    seen = client.get("/console/overview")
    assert seen.status_code == 200 and 'id="fig-cost"' in seen.text
    assert "Budgets near or over their limit" not in seen.text
    assert "near-budgets" not in seen.text and "b-retrying" not in seen.text
    assert 'id="fig-failed"' not in seen.text and "/console/alerts" not in seen.text
    assert client.get("/console/alerts").status_code == 403


def test_the_usage_charts_label_their_axis_as_money_and_token_counts(
    seeded: TestClient, tokens: dict[str, str]
) -> None:
    read = {"Authorization": f"Bearer {tokens['read']}"}
    rows = seeded.get("/v1/usage", params=KOLKATA_USAGE, headers=read).json()["data"]
    top_cost = max(Decimal(r["cost_usd"]) for r in rows if r["cost_usd"] is not None)
    top_tokens = max(
        max(r["input_tokens"], r["output_tokens_billed"]) for r in rows
    )  # fmt: skip
    sign_in(seeded, tokens["read"])
    body = seeded.get("/console/usage", params=KOLKATA_USAGE).text
    labels = re.findall(r'class="label axis-top" data-exact="([^"]+)">([^<]+)</text>', body)
    assert labels == [
        (f"{top_cost.normalize():f}", usd(top_cost)),
        (str(top_tokens), count(top_tokens)),
    ]
    assert labels[1][1] == f"{top_tokens:,}" and "," in labels[1][1]
    assert re.search(r"\d\.\d+E[+-]\d", body) is None
