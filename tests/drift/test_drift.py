"""Drift (CONTRACT "Provider reports and drift"): our calls against provider report pages, with
exact figures, through the API on the test database (SQLite or PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.pool import NullPool

from billing.storage.models import Call
from tests.builders import post
from tests.providers.pages import (
    anthropic_cost_result,
    anthropic_page,
    anthropic_usage_result,
    openai_page,
    openai_usage_result,
)

DAY = datetime(2026, 11, 10, tzinfo=UTC)
PERIOD = {"since": "2026-11-10T00:00:00Z", "until": "2026-11-11T00:00:00Z"}


def call(
    client: TestClient,
    rid: str,
    *,
    model: str = "gpt-4o",
    protocol: str = "openai.chat_completions",
    at: datetime = DAY + timedelta(hours=10),
    input_tokens: int = 100,
    cache_read: int = 50,
    cache_creation: int = 0,
    output: int = 200,
    tier: str | None = None,
    units: dict[str, int] | None = None,
    **started: Any,
) -> None:
    """One call of one attempt with the provider's usage (our token semantics: input without
    cache), started at ``at``."""
    when = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    later = (at + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    events = [
        {
            "event_id": f"{rid}-s",
            "request_id": rid,
            "type": "stream.started",
            "occurred_at": when,
            "api_key_id": "key_7f3a",
            "model": model,
            "protocol": protocol,
            **started,
        },
        {
            "event_id": f"{rid}-u",
            "request_id": rid,
            "type": "stream.usage",
            "occurred_at": later,
            "input_tokens": input_tokens,
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_creation,
            "output_tokens": output,
            "source": "upstream",
            **({"service_tier": tier} if tier else {}),
            **({"units": units} if units else {}),
        },
    ]
    assert post(client, events).status_code == 200


def settle(client: TestClient) -> None:
    assert client.post("/v1/reconcile", json={}).status_code == 200


def report(client: TestClient, provider: str, kind: str, page: dict[str, Any]) -> Any:
    response = client.post(
        "/v1/provider-reports", json={"provider": provider, "kind": kind, "report": page}
    )
    assert response.status_code == 200, response.text
    return response.json()


def drift(client: TestClient, **params: str) -> list[dict[str, Any]]:
    response = client.get("/v1/drift", params={**PERIOD, **params})
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()["data"]
    return rows


def figures(requests: Any, inp: Any, read: Any, creation: Any, out: Any, cost: Any) -> Any:
    return {
        "requests": requests,
        "input_tokens": inp,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": creation,
        "output_tokens": out,
        "cost_usd": cost,
    }


def test_openai_usage_that_agrees_matches_with_cached_tokens_inside_its_input(
    client: TestClient,
) -> None:
    # Ours: 2 calls, 100 input (without cache) + 50 cache read + 200 output each.
    call(client, "r1")
    call(client, "r2", at=DAY + timedelta(hours=23, minutes=59, seconds=50))
    settle(client)
    # OpenAI counts the cached tokens inside input_tokens: 2 × (100 + 50) = 300, 100 cached.
    page = openai_page([(DAY, [openai_usage_result("gpt-4o", 300, 100, 400, 2)])])
    assert report(client, "openai", "usage", page) == {
        "buckets": 1,
        "new": 1,
        "changed": 0,
        "unchanged": 0,
    }
    (row,) = drift(client)
    assert row["status"] == "match"
    assert (row["provider"], row["day"], row["model"]) == ("openai", "2026-11-10", "gpt-4o")
    # gpt-4o has no price here: ours' cost is unknown (null, as in /v1/usage), never "0".
    assert row["ours"] == figures(2, 200, 100, 0, 400, None)
    assert row["theirs"] == figures(2, 200, 100, 0, 400, None)
    assert row["delta"] == figures(0, 0, 0, 0, 0, None)
    assert row["delta_pct"] == figures("0", "0", "0", "0", "0", None)


def test_provider_billing_370_more_output_tokens_is_drift_with_delta_370(
    client: TestClient,
) -> None:
    call(client, "r1", output=380)
    call(client, "r2", model="gpt-4o-mini", output=10)
    settle(client)
    page = openai_page(
        [
            (
                DAY,
                [
                    openai_usage_result("gpt-4o", 150, 50, 750, 1),
                    openai_usage_result("gpt-4o-mini", 150, 50, 10, 1),
                ],
            )
        ]
    )
    report(client, "openai", "usage", page)
    first, second = drift(client)
    assert first["model"] == "gpt-4o" and first["status"] == "drift"
    assert first["delta"] == figures(0, 0, 0, 0, 370, None)
    assert first["delta_pct"]["output_tokens"] == "97.3684"
    assert second["model"] == "gpt-4o-mini" and second["status"] == "match"
    # Within the tolerance: 370 more on 380 is 97.4 %.
    assert drift(client, tolerance_pct="98")[0]["status"] == "match"


def test_a_provider_bucket_for_a_model_we_never_saw_is_missing_ours(client: TestClient) -> None:
    call(client, "r1")
    settle(client)
    page = openai_page(
        [
            (
                DAY,
                [
                    openai_usage_result("gpt-4o", 150, 50, 200, 1),
                    openai_usage_result("o3-ghost", 1000, 0, 20, 3),
                ],
            )
        ]
    )
    report(client, "openai", "usage", page)
    ghost, known = drift(client)
    assert (ghost["model"], ghost["status"]) == ("o3-ghost", "missing_ours")
    assert ghost["ours"] == figures(0, 0, 0, 0, 0, "0")
    assert ghost["delta"] == figures(3, 1000, 0, 0, 20, None)
    assert ghost["delta_pct"] == figures(None, None, "0", "0", None, None)
    assert (known["model"], known["status"]) == ("gpt-4o", "match")


def test_calls_without_a_provider_line_are_missing_theirs(client: TestClient) -> None:
    call(client, "r1")
    call(client, "r2", model="gpt-4.1")
    settle(client)
    report(
        client,
        "openai",
        "usage",
        openai_page([(DAY, [openai_usage_result("gpt-4o", 150, 50, 200, 1)])]),
    )
    missing, matched = drift(client)
    assert (missing["model"], missing["status"]) == ("gpt-4.1", "missing_theirs")
    assert missing["theirs"] == figures(None, None, None, None, None, None)
    assert matched["status"] == "match"


def test_anthropic_cost_report_in_cents_against_our_dollars(client: TestClient) -> None:
    price = {
        "model": "claude-sonnet-4-5",
        "effective_from": "2026-01-01T00:00:00Z",
        "input_usd_per_mtok": "3",
        "output_usd_per_mtok": "15",
        "cache_read_usd_per_mtok": "0.3",
        "cache_creation_usd_per_mtok": "3.75",
    }
    assert client.post("/v1/prices", json=price).status_code == 201
    # 1000 input × 3 + 2000 cache read × 0.3 + 400 cache write × 3.75 + 2000 output × 15
    # = 0.003 + 0.0006 + 0.0015 + 0.03 = 0.0351 USD = 3.51 cents.
    call(
        client,
        "r1",
        model="claude-sonnet-4-5",
        protocol="anthropic.messages",
        input_tokens=1000,
        cache_read=2000,
        cache_creation=400,
        output=2000,
        upstream_account="wrkspc_01",
    )
    settle(client)
    usage = anthropic_page(
        [
            (
                DAY,
                [
                    anthropic_usage_result(
                        "claude-sonnet-4-5", 1000, 2000, 300, 100, 2000, workspace_id="wrkspc_01"
                    )
                ],
            )
        ]
    )
    cost = anthropic_page(
        [
            (
                DAY,
                [
                    anthropic_cost_result(
                        "0.3",
                        "claude-sonnet-4-5",
                        "uncached_input_tokens",
                        workspace_id="wrkspc_01",
                    ),
                    anthropic_cost_result(
                        "0.06",
                        "claude-sonnet-4-5",
                        "cache_read_input_tokens",
                        workspace_id="wrkspc_01",
                    ),
                    anthropic_cost_result(
                        "0.15",
                        "claude-sonnet-4-5",
                        "cache_creation.ephemeral_5m_input_tokens",
                        workspace_id="wrkspc_01",
                    ),
                    anthropic_cost_result(
                        "3", "claude-sonnet-4-5", "output_tokens", workspace_id="wrkspc_01"
                    ),
                ],
            )
        ]
    )
    report(client, "anthropic", "usage", usage)
    report(client, "anthropic", "cost", cost)
    (row,) = drift(client, group_by="day,model,upstream_account")
    assert row["status"] == "match"
    assert (row["provider"], row["upstream_account"]) == ("anthropic", "wrkspc_01")
    assert row["ours"] == figures(1, 1000, 2000, 400, 2000, "0.0351")
    # No request count in Anthropic's usage report; the cents became dollars.
    assert row["theirs"] == figures(None, 1000, 2000, 400, 2000, "0.0351")
    assert row["delta"]["cost_usd"] == "0"

    # The provider charged 1.2 cents more for output (negotiated vs list price, say): drift.
    cost["data"][0]["results"][3]["amount"] = "4.2"
    assert report(client, "anthropic", "cost", cost)["changed"] == 1
    (row,) = drift(client, group_by="day,model,upstream_account")
    assert row["status"] == "drift"
    assert row["theirs"]["cost_usd"] == "0.0471"
    assert row["delta"]["cost_usd"] == "0.012"
    assert row["delta_pct"]["cost_usd"] == "34.188"


def test_a_reimported_page_with_changed_figures_supersedes_the_first(
    client: TestClient, db_url: str
) -> None:
    call(client, "r1")
    settle(client)
    page = openai_page([(DAY, [openai_usage_result("gpt-4o", 150, 50, 200, 1)])])
    assert report(client, "openai", "usage", page)["new"] == 1
    same = json.loads(json.dumps(page, indent=2))  # the same figures, written differently
    assert report(client, "openai", "usage", same) == {
        "buckets": 1,
        "new": 0,
        "changed": 0,
        "unchanged": 1,
    }
    assert drift(client)[0]["status"] == "match"
    page["data"][0]["results"][0]["output_tokens"] = 570
    assert report(client, "openai", "usage", page) == {
        "buckets": 1,
        "new": 0,
        "changed": 1,
        "unchanged": 0,
    }
    (row,) = drift(client)
    assert row["status"] == "drift"
    assert row["theirs"]["output_tokens"] == 570
    assert row["delta"]["output_tokens"] == 370
    # The first figures stay, as history.
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn:
        versions = conn.exec_driver_sql(
            "SELECT v.version, l.output_tokens FROM provider_report_versions v "
            "JOIN provider_report_lines l ON l.version_id = v.id ORDER BY v.version"
        ).all()
    engine.dispose()
    assert [tuple(v) for v in versions] == [(1, 200), (2, 570)]


def test_hourly_buckets_make_up_a_day_and_daily_ones_win_where_given(client: TestClient) -> None:
    call(client, "r1", at=DAY + timedelta(hours=3, minutes=5))
    call(client, "r2", at=DAY + timedelta(hours=4, minutes=59))
    settle(client)
    hourly = openai_page(
        [
            (DAY + timedelta(hours=3), [openai_usage_result("gpt-4o", 150, 50, 200, 1)]),
            (DAY + timedelta(hours=4), [openai_usage_result("gpt-4o", 150, 50, 200, 1)]),
        ],
        width=timedelta(hours=1),
    )
    report(client, "openai", "usage", hourly)
    (row,) = drift(client)
    assert (row["status"], row["theirs"]["output_tokens"]) == ("match", 400)
    three, four = drift(client, group_by="hour,model")
    assert (three["hour"], three["status"]) == ("2026-11-10T03:00:00Z", "match")
    assert (four["hour"], four["theirs"]["requests"]) == ("2026-11-10T04:00:00Z", 1)
    # A daily bucket of the same day is the day's figure; the hourly ones are not added to it.
    daily = openai_page([(DAY, [openai_usage_result("gpt-4o", 300, 100, 500, 2)])])
    report(client, "openai", "usage", daily)
    (row,) = drift(client)
    assert (row["status"], row["theirs"]["output_tokens"]) == ("drift", 500)
    # The hours still come from the hourly buckets.
    assert [r["theirs"]["output_tokens"] for r in drift(client, group_by="hour,model")] == [
        200,
        200,
    ]


def test_openai_cost_float_amounts_are_read_from_their_text(client: TestClient) -> None:
    # 0.1 + 0.2 in binary floating point is 0.30000000000000004.
    start, end = int(DAY.timestamp()), int((DAY + timedelta(days=1)).timestamp())
    body = (
        '{"provider": "openai", "kind": "cost", "report": {"object": "page", "data": [{'
        f'"object": "bucket", "start_time": {start}, "end_time": {end}, "results": ['
        '{"object": "organization.costs.result", "amount": {"value": 0.1, "currency": "usd"},'
        ' "line_item": "gpt-4o-2024-08-06, input", "project_id": "proj_1"},'
        '{"object": "organization.costs.result", "amount": {"value": 0.2, "currency": "usd"},'
        ' "line_item": "gpt-4o-2024-08-06, output", "project_id": "proj_1"}]}],'
        ' "has_more": false, "next_page": null}}'
    )
    response = client.post(
        "/v1/provider-reports", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.json() == {"buckets": 1, "new": 1, "changed": 0, "unchanged": 0}
    (row,) = drift(client, group_by="day,model,upstream_account")
    assert (row["model"], row["upstream_account"]) == ("gpt-4o-2024-08-06", "proj_1")
    assert row["theirs"]["cost_usd"] == "0.3"
    assert row["status"] == "missing_ours"


def test_a_page_of_another_shape_is_a_422_naming_what_was_expected(client: TestClient) -> None:
    anthropic = anthropic_page([(DAY, [anthropic_usage_result("m", 1, 0, 0, 0, 1)])])
    response = client.post(
        "/v1/provider-reports", json={"provider": "openai", "kind": "usage", "report": anthropic}
    )
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert {"index": None, "path": "report.object", "message": errors[0]["message"]} in errors
    assert errors[0]["message"].startswith(
        "expected a page of openai GET /v1/organization/usage/completions"
    )
    bad = openai_page([(DAY, [openai_usage_result("m", 1, 0, -1, 1)])])
    response = client.post(
        "/v1/provider-reports", json={"provider": "openai", "kind": "usage", "report": bad}
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["path"] == "report.data[0].results[0].output_tokens"
    response = client.post(
        "/v1/provider-reports", json={"provider": "azure", "kind": "usage", "report": bad}
    )
    assert (response.status_code, response.json()["errors"][0]["path"]) == (422, "body.provider")
    response = client.get("/v1/drift", params={**PERIOD, "group_by": "day,hour"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["path"] == "query.group_by"
    assert client.get("/v1/drift").json()["errors"][0]["path"] == "query.since"


def test_started_provider_and_upstream_account_are_stored_on_the_call(
    client: TestClient, db_url: str
) -> None:
    call(client, "r1", upstream_account="proj_abc")
    call(client, "r2", protocol="anthropic.messages")
    call(client, "r3", provider="azure-openai")
    refused = post(
        client,
        [
            {
                "event_id": "x",
                "request_id": "rx",
                "type": "stream.started",
                "occurred_at": "2026-11-10T10:00:00Z",
                "api_key_id": "key_7f3a",
                "model": "gpt-4o",
                "protocol": "openai.responses",
                "upstream_account": "sk-proj-abcdef123456",
            }
        ],
    )
    assert refused.status_code == 422
    (error,) = refused.json()["errors"]
    assert error["path"] == "events[0].upstream_account"
    assert "secret" in error["message"]
    settle(client)
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn:
        rows = conn.execute(
            select(Call.request_id, Call.provider, Call.upstream_account).order_by(Call.request_id)
        ).all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [
        ("r1", "openai", "proj_abc"),
        ("r2", "anthropic", None),
        ("r3", "azure-openai", None),
    ]


def test_drift_csv_has_the_rows_of_the_json(client: TestClient) -> None:
    call(client, "r1", output=380)
    settle(client)
    report(
        client, "openai", "usage", openai_page([(DAY, [openai_usage_result("=gpt", 1, 0, 1, 1)])])
    )
    response = client.get("/v1/exports/drift.csv", params=PERIOD)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    lines = response.content.split(b"\r\n")
    assert lines[0] == (
        b"provider,day,model,status,"
        b"ours_requests,theirs_requests,delta_requests,delta_pct_requests,"
        b"ours_input_tokens,theirs_input_tokens,delta_input_tokens,delta_pct_input_tokens,"
        b"ours_cache_read_input_tokens,theirs_cache_read_input_tokens,"
        b"delta_cache_read_input_tokens,delta_pct_cache_read_input_tokens,"
        b"ours_cache_creation_input_tokens,theirs_cache_creation_input_tokens,"
        b"delta_cache_creation_input_tokens,delta_pct_cache_creation_input_tokens,"
        b"ours_output_tokens,theirs_output_tokens,delta_output_tokens,delta_pct_output_tokens,"
        b"ours_cost_usd,theirs_cost_usd,delta_cost_usd,delta_pct_cost_usd"
    )
    assert (
        lines[1]
        == b"openai,2026-11-10,'=gpt,missing_ours,0,1,1,,0,1,1,,0,0,0,0,0,0,0,0,0,1,1,,0,,,"
    )
    assert lines[2] == (
        b"openai,2026-11-10,gpt-4o,missing_theirs,1,,,,100,,,,50,,,,0,,,,380,,,,,,,"
    )
    assert lines[3:] == [b""]


@pytest.mark.parametrize("role", ["read", "export"])
def test_drift_is_for_read_and_export(client: TestClient, role: str) -> None:
    from billing.auth.tokens import create_token
    from billing.storage.db import write_transaction

    state = client.app.state.billing  # type: ignore[attr-defined]
    with write_transaction(state.sessions) as session:
        token, _ = create_token(session, role, "t", datetime.now(UTC))
        ingest, _ = create_token(session, "ingest", "g", datetime.now(UTC))
    client.app.state.tokens._roles.clear()  # type: ignore[attr-defined]
    ok = client.get("/v1/drift", params=PERIOD, headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    no = client.get("/v1/drift", params=PERIOD, headers={"Authorization": f"Bearer {ingest}"})
    assert no.status_code == 403
    posted = client.post(
        "/v1/provider-reports",
        json={"provider": "openai", "kind": "usage", "report": openai_page([])},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert posted.status_code == 403


def test_ours_are_the_calls_started_in_the_period_by_their_start(client: TestClient) -> None:
    call(client, "r1", at=DAY + timedelta(hours=3, minutes=5))
    call(client, "r2", at=DAY + timedelta(hours=4, minutes=59), output=7)
    call(client, "r3", at=DAY + timedelta(days=1), output=9)  # the next day
    settle(client)
    (row,) = drift(client, since="2026-11-10T04:00:00Z", group_by="hour,model")
    assert (row["hour"], row["ours"]["requests"], row["ours"]["output_tokens"]) == (
        "2026-11-10T04:00:00Z",
        1,
        7,
    )
    hours = drift(client, since="2026-11-10T04:00:00+01:00", group_by="hour,model")
    assert [(r["hour"], r["ours"]["output_tokens"]) for r in hours] == [
        ("2026-11-10T03:00:00Z", 200),
        ("2026-11-10T04:00:00Z", 7),
    ]
    rows = drift(client, until="2026-11-12T00:00:00Z", group_by="model")
    assert [(r["ours"]["requests"], r["ours"]["output_tokens"]) for r in rows] == [(3, 216)]
    assert "day" not in rows[0]


def test_by_served_tier_ours_are_the_tier_each_upstream_served(client: TestClient) -> None:
    """Two calls served at ``priority`` and one at ``default`` (the tier the response named),
    against OpenAI's usage grouped by ``service_tier``: a match per tier; a report line of a
    tier we never served is ``missing_ours``."""
    call(client, "p1", tier="priority")
    call(client, "p2", tier="priority", at=DAY + timedelta(hours=11))
    call(client, "d1", tier="default")
    settle(client)
    results = [
        openai_usage_result("gpt-4o", 300, 100, 400, 2, service_tier="priority"),
        openai_usage_result("gpt-4o", 150, 50, 200, 1, service_tier="default"),
        openai_usage_result("gpt-4o", 10, 0, 5, 1, service_tier="flex"),
    ]
    report(client, "openai", "usage", openai_page([(DAY, results)]))
    rows = drift(client, group_by="day,model,service_tier")
    by_tier = {row["service_tier"]: row for row in rows}
    assert {tier: row["status"] for tier, row in by_tier.items()} == {
        "priority": "match",
        "default": "match",
        "flex": "missing_ours",
    }
    assert by_tier["priority"]["ours"] == figures(2, 200, 100, 0, 400, None)  # unpriced
    assert by_tier["default"]["ours"] == figures(1, 100, 50, 0, 200, None)
    assert rows[0]["service_tier"] == "flex"  # mismatches first


def test_an_unpriced_call_makes_ours_cost_unknown_never_silently_free(
    client: TestClient,
) -> None:
    """Two gpt-4o calls, the second with 2 web searches that have no unit price (so the call is
    ``unpriced``): ours' tokens are both calls', its cost is null (not the priced call's alone),
    the cost plays no part in the status; once the unit is priced, the cost is both calls'."""
    price = {
        "model": "gpt-4o",
        "effective_from": "2026-01-01T00:00:00Z",
        "input_usd_per_mtok": "2.5",
        "output_usd_per_mtok": "10",
        "cache_read_usd_per_mtok": "1.25",
        "cache_creation_usd_per_mtok": "3.125",
    }
    assert client.post("/v1/prices", json=price).status_code == 201
    call(client, "r1")
    call(client, "r2", at=DAY + timedelta(hours=11), units={"web_search_requests": 2})
    settle(client)
    assert client.get("/v1/calls/r2").json()["cost_usd"] is None
    report(
        client,
        "openai",
        "usage",
        openai_page([(DAY, [openai_usage_result("gpt-4o", 300, 100, 400, 2)])]),
    )
    (row,) = drift(client)
    assert row["status"] == "match"
    assert row["ours"] == figures(2, 200, 100, 0, 400, None)
    assert row["delta"] == figures(0, 0, 0, 0, 0, None)
    assert row["delta_pct"]["cost_usd"] is None
    # Priced from a later version on (r1 and r2 each 100 × 2.5 + 50 × 1.25 + 200 × 10 per
    # million = 0.0023125; r2's searches 2 × 0.01).
    priced = {**price, "effective_from": "2026-11-01T00:00:00Z"}
    priced["unit_prices"] = {"web_search_requests": "0.01"}
    assert client.post("/v1/prices", json=priced).status_code == 201
    settle(client)
    (row,) = drift(client)
    assert row["ours"]["cost_usd"] == "0.024625"


@pytest.mark.parametrize(
    ("params", "field", "floor"),
    [
        ({"since": "2026-11-10T04:00:00Z"}, "since", "2026-11-10T00:00:00Z"),
        ({"until": "2026-11-10T23:00:00+01:00"}, "until", "2026-11-10T00:00:00Z"),
        ({"since": "2026-11-10T10:30:00Z", "group_by": "hour"}, "since", "2026-11-10T10:00:00Z"),
        ({"until": "2026-11-10T12:00:00.5Z", "group_by": "hour"}, "until", "2026-11-10T12:00:00Z"),
    ],
)
def test_a_period_edge_inside_a_provider_bucket_is_a_422_naming_the_whole_one(
    client: TestClient, params: dict[str, str], field: str, floor: str
) -> None:
    """A provider bucket is compared whole, so the period must not cut one: ``since`` and
    ``until`` on whole UTC days (by day) or hours (by hour); the 422 says which, with the
    edge below."""
    call(client, "r1")
    settle(client)
    response = client.get("/v1/drift", params={**PERIOD, **params})
    assert response.status_code == 422, response.text
    (error,) = response.json()["errors"]
    grain = "hour" if params.get("group_by") == "hour" else "day"
    assert error["path"] == f"query.{field}"
    assert f"must be on a whole UTC {grain}" in error["message"]
    assert floor in error["message"]
