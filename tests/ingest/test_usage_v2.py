"""The v2 fields of ``stream.usage`` at ingest (CONTRACT "Usage dimensions (v2)"): what is
accepted, the 422 that names each bad field, and the two rules that are ingest's own (an
estimate may leave its input out; one-hour cache writes are a part of the cache writes).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.builders import raw, started, tokens, usage
from tests.reconcile.test_reconcile_late_events import (  # noqa: F401 (priced: a fixture)
    get,
    post,
    priced,
    reconcile,
)
from tests.reconcile.test_reconcile_scenarios import settle_due


def _errors(client: TestClient, *events: dict[str, Any]) -> list[tuple[str, str]]:
    response = client.post("/v1/events", json={"events": list(events)})
    assert response.status_code == 422, response.text
    return [(e["path"], e["message"]) for e in response.json()["errors"]]


def test_every_v2_field_is_accepted_and_stored_as_sent(client: TestClient) -> None:
    event = usage(
        "u1",
        120,
        40,
        cache_creation_input_tokens=900,
        cache_creation_1h_input_tokens=600,
        service_tier="priority",
        units={"web_search_requests": 3},
        other_models=[{"model": "m2", "input_tokens": 10, "output_tokens": 5}],
        anomalies=["usage_inconsistent"],
    )
    assert post(client, started("s1"), event) == {"accepted": 2, "duplicates": 0}
    # The same content with the other model's cache counts written out as 0 is a duplicate.
    again = {
        **event,
        "other_models": [
            {
                "model": "m2",
                "input_tokens": 10,
                "output_tokens": 5,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            }
        ],
    }
    assert post(client, again) == {"accepted": 0, "duplicates": 1}
    stored = next(e for e in get(client, "r1")["events"] if e["event_id"] == "u1")
    assert stored["units"] == {"web_search_requests": 3}
    assert stored["service_tier"] == "priority"
    assert stored["cache_creation_1h_input_tokens"] == 600


def test_each_bad_v2_field_is_named_in_one_422(client: TestClient) -> None:
    bad = usage(
        "u1",
        1,
        1,
        cache_creation_input_tokens=5,
        service_tier="x" * 33,
        units={"Web Search": 1, "ok": -2},
        other_models=[{"model": "m2", "output_tokens": 1, "extra": 1}],
        anomalies=["unpriced"],
    )
    one_hour = usage("u2", 1, 1, cache_creation_input_tokens=5, cache_creation_1h_input_tokens=6)
    no_input = raw("stream.usage", "u3", output_tokens=1, source="upstream")
    errors = dict(_errors(client, bad, one_hour, no_input))
    assert errors == {
        "events[0].service_tier": "is too long: at most 32 characters",
        "events[0].units.Web Search": (
            "unit name must be 1 to 64 characters of a-z, 0-9 and _ (such as web_search_requests)"
        ),
        "events[0].units.ok": "must be ≥ 0: counts are never negative",
        "events[0].other_models[0].input_tokens": "is required for stream.usage events",
        "events[0].other_models[0].extra": errors["events[0].other_models[0].extra"],
        "events[0].anomalies[0]": (
            "unknown anomaly code; use one of usage_inconsistent, drain_skipped"
        ),
        "events[1].cache_creation_1h_input_tokens": (
            "is 6, more than cache_creation_input_tokens (5): the one-hour cache writes are a "
            "part of the cache writes"
        ),
        "events[2].input_tokens": (
            'is required for stream.usage events with source "upstream" (only an estimate may '
            "leave it out)"
        ),
    }
    # The fields of an other_models entry, not those of the event around it.
    assert errors["events[0].other_models[0].extra"] == (
        "is not a field of an other_models entry; remove it (allowed: model, input_tokens, "
        "output_tokens, cache_read_input_tokens, cache_creation_input_tokens)"
    )
    assert client.get("/v1/calls").json()["data"] == []  # nothing of the batch was stored


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("units", {f"u{i}": 1 for i in range(17)}, "has too many entries: at most 16"),
        ("other_models", [{"model": "m", "input_tokens": 1, "output_tokens": 1}] * 9, "at most 8"),
        ("units", [1], "must be a JSON object of unit names to counts"),
    ],
)
def test_v2_field_limits(client: TestClient, field: str, value: Any, message: str) -> None:
    ((path, text),) = _errors(client, usage("u1", 1, 1, **{field: value}))
    assert path == f"events[0].{field}"
    assert message in text


def test_an_estimate_without_input_takes_the_gateways_count(priced: TestClient) -> None:  # noqa: F811
    client = priced
    # The gateway counted 730 input tokens; the stream ended without usage, so the tap estimated
    # only the output (41) and left the input out.
    post(
        client,
        started("s1", input_tokens=730),
        tokens("t1", 41, 41, at=1),
        raw("stream.usage", "e1", at=2, output_tokens=41, source="estimate"),
    )
    settle_due(client)
    call = get(client, "r1")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (730, 41)
    assert call["anomalies"] == ["usage_missing"]


def test_an_estimate_without_any_input_is_input_unknown(priced: TestClient) -> None:  # noqa: F811
    client = priced
    post(
        client,
        started("s1"),
        raw("stream.usage", "e1", at=2, output_tokens=9, source="estimate"),
    )
    settle_due(client)
    call = get(client, "r1")
    assert (call["input_tokens"], call["output_tokens_billed"]) == (0, 9)
    assert call["anomalies"] == ["input_unknown", "usage_missing"]


def test_reported_anomalies_are_carried_onto_the_call(priced: TestClient) -> None:  # noqa: F811
    client = priced
    post(
        client,
        started("s1"),
        usage("u1", 17, 3, at=1, anomalies=["usage_inconsistent"]),
        started("s2", "r2"),
        raw(
            "stream.usage",
            "u2",
            "r2",
            at=1,
            output_tokens=3,
            source="estimate",
            anomalies=["drain_skipped"],
        ),
    )
    reconcile(client)
    call = get(client, "r1")
    assert call["settled"] is True
    assert (call["input_tokens"], call["anomalies"]) == (17, ["usage_inconsistent"])
    settle_due(client)
    assert get(client, "r2")["anomalies"] == ["drain_skipped", "input_unknown", "usage_missing"]
