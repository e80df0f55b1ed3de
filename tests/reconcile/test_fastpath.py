"""The common call settled by the database (``billing.reconcile.fastpath``) gives the rows the rule
gives: the same random calls are ingested into two databases, one reconciled with the SQL path
and one with the rule only, and every row of ``calls``, ``call_attempts``, ``ledger_entries`` and
the rollups must be equal; the SQL path must take exactly the calls of the common shape.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, text

import billing.reconcile.service as service
from billing.ingest.service import store_batch
from billing.ingest.validation import parse_batch
from billing.plans.schemas import KeyIn
from billing.plans.service import set_key
from billing.pricing.schemas import PriceIn
from billing.pricing.service import record_price
from billing.rates import RATES, Rate
from billing.reconcile.service import reconcile_step
from billing.reconcile.sql import fastpath, postgres_fastpath, sqlite_fastpath
from billing.rollups import service as rollups
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker, write_transaction
from tests.invariants import check_invariants, scratch_database

T0 = datetime(2026, 10, 15, 8, 0, tzinfo=UTC)
#: model -> [(effective_from, input, output, cache read, cache creation) in USD per Mtok]
PRICES = {
    "m-a": [(T0 - timedelta(days=1), "3", "15", "0.30", "3.75")],
    # Two prices: calls before 08:30 take the first, later ones the second.
    "m-b": [
        (T0 - timedelta(days=1), "0.15", "0.60", "0.075", "0.05"),
        (T0 + timedelta(minutes=30), "0.25", "1.25", "0.125", "0.3"),
    ],
    # No price in force before 08:30: earlier calls are unpriced (the rule's path).
    "m-late": [(T0 + timedelta(minutes=30), "1", "2", "0.5", "1")],
    # A rate too large for the SQL path (≥ 2,147 USD per Mtok): the rule prices it.
    "m-dear": [(T0 - timedelta(days=1), "2500", "5000", "1", "1")],
}


def _stamp(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _call(rng: random.Random, request_id: str, shape: str) -> list[dict[str, Any]]:
    """One call's events in a shape, in random order."""
    start = T0 + timedelta(minutes=rng.randrange(0, 60), seconds=rng.randrange(60))
    attempt = rng.choice([1, 1, 1, 2, 3])
    model = rng.choice(["m-a", "m-a", "m-b"])
    if shape == "unpriced":
        model = rng.choice(["m-none", "m-late"])
        start = start.replace(minute=rng.randrange(0, 30))
    if shape == "dear":
        model = "m-dear"
    n = 0

    def event(kind: str, at: datetime, a: int = attempt, **fields: Any) -> dict[str, Any]:
        nonlocal n
        n += 1
        return {
            "event_id": f"{request_id}-{n}",
            "request_id": request_id,
            "type": kind,
            "occurred_at": _stamp(at),
            "attempt": a,
            **fields,
        }

    started: dict[str, Any] = {
        "api_key_id": rng.choice(["key-1", "key-2", "key-3"]),
        "model": model,
        "protocol": rng.choice(["openai.chat_completions", "anthropic.messages"]),
    }
    if rng.random() < 0.5:
        started["input_tokens"] = rng.randrange(0, 5000)
    metadata = rng.choice([None, {}, {"team": "search"}, {"ünï": "cödé", "b": "2"}, "absent"])
    if metadata != "absent":
        started["metadata"] = metadata
    events = [event("stream.started", start, **started)]
    generated = delivered = 0
    for i in range(rng.randrange(0, 6)):
        generated += rng.randrange(0, 80)
        delivered = min(generated, delivered + rng.randrange(0, 80))
        at = start + timedelta(seconds=i + 1, microseconds=rng.randrange(10**6))
        events.append(
            event(
                "stream.tokens",
                at,
                output_tokens_generated=generated,
                output_tokens_delivered=delivered,
            )
        )
    if shape in ("disconnect", "two_disconnects") or (shape == "estimate" and rng.random() < 0.5):
        delivered += rng.randrange(0, 20)
        fields: dict[str, Any] = {"output_tokens_delivered": delivered}
        if rng.random() < 0.5:
            fields["output_tokens_generated"] = generated + rng.randrange(0, 800)
        events.append(event("stream.client_disconnected", start + timedelta(seconds=8), **fields))
        if shape == "two_disconnects":
            events.append(
                event("stream.client_disconnected", start + timedelta(seconds=9), **fields)
            )
    usage: dict[str, Any] = {
        "input_tokens": rng.randrange(0, 10_000),
        "output_tokens": delivered + rng.randrange(0, 500),
        "source": "upstream",
    }
    for name in ("cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens"):
        if rng.random() < 0.5:
            usage[name] = rng.randrange(0, 3000)
    if rng.random() < 0.5:
        usage["stop_reason"] = rng.choice(["stop", "length", "end_turn"])
    if rng.random() < 0.3:
        usage["model"] = model
    if shape == "short":  # the provider counted fewer than were delivered: an anomaly
        usage["output_tokens"] = max(0, delivered - 1 - rng.randrange(10))
        if delivered == 0:
            events.append(
                event(
                    "stream.tokens",
                    start + timedelta(seconds=7),
                    output_tokens_generated=5,
                    output_tokens_delivered=5,
                )
            )
    if shape == "estimate":
        usage["source"] = "estimate"
    if shape == "null_field":  # a field written as JSON null: valid, and the rule's to read
        usage[rng.choice(["stop_reason", "model"])] = None
    usage_at = start + timedelta(seconds=10, microseconds=rng.randrange(10**6))
    if shape != "no_usage":
        events.append(event("stream.usage", usage_at, **usage))
    if shape == "two_usages":
        later = dict(usage, output_tokens=usage["output_tokens"] + 1)
        events.append(event("stream.usage", usage_at + timedelta(seconds=1), **later))
    if shape == "two_attempts":
        events.append(
            event("stream.started", start + timedelta(seconds=20), a=attempt + 1, **started)
        )
        events.append(event("stream.usage", start + timedelta(seconds=30), a=attempt + 1, **usage))
    if shape == "failed":
        events.append(event("stream.failed", start + timedelta(seconds=11), error_type="api_error"))
    if shape == "two_started":
        events.append(event("stream.started", start + timedelta(seconds=2), **started))
    if shape == "no_started":
        events = events[1:]
    rng.shuffle(events)
    return events


