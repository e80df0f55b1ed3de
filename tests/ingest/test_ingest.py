"""``POST /v1/events`` (CONTRACT "Events" and "Ingest") on a real database built by migrations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, func, inspect, select, text
from sqlalchemy.exc import OperationalError

from billing.ingest.repository import repository as ingest_repository
from billing.reconcile.runner import run_pass
from billing.storage.models import Base, Call, Event, row_dict
from tests.builders import RECENT as T0
from tests.builders import post, post_raw
from tests.builders import recent_ts as ts
from tests.builders import seed_disconnected as disconnected
from tests.builders import seed_failed as failed
from tests.builders import seed_started as started
from tests.builders import seed_tokens as tokens
from tests.builders import seed_usage as usage

SCENARIOS = sorted((Path(__file__).parent.parent / "fixtures" / "scenarios").glob("*.json"))
MIB = 1024 * 1024


#: The reflected schemas, by dialect and table names: every test database is the migrations'
#: head, and reflecting it costs more than reading its rows (a new table is a new key).
_REFLECTED: dict[tuple[str, frozenset[str]], MetaData] = {}


def snapshot(app: FastAPI) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table in the database (as the migrations made it), in a fixed order."""
    engine = app.state.billing.engine
    tables: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        key = (conn.dialect.name, frozenset(inspect(conn).get_table_names()))
        schema = _REFLECTED.get(key)
        if schema is None:
            schema = _REFLECTED[key] = MetaData()
            schema.reflect(conn)
        for table in schema.sorted_tables:
            query = select(table).order_by(*(table.primary_key.columns or table.columns))
            tables[table.name] = [tuple(row) for row in conn.execute(query)]
    assert {"events", "calls"} <= set(tables)
    return tables


def stored_events(app: FastAPI) -> dict[str, Event]:
    with app.state.billing.sessions() as session:
        return {e.event_id: e for e in session.scalars(select(Event))}


def stored_calls(app: FastAPI) -> dict[str, Call]:
    with app.state.billing.sessions() as session:
        return {c.request_id: c for c in session.scalars(select(Call))}


def count(app: FastAPI, model: type[Base]) -> int:
    with app.state.billing.sessions() as session:
        result = session.scalar(select(func.count()).select_from(model))
        assert result is not None
        return result


def assert_nothing_stored(app: FastAPI) -> None:
    assert count(app, Event) == 0
    assert count(app, Call) == 0


# --- every scenario is accepted --------------------------------------------------------------


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_scenario_is_accepted_once(client: TestClient, app: FastAPI, path: Path) -> None:
    scenario = json.loads(path.read_text(encoding="utf-8"))
    events = scenario["events"]
    distinct = {e["event_id"] for e in events}
    repeated = len(events) - len(distinct)
    if "duplicates" in scenario["expect"]:
        assert scenario["expect"]["duplicates"] == repeated  # the fixture agrees with itself

    reply = post(client, events)

    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": len(distinct), "duplicates": repeated}
    stored = stored_events(app)
    assert set(stored) == distinct
    for event in events:
        assert json.loads(stored[event["event_id"]].body) == event
    assert set(stored_calls(app)) == {e["request_id"] for e in events}

    before = snapshot(app)
    again = post(client, events)

    assert again.status_code == 200, again.text
    assert again.json() == {"accepted": 0, "duplicates": len(events)}
    assert snapshot(app) == before


def test_scenario_06_counts_in_batch_repeats_as_duplicates(client: TestClient) -> None:
    scenario = json.loads((SCENARIOS[5]).read_text(encoding="utf-8"))
    assert SCENARIOS[5].name.startswith("06_")
    reply = post(client, scenario["events"])
    assert reply.json() == {"accepted": 6, "duplicates": 3}


