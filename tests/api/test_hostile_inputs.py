"""Issue 44: the last hostile inputs of the JSON API, each a 422 in the shared error shape with
nothing stored: a body nested too deep or not UTF-8 on the routes FastAPI parses (prices, budgets,
plans, tokens), Unix seconds as ``/v1/alerts?since=`` (the RFC 3339 rule of every query), and an
event's ``occurred_at`` outside the one range of instants queries accept (``billing.fields``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.builders import post

DEEP = b"[" * 5000 + b"]" * 5000
DEEP_OBJECT = b'{"a":' * 3000 + b"1" + b"}" * 3000
NOT_UTF8 = b'{"model": "\xff\xfe"}'


@pytest.mark.parametrize("path", ["/v1/prices", "/v1/budgets", "/v1/plans", "/v1/tokens"])
@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT, NOT_UTF8])
def test_an_unreadable_body_is_a_422(client: TestClient, path: str, body: bytes) -> None:
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert (error["index"], error["path"]) == (None, "body")
    assert client.get("/v1/prices").json()["data"] == []
    assert client.get("/v1/budgets").json()["data"] == []


@pytest.mark.parametrize("since", ["1700000000", "1700000000.5", "0", "2026-01-01T00:00:00"])
def test_alerts_since_takes_rfc_3339_only(client: TestClient, since: str) -> None:
    response = client.get("/v1/alerts", params={"since": since})
    assert response.status_code == 422, response.text
    assert [e["path"] for e in response.json()["errors"]] == ["query.since"]


def test_alerts_since_reads_an_offset_as_the_other_queries_do(client: TestClient) -> None:
    for since in ("2026-01-01T00:00:00Z", "2026-01-01T05:30:00 05:30", "2026-01-01t00:00:00z"):
        response = client.get("/v1/alerts", params={"since": since})
        assert response.status_code == 200, (since, response.text)


def _started(at: str) -> dict[str, object]:
    return {
        "event_id": f"e-{at}",
        "request_id": f"r-{at}",
        "type": "stream.started",
        "occurred_at": at,
        "api_key_id": "key_1",
        "model": "m",
        "protocol": "openai.chat_completions",
    }


@pytest.mark.parametrize(
    "at", ["0001-01-02T00:00:00Z", "1899-12-31T23:59:59Z", "0001-01-01T00:30:00+01:00"]
)
def test_an_event_outside_the_query_range_is_a_422(client: TestClient, at: str) -> None:
    response = post(client, [_started(at)])
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["path"] == "events[0].occurred_at"
    assert client.get("/v1/calls").json()["data"] == []
    usage = client.get("/v1/usage", params={"since": at, "until": "2026-01-01T00:00:00Z"})
    assert usage.status_code == 422  # the same range refuses the same instant


def test_the_range_edge_is_accepted_by_events_and_queries(client: TestClient) -> None:
    assert post(client, [_started("1900-01-01T00:00:00Z")]).status_code == 200
    usage = client.get(
        "/v1/usage", params={"since": "1900-01-01T00:00:00Z", "until": "1900-01-02T00:00:00Z"}
    )
    assert usage.status_code == 200, usage.text
