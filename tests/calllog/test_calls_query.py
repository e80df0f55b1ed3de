"""``GET /v1/calls`` (CONTRACT "Call log and usage queries"): filters, order, keyset pages, 422s.

Calls are made through ``POST /v1/events`` and settled by a reconciliation pass, as in production.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from billing.reconcile.runner import run_pass

Client = TestClient | httpx.Client

M1_PRICE = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "3",
    "output_usd_per_mtok": "15",
    "cache_read_usd_per_mtok": "0.30",
    "cache_creation_usd_per_mtok": "3.75",
}
M2_PRICE = {**M1_PRICE, "model": "m2", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2"}

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def call_events(
    rid: str,
    at: datetime,
    *,
    key: str = "key_a",
    model: str = "m1",
    inp: int = 100,
    out: int = 10,
    status: str = "completed",
    with_usage: bool = True,
) -> list[dict[str, Any]]:
    """One call's events: ``stream.started`` at ``at``, and its upstream usage 2 s later (it then
    settles at the next pass); a completed call delivered everything, a disconnected one half,
    a failed one nothing."""
    events: list[dict[str, Any]] = [
        {
            "event_id": f"{rid}-start",
            "request_id": rid,
            "type": "stream.started",
            "occurred_at": iso(at),
            "api_key_id": key,
            "model": model,
            "protocol": "openai.responses",
        }
    ]
    if status == "completed" and with_usage:
        events.append(
            {
                "event_id": f"{rid}-tok",
                "request_id": rid,
                "type": "stream.tokens",
                "occurred_at": iso(at + timedelta(seconds=1)),
                "output_tokens_generated": out,
                "output_tokens_delivered": out,
            }
        )
    if status == "failed":
        events.append(
            {
                "event_id": f"{rid}-fail",
                "request_id": rid,
                "type": "stream.failed",
                "occurred_at": iso(at + timedelta(seconds=1)),
                "error_type": "api_error",
            }
        )
    if status == "client_disconnected":
        events.append(
            {
                "event_id": f"{rid}-gone",
                "request_id": rid,
                "type": "stream.client_disconnected",
                "occurred_at": iso(at + timedelta(seconds=1)),
                "output_tokens_delivered": out // 2,
            }
        )
    if with_usage:
        events.append(
            {
                "event_id": f"{rid}-usage",
                "request_id": rid,
                "type": "stream.usage",
                "occurred_at": iso(at + timedelta(seconds=2)),
                "input_tokens": inp,
                "output_tokens": out,
                "source": "upstream",
            }
        )
    return events


def post(client: Client, events: list[dict[str, Any]]) -> None:
    for i in range(0, len(events), 1000):
        response = client.post("/v1/events", json={"events": events[i : i + 1000]})
        assert response.status_code == 200, response.text


def reconcile_at(client: TestClient, now: datetime) -> None:
    """One reconciliation pass with its clock at ``now`` (entries are booked at ``now``)."""
    state = client.app.state.billing  # type: ignore[attr-defined]
    run_pass(state.sessions, state.settings, now=now)


def page(client: Client, **params: Any) -> dict[str, Any]:
    response = client.get("/v1/calls", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"data", "next_cursor"}
    return body


def ids(client: Client, **params: Any) -> list[str]:
    return [call["request_id"] for call in page(client, **params)["data"]]


def walk(client: Client, **params: Any) -> list[str]:
    """Every page of the query, following next_cursor; the request_ids in order."""
    found: list[str] = []
    cursor = None
    while True:
        body = page(client, **params, **({"cursor": cursor} if cursor else {}))
        found += [call["request_id"] for call in body["data"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return found


def errors(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    found: list[dict[str, Any]] = response.json()["errors"]
    for error in found:
        assert set(error) == {"index", "path", "message"}
        assert error["index"] is None
        assert len(error["message"].split()) >= 3, error  # a sentence, not a code
    return found


@pytest.fixture
def priced(client: TestClient) -> TestClient:
    for price in (M1_PRICE, M2_PRICE):
        assert client.post("/v1/prices", json=price).status_code == 201
    return client


@pytest.fixture
def log(priced: TestClient) -> TestClient:
    """Eight settled calls over two keys, two models and three statuses, a minute apart."""
    plan = [
        ("c1", "key_a", "m1", "completed"),
        ("c2", "key_b", "m1", "failed"),
        ("c3", "key_a", "m2", "completed"),
        ("c4", "key_a", "m1", "client_disconnected"),
        ("c5", "key_b", "m2", "completed"),
        ("c6", "key_a", "m1", "failed"),
        ("c7", "key_b", "m1", "completed"),
        ("c8", "key_a", "m2", "completed"),
    ]
    events = []
    for i, (rid, key, model, status) in enumerate(plan):
        events += call_events(
            rid,
            T0 + timedelta(minutes=i),
            key=key,
            model=model,
            status=status,
            inp=100 + i,
            out=10 + i,
        )
    post(priced, events)
    reconcile_at(priced, T0 + timedelta(hours=1))
    return priced


def test_newest_first_with_the_call_object(log: TestClient) -> None:
    body = page(log)
    assert [c["request_id"] for c in body["data"]] == [f"c{i}" for i in range(8, 0, -1)]
    assert body["next_cursor"] is None
    c8 = body["data"][0]
    assert c8 == {
        "request_id": "c8",
        "api_key_id": "key_a",
        "model": "m2",
        "protocol": "openai.responses",
        "status": "completed",
        "settled": True,
        "usage_source": "upstream",
        "started_at": "2026-03-10T12:07:00Z",
        "ended_at": "2026-03-10T12:07:02Z",
        "attempts": 1,
        "input_tokens": 107,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
        "output_tokens_billed": 17,
        "output_tokens_delivered": 17,
        "output_tokens_undelivered": 0,
        "reasoning_tokens": 0,
        "cost_usd": "0.000141",  # 107 × 1 + 17 × 2 µ$
        "error_type": None,
        "stop_reason": None,
        "metadata": {},
        "anomalies": [],
        # v2 (CONTRACT "Usage dimensions (v2)"): none reported.
        "service_tier": None,
        "units": {},
        "other_models": [],
        # v2 (CONTRACT "Keys, customers and plans (v2)"): no plan, charged at cost.
        "customer_id": None,
        "plan_id": None,
        "charge_usd": "0.000141",
        # v3: no failure policy, no provider cost, counters or geo reported.
        "leakage_usd": "0",
        "provider_cost_usd": None,
        "cost_drift_usd": None,
        "counters": {},
        "inference_geo": None,
    }


def test_filters_combine(log: TestClient) -> None:
    assert ids(log, api_key_id="key_a") == ["c8", "c6", "c4", "c3", "c1"]
    assert ids(log, model="m1") == ["c7", "c6", "c4", "c2", "c1"]
    assert ids(log, status="failed") == ["c6", "c2"]
    assert ids(log, api_key_id="key_a", model="m1") == ["c6", "c4", "c1"]
    assert ids(log, api_key_id="key_a", status="completed") == ["c8", "c3", "c1"]
    assert ids(log, api_key_id="key_b", model="m2", status="completed") == ["c5"]
    assert ids(log, api_key_id="key_a", model="m1", status="client_disconnected") == ["c4"]
    assert ids(log, api_key_id="key_c") == []
    assert ids(log, status="open") == []
    # since/until on the call's start, half-open: 12:02 <= start < 12:05.
    window = {"since": "2026-03-10T12:02:00Z", "until": "2026-03-10T12:05:00Z"}
    assert ids(log, **window) == ["c5", "c4", "c3"]
    assert ids(log, **window, api_key_id="key_a") == ["c4", "c3"]
    assert ids(log, **window, api_key_id="key_a", model="m2", status="completed") == ["c3"]
    # The same instants written in another offset.
    assert ids(log, since="2026-03-10T17:32:00+05:30", until="2026-03-10T07:05:00-05:00") == [
        "c5",
        "c4",
        "c3",
    ]
    assert ids(log, since="2026-03-10T12:07:00Z") == ["c8"]
    assert ids(log, until="2026-03-10T12:01:00Z") == ["c1"]


def test_an_unencoded_plus_offset_is_read_as_plus(log: TestClient) -> None:
    # A "+" in a query string means a space; "…T17:32:00 05:30" can only mean +05:30.
    response = log.get("/v1/calls?since=2026-03-10T17:32:00+05:30&until=2026-03-10T12:05:00Z")
    assert [c["request_id"] for c in response.json()["data"]] == ["c5", "c4", "c3"]


def test_pages_follow_each_other(log: TestClient) -> None:
    first = page(log, limit=3)
    assert [c["request_id"] for c in first["data"]] == ["c8", "c7", "c6"]
    second = page(log, limit=3, cursor=first["next_cursor"])
    assert [c["request_id"] for c in second["data"]] == ["c5", "c4", "c3"]
    third = page(log, limit=3, cursor=second["next_cursor"])
    assert [c["request_id"] for c in third["data"]] == ["c2", "c1"]
    assert third["next_cursor"] is None
    # A page that ends exactly at the last call says so: no empty page after it.
    assert page(log, limit=8)["next_cursor"] is None
    assert walk(log, limit=1, api_key_id="key_b") == ["c7", "c5", "c2"]
    assert walk(log, limit=2, model="m2", status="completed") == ["c8", "c5", "c3"]


def test_equal_starts_are_ordered_by_request_id(priced: TestClient) -> None:
    events = []
    for rid in ("t-b", "t-d", "t-a", "t-c"):
        events += call_events(rid, T0)
    events += call_events("t-later", T0 + timedelta(microseconds=1))
    events += call_events("t-earlier", T0 - timedelta(microseconds=1))
    post(priced, events)
    reconcile_at(priced, T0 + timedelta(hours=1))
    expected = ["t-later", "t-d", "t-c", "t-b", "t-a", "t-earlier"]
    assert ids(priced) == expected
    for limit in (1, 2, 3, 4, 5):
        assert walk(priced, limit=limit) == expected


def test_pagination_is_complete_and_stable_while_calls_arrive(priced: TestClient) -> None:
    events = []
    for i in range(40):
        # Clumps of equal starts, so that pages end inside a clump.
        events += call_events(f"old-{i:02d}", T0 + timedelta(minutes=i // 3), key="key_a")
    post(priced, events)
    reconcile_at(priced, T0 + timedelta(hours=2))
    existing = ids(priced, api_key_id="key_a", limit=1000)
    assert len(existing) == 40

    seen: list[str] = []
    cursor = None
    arrivals = 0
    while True:
        body = page(priced, api_key_id="key_a", limit=7, **({"cursor": cursor} if cursor else {}))
        seen += [c["request_id"] for c in body["data"]]
        # New calls arrive between pages: newer ones, older ones, some inside the walked range,
        # one never reconciled (no start yet), and one for another key.
        n = arrivals
        arrivals += 1
        post(
            priced,
            [
                *call_events(f"new-{n}-newer", T0 + timedelta(hours=1, minutes=n)),
                *call_events(f"new-{n}-older", T0 - timedelta(hours=1, minutes=n)),
                *call_events(f"new-{n}-inside", T0 + timedelta(minutes=n % 13, seconds=30)),
                *call_events(f"new-{n}-other", T0 + timedelta(minutes=5), key="key_b"),
                {
                    "event_id": f"new-{n}-undated-tok",
                    "request_id": f"new-{n}-undated",
                    "type": "stream.tokens",
                    "occurred_at": iso(T0),
                    "output_tokens_generated": 1,
                    "output_tokens_delivered": 1,
                },
            ],
        )
        if n % 2:
            reconcile_at(priced, T0 + timedelta(hours=2))
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert arrivals >= 6
    assert len(seen) == len(set(seen)), "a call was repeated"
    assert set(existing) <= set(seen), "a call was skipped"
    assert [rid for rid in seen if rid in set(existing)] == existing  # and in the same order
    assert not any(rid.endswith("-other") for rid in seen)


def test_calls_without_a_start_yet_come_first(priced: TestClient) -> None:
    post(priced, call_events("dated", T0))
    reconcile_at(priced, T0 + timedelta(hours=1))
    # Events without stream.started, not reconciled yet: the call has no start.
    post(
        priced,
        [
            {
                "event_id": f"{rid}-tok",
                "request_id": rid,
                "type": "stream.tokens",
                "occurred_at": iso(T0 + timedelta(minutes=5)),
                "output_tokens_generated": 3,
                "output_tokens_delivered": 3,
            }
            for rid in ("undated-1", "undated-2")
        ],
    )
    body = page(priced)
    assert [c["request_id"] for c in body["data"]] == ["undated-2", "undated-1", "dated"]
    assert [c["started_at"] for c in body["data"]] == [None, None, "2026-03-10T12:00:00Z"]
    assert walk(priced, limit=1) == ["undated-2", "undated-1", "dated"]
    assert ids(priced, status="open") == ["undated-2", "undated-1"]
    assert ids(priced, status="completed") == ["dated"]
    # Their start is unknown: a period leaves them out.
    assert ids(priced, since="2026-01-01T00:00:00Z") == ["dated"]
    # The next pass dates them by their earliest event; they take their place by that start.
    state = priced.app.state.billing  # type: ignore[attr-defined]
    run_pass(state.sessions, state.settings, now=T0 + timedelta(hours=1))
    assert ids(priced) == ["undated-2", "undated-1", "dated"]
    assert [c["started_at"] for c in page(priced)["data"]] == [
        "2026-03-10T12:05:00Z",
        "2026-03-10T12:05:00Z",
        "2026-03-10T12:00:00Z",
    ]


def test_limit_defaults_to_100_and_goes_to_1000(priced: TestClient) -> None:
    events = []
    for i in range(1001):
        events += call_events(f"n{i:04d}", T0 + timedelta(seconds=i), with_usage=False)
    post(priced, events)
    assert len(page(priced)["data"]) == 100
    full = page(priced, limit=1000)
    assert len(full["data"]) == 1000 and full["next_cursor"] is not None
    assert [
        c["request_id"] for c in page(priced, limit=1000, cursor=full["next_cursor"])["data"]
    ] == ["n0000"]


def test_unknown_and_malformed_parameters_get_422_in_words(log: TestClient) -> None:
    found = errors(log.get("/v1/calls", params={"api_key": "key_a"}))
    assert [e["path"] for e in found] == ["query.api_key"]
    assert "not a known query parameter" in found[0]["message"]
    assert "api_key_id" in found[0]["message"]

    def bad_cursor(text: str) -> None:
        found = errors(log.get("/v1/calls", params={"cursor": text}))
        assert [e["path"] for e in found] == ["query.cursor"]
        assert "next_cursor" in found[0]["message"]

    bad_cursor("not-a-cursor")
    bad_cursor("!!!")
    bad_cursor(base64.urlsafe_b64encode(b'["2026-03-10T12:00:00", "c1"]').decode())  # no offset
    bad_cursor(base64.urlsafe_b64encode(b'{"a": 1}').decode())
    bad_cursor(base64.urlsafe_b64encode(b'[null, ""]').decode())
    bad_cursor(base64.urlsafe_b64encode(b"[1, 2, 3]").decode())
    bad_cursor(page(log, limit=1)["next_cursor"][:-3])

    found = errors(log.get("/v1/calls", params={"since": "2026-03-10T12:00:00"}))
    assert [e["path"] for e in found] == ["query.since"]
    assert "no UTC offset" in found[0]["message"]
    found = errors(log.get("/v1/calls", params={"until": "yesterday"}))
    assert [e["path"] for e in found] == ["query.until"]
    assert "RFC 3339" in found[0]["message"]
    for impossible in ("2026-02-30T00:00:00Z", "0001-01-01T00:00:00+05:30"):
        found = errors(log.get("/v1/calls", params={"since": impossible}))
        assert [e["path"] for e in found] == ["query.since"]
    for limit in ("0", "1001", "ten", "-1", "1.5", ""):
        found = errors(log.get("/v1/calls", params={"limit": limit}))
        assert [e["path"] for e in found] == ["query.limit"], limit
    found = errors(log.get("/v1/calls", params={"status": "done"}))
    assert [e["path"] for e in found] == ["query.status"]
    assert "completed" in found[0]["message"]
    found = errors(log.get("/v1/calls?model=m1&model=m2"))
    assert [e["path"] for e in found] == ["query.model"]
    assert "once" in found[0]["message"]
    found = errors(
        log.get(
            "/v1/calls", params={"since": "2026-03-11T00:00:00Z", "until": "2026-03-10T00:00:00Z"}
        )
    )
    assert [e["path"] for e in found] == ["query.until"]
    # Every problem at once.
    found = errors(log.get("/v1/calls", params={"limit": "0", "cursor": "x", "colour": "red"}))
    assert sorted(e["path"] for e in found) == ["query.colour", "query.cursor", "query.limit"]


@pytest.mark.parametrize(
    "query",
    [
        "since=2026-03-10T00:00:00Z&since=2026-03-11T00:00:00Z",
        "until=2026-03-11T00:00:00Z&until=2026-03-11T00:00:00Z",  # even the same value twice
        "limit=5&limit=10",
        "status=completed&status=failed",
        "api_key_id=key_a&api_key_id=key_b",
        "cursor=x&cursor=y",
    ],
)
def test_a_repeated_parameter_gets_422(priced: TestClient, query: str) -> None:
    """One of two values is never chosen silently: a repeated parameter is refused."""
    name = query.split("=", 1)[0]
    assert errors(priced.get(f"/v1/calls?{query}")) == [
        {"index": None, "path": f"query.{name}", "message": "is given 2 times; give it once"}
    ]


def test_unknown_and_repeated_parameters_are_reported_together(priced: TestClient) -> None:
    found = errors(priced.get("/v1/calls?colour=red&model=a&model=b&model=c&colour=blue"))
    assert [(e["path"], e["message"]) for e in found] == [
        (
            "query.colour",
            "is not a known query parameter; the known ones are api_key_id, customer_id, model, "
            "status, since, until, limit, cursor",
        ),
        ("query.model", "is given 3 times; give it once"),
    ]


def test_one_call_and_an_unknown_one(log: TestClient) -> None:
    response = log.get("/v1/calls/c3")
    assert response.status_code == 200
    body = response.json()
    assert body["request_id"] == "c3"
    assert [e["kind"] for e in body["ledger_entries"]] == ["settlement"]
    assert [e["type"] for e in body["events"]] == [
        "stream.started",
        "stream.tokens",
        "stream.usage",
    ]
    response = log.get("/v1/calls/nope")
    assert response.status_code == 404
    assert "no call with request_id 'nope'" in response.json()["error"]


def test_pages_through_a_real_server(log: TestClient, http: httpx.Client) -> None:
    assert walk(http, limit=3, api_key_id="key_a") == ["c8", "c6", "c4", "c3", "c1"]
    assert errors(http.get("/v1/calls", params={"cursor": "%%%"}))[0]["path"] == "query.cursor"