def test_scenarios_posted_one_event_at_a_time(client: TestClient, app: FastAPI) -> None:
    """All scenarios into one database, one request per event: only first sightings count."""
    seen: set[str] = set()
    for path in SCENARIOS:
        for event in json.loads(path.read_text(encoding="utf-8"))["events"]:
            new = event["event_id"] not in seen
            seen.add(event["event_id"])
            reply = post(client, [event])
            assert reply.status_code == 200, reply.text
            assert reply.json() == {"accepted": int(new), "duplicates": int(not new)}
    # Scenarios 01 and 06 describe the same call with the same event ids.
    assert set(stored_events(app)) == seen
    assert count(app, Event) == len(seen)


# --- each event type, stored as sent -----------------------------------------------------------


def every_type() -> list[dict[str, Any]]:
    """One event of each type with every optional field, times written at +02:00."""
    return [
        started(
            "ev-started",
            occurred_at=ts(0, offset_hours=2),
            attempt=1,
            input_tokens=22,
            metadata={"tenant": "acme", "route": "/v1/messages"},
        ),
        tokens("ev-tokens", occurred_at=ts(1, offset_hours=2), generated=120, delivered=118),
        disconnected(
            "ev-disconnected",
            occurred_at=ts(2, offset_hours=2),
            output_tokens_delivered=380,
            output_tokens_generated=400,
        ),
        usage(
            "ev-usage",
            occurred_at=ts(3, offset_hours=2),
            attempt=2,
            cache_read_input_tokens=5,
            cache_creation_input_tokens=7,
            reasoning_tokens=11,
            model="claude-sonnet-5-5-20261001",
            stop_reason="end_turn",
            source="estimate",
        ),
        failed(
            "ev-failed",
            occurred_at=ts(4, offset_hours=2),
            attempt=2,
            message="upstream went away",
            output_tokens_generated=42,
        ),
    ]


def test_each_event_type_is_stored_with_its_body(
    client: TestClient, app: FastAPI, is_postgres: bool
) -> None:
    events = every_type()
    reply = post(client, events)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 5, "duplicates": 0}

    stored = stored_events(app)
    assert set(stored) == {e["event_id"] for e in events}
    for seconds, event in enumerate(events):
        row = stored[event["event_id"]]
        assert json.loads(row.body) == event
        assert row.type == event["type"]
        assert row.request_id == "req-1"
        assert row.attempt == event.get("attempt", 1)
        assert row.occurred_at == T0 + timedelta(seconds=seconds)
        assert row.occurred_at.utcoffset() == timedelta(0)
        assert len(row.content_hash) == 64

    # In the database itself the instant is kept in UTC, not in the sender's +02:00.
    with app.state.billing.engine.connect() as conn:
        if is_postgres:
            query = "SELECT to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
        else:
            query = "SELECT substr(occurred_at, 1, 19) "
        raw = conn.scalar(text(query + "FROM events WHERE event_id = 'ev-started'"))
    assert raw == T0.strftime("%Y-%m-%d %H:%M:%S")


def test_fractional_seconds_and_lower_case_separators(client: TestClient, app: FastAPI) -> None:
    event = tokens("ev-frac", occurred_at=ts(0).replace("T", "t").replace("Z", ".250z"))
    reply = post(client, [event])
    assert reply.status_code == 200, reply.text
    assert stored_events(app)["ev-frac"].occurred_at == T0 + timedelta(milliseconds=250)


# --- same content is a duplicate --------------------------------------------------------------


def _reordered(event: dict[str, Any]) -> dict[str, Any]:
    return dict(reversed(list(event.items())))


SAME_CONTENT = {
    "key order": (usage("e"), _reordered(usage("e"))),
    "defaulted attempt": (usage("e"), usage("e", attempt=1)),
    "explicit attempt first": (usage("e", attempt=1), usage("e")),
    "another offset": (usage("e"), usage("e", occurred_at=ts(3, offset_hours=2))),
    "negative offset": (usage("e"), usage("e", occurred_at=ts(3, offset_hours=-7))),
    "zero fraction": (usage("e"), usage("e", occurred_at=ts(3).replace("Z", ".000Z"))),
    "+00:00 for Z": (usage("e"), usage("e", occurred_at=ts(3).replace("Z", "+00:00"))),
    "defaulted cache fields": (usage("e"), usage("e", cache_read_input_tokens=0)),
}


