"""The fast path (``billing.reconcile.fastpath``) proven against the rule over calls generated from
the event schemas themselves: any event type of ``billing.ingest.schemas.Event``, each optional
field present or absent, values at the edges of their types, any order, duplicates under the same
and under another event id. Every generated call is ingested into two databases, priced at every
rate of ``billing.rates`` and every unit the calls count (each a value of its own), one
reconciled with the fast path and one with the rule only: the fast path must take exactly the
calls that ``is_common`` names among those that settle now, and every row must be the same.

A field added to an event is generated here at once; ``is_common`` is false for a call that
carries it until the fast path declares it handled (``HANDLED``), so the property fails until
the fast path's statements handle the field or decline such calls.
"""

from __future__ import annotations

import types
from datetime import UTC, timedelta, timezone
from typing import Annotated, Any, Literal, NotRequired, Union, get_args, get_origin, get_type_hints

import annotated_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from sqlalchemy import Engine
from typing_extensions import is_typeddict

from billing.ingest.schemas import Event
from billing.reconcile.fastpath import HANDLED, is_common
from tests.reconcile.test_fastpath import (
    T0,
    _ingest,
    _price,
    _reconcile,
    _rows,
    taken,  # noqa: F401 (a fixture)
    two_databases,  # noqa: F401 (a fixture)
)

#: Every event model of the discriminated union.
MODELS: tuple[type[BaseModel], ...] = get_args(get_args(Event)[0])
_ENVELOPE = {"type", "event_id", "request_id", "occurred_at", "attempt"}
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)

#: Values for text fields, filtered by each field's length limits: plain, the text the SQL of
#: the fast path looks for in a usage body, JSON-escaped characters, non-ASCII, the longest.
_TEXT = ["stop", "end_turn", "x:null", 'quo"te\\', "ünï cödé", "L" * 64, "M" * 256]
#: Names the schemas give a meaning to: the models are priced
#: (tests.reconcile.test_fastpath).
_NAMED = {"model": ["m-a", "m-b"], "api_key_id": ["key-1", "key-2"]}
_METADATA: list[dict[str, str]] = [{}, {"team": "search"}, {"ünï": "a:null", "b": ""}]
_UNITS: list[dict[str, int]] = [{}, {"web_search_requests": 3}, {"a": 0, "b_2": 10**9}]
#: A price (USD per unit) of every unit the calls count, none equal to another.
UNIT_PRICES = {"web_search_requests": "0.01", "a": "0.5", "b_2": "0.000003"}
_OFFSETS = [UTC, timezone(timedelta(hours=2)), timezone(-timedelta(hours=5, minutes=30))]


def _bounds(metadata: list[Any]) -> tuple[int, int]:
    low, high = 0, 10**9
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = int(item.ge)  # type: ignore[call-overload]
        if isinstance(item, annotated_types.Le):
            high = int(item.le)  # type: ignore[call-overload]
    return low, high


def _max_length(metadata: list[Any]) -> int:
    for item in metadata:
        length = getattr(item, "max_length", None)
        if length is not None:
            return int(length)
    return 10**6