SHAPES = [
    *["plain"] * 10,
    *["disconnect"] * 4,
    *["open_first"] * 4,
    "short",
    *["estimate"] * 3,
    "null_field",
    "no_usage",
    "two_usages",
    "two_attempts",
    "failed",
    "two_started",
    "two_disconnects",
    "no_started",
    "unpriced",
    "dear",
]


def _priced(model: str, start: str) -> bool:
    return model in ("m-a", "m-b") or (model == "m-late" and start >= _stamp(PRICES[model][0][0]))


def _complete(events: list[dict[str, Any]]) -> bool:
    """The rule settles the call now: stream.started and upstream usage in every attempt."""
    attempts = {e["attempt"] for e in events}
    upstream = {
        e["attempt"] for e in events if e["type"] == "stream.usage" and e["source"] == "upstream"
    }
    return any(e["type"] == "stream.started" for e in events) and attempts <= upstream


#: (``_World``) m-a's long-context prices: above this input (input, cache read and creation).
LONG_CONTEXT_ABOVE = 9000
#: (``_World``) The key with an assignment (a customer): its calls are the rule's.
ASSIGNED_KEY = "key-3"


def _common(
    events: list[dict[str, Any]], due: bool, long_context: bool = False, assigned: bool = False
) -> bool:
    """The common shape, stated apart from the SQL that finds it (module docstring of
    billing.reconcile.fastpath), for a call not settled yet; ``due``: its last event arrived
    settle_after ago (an estimate's call settles then). With ``long_context``, m-a has
    long-context prices above ``LONG_CONTEXT_ABOVE``; with ``assigned``, ``ASSIGNED_KEY`` has a
    customer."""
    kinds = [e["type"] for e in events]
    if len({e["attempt"] for e in events}) != 1 or kinds.count("stream.started") != 1:
        return False
    if kinds.count("stream.usage") != 1 or kinds.count("stream.client_disconnected") > 1:
        return False
    if "stream.failed" in kinds:
        return False
    (started,) = (e for e in events if e["type"] == "stream.started")
    (usage,) = (e for e in events if e["type"] == "stream.usage")
    if None in usage.values() or not _priced(started["model"], started["occurred_at"]):
        return False
    if assigned and started["api_key_id"] == ASSIGNED_KEY:
        return False
    whole_input = sum(
        usage.get(name, 0)
        for name in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    if long_context and started["model"] == "m-a" and whole_input > LONG_CONTEXT_ABOVE:
        return False
    if usage["source"] == "estimate":
        return due
    delivered = max(
        [0] + [e["output_tokens_delivered"] for e in events if "output_tokens_delivered" in e]
    )
    return delivered <= usage["output_tokens"]


def _world(
    seed: int, calls: int, long_context: bool = False, assigned: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(events before the first pass, events after it, the calls the SQL path must take: in
    the first pass if they have the common shape then (no call is due then), else in the second
    (every call is due) if they were not settled in the first and have it with every event);
    ``long_context`` and ``assigned`` as ``_common``'s."""
    rng = random.Random(seed)
    first: list[dict[str, Any]] = []
    later: list[dict[str, Any]] = []
    common: list[str] = []
    for i in range(calls):
        shape = rng.choice(SHAPES)
        request_id = f"c{seed}-{i:04d}-{shape}"
        events = _call(rng, request_id, shape)
        if shape == "open_first":
            # Reconciled while open (no usage yet): its attempt row exists when it settles.
            before = [e for e in events if e["type"] != "stream.usage"]
        elif rng.random() < 0.15:
            # One event arrives after the first pass: the call settles then, or is adjusted.
            before = events[:-1]
        else:
            before = events
        first += before
        later += (
            events[len(before) :]
            if shape != "open_first"
            else [e for e in events if e["type"] == "stream.usage"]
        )
        settled_first = bool(before) and _complete(before)
        world = {"long_context": long_context, "assigned": assigned}
        if (before and _common(before, False, **world)) or (
            not settled_first and _common(events, True, **world)
        ):
            common.append(request_id)
    return first, later, common


@pytest.fixture
def two_databases(db_url: str, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    with scratch_database(db_url, tmp_path, "rule_only") as other:
        engines = (
            make_engine(Settings(database_url=db_url)),
            make_engine(Settings(database_url=other)),
        )
        yield engines
        for engine in engines:
            engine.dispose()


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls the SQL path settles, as the real ``settle_common`` returns them."""
    settled_by_sql: list[str] = []
    real = service.settle_common

    def spy(*args: Any) -> list[str]:
        settled = real(*args)
        settled_by_sql.extend(settled)
        return settled

    monkeypatch.setattr(service, "settle_common", spy)
    return settled_by_sql


def _ingest(engine: Engine, events: list[dict[str, Any]], now: datetime) -> None:
    sessions = make_sessionmaker(engine)
    for start in range(0, len(events), 500):
        body = orjson.dumps({"events": events[start : start + 500]})
        with write_transaction(sessions) as session:
            store_batch(session, parse_batch(body, now), now)


#: The v1 rates' fields, in the order of ``PRICES``' rates.
_V1_FIELDS = (
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "cache_read_usd_per_mtok",
    "cache_creation_usd_per_mtok",
)


def _every_rate(given: Sequence[str], seed: int) -> dict[str, str]:
    """A price of every rate of ``billing.rates.RATES``: the v1 ones from ``given`` (``PRICES``'
    order), every later one a value of its own (none equal to another, so that a term left out
    of a cost, or billed at another rate, changes it)."""
    v1 = dict(zip(_V1_FIELDS, given, strict=True))
    return {r.field: v1.get(r.field, f"{seed + i}.{i + 7}") for i, r in enumerate(RATES)}


def _price(
    engine: Engine,
    long_context: bool = False,
    assigned: bool = False,
    unit_prices: dict[str, str] | None = None,
) -> None:
    """``PRICES``, with every rate of ``billing.rates`` (``_every_rate``) and ``unit_prices``;
    with ``long_context``, m-a's with long-context prices (doubled) above
    ``LONG_CONTEXT_ABOVE``; with ``assigned``, ``ASSIGNED_KEY`` assigned to a customer."""
    sessions = make_sessionmaker(engine)
    with write_transaction(sessions) as session:
        for model, rows in PRICES.items():
            for effective_from, *rates in rows:
                extra: dict[str, Any] = {}
                if long_context and model == "m-a":
                    extra["long_context"] = {
                        "above_input_tokens": LONG_CONTEXT_ABOVE,
                        **_every_rate(["6", "30", "0.6", "7.5"], 11),
                    }
                price = PriceIn(
                    model=model,
                    effective_from=_stamp(effective_from),
                    unit_prices=unit_prices,
                    **_every_rate(rates, 3),
                    **extra,
                )
                record_price(session, price, T0)
        if assigned:
            key = KeyIn(customer_id="cust-3", effective_from=_stamp(T0 - timedelta(days=1)))
            set_key(session, ASSIGNED_KEY, key, T0)


def _reconcile(engine: Engine, now: datetime, common_in_sql: bool, limit: int) -> None:
    sessions = make_sessionmaker(engine)
    while True:
        with write_transaction(sessions) as session:
            step = reconcile_step(session, now, 60.0, limit, common_in_sql=common_in_sql)
        if step.examined < limit:
            return


def _price_and_ingest(
    engines: tuple[Engine, Engine], events: list[dict[str, Any]], now: datetime, **world: bool
) -> None:
    for engine in engines:
        _price(engine, **world)
        _ingest(engine, events, now)


def _reconcile_both(engines: tuple[Engine, Engine], now: datetime, limit: int) -> None:
    """The first database with the SQL path, the second with the rule only."""
    with_sql, rule_only = engines
    _reconcile(with_sql, now, True, limit)
    _reconcile(rule_only, now, False, limit)


def _rows(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    queries = {
        "calls": "SELECT * FROM calls ORDER BY request_id",
        "call_attempts": "SELECT * FROM call_attempts ORDER BY request_id, attempt",
        "ledger_entries": (
            "SELECT request_id, seq, kind, reason, booked_at, api_key_id, model, protocol, "
            "status, call_started_at, input_tokens, cache_read_input_tokens, "
            "cache_creation_input_tokens, output_tokens_billed, output_tokens_delivered, "
            "output_tokens_undelivered, reasoning_tokens, price_id, input_uusd_per_mtok, "
            "output_uusd_per_mtok, cache_read_uusd_per_mtok, cache_creation_uusd_per_mtok, "
            "cost_pusd FROM ledger_entries ORDER BY request_id, seq"
        ),
        "usage_rollups": "SELECT * FROM usage_rollups ORDER BY 1, 2, 3, 4, 5",
        "usage_rollups_all_keys": "SELECT * FROM usage_rollups_all_keys ORDER BY 1, 2, 3, 4",
        "usage_rollup_keyless": "SELECT * FROM usage_rollup_keyless ORDER BY request_id",
    }
    with engine.connect() as conn:
        return {
            name: [tuple(row) for row in conn.execute(text(sql))] for name, sql in queries.items()
        }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "world"),
    [
        (1, {}),
        (2, {}),
        (3, {}),
        # the statements' probes (settle_common_sql.PROBES_NEEDED): run only when their rows exist
        (4, {"long_context": True}),
        (5, {"assigned": True}),
        (6, {"long_context": True, "assigned": True}),
    ],
    ids=["1", "2", "3", "long-context", "assigned", "long-context-assigned"],
)
def test_the_database_settles_common_calls_as_the_rule_does(
    two_databases: tuple[Engine, Engine], taken: list[str], seed: int, world: dict[str, bool]
) -> None:
    with_sql, rule_only = two_databases
    first, later, common = _world(seed, 300, **world)
    now = T0 + timedelta(hours=2)
    _price_and_ingest(two_databases, first, now, **world)
    # Steps of 37 calls: calls of both paths share steps (and their rollup rows).
    _reconcile_both(two_databases, now, 37)
    later_now = now + timedelta(minutes=5)
    for engine in two_databases:
        _ingest(engine, later, later_now)
    # Past settle_after: every call settles, those without upstream usage on the clock.
    _reconcile_both(two_databases, later_now + timedelta(minutes=10), 37)

    assert sorted(taken) == sorted(common)
    assert len(common) > (80 if world else 150)  # the SQL path did most of the work
    assert _rows(with_sql) == _rows(rule_only)
    for engine in (with_sql, rule_only):
        check_invariants(engine)
        with make_sessionmaker(engine)() as session:
            incremental = rollups.dump(session)
            rollups.rebuild(session)
            assert rollups.dump(session) == incremental
            session.rollback()


#: Stored bodies no longer as ingest wrote them (as after a botched manual repair), by event:
#: the rule refuses each but a negative delivered count at a disconnect (the largest count wins)
#: (a refused call stays pending, logged); the SQL path must leave them all to it.
CORRUPT = {
    "usage": [
        ("input_tokens", 5.0),
        ("cache_read_input_tokens", "7"),
        ("output_tokens", -3),
        ("stop_reason", 5),
        # its cost does not fit the 64-bit column: no cost (unpriced), the call settles
        ("input_tokens", 10**15),
    ],
    "stream.client_disconnected": [
        ("output_tokens_delivered", None),
        ("output_tokens_delivered", -1),
    ],
}


def test_bodies_the_rule_refuses_are_left_to_it(
    two_databases: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    from billing.reconcile.runner import run_pass

    with_sql, rule_only = two_databases
    rng = random.Random(7)
    events: list[dict[str, Any]] = []
    spoilt: dict[str, str] = {}  # event_id -> new body
    for i in range(40):
        shape = "disconnect" if i % 4 == 0 else "plain"
        call = _call(rng, f"x-{i:02d}", shape)
        events += call
        if i % 4 == 0:
            spoils = CORRUPT["stream.client_disconnected"]
            kind, (field, value) = "stream.client_disconnected", spoils[i // 4 % len(spoils)]
        elif i % 4 == 1 and i // 4 < len(CORRUPT["usage"]):
            kind, (field, value) = "stream.usage", CORRUPT["usage"][i // 4]
        elif i == 2:
            (usage,) = (e for e in call if e["type"] == "stream.usage")
            spoilt[usage["event_id"]] = "{not json"
            continue
        else:
            continue
        (event,) = (e for e in call if e["type"] == kind)
        spoilt[event["event_id"]] = orjson.dumps({**event, field: value}).decode()
    now = T0 + timedelta(hours=2)
    _price_and_ingest(two_databases, events, now)
    for engine in two_databases:
        with engine.begin() as conn:
            for event_id, body in spoilt.items():
                conn.execute(
                    text("UPDATE events SET body = :body WHERE event_id = :id"),
                    {"body": body, "id": event_id},
                )
    # One step for all: it fails on the refused calls, is redone call by call, and the pass ends
    # (run_pass takes its database from the sessions).
    settings = Settings(reconcile_batch_size=100)
    results = []
    for engine, sql_path in ((with_sql, True), (rule_only, False)):
        if not sql_path:
            monkeypatch.setattr(service, "settle_common", lambda *args: [])
        results.append(run_pass(make_sessionmaker(engine), settings, None, now))
    refused = {
        event_id.rsplit("-", 1)[0]
        for event_id, body in spoilt.items()
        if '":-1' not in body and f'":{10**15}' not in body
    }
    assert len(spoilt) == 1 + len(CORRUPT["usage"]) + 10
    assert len(refused) == 1 + len(CORRUPT["usage"]) - 1 + 5
    assert results[0].settled == results[1].settled == 40 - len(refused)
    assert _rows(with_sql) == _rows(rule_only)
    with with_sql.connect() as conn:
        pending = set(conn.execute(text("SELECT request_id FROM calls WHERE pending")).scalars())
    assert pending == refused


def test_costs_summing_past_64_bits_in_one_bucket_settle_alike(
    two_databases: tuple[Engine, Engine],
) -> None:
    """419 calls of 10**9 tokens of each kind at 3 / 15 / 0.30 / 3.75 USD per Mtok cost
    $22,050 each: $9,238,950 in one rollup bucket, past 2**63 picodollars (SQLite's sum() of the
    costs overflowed and stopped every pass)."""
    with_sql, rule_only = two_databases
    events: list[dict[str, Any]] = []
    for i in range(419):
        base = {"request_id": f"big-{i:03d}", "attempt": 1}
        events.append(
            {
                **base,
                "event_id": f"big-{i:03d}-s",
                "type": "stream.started",
                "occurred_at": "2026-10-15T08:00:00Z",
                "api_key_id": "key-big",
                "model": "m-a",
                "protocol": "anthropic.messages",
            }
        )
        events.append(
            {
                **base,
                "event_id": f"big-{i:03d}-u",
                "type": "stream.usage",
                "occurred_at": "2026-10-15T08:00:01Z",
                "input_tokens": 10**9,
                "output_tokens": 10**9,
                "cache_read_input_tokens": 10**9,
                "cache_creation_input_tokens": 10**9,
                "source": "upstream",
            }
        )
    now = T0 + timedelta(hours=2)
    _price_and_ingest(two_databases, events, now)
    _reconcile_both(two_databases, now, 4000)
    rows = _rows(with_sql)
    assert rows == _rows(rule_only)
    assert len(rows["ledger_entries"]) == 419
    with with_sql.connect() as conn:
        whole, frac = conn.execute(
            text(
                "SELECT cost_whole_usd, cost_frac_pusd FROM usage_rollups WHERE basis = "
                "'booked' AND level = (SELECT max(level) FROM usage_rollups)"
            )
        ).one()
    assert (whole, frac) == (9_238_950, 0)


def test_an_old_sqlite_leaves_every_call_to_the_rule(
    two_databases: tuple[Engine, Engine],
    taken: list[str],
    monkeypatch: pytest.MonkeyPatch,
    is_postgres: bool,
) -> None:
    """Below SQLite 3.33 (no ``UPDATE … FROM``) the SQL path takes nothing and the rule settles
    every call as it would anyway."""
    if is_postgres:
        pytest.skip("SQLite's library version only")
    import billing.reconcile.sql.sqlite_fastpath as sqlite_settle_common

    monkeypatch.setattr(sqlite_settle_common, "SQLITE_SUPPORTED", False)
    with_sql, rule_only = two_databases
    first, later, _common_calls = _world(4, 60)
    now = T0 + timedelta(hours=2)
    _price_and_ingest(two_databases, first + later, now)
    _reconcile_both(two_databases, now + timedelta(minutes=10), 4000)
    with with_sql.connect() as conn:
        settled = conn.execute(text("SELECT count(*) FROM calls WHERE settled")).scalar()
    assert taken == []
    assert settled == 60
    assert _rows(with_sql) == _rows(rule_only)


#: The rates whose buckets a call of the common shape can count: the fast path's cost has a
#: term for each (the other buckets are 0 in every such call, ``fastpath.BUCKET_SQL``).
_COST_TERMS = [r for r in RATES if fastpath.BUCKET_SQL[r.bucket.name] != "0"]


@pytest.mark.slow
@pytest.mark.parametrize("dropped", _COST_TERMS, ids=[r.field for r in _COST_TERMS])
def test_the_equivalence_sees_every_cost_term_of_the_fast_path(
    two_databases: tuple[Engine, Engine],
    taken: list[str],
    dropped: Rate,
    monkeypatch: pytest.MonkeyPatch,
    is_postgres: bool,
) -> None:
    """The proof above sees every term of the fast path's cost (``fastpath.cost_sql``, derived
    from the rates): with the statements built without one rate's term, the SQL path's rows
    differ from the rule's."""
    module: Any = postgres_fastpath if is_postgres else sqlite_fastpath
    name, names = ("SETTLE", ("u", "GREATEST")) if is_postgres else ("GATHER", ("g", "max"))
    full = fastpath.cost_sql().format(u=names[0], greatest=names[1])
    less = fastpath.cost_sql([r for r in RATES if r is not dropped])
    less = less.format(u=names[0], greatest=names[1])
    statements: dict[Any, str] = getattr(module, name)
    assert all(full in sql for sql in statements.values())
    monkeypatch.setattr(module, name, {k: sql.replace(full, less) for k, sql in statements.items()})
    with_sql, rule_only = two_databases
    first, later, _common = _world(1, 120)
    now = T0 + timedelta(hours=2)
    _price_and_ingest(two_databases, first + later, now)
    _reconcile_both(two_databases, now + timedelta(minutes=10), 60)
    assert len(taken) > 40
    assert _rows(with_sql) != _rows(rule_only)