@pytest.mark.parametrize(("first", "second"), SAME_CONTENT.values(), ids=SAME_CONTENT.keys())
def test_same_content_is_a_duplicate(
    client: TestClient, app: FastAPI, first: dict[str, Any], second: dict[str, Any]
) -> None:
    assert post(client, [first]).json() == {"accepted": 1, "duplicates": 0}
    before = snapshot(app)

    reply = post(client, [second])

    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 0, "duplicates": 1}
    assert snapshot(app) == before
    assert json.loads(stored_events(app)["e"].body) == first  # the first sending is kept


@pytest.mark.parametrize(("first", "second"), SAME_CONTENT.values(), ids=SAME_CONTENT.keys())
def test_same_content_in_one_batch_is_a_duplicate(
    client: TestClient, app: FastAPI, first: dict[str, Any], second: dict[str, Any]
) -> None:
    reply = post(client, [first, second])
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 1, "duplicates": 1}
    assert count(app, Event) == 1


def test_white_space_does_not_matter(client: TestClient, app: FastAPI) -> None:
    event = usage("e")
    compact = orjson.dumps({"events": [event]})
    spaced = json.dumps({"events": [event]}, indent="\t", separators=(" ,\n ", " :  ")).encode()
    spaced = b"\r\n  " + spaced + b"\n\n"
    assert compact != spaced

    first = post_raw(client, compact)
    before = snapshot(app)
    second = post_raw(client, spaced)

    assert first.json() == {"accepted": 1, "duplicates": 0}
    assert second.status_code == 200, second.text
    assert second.json() == {"accepted": 0, "duplicates": 1}
    assert snapshot(app) == before


# --- 422: validation ----------------------------------------------------------------------------


def _without(event: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != field}