def _values(name: str, annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    """Values of a field's type, read off its annotation and constraints."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return st.one_of(
            [
                st.none() if arg is type(None) else _values(name, arg, metadata)
                for arg in get_args(annotation)
            ]
        )
    if origin is Annotated:
        base, *extra = get_args(annotation)
        flat = [*metadata]
        for item in extra:
            flat.extend(item.metadata if isinstance(item, FieldInfo) else [item])
        return _values(name, base, flat)
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if origin is dict:
        if get_args(annotation)[1] is str:
            return st.sampled_from(_METADATA)
        return st.sampled_from(_UNITS)
    if origin is list:
        (item,) = get_args(annotation)
        return st.lists(_values(name, item, []), max_size=2)
    if is_typeddict(annotation):
        # NotRequired[...] marks an optional key (the schemas' module postpones annotations, so
        # the TypedDict's own __required_keys__ does not know it; pydantic reads the hints too).
        hints = get_type_hints(annotation, include_extras=True)
        optional = {k for k, hint in hints.items() if get_origin(hint) is NotRequired}
        parts = {
            key: _values(key, get_args(hint)[0] if key in optional else hint, [])
            for key, hint in hints.items()
        }
        return st.fixed_dictionaries(
            {k: v for k, v in parts.items() if k not in optional},
            optional={k: v for k, v in parts.items() if k in optional},
        )
    if annotation is int:
        low, high = _bounds(metadata)
        return st.one_of(
            st.sampled_from([low, low + 1, high]), st.integers(low, min(high, low + 3000))
        )
    if annotation is str:
        longest = _max_length(metadata)
        return st.sampled_from(_NAMED.get(name) or [t for t in _TEXT if len(t) <= longest])
    raise AssertionError(f"no values for the field {name!r} ({annotation!r})")


def _fields(model: type[BaseModel], plain: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """A model's own fields: every required one, each optional one present or absent. ``plain``:
    of the common shape's fields only (``HANDLED``), with an input count in a usage."""
    parts: dict[str, st.SearchStrategy[Any]] = {}
    optional: list[str] = []
    handled = HANDLED.get(model, frozenset())
    for name, info in model.model_fields.items():
        if name in _ENVELOPE or (plain and name not in handled):
            continue
        parts[name] = _values(name, info.annotation, list(info.metadata))
        if not info.is_required() and not (plain and name == "input_tokens"):
            optional.append(name)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        return {
            name: draw(values)
            for name, values in parts.items()
            if name not in optional or draw(st.booleans())
        }

    return build()


_BY_TYPE = {get_args(m.model_fields["type"].annotation)[0]: m for m in MODELS}


@st.composite
def _call(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One call's events (without its ids yet): three in four plain (the common shape's events
    and fields, one attempt), the others mostly that shape and any other event or field."""
    plain = draw(st.sampled_from([True, True, True, False]))
    kinds = []
    if plain or draw(st.floats(0, 1)) < 0.9:
        kinds.append("stream.started")
    kinds += ["stream.tokens"] * draw(st.integers(0, 3))
    if draw(st.floats(0, 1)) < 0.3:
        kinds.append("stream.client_disconnected")
    if plain or draw(st.floats(0, 1)) < 0.9:
        kinds.append("stream.usage")
    if not plain and draw(st.floats(0, 1)) < 0.3:
        kinds += draw(st.lists(st.sampled_from(sorted(_BY_TYPE)), min_size=1, max_size=2))
    attempt = draw(st.sampled_from([1, 1, 1, 2]))
    events = []
    for kind in kinds:
        fields = draw(_fields(_BY_TYPE[kind], plain))
        when = T0 + timedelta(
            seconds=draw(st.integers(0, 600)), microseconds=draw(st.integers(0, 999_999))
        )
        stamp = when.astimezone(draw(st.sampled_from(_OFFSETS))).isoformat()
        event: dict[str, Any] = {"type": kind, "occurred_at": stamp.replace("+00:00", "Z")}
        if attempt != 1 or draw(st.booleans()):
            others = [] if plain else [attempt + 1]
            event["attempt"] = draw(st.sampled_from([attempt, attempt, attempt, *others]))
        events.append({**event, **fields})
    return events


def _with_ids(
    calls: list[list[dict[str, Any]]], prefix: str, data: st.DataObject
) -> dict[str, list[dict[str, Any]]]:
    """The calls' events with their ids, duplicated (the same event again, or under another id)
    and shuffled."""
    out: dict[str, list[dict[str, Any]]] = {}
    for i, events in enumerate(calls):
        request_id = f"{prefix}-{i}"
        posted = [
            {"event_id": f"{request_id}-e{n}", "request_id": request_id, **event}
            for n, event in enumerate(events)
        ]
        for n, event in enumerate(list(posted)):
            twice = data.draw(st.sampled_from(["", "", "", "", "same", "other"]))
            if twice == "same":
                posted.append(dict(event))
            elif twice == "other":
                posted.append({**event, "event_id": f"{request_id}-d{n}"})
        out[request_id] = data.draw(st.permutations(posted))
    return out


def _validated(events: list[dict[str, Any]]) -> list[Any] | None:
    """The call's distinct events as ingest validates them (None: one is not valid)."""
    distinct = {e["event_id"]: e for e in events}
    try:
        return [_ADAPTER.validate_python(e) for e in distinct.values()]
    except ValidationError:
        return None


def _upstream(models: list[Any]) -> bool:
    return any(getattr(e, "source", None) == "upstream" for e in models)


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(calls=st.lists(_call(), min_size=1, max_size=6), due=st.booleans(), data=st.data())
def test_the_fast_path_settles_exactly_the_common_calls_as_the_rule_does(
    two_databases: tuple[Engine, Engine],  # noqa: F811
    taken: list[str],  # noqa: F811
    calls: list[list[dict[str, Any]]],
    due: bool,
    data: st.DataObject,
) -> None:
    with_sql, rule_only = two_databases
    with with_sql.connect() as conn:
        examples = conn.exec_driver_sql("SELECT count(*) FROM prices").scalar()
    if not examples:
        for engine in two_databases:
            _price(engine, unit_prices=UNIT_PRICES)
    with with_sql.connect() as conn:
        prefix = f"p{conn.exec_driver_sql('SELECT count(*) FROM calls').scalar()}"
    posted = _with_ids(calls, prefix, data)
    models: dict[str, list[Any]] = {}
    for request_id, events in posted.items():
        validated = _validated(events)
        if validated is not None:
            models[request_id] = validated
    events = [e for rid in models for e in posted[rid]]
    if not events:
        return
    received = T0 + timedelta(hours=1)
    for engine in two_databases:
        _ingest(engine, events, received)

    # First pass: upstream calls settle now; an estimate's call only when it is due.
    taken.clear()
    first = received + timedelta(seconds=61 if due else 0)
    _reconcile(with_sql, first, True, 5)
    _reconcile(rule_only, first, False, 5)
    settle_now = {rid for rid, m in models.items() if is_common(m) and (due or _upstream(m))}
    assert set(taken) == settle_now
    assert _rows(with_sql) == _rows(rule_only)

    # Then every call is due: the common calls left settle by the fast path.
    settled_first = set(taken)
    taken.clear()
    later = received + timedelta(hours=1)
    _reconcile(with_sql, later, True, 5)
    _reconcile(rule_only, later, False, 5)
    assert set(taken) == {rid for rid, m in models.items() if is_common(m)} - settled_first
    assert _rows(with_sql) == _rows(rule_only)
