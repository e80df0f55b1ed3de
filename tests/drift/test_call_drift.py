"""Per-call drift (CONTRACT "Non-streaming calls, hosted-tool fees, provider-reported cost (v3)":
"drift shows per call where they differ"): ``GET /v1/drift/calls`` lists the calls whose
provider-reported cost (``stream.usage.provider_cost_usd``) is not ours, with exact figures,
ingested through the API, on the test database (SQLite or PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.builders import post
from tests.console.conftest import table
from tests.drift.test_drift_cli import Billing, billing  # noqa: F401 (the fixture)

DAY = datetime(2026, 11, 10, tzinfo=UTC)
PERIOD = {"since": "2026-11-10T00:00:00Z", "until": "2026-11-11T00:00:00Z"}
#: $1 per million input tokens, $2 per million output tokens.
PRICE = {
    "model": "m-drift",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "1",
    "output_usd_per_mtok": "2",
    "cache_read_usd_per_mtok": "0",
    "cache_creation_usd_per_mtok": "0",
}


def call(
    client: TestClient,
    rid: str,
    at: datetime,
    provider_cost: str | None,
    model: str = "m-drift",
) -> None:
    """A settled call of 1,000 input and 500 output tokens ($0.002 at ``PRICE``)."""
    usage: dict[str, Any] = {
        "event_id": f"{rid}-u",
        "request_id": rid,
        "type": "stream.usage",
        "occurred_at": (at + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "input_tokens": 1000,
        "output_tokens": 500,
        "source": "upstream",
    }
    if provider_cost is not None:
        usage["provider_cost_usd"] = provider_cost
    events = [
        {
            "event_id": f"{rid}-s",
            "request_id": rid,
            "type": "stream.started",
            "occurred_at": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "api_key_id": "key_7f3a",
            "model": model,
            "protocol": "openai.chat_completions",
        },
        usage,
    ]
    response = post(client, events)
    assert response.status_code == 200, response.text


def calls(client: TestClient, **params: Any) -> dict[str, Any]:
    response = client.get("/v1/drift/calls", params={**PERIOD, **params})
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def seed(client: TestClient) -> None:
    assert client.post("/v1/prices", json=PRICE).status_code in (200, 201)
    call(client, "near", DAY + timedelta(hours=10), "0.00201")  # +0.5 %
    call(client, "far", DAY + timedelta(hours=11), "0.0025")  # +25 %
    call(client, "same", DAY + timedelta(hours=11, minutes=30), "0.002")
    call(client, "unpriced", DAY + timedelta(hours=12), "0.003", model="m-none")
    call(client, "unreported", DAY + timedelta(hours=13), None)
    call(client, "before", DAY - timedelta(seconds=1), "0.009")
    assert client.post("/v1/reconcile", json={}).status_code == 200


def row(
    rid: str, at: str, model: str, ours: Any, theirs: str, delta: Any, pct: Any, status: str
) -> dict[str, Any]:
    return {
        "request_id": rid,
        "started_at": at,
        "provider": "openai",
        "model": model,
        "api_key_id": "key_7f3a",
        "upstream_account": None,
        "settled": True,
        "ours": ours,
        "theirs": theirs,
        "delta": delta,
        "delta_pct": pct,
        "status": status,
    }


def test_the_calls_whose_provider_cost_differs_newest_first_with_exact_figures(
    client: TestClient,
) -> None:
    seed(client)
    assert calls(client) == {
        "data": [
            row(
                "unpriced",
                "2026-11-10T12:00:00Z",
                "m-none",
                None,
                "0.003",
                None,
                None,
                "missing_ours",
            ),
            row(
                "far", "2026-11-10T11:00:00Z", "m-drift", "0.002", "0.0025", "0.0005", "25", "drift"
            ),
            row(
                "near",
                "2026-11-10T10:00:00Z",
                "m-drift",
                "0.002",
                "0.00201",
                "0.00001",
                "0.5",
                "match",
            ),
        ],
        "next_cursor": None,
    }
    # A wider tolerance: 25 % is within 30 %.
    assert [r["status"] for r in calls(client, tolerance_pct="30")["data"]] == [
        "missing_ours",
        "match",
        "match",
    ]
    assert calls(client, provider="anthropic") == {"data": [], "next_cursor": None}


def test_pages_follow_each_other_by_cursor(client: TestClient) -> None:
    seed(client)
    first = calls(client, limit=2)
    assert [r["request_id"] for r in first["data"]] == ["unpriced", "far"]
    assert first["next_cursor"] is not None
    second = calls(client, limit=2, cursor=first["next_cursor"])
    assert [r["request_id"] for r in second["data"]] == ["near"]
    assert second["next_cursor"] is None


def test_a_cursor_of_another_range_or_provider_is_a_422(client: TestClient) -> None:
    seed(client)
    first = calls(client, limit=2)
    assert [r["request_id"] for r in first["data"]] == ["unpriced", "far"]
    cut = first["next_cursor"]
    message = (
        "was issued for another query (since, until or a filter differ); pass the next_cursor "
        "of the previous page with the same query, or leave cursor out for the first page"
    )
    others = (
        {"since": "2026-11-10T09:00:00Z"},  # another range, the cursor's row within it
        {"until": "2026-11-11T00:00:01Z"},
        {"provider": "openai"},  # the same rows, but another query
    )
    for other in others:
        response = client.get(
            "/v1/drift/calls", params={**PERIOD, "limit": 2, **other, "cursor": cut}
        )
        assert response.status_code == 422, (other, response.text)
        assert response.json() == {
            "errors": [{"index": None, "path": "query.cursor", "message": message}]
        }
    # the same instants written another way are the same query; tolerance only grades rows
    same = calls(
        client,
        since=PERIOD["since"].replace("Z", "+00:00"),
        limit=2,
        tolerance_pct="30",
        cursor=cut,
    )
    assert [(r["request_id"], r["status"]) for r in same["data"]] == [("near", "match")]
    # a call log cursor (no stamp) is not one of this endpoint's
    log_cursor = client.get("/v1/calls", params={"limit": 1}).json()["next_cursor"]
    response = client.get("/v1/drift/calls", params={**PERIOD, "cursor": log_cursor})
    assert response.status_code == 422 and "is not a cursor from this endpoint" in response.text


def test_bad_parameters_are_a_422_naming_each(client: TestClient) -> None:
    response = client.get(
        "/v1/drift/calls",
        params={"since": "2026-11-10T00:00:00Z", "until": "2026-11-09T00:00:00Z", "limit": "0"},
    )
    assert response.status_code == 422, response.text
    text = response.text
    assert "until" in text and "limit" in text


def test_billing_drift_calls_gives_every_page_as_csv_or_json(
    client: TestClient,
    db_url: str,
    tmp_path: Path,
    billing: Billing,  # noqa: F811
) -> None:
    seed(client)
    period = ("--since", PERIOD["since"], "--until", PERIOD["until"])
    done = billing(db_url, tmp_path, "drift", "--calls", *period)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split("\r\n") == [
        "request_id,started_at,provider,model,api_key_id,upstream_account,settled,status,"
        "ours_cost_usd,theirs_cost_usd,delta_cost_usd,delta_pct_cost_usd",
        "unpriced,2026-11-10T12:00:00Z,openai,m-none,key_7f3a,,true,missing_ours,,0.003,,",
        "far,2026-11-10T11:00:00Z,openai,m-drift,key_7f3a,,true,drift,0.002,0.0025,0.0005,25",
        "near,2026-11-10T10:00:00Z,openai,m-drift,key_7f3a,,true,match,0.002,0.00201,0.00001,0.5",
        "",
    ]
    done = billing(db_url, tmp_path, "drift", "--calls", *period, "--format", "json")
    assert json.loads(done.stdout) == {"data": calls(client)["data"]}
    done = billing(db_url, tmp_path, "drift", "--calls", "--group-by", "model", *period)
    assert done.returncode == 2


def test_the_console_drift_page_lists_the_calls_below_the_groups(client: TestClient) -> None:
    seed(client)
    response = client.get("/console/drift", params=PERIOD)
    assert response.status_code == 200, response.text
    body = response.text.replace('<table class="drift-calls">', '<table id="c">')
    # (An unpriced call's cost shows as in /console/usage; no delta without it.)
    key = ("openai", "key_7f3a")
    assert table(body, "c").rows == [
        [
            "unpriced",
            "2026-11-10T12:00:00Z",
            key[0],
            "m-none",
            key[1],
            "missing_ours",
            "unpriced",
            "0.003",
            "",
        ],
        [
            "far",
            "2026-11-10T11:00:00Z",
            key[0],
            "m-drift",
            key[1],
            "drift",
            "0.002",
            "0.0025",
            "0.0005 (25 %)",
        ],
        [
            "near",
            "2026-11-10T10:00:00Z",
            key[0],
            "m-drift",
            key[1],
            "match",
            "0.002",
            "0.00201",
            "0.00001 (0.5 %)",
        ],
    ]


def test_the_console_groups_show_a_dash_where_a_side_has_no_figures(client: TestClient) -> None:
    """No report is imported: every group is ``missing_theirs``; its provider and delta cells
    read "—", never Python's ``None``."""
    seed(client)
    response = client.get("/console/drift", params=PERIOD)
    assert response.status_code == 200, response.text
    groups = response.text.split('<table class="drift-calls">', 1)[0]
    assert "missing_theirs" in groups
    assert ">None<" not in groups
    assert '<td class="num">—</td>' in groups