LONG_KEY = "k" * 65
INVALID: dict[str, tuple[Any, str]] = {
    # name: (the event at index 1, the path of its error)
    "negative tokens": (tokens("b", generated=-1), "events[1].output_tokens_generated"),
    "negative delivered": (
        disconnected("b", output_tokens_delivered=-5),
        "events[1].output_tokens_delivered",
    ),
    "negative usage": (usage("b", cache_read_input_tokens=-1), "events[1].cache_read_input_tokens"),
    "unknown type": (tokens("b", type="stream.finished"), "events[1].type"),
    "missing type": (_without(tokens("b"), "type"), "events[1].type"),
    "missing required field": (_without(usage("b"), "source"), "events[1].source"),
    "missing event_id": (_without(tokens("b"), "event_id"), "events[1].event_id"),
    "missing occurred_at": (_without(tokens("b"), "occurred_at"), "events[1].occurred_at"),
    "missing model": (_without(started("b"), "model"), "events[1].model"),
    "naive timestamp": (tokens("b", occurred_at=ts(1).rstrip("Z")), "events[1].occurred_at"),
    "date only": (tokens("b", occurred_at=ts(1)[:10]), "events[1].occurred_at"),
    "unix time as text": (tokens("b", occurred_at="1760515200"), "events[1].occurred_at"),
    "timestamp as number": (tokens("b", occurred_at=1760515200), "events[1].occurred_at"),
    "not a date": (tokens("b", occurred_at="yesterday"), "events[1].occurred_at"),
    # Built when the test runs, not when it is collected: a slow suite (14 minutes on a busy
    # machine) would otherwise post it less than MAX_FUTURE ahead.
    "far future": (
        lambda: tokens("b", occurred_at=(datetime.now(UTC) + timedelta(minutes=10)).isoformat()),
        "events[1].occurred_at",
    ),
    "future by offset": (
        # 5 minutes ahead in UTC would be fine; written at -05:00 without converting it is not.
        tokens("b", occurred_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S-05:00")),
        "events[1].occurred_at",
    ),
    "unknown protocol": (started("b", protocol="openai.completions"), "events[1].protocol"),
    "unknown usage source": (usage("b", source="provider"), "events[1].source"),
    "metadata value not a string": (started("b", metadata={"tier": 1}), "events[1].metadata.tier"),
    "metadata value null": (started("b", metadata={"tier": None}), "events[1].metadata.tier"),
    "metadata not an object": (started("b", metadata=["a", "b"]), "events[1].metadata"),
    "metadata 33 entries": (
        started("b", metadata={f"k{i}": "v" for i in range(33)}),
        "events[1].metadata",
    ),
    "metadata key 65 chars": (
        started("b", metadata={LONG_KEY: "v"}),
        f"events[1].metadata.{LONG_KEY}",
    ),
    "metadata value 257 chars": (started("b", metadata={"k": "v" * 257}), "events[1].metadata.k"),
    "unknown field": (tokens("b", colour="blue"), "events[1].colour"),
    "field of another type": (tokens("b", source="upstream"), "events[1].source"),
    "bool tokens": (tokens("b", generated=True), "events[1].output_tokens_generated"),
    "float tokens": (tokens("b", delivered=9.0), "events[1].output_tokens_delivered"),
    "fractional tokens": (usage("b", output_tokens=1.5), "events[1].output_tokens"),
    "string tokens": (usage("b", input_tokens="22"), "events[1].input_tokens"),
    "null required tokens": (usage("b", input_tokens=None), "events[1].input_tokens"),
    "bool optional tokens": (started("b", input_tokens=False), "events[1].input_tokens"),
    "attempt 0": (tokens("b", attempt=0), "events[1].attempt"),
    "attempt as string": (tokens("b", attempt="2"), "events[1].attempt"),
    "empty event_id": (tokens(""), "events[1].event_id"),
    "event_id 129 chars": (tokens("x" * 129), "events[1].event_id"),
    "request_id not a string": (tokens("b", request_id=7), "events[1].request_id"),
    "event not an object": ("stream.tokens", "events[1]"),
    "event is null": (None, "events[1]"),
}


@pytest.mark.parametrize(("bad", "path"), INVALID.values(), ids=INVALID.keys())
def test_invalid_event_is_refused_with_its_path(
    client: TestClient, app: FastAPI, bad: Any, path: str
) -> None:
    if callable(bad):
        bad = bad()
    reply = post(client, [started("good"), bad])

    assert reply.status_code == 422, reply.text
    errors = reply.json()["errors"]
    assert [(e["index"], e["path"]) for e in errors] == [(1, path)]
    message = errors[0]["message"]
    assert isinstance(message, str) and len(message) > 10
    assert not message.startswith("Input should"), "a pydantic message, not the service's own"
    assert_nothing_stored(app)


VALID_EDGES: dict[str, Any] = {
    "zero tokens": tokens("b", generated=0, delivered=0),
    # Built when the test runs (see "far future" above).
    "4 minutes ahead": lambda: tokens(
        "b", occurred_at=(datetime.now(UTC) + timedelta(minutes=4)).isoformat()
    ),
    "metadata 32 entries": started("b", metadata={f"k{i}": "v" for i in range(32)}),
    "metadata key 64 chars": started("b", metadata={"k" * 64: "v"}),
    "metadata value 256 chars": started("b", metadata={"k": "v" * 256}),
    "metadata empty value": started("b", metadata={"k": ""}),
    "empty metadata": started("b", metadata={}),
    "null optional fields": started("b", input_tokens=None, metadata=None),
    "event_id 128 chars": tokens("x" * 128),
    "attempt 3": tokens("b", attempt=3),
    "large token count": usage("b", output_tokens=2_000_000, input_tokens=900_000),
}


@pytest.mark.parametrize("event", VALID_EDGES.values(), ids=VALID_EDGES.keys())
def test_edge_values_are_accepted(client: TestClient, app: FastAPI, event: Any) -> None:
    if callable(event):
        event = event()
    reply = post(client, [started("good"), event])
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 2, "duplicates": 0}
    assert json.loads(stored_events(app)[event["event_id"]].body) == event


