"""The fast ingest path (issue #8) keeps the semantics of the simple one it replaced.

One validation call per batch with a per-event fallback, multi-row statements of any size, the
rows inserted found without a ``max(seq)`` query, and the app answering ``POST /v1/events`` ahead
of its middleware stack.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from billing.errors import EventConflict, ValidationFailed
from billing.ingest import service
from billing.ingest.service import IngestResult, content_hash, prepare_batch, write_group
from billing.ingest.sql import sqlite as sqlite_ingest
from billing.ingest.validation import (
    MAX_FUTURE,
    ParsedEvent,
    _describe,
    _event_adapter,
    parse_batch,
)
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call, Event
from tests.builders import seed_started as started
from tests.builders import seed_tokens as tokens
from tests.builders import seed_usage as usage

#: Printable text (metadata keys and values are printable, issue 29): no control, format,
#: separator (but the space), surrogate, private or unassigned characters.
_PRINTABLE = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))

NOW = datetime.now(UTC)


def body(*events: Any) -> bytes:
    return orjson.dumps({"events": list(events)})


def reference_parse(raws: list[Any], now: datetime) -> list[tuple[int | None, str, str]]:
    """The errors of the event-by-event validation this replaced, in its order."""
    errors: list[tuple[int | None, str, str]] = []
    for i, raw in enumerate(raws):
        try:
            event = _event_adapter.validate_python(raw)
        except ValidationError as error:
            described = (_describe(item, raws, i) for item in error.errors(include_url=False))
            errors += [(e.index, e.path, e.message) for e in described]
            continue
        if event.occurred_at - now > MAX_FUTURE:
            errors.append((i, f"events[{i}].occurred_at", "future"))
    return errors


def test_one_422_lists_every_problem_in_batch_order() -> None:
    future = (NOW + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    raws = [
        tokens("a"),
        started("b", occurred_at=future),
        tokens("c", generated=-1, delivered="x"),
        usage("d"),
        {"type": "stream.nope"},
        started("e", occurred_at=future),
        7,
    ]
    with pytest.raises(ValidationFailed) as caught:
        parse_batch(body(*raws), NOW)
    got = [(e.index, e.path, e.message) for e in caught.value.errors]
    want = reference_parse(raws, NOW)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g for g in got if "ahead of the service's clock" not in g[2]] == [
        w for w in want if w[2] != "future"
    ]


@pytest.mark.parametrize("stamp", ["0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00"])
def test_an_instant_outside_years_1_to_9999_utc_is_a_422_not_a_500(stamp: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_batch(body(tokens("a"), tokens("b", occurred_at=stamp)), NOW)
    [error] = caught.value.errors
    assert (error.index, error.path) == (1, "events[1].occurred_at")
    assert "out of range" in error.message


def _old_hash(parsed: ParsedEvent) -> str:
    canonical = parsed.event.model_dump(mode="json")
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()


@settings(max_examples=200, deadline=None)
@given(
    micro=st.integers(0, 999_999),
    offset=st.integers(-14 * 60, 14 * 60),
    attempt=st.one_of(st.none(), st.integers(1, 1000)),
    metadata=st.one_of(
        st.none(),
        st.dictionaries(
            st.text(_PRINTABLE, min_size=1, max_size=8).filter(lambda k: not k.isspace()),
            st.text(_PRINTABLE, max_size=8),
            max_size=32,
        ),
    ),
)
def test_rows_carry_the_values_the_old_path_computed(
    micro: int, offset: int, attempt: int | None, metadata: dict[str, str] | None
) -> None:
    moment = (NOW - timedelta(days=3)).replace(microsecond=micro)
    zone = f"{'+' if offset >= 0 else '-'}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
    local = moment + timedelta(minutes=offset)
    stamp = local.replace(tzinfo=None).isoformat() + zone
    extra: dict[str, Any] = {} if attempt is None else {"attempt": attempt}
    raws = [
        started("s", occurred_at=stamp, metadata=metadata, **extra),
        tokens("t", occurred_at=stamp, **extra),
        usage("u", occurred_at=stamp, cache_read_input_tokens=3, **extra),
        {
            "event_id": "d",
            "request_id": "req-1",
            "type": "stream.client_disconnected",
            "occurred_at": stamp,
            "output_tokens_delivered": 4,
            **extra,
        },
        {
            "event_id": "f",
            "request_id": "req-1",
            "type": "stream.failed",
            "occurred_at": stamp,
            "error_type": "api_error",
            # printable text only (issue 44: a message refuses control characters as every
            # text field does); quotes, a backslash and non-ASCII text are kept as sent
            "message": "".join((metadata or {"é": '"x\\ é'}).values()),
            **extra,
        },
    ]
    parsed = parse_batch(body(*raws), NOW)
    batch = prepare_batch(parsed, NOW)
    for row, event in zip(batch.rows, parsed, strict=True):
        assert row.digest == content_hash(event) == _old_hash(event)
        at = event.event.occurred_at
        assert row.occurred_text == at.astimezone(UTC).replace(tzinfo=None).isoformat(
            " ", "microseconds"
        )
        assert row.body == orjson.dumps(event.raw).decode()
        # plain_usage: set for the usage only (plain: none of the fields the fast path declines)
        assert row.plain_usage is (True if event.event.type == "stream.usage" else None)
    assert batch.rows[0].started is not None
    assert batch.rows[0].started.metadata == json.dumps(metadata)


@pytest.mark.parametrize("count", [1, 15, 31, 32, 33, 100, 257, 800, 1000])
def test_multi_row_statements_cover_every_row(count: int) -> None:
    sizes: list[int] = []
    width = sqlite_ingest.INSERT_EVENTS[1].count("?")
    assert width == 12  # the eleven event columns and the call number

    class Conn:
        def exec_driver_sql(self, sql: str, params: tuple[Any, ...]) -> Any:
            sizes.append(len(params) // width)
            assert sql.count(sqlite_ingest.INSERT_EVENTS[1]) == len(params) // width
            assert len(params) <= 32766

            class Result:
                rowcount = len(params) // width

            return Result()

    rows = [tuple(range(width))] * count
    assert sqlite_ingest._many(Conn(), sqlite_ingest.INSERT_EVENTS, rows) == count  # type: ignore[arg-type]
    assert sum(sizes) == count
    assert len(sizes) <= 8


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings)
    yield make_sessionmaker(engine)
    engine.dispose()


def prepared(*events: dict[str, Any]) -> service.PreparedBatch:
    now = datetime.now(UTC)
    return prepare_batch(parse_batch(body(*events), now), now)


def test_new_and_stored_events_mixed_across_statements(sessions: sessionmaker[Session]) -> None:
    """Some events of a group are stored already (duplicates), scattered over several multi-row
    statements: exactly the new ones are counted and touch their calls."""
    first = [tokens(f"e{i:03d}", request_id=f"r{i % 9}") for i in range(0, 300, 7)]
    assert write_group(sessions, [prepared(*first)]) == [IngestResult(len(first), 0)]
    again = [tokens(f"e{i:03d}", request_id=f"r{i % 9}") for i in range(300)]
    fresh = [started(f"s{i}", request_id=f"new{i}") for i in range(40)]
    results = write_group(sessions, [prepared(*again[:150]), prepared(*again[150:], *fresh)])
    early = len(range(0, 150, 7))  # stored events among the first 150
    late = len(first) - early
    assert results == [IngestResult(150 - early, early), IngestResult(150 - late + 40, late)]
    with sessions() as session:
        assert len(set(session.scalars(select(Event.event_id)))) == 340
        calls = {c.request_id: c for c in session.scalars(select(Call))}
    assert set(calls) == {f"r{i}" for i in range(9)} | {f"new{i}" for i in range(40)}
    assert all(calls[f"new{i}"].api_key_id == "key_7f3a" for i in range(40))


def test_a_conflict_among_stored_events_is_refused(sessions: sessionmaker[Session]) -> None:
    write_group(sessions, [prepared(*(tokens(f"e{i}") for i in range(50)))])
    changed = [tokens(f"e{i}") for i in range(50)] + [tokens("new")]
    changed[17] = tokens("e17", generated=11)
    [result] = write_group(sessions, [prepared(*changed)])
    assert isinstance(result, EventConflict)
    assert [(c.index, c.event_id) for c in result.conflicts] == [(17, "e17")]
    with sessions() as session:
        assert "new" not in set(session.scalars(select(Event.event_id)))


def test_the_ingest_fast_path_answers_like_the_route(app: FastAPI) -> None:
    with TestClient(app, base_url="http://127.0.0.1") as client:
        reply = client.post("/v1/events", json={"events": [tokens("a")]})
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "application/json"
        assert int(reply.headers["content-length"]) == len(reply.content)
        assert reply.json() == {"accepted": 1, "duplicates": 0}
        reply = client.post("/v1/events", json={"events": [{"type": "x"}, tokens("a")]})
        assert reply.status_code == 422
        assert [e["index"] for e in reply.json()["errors"]] == [0]
        assert "/v1/events" in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    ("extra", "plain"),
    [
        ({}, True),
        ({"stop_reason": "end_turn"}, True),
        ({"service_tier": "priority"}, False),
        ({"cache_creation_input_tokens": 5, "cache_creation_1h_input_tokens": 5}, False),
        ({"units": {"web_search": 1}}, False),
        ({"stop_reason": None}, False),  # a JSON null: the rule's
        ({"stop_reason": "a:null"}, False),  # the text ":null" anywhere (ASCII case ignored)
        ({"stop_reason": "a:NULL"}, False),
        ({"stop_reason": '"units":'}, True),  # a quote inside a string is escaped: no key
    ],
)
def test_usage_bodies_are_flagged_plain_at_ingest(extra: dict[str, Any], plain: bool) -> None:
    """``events.plain_usage`` (migration 0012), which the reconciler's fast path reads instead of
    searching the body: false for a usage with a field it declines or a JSON null."""
    parsed = parse_batch(body(usage("u", **extra)), NOW)
    (row,) = prepare_batch(parsed, NOW).rows
    assert row.plain_usage is plain
