"""The v3 fields of ``stream.usage`` at ingest (CONTRACT "Non-streaming calls, hosted-tool fees,
provider-reported cost (v3)"): ``provider_cost_usd`` (a decimal string, exact),
``counters`` (name → count, like ``units``) and ``inference_geo`` (text, like ``service_tier``);
what is accepted, the 422 that names each bad field, the events' JSON Schema, and that a usage
carrying one is not plain (the SQL fast path leaves it to the rule).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from billing.ingest.plain import V2_USAGE_KEYS, plain_usage
from tests.builders import started, usage
from tests.reconcile.test_reconcile_late_events import get, post

V3_FIELDS = {
    "provider_cost_usd": "0.00042",
    "counters": {"web_fetch_requests": 2},
    "inference_geo": "us",
}


def _errors(client: TestClient, *events: dict[str, Any]) -> dict[str, str]:
    response = client.post("/v1/events", json={"events": list(events)})
    assert response.status_code == 422, response.text
    return {e["path"]: e["message"] for e in response.json()["errors"]}


def test_the_v3_fields_are_accepted_and_stored_as_sent(client: TestClient) -> None:
    event = usage("u1", 120, 40, **V3_FIELDS)
    assert post(client, started("s1"), event) == {"accepted": 2, "duplicates": 0}
    stored = next(e for e in get(client, "r1")["events"] if e["event_id"] == "u1")
    assert {name: stored[name] for name in V3_FIELDS} == V3_FIELDS


def test_the_same_cost_written_with_trailing_zeros_is_the_same_content(
    client: TestClient,
) -> None:
    assert post(client, usage("u1", 1, 1, provider_cost_usd="0.10")) == {
        "accepted": 1,
        "duplicates": 0,
    }
    # "0.1" is "0.10" after validation: a duplicate, not a conflict.
    assert post(client, usage("u1", 1, 1, provider_cost_usd="0.1")) == {
        "accepted": 0,
        "duplicates": 1,
    }
    response = client.post(
        "/v1/events", json={"events": [usage("u1", 1, 1, provider_cost_usd="0.11")]}
    )
    assert response.status_code == 409
    assert response.json()["conflicts"] == [{"index": 0, "event_id": "u1"}]


def test_each_bad_v3_field_is_named_in_one_422(client: TestClient) -> None:
    events = [
        usage("u0", 1, 1, provider_cost_usd=0.0042),  # a JSON number: not exact
        usage("u1", 1, 1, provider_cost_usd="-0.5"),
        usage("u2", 1, 1, provider_cost_usd="4.2e-3"),
        usage("u3", 1, 1, provider_cost_usd="0.0000000000001"),  # 13 places
        usage("u4", 1, 1, provider_cost_usd="10000000"),
        usage("u5", 1, 1, counters={"Web Fetch": 1, "ok": -2, "half": 0.5}),
        usage("u6", 1, 1, counters=[1]),
        usage("u7", 1, 1, counters={f"c{i}": 1 for i in range(17)}),
        usage("u8", 1, 1, inference_geo=""),
        usage("u9", 1, 1, inference_geo="x" * 33),
        usage("u10", 1, 1, inference_geo="u\ns"),
    ]
    assert _errors(client, *events) == {
        "events[0].provider_cost_usd": (
            'must be a decimal string such as "0.0042" (a JSON number may not be exact)'
        ),
        "events[1].provider_cost_usd": "must not be negative",
        "events[2].provider_cost_usd": (
            "'4.2e-3' is not a plain decimal number; send digits with an optional fraction "
            'such as "0.0042"'
        ),
        "events[3].provider_cost_usd": (
            "has more than 12 decimal places (amounts are exact to the picodollar, "
            "0.000000000001 USD)"
        ),
        "events[4].provider_cost_usd": "must be at most 9223372.036854775807 USD",
        "events[5].counters.Web Fetch": (
            "counter name must be 1 to 64 characters of a-z, 0-9 and _ (such as "
            "web_search_requests)"
        ),
        "events[5].counters.ok": "must be ≥ 0: counts are never negative",
        "events[5].counters.half": "must be a whole number (a JSON integer ≥ 0)",
        "events[6].counters": (
            'must be a JSON object of counter names to counts, such as {"web_fetch_requests": 2}'
        ),
        "events[7].counters": "has too many entries: at most 16 counter names to counts",
        "events[8].inference_geo": "must not be empty",
        "events[9].inference_geo": "is too long: at most 32 characters",
        "events[10].inference_geo": "must be printable text (no control characters)",
    }
    assert client.get("/v1/calls").json()["data"] == []  # nothing of the batch was stored


def test_the_largest_cost_is_accepted(client: TestClient) -> None:
    # The largest amount the service stores: 2**63 - 1 picodollars.
    event = usage("u1", 1, 1, provider_cost_usd="9223372.036854775807")
    assert post(client, event) == {"accepted": 1, "duplicates": 0}


@pytest.mark.parametrize("field", sorted(V3_FIELDS))
def test_a_usage_with_a_v3_field_is_not_plain(field: str) -> None:
    assert field in V2_USAGE_KEYS
    body = f'{{"type":"stream.usage","input_tokens":1,"{field}":{V3_FIELDS[field]!r}}}'
    assert not plain_usage(body.replace("'", '"'))
    assert plain_usage('{"type":"stream.usage","input_tokens":1,"output_tokens":1}')


def test_the_events_schema_states_the_v3_fields(client: TestClient) -> None:
    schema = client.get("/v1/schema/events.json").json()
    properties = schema["$defs"]["StreamUsage"]["properties"]
    cost = properties["provider_cost_usd"]["anyOf"][0]
    assert (cost["type"], cost["pattern"]) == ("string", r"^[0-9]+(\.[0-9]{1,12})?$")
    counters = properties["counters"]["anyOf"][0]
    assert counters["maxProperties"] == 16
    assert counters["patternProperties"] == {
        "^[a-z0-9_]{1,64}$": {"maximum": 1_000_000_000, "minimum": 0, "type": "integer"}
    }
    assert counters["additionalProperties"] is False  # a name of another shape is refused
    geo = properties["inference_geo"]["anyOf"][0]
    assert (geo["minLength"], geo["maxLength"]) == (1, 32)
    validator = Draft202012Validator(schema)
    assert validator.is_valid(usage("u1", 1, 1, **V3_FIELDS))
    assert not validator.is_valid(usage("u1", 1, 1, provider_cost_usd=0.5))
    assert not validator.is_valid(usage("u1", 1, 1, provider_cost_usd="1e-3"))
    assert not validator.is_valid(usage("u1", 1, 1, counters={"Bad": 1}))
    assert not validator.is_valid(usage("u1", 1, 1, units={"Bad": 1}))