BAD_BODIES: dict[str, tuple[bytes, str]] = {
    "empty batch": (b'{"events": []}', "events"),
    "not JSON": (b'{"events": [', "body"),
    "empty body": (b"", "body"),
    "not UTF-8": (b'{"events": ["\xff"]}', "body"),
    "a JSON list": (orjson.dumps([started("a")]), "body"),
    "a JSON string": (b'"events"', "body"),
    "events not a list": (orjson.dumps({"events": started("a")}), "body"),
    "no events key": (orjson.dumps({"event": [started("a")]}), "body"),
    "extra top-level field": (
        orjson.dumps({"events": [started("a")], "gateway": "gw-1"}),
        "body.gateway",
    ),
}


@pytest.mark.parametrize(("body", "path"), BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_body_is_refused(client: TestClient, app: FastAPI, body: bytes, path: str) -> None:
    reply = post_raw(client, body)

    assert reply.status_code == 422, reply.text
    errors = reply.json()["errors"]
    assert [(e["index"], e["path"]) for e in errors] == [(None, path)]
    assert errors[0]["message"]
    assert_nothing_stored(app)


HOSTILE: dict[str, tuple[bytes, int]] = {
    # A failure's message is text like every other field (issue 44): no NUL, no control.
    "NUL in a message": (
        orjson.dumps({"events": [failed("nul-f", message="stack\x00trace")]}),
        422,
    ),
    # Metadata is text like every other field of an event (issue 29): no NUL, no control.
    "NUL in metadata": (
        orjson.dumps({"events": [started("nul-s", metadata={"a": "a\x00b"})]}),
        422,
    ),
    "NUL in an id": (orjson.dumps({"events": [tokens("nul\x00id")]}), 422),
    "lone surrogate": (b'{"events": [{"event_id": "\\ud800"}]}', 422),
    "integer past 64 bits": (
        orjson.dumps({"events": [tokens("big")]}).replace(
            b'"output_tokens_generated":10', b'"output_tokens_generated":' + b"9" * 30
        ),
        422,
    ),
    "token count past the limit": (orjson.dumps({"events": [tokens("big", generated=2**62)]}), 422),
    "deep nesting": (b'{"events": [' + b"[" * 5000 + b"]" * 5000 + b"]}", 422),
    "NaN": (b'{"events": [{"output_tokens_generated": NaN}]}', 422),
}


@pytest.mark.parametrize(("body", "status"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_input_is_never_a_500(
    client: TestClient, app: FastAPI, body: bytes, status: int
) -> None:
    reply = post_raw(client, body)
    assert reply.status_code == status, reply.text
    if status == 200:
        stored = stored_events(app)
        assert {k: json.loads(v.body) for k, v in stored.items()} == {
            e["event_id"]: e for e in orjson.loads(body)["events"]
        }
    else:
        assert reply.json()["errors"]
        assert_nothing_stored(app)


def test_one_422_lists_every_bad_event(client: TestClient, app: FastAPI) -> None:
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    batch = [
        started("ok-0"),
        tokens("bad-1", generated=-3, occurred_at=future),
        usage("ok-2"),
        {**_without(failed("bad-3"), "error_type"), "attempt": 0, "extra": True},
        tokens("bad-4", occurred_at=future),
    ]

    reply = post(client, batch)

    assert reply.status_code == 422, reply.text
    found = sorted((e["index"], e["path"]) for e in reply.json()["errors"])
    assert found == [
        (1, "events[1].output_tokens_generated"),
        (3, "events[3].attempt"),
        (3, "events[3].error_type"),
        (3, "events[3].extra"),
        (4, "events[4].occurred_at"),
    ]
    assert all(e["message"] for e in reply.json()["errors"])
    assert_nothing_stored(app)


def test_validation_wins_over_conflict_and_stores_nothing(client: TestClient, app: FastAPI) -> None:
    post(client, [usage("u")])
    before = snapshot(app)
    reply = post(client, [usage("u", output_tokens=1), tokens("t", generated=-1), started("new")])
    assert reply.status_code == 422, reply.text
    assert [e["index"] for e in reply.json()["errors"]] == [1]
    assert snapshot(app) == before


# --- 413: too large -------------------------------------------------------------------------------


def _many(n: int) -> list[dict[str, Any]]:
    return [tokens(f"ev-{i:05d}", request_id=f"req-{i % 7}") for i in range(n)]


def test_1000_events_are_accepted(client: TestClient, app: FastAPI) -> None:
    reply = post(client, _many(1000))
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 1000, "duplicates": 0}
    assert count(app, Event) == 1000
    assert count(app, Call) == 7


def test_1001_events_are_too_many(client: TestClient, app: FastAPI) -> None:
    reply = post(client, _many(1001))
    assert reply.status_code == 413, reply.text
    assert "1000" in reply.text
    assert_nothing_stored(app)


def _padded(size: int) -> bytes:
    """A valid batch of one event, padded with white space to exactly ``size`` bytes."""
    body = orjson.dumps({"events": [started("big")]})
    return body + b" " * (size - len(body))


def test_a_body_of_exactly_1_mib_is_accepted(http: httpx.Client, app: FastAPI) -> None:
    reply = post_raw(http, _padded(MIB))
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 1, "duplicates": 0}


def test_a_body_over_1_mib_is_too_large(http: httpx.Client, app: FastAPI) -> None:
    body = _padded(MIB + 1)
    reply = post_raw(http, body)
    assert reply.status_code == 413, reply.text
    assert_nothing_stored(app)


def test_a_large_batch_of_valid_events_over_1_mib_is_too_large(
    http: httpx.Client, app: FastAPI
) -> None:
    events = [failed(f"f{i}", message="x" * 4000) for i in range(300)]
    reply = post(http, events)
    assert reply.status_code == 413, reply.text
    assert_nothing_stored(app)


def test_a_streamed_body_over_1_mib_without_length_is_too_large(
    http: httpx.Client, app: FastAPI
) -> None:
    body = _padded(MIB + 1)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    reply = http.post("/v1/events", content=chunks(), headers={"Content-Type": "application/json"})
    assert reply.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in reply.request.headers
    assert reply.status_code == 413, reply.text
    assert_nothing_stored(app)


def test_a_streamed_body_under_1_mib_is_accepted(http: httpx.Client, app: FastAPI) -> None:
    body = _padded(MIB - 10)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 100_000):
            yield body[start : start + 100_000]

    reply = http.post("/v1/events", content=chunks(), headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert count(app, Event) == 1


# --- 409: conflicts -------------------------------------------------------------------------------


def test_reused_event_id_with_other_content_is_a_conflict(client: TestClient, app: FastAPI) -> None:
    assert post(client, [started("s"), usage("u"), tokens("t")]).json()["accepted"] == 3
    before = snapshot(app)

    reply = post(
        client,
        [
            started("brand-new", request_id="req-new"),  # valid and new: must not be stored
            tokens("t"),  # a duplicate
            usage("u", output_tokens=751),  # a conflict
        ],
    )

    assert reply.status_code == 409, reply.text
    assert reply.json()["conflicts"] == [{"index": 2, "event_id": "u"}]
    assert snapshot(app) == before
    assert "brand-new" not in stored_events(app)
    assert "req-new" not in stored_calls(app)


def test_every_conflict_is_listed_in_batch_order(client: TestClient, app: FastAPI) -> None:
    post(client, [started("s"), usage("u"), tokens("t")])
    before = snapshot(app)

    reply = post(
        client,
        [
            tokens("t", generated=11),
            tokens("fresh"),
            started("s", occurred_at=ts(0).replace("Z", "+02:00")),  # another instant
            usage("u", attempt=2),
        ],
    )

    assert reply.status_code == 409, reply.text
    assert reply.json()["conflicts"] == [
        {"index": 0, "event_id": "t"},
        {"index": 2, "event_id": "s"},
        {"index": 3, "event_id": "u"},
    ]
    assert snapshot(app) == before


def test_a_conflict_inside_one_batch(client: TestClient, app: FastAPI) -> None:
    reply = post(
        client,
        [
            tokens("x", generated=10),
            started("y"),
            tokens("x", generated=10),  # a duplicate of index 0
            tokens("x", generated=12),  # a conflict with index 0
        ],
    )
    assert reply.status_code == 409, reply.text
    assert reply.json()["conflicts"] == [{"index": 3, "event_id": "x"}]
    assert_nothing_stored(app)


def test_an_event_id_of_another_type_is_a_conflict(client: TestClient, app: FastAPI) -> None:
    post(client, [tokens("same-id")])
    reply = post(client, [failed("same-id")])
    assert reply.status_code == 409, reply.text
    assert reply.json()["conflicts"] == [{"index": 0, "event_id": "same-id"}]
    assert count(app, Event) == 1


def test_the_same_event_id_for_another_call_is_a_conflict(client: TestClient, app: FastAPI) -> None:
    post(client, [tokens("same-id", request_id="req-a")])
    reply = post(client, [tokens("same-id", request_id="req-b")])
    assert reply.status_code == 409, reply.text
    assert set(stored_calls(app)) == {"req-a"}


# --- atomicity --------------------------------------------------------------------------------


def test_a_batch_is_stored_whole_or_not_at_all(client: TestClient, app: FastAPI) -> None:
    batch = [started("a", request_id=f"req-{i}") for i in range(5)]
    batch[2] = {**batch[2], "event_id": "c", "protocol": "grpc"}
    batch += [tokens(f"t{i}", request_id=f"req-{i}") for i in range(5)]

    assert post(client, batch).status_code == 422
    assert_nothing_stored(app)

    batch[2] = started("c", request_id="req-2")
    batch[0] = started("a0", request_id="req-0")
    batch[1] = started("a1", request_id="req-1")
    batch[3] = started("a3", request_id="req-3")
    batch[4] = started("a4", request_id="req-4")
    reply = post(client, batch)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"accepted": 10, "duplicates": 0}
    assert count(app, Event) == 10
    assert set(stored_calls(app)) == {f"req-{i}" for i in range(5)}


def test_a_database_failure_mid_batch_stores_nothing(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events are written before the calls are touched; a failure there must roll the
    events back. (The call exists already and was reconciled since, so that it is touched on
    both databases: PostgreSQL creates a new call with its events, in one statement, and leaves
    a call that is pending already alone.)"""
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert post(client, [started("a")]).status_code == 200
    state = app.state.billing
    run_pass(state.sessions, state.settings, now=datetime.now(UTC))
    assert row_dict(stored_calls(app)["req-1"])["pending"] is False
    inserted_before_failure: list[int] = []

    def broken(session: Any, calls: Any, known: Any) -> None:
        inserted_before_failure.append(session.scalar(select(func.count()).select_from(Event)))
        raise OperationalError("UPDATE calls", {}, Exception("connection reset by peer"))

    monkeypatch.setattr(ingest_repository(state.sessions.kw["bind"]), "touch_calls", broken)
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        reply = post(client, [tokens("b"), usage("c")])

    assert inserted_before_failure == [3]
    assert reply.status_code == 503, reply.text
    assert int(reply.headers["Retry-After"]) >= 1
    assert count(app, Event) == 1
    assert count(app, Call) == 1
    assert row_dict(stored_calls(app)["req-1"])["pending"] is False


# --- the calls table ------------------------------------------------------------------------------


def test_one_pending_call_per_request_id(client: TestClient, app: FastAPI) -> None:
    batch = [
        tokens("a-tokens", request_id="req-a"),
        started(
            "a-started",
            request_id="req-a",
            occurred_at=ts(0, offset_hours=5),
            api_key_id="key_a",
            model="gpt-5.6-sol",
            protocol="openai.responses",
            metadata={"team": "search"},
        ),
        usage("a-usage", request_id="req-a"),
        started(
            "b-started", request_id="req-b", api_key_id="key_b", protocol="openai.chat_completions"
        ),
        tokens("c-tokens", request_id="req-c"),  # no stream.started yet
    ]
    assert post(client, batch).json() == {"accepted": 5, "duplicates": 0}

    calls = stored_calls(app)
    assert set(calls) == {"req-a", "req-b", "req-c"}
    a, b, c = calls["req-a"], calls["req-b"], calls["req-c"]
    assert all(call.pending for call in calls.values())
    assert not any(call.settled for call in calls.values())
    assert (a.api_key_id, a.model, a.protocol, a.started_at, a.metadata_) == (
        "key_a",
        "gpt-5.6-sol",
        "openai.responses",
        T0,
        {"team": "search"},
    )
    assert a.started_at is not None and a.started_at.utcoffset() == timedelta(0)
    assert (b.api_key_id, b.model, b.protocol, b.started_at) == (
        "key_b",
        "claude-sonnet-5-5",
        "openai.chat_completions",
        T0,
    )
    assert (c.api_key_id, c.model, c.protocol, c.started_at) == (None, None, None, None)


def test_a_late_stream_started_fills_in_the_call(client: TestClient, app: FastAPI) -> None:
    post(client, [tokens("t", request_id="req-late")])
    assert stored_calls(app)["req-late"].api_key_id is None

    post(client, [started("s", request_id="req-late", api_key_id="key_late")])

    call = stored_calls(app)["req-late"]
    assert (call.api_key_id, call.model, call.protocol, call.started_at) == (
        "key_late",
        "claude-sonnet-5-5",
        "anthropic.messages",
        T0,
    )
    assert call.pending
    assert count(app, Call) == 1


def test_a_new_event_marks_a_reconciled_call_pending_and_a_duplicate_does_not(
    client: TestClient, app: FastAPI
) -> None:
    """A duplicate changes nothing; a later event of a pending call leaves its row alone (the
    reconciler reads every event); an event for a call reconciled since marks it pending again."""
    post(client, [started("s")])
    first = row_dict(stored_calls(app)["req-1"])
    assert (first["pending"], first["change_seq"]) == (True, 1)
    assert first["last_received_at"] == first["first_received_at"]
    post(client, [started("s")])
    assert row_dict(stored_calls(app)["req-1"]) == first
    post(client, [tokens("t")])
    assert row_dict(stored_calls(app)["req-1"]) == first
    state = app.state.billing
    # Within settle_after of the events: reconciled, not settled (no stream.usage yet).
    result = run_pass(state.sessions, state.settings, now=datetime.now(UTC))
    assert (result.examined, result.settled) == (1, 0)
    reconciled = row_dict(stored_calls(app)["req-1"])
    with state.sessions() as session:
        arrived = session.scalar(select(func.max(Event.received_at)))
    assert reconciled["pending"] is False
    assert reconciled["last_received_at"] == arrived
    assert arrived > first["last_received_at"]
    post(client, [tokens("t2", generated=20)])
    later = row_dict(stored_calls(app)["req-1"])
    assert (later["pending"], later["change_seq"]) == (True, 2)
    assert later["last_received_at"] > arrived


def test_a_post_creating_a_call_also_marks_a_reconciled_call_pending(
    client: TestClient, app: FastAPI
) -> None:
    """One post whose events are all new, for a new call and for a call reconciled since its
    last event: the new call is created pending, the reconciled one is pending again (on
    PostgreSQL the events statement creates the first, the upsert marks only the second)."""
    post(client, [started("s")])
    state = app.state.billing
    run_pass(state.sessions, state.settings, now=datetime.now(UTC))
    assert row_dict(stored_calls(app)["req-1"])["pending"] is False

    reply = post(client, [started("s2", request_id="req-2"), tokens("t")])
    assert reply.json() == {"accepted": 2, "duplicates": 0}
    calls = {rid: row_dict(call) for rid, call in stored_calls(app).items()}
    assert (calls["req-1"]["pending"], calls["req-1"]["change_seq"]) == (True, 2)
    assert (calls["req-2"]["pending"], calls["req-2"]["change_seq"]) == (True, 1)
    assert calls["req-2"]["api_key_id"] == calls["req-1"]["api_key_id"]
