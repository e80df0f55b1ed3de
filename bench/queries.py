"""Benchmark of the operators' queries: the call log and /v1/usage on a seeded database.

Seeds ``--calls`` settled calls (default 1,000,000) across ``--keys`` api keys (default 1,000;
Zipf-like traffic, so the busiest key has about 13% of the calls) and ``--models`` models (10)
over 90 days, each with its settlement ledger entry, 2% with a later adjustment, and the last
hour's calls still open; bulk-loaded (SQLite ``executemany``, PostgreSQL ``COPY``), then the
rollups are rebuilt with set-based SQL (``billing.rollups.service.rebuild``), exactly as the
reconciler would have kept them. Then it times, calling the domain functions in-process (one
read transaction per query, JSON included; each query's inputs are run once untimed first, so
that the pages they need are in memory):

- a first page (100) of one key's calls;       - page 50 of one key's calls;
- one key's 30-day usage by day;                - all keys' usage by model for a month;

for the busiest key and for random keys, plus a Kolkata variant of the usage queries, and once
more through HTTP with a real server (uvicorn in this process, httpx). Targets at 1M calls: the
per-key queries p95 under 20 ms, all keys by model for a month p95 under 100 ms. With
``--plans`` every key is first assigned a customer (one of 100) and a plan (100 % markup), the
charges set as the reconciler books them, and the per-customer usage queries are timed too
(targets: a customer's 30 days as a key's, all keys by customer as all keys by model).

    python bench/queries.py                     # SQLite file $TMPDIR/billing-bench-queries.db
    BILLING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/bench python bench/queries.py
    python bench/queries.py --calls 100000 --reuse         # keep an already seeded database
    python bench/queries.py --plans                        # every key with a customer and plan
"""

from __future__ import annotations

import argparse
import io
import os
import random
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import uvicorn
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from billing.calllog.cursor import Position, decode, encode
from billing.calllog.queries import CallsQuery, list_calls
from billing.calllog.usage import UsageQuery, usage_rows
from billing.rates import PLAN_RATE_COLUMNS
from billing.rollups import service as rollups
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker, read_transaction
from billing.storage.migrate import upgrade_to_head
from billing.storage.models import Call, LedgerEntry

END = datetime(2026, 11, 28, tzinfo=UTC)
DAYS = 90
MONTH = (datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC))
KOLKATA = ZoneInfo("Asia/Kolkata")
CHUNK = 50_000
PROTOCOLS = ("openai.chat_completions", "openai.responses", "anthropic.messages")

_CALL_COLUMNS = (
    "request_id",
    "api_key_id",
    "model",
    "protocol",
    "started_at",
    "ended_at",
    "first_received_at",
    "last_received_at",
    "change_seq",
    "pending",
    "status",
    "settled",
    "settled_at",
    "usage_source",
    "attempts",
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens_billed",
    "output_tokens_delivered",
    "output_tokens_undelivered",
    "reasoning_tokens",
    "cost_pusd",
    "error_type",
    "stop_reason",
    "anomalies",
    "call_no",
)
#: The v2 columns of a ledger entry (usage dimensions), which the seeded calls leave at their
#: defaults (0 one-hour cache writes, no units).
_V2_ENTRY_COLUMNS = frozenset(
    (
        "cache_creation_1h_input_tokens",
        "cache_creation_1h_uusd_per_mtok",
        "units",
        "unit_prices",
        # Keys, customers and plans: set after loading (``_charge``).
        "customer_id",
        "plan_id",
        "plan_price_id",
        *PLAN_RATE_COLUMNS,
        "plan_unit_prices",
        "markup_pct",
        "charge_pusd",
        # (v3) Provider-reported cost (none here) and the failure charge policy (none: ``bill``);
        # the leakage is set to 0 (none) after loading (``_charge``).
        "provider_cost_pusd",
        "failure_charge",
        "leakage_pusd",
    )
)
#: The ledger columns ``_rows`` fills, in its order: those of the ORM model (the public
#: definition of the table) less ``entry_id``, which the database numbers, and the v2 ones.
_ENTRY_COLUMNS = tuple(
    column.name
    for column in LedgerEntry.__table__.columns
    if column.name != "entry_id" and column.name not in _V2_ENTRY_COLUMNS
)


# --- seeding ----------------------------------------------------------------------------------


def _prices(models: int) -> list[tuple[int, int, int, int]]:
    """(input, output, cache read, cache write) micro-USD per Mtok, per model."""
    rng = random.Random(1)
    return [
        (p, 5 * p, p // 10, p + p // 4)
        for p in (rng.randrange(100_000, 15_000_000) for _ in range(models))
    ]


def _rows(
    n: int, keys: int, models: int, seed: int
) -> Iterator[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Chunks of (call rows, ledger entry rows) as Python values in ``_*_COLUMNS`` order."""
    rng = random.Random(seed)
    weights = [1 / rank for rank in range(1, keys + 1)]
    cum = [0.0]
    for w in weights:
        cum.append(cum[-1] + w)
    cum = cum[1:]
    key_names = [f"key_{rank:04d}" for rank in range(1, keys + 1)]
    prices = _prices(models)
    start = END - timedelta(days=DAYS)
    span_us = DAYS * 86_400 * 1_000_000
    open_after = END - timedelta(hours=1)
    for first in range(0, n, CHUNK):
        size = min(CHUNK, n - first)
        chosen = rng.choices(key_names, cum_weights=cum, k=size)
        calls, entries = [], []
        for key in chosen:
            m = rng.randrange(models)
            model = f"model-{m:02d}"
            started = start + timedelta(microseconds=rng.randrange(span_us))
            ended = started + timedelta(milliseconds=rng.randrange(500, 60_000))
            inp, cr, cc = rng.randrange(10, 8000), rng.randrange(0, 4000), rng.randrange(0, 500)
            out = rng.randrange(1, 2000)
            roll = rng.random()
            status = (
                "failed" if roll < 0.03 else "client_disconnected" if roll < 0.08 else "completed"
            )
            delivered = out if status == "completed" else rng.randrange(0, out + 1)
            reasoning = out // 3 if m % 3 == 0 else 0
            tokens = [inp, cr, cc, out, delivered, out - delivered, reasoning]
            p_in, p_out, p_cr, p_cc = prices[m]
            cost = inp * p_in + cr * p_cr + cc * p_cc + out * p_out
            rid = f"req_{rng.getrandbits(64):016x}"
            protocol = PROTOCOLS[m % 3]
            received = ended + timedelta(seconds=1)
            settled = started < open_after
            error = "api_error" if status == "failed" else None
            if not settled:
                calls.append(
                    (
                        rid,
                        key,
                        model,
                        protocol,
                        started,
                        ended,
                        received,
                        received,
                        1,
                        False,
                        "open",
                        False,
                        None,
                        "upstream",
                        1,
                        *tokens,
                        cost,
                        error,
                        None,
                        "[]",
                    )
                )
                continue
            booked = received + timedelta(seconds=2)
            entries.append(
                (
                    rid,
                    1,
                    "settlement",
                    "settled: upstream usage for every attempt",
                    booked,
                    key,
                    model,
                    protocol,
                    status,
                    started,
                    *tokens,
                    m + 1,
                    p_in,
                    p_out,
                    p_cr,
                    p_cc,
                    cost,
                )
            )
            if rng.random() < 0.02:  # a late usage: more output, booked hours or days later
                extra = rng.randrange(1, 500)
                later = booked + timedelta(seconds=rng.randrange(60, 3 * 86_400))
                entries.append(
                    (
                        rid,
                        2,
                        "adjustment",
                        f"late events changed the usage: output_tokens_billed +{extra}",
                        later,
                        key,
                        model,
                        protocol,
                        status,
                        started,
                        0,
                        0,
                        0,
                        extra,
                        0,
                        extra,
                        0,
                        m + 1,
                        p_in,
                        p_out,
                        p_cr,
                        p_cc,
                        extra * p_out,
                    )
                )
                tokens[3] += extra
                tokens[5] += extra
                cost += extra * p_out
            calls.append(
                (
                    rid,
                    key,
                    model,
                    protocol,
                    started,
                    ended,
                    received,
                    received,
                    1,
                    False,
                    status,
                    True,
                    booked,
                    "upstream",
                    1,
                    *tokens,
                    cost,
                    error,
                    None,
                    "[]",
                )
            )
        yield calls, entries


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, bool):
        return int(value)
    return value


def _copy_value(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


#: The plan every key is assigned with ``--plans``: 100 % over cost (an exact doubling).
BENCH_PLAN = "bench-plan"
#: With ``--plans``, keys share customers: key rank r belongs to customer ``r % CUSTOMERS``.
CUSTOMERS = 100


def customer_of(key: str) -> str:
    """The customer ``--plans`` assigns ``key`` (``key_0042`` → ``cust_042``)."""
    return f"cust_{int(key.removeprefix('key_')) % CUSTOMERS:03d}"


def _charge(conn: Any, keys: int, plans: bool) -> None:
    """The calls' and entries' charge: their cost; with ``plans``, every key assigned a customer
    and ``BENCH_PLAN`` (100 %) from before the first call, and the charge doubled, as the
    reconciler books it (the rollups are rebuilt from these afterwards). No call leaked output
    uncharged (``leakage_pusd`` 0: the cost is known)."""
    conn.execute(text("UPDATE ledger_entries SET leakage_pusd = 0"))
    conn.execute(text("UPDATE calls SET leakage_pusd = 0 WHERE settled"))
    if not plans:
        conn.execute(text("UPDATE calls SET charge_pusd = cost_pusd"))
        conn.execute(text("UPDATE ledger_entries SET charge_pusd = cost_pusd"))
        return
    since = datetime(2025, 1, 1, tzinfo=UTC)
    at = _sqlite_value(since) if conn.dialect.name == "sqlite" else since
    conn.execute(
        text(
            "INSERT INTO plan_versions (plan_id, effective_from, markup_pct, created_at) "
            "VALUES (:plan, :at, '100', :at)"
        ),
        {"plan": BENCH_PLAN, "at": at},
    )
    names = [f"key_{rank:04d}" for rank in range(1, keys + 1)]
    conn.execute(
        text(
            "INSERT INTO key_assignments (api_key_id, effective_from, customer_id, plan_id, "
            "created_at) VALUES (:key, :at, :customer, :plan, :at)"
        ),
        [{"key": k, "at": at, "customer": customer_of(k), "plan": BENCH_PLAN} for k in names],
    )
    customer = "(SELECT k.customer_id FROM key_assignments k WHERE k.api_key_id = {t}.api_key_id)"
    conn.execute(
        text(
            f"UPDATE calls SET customer_id = {customer.format(t='calls')}, plan_id = :plan, "
            "charge_pusd = cost_pusd * 2 WHERE api_key_id IS NOT NULL"
        ),
        {"plan": BENCH_PLAN},
    )
    conn.execute(
        text(
            f"UPDATE ledger_entries SET customer_id = {customer.format(t='ledger_entries')}, "
            "plan_id = :plan, markup_pct = '100', charge_pusd = cost_pusd * 2 "
            "WHERE api_key_id IS NOT NULL"
        ),
        {"plan": BENCH_PLAN},
    )


def seed(engine: Engine, n: int, keys: int, models: int, plans: bool = False) -> None:
    """Empty the tables and load ``n`` calls with their ledger entries (with ``plans``, every
    key assigned a customer and a plan: ``_charge``), then rebuild rollups."""
    dialect = engine.dialect.name
    tables = [
        "key_assignments",
        "plan_prices",
        "plan_versions",
        "usage_rollups",
        "usage_rollups_all_keys",
        "usage_rollup_keyless",
        "call_attempts",
        "ledger_entries",
        "events",
        "calls",
        "prices",
    ]
    prices = _prices(models)
    with engine.begin() as conn:
        for table in tables:
            conn.execute(text(f"DELETE FROM {table}"))
        for m, (p_in, p_out, p_cr, p_cc) in enumerate(prices):
            conn.execute(
                text(
                    "INSERT INTO prices (id, model, effective_from, input_uusd_per_mtok, "
                    "output_uusd_per_mtok, cache_read_uusd_per_mtok, cache_creation_uusd_per_mtok, "
                    "cache_creation_1h_uusd_per_mtok, created_at) "
                    "VALUES (:id, :model, :at, :i, :o, :r, :c, :c, :at)"
                ),
                {
                    "id": m + 1,
                    "model": f"model-{m:02d}",
                    "i": p_in,
                    "o": p_out,
                    "r": p_cr,
                    "c": p_cc,
                    "at": _sqlite_value(datetime(2025, 1, 1, tzinfo=UTC))
                    if dialect == "sqlite"
                    else datetime(2025, 1, 1, tzinfo=UTC),
                },
            )
        raw: Any = conn.connection.driver_connection
        loaded = 0
        for calls, entries in _rows(n, keys, models, seed=42):
            calls = [(*row, loaded + i) for i, row in enumerate(calls, 1)]  # call_no
            if dialect == "sqlite":
                for table, columns, rows in (
                    ("calls", _CALL_COLUMNS, calls),
                    ("ledger_entries", _ENTRY_COLUMNS, entries),
                ):
                    marks = ", ".join("?" for _ in columns)
                    raw.executemany(
                        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                        [tuple(_sqlite_value(v) for v in row) for row in rows],
                    )
            else:
                with raw.cursor() as cursor:
                    for table, columns, rows in (
                        ("calls", _CALL_COLUMNS, calls),
                        ("ledger_entries", _ENTRY_COLUMNS, entries),
                    ):
                        buffer = io.StringIO()
                        for row in rows:
                            buffer.write("\t".join(_copy_value(v) for v in row) + "\n")
                        with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                            copy.write(buffer.getvalue())
            loaded += len(calls)
            print(f"  loaded {loaded:,} calls", end="\r", flush=True)
        _charge(conn, keys, plans)
    print()
    started = time.perf_counter()
    with Session(engine) as session:
        rollups.rebuild(session)
        session.commit()
    print(f"  rollups rebuilt in {time.perf_counter() - started:.1f} s")
    if dialect == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))


# --- timing -----------------------------------------------------------------------------------


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    """p50, p95, p99 in milliseconds."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[94] * 1000, cuts[98] * 1000


def timed(label: str, run: Callable[[int], Any], iterations: int, target_ms: float) -> None:
    """Time ``run(0..iterations-1)`` after one untimed pass over the same inputs (the pages they
    read are then in memory, as a server's working set is)."""
    for i in range(iterations):
        run(i)
    samples = []
    for i in range(iterations):
        begin = time.perf_counter()
        run(i)
        samples.append(time.perf_counter() - begin)
    p50, p95, p99 = percentiles(samples)
    verdict = "ok" if p95 < target_ms else f"OVER {target_ms:g} ms"
    print(f"  {label:<58} p50 {p50:7.2f}  p95 {p95:7.2f}  p99 {p99:7.2f} ms   {verdict}")


def _page_50_position(sessions: sessionmaker[Session], key: str) -> Position:
    """Where page 49 of ``key``'s calls ends (walked page by page, as a client would)."""
    after = None
    with read_transaction(sessions) as session:
        for _ in range(49):
            page = list_calls(session, CallsQuery(api_key_id=key, after=after))
            assert page.next_cursor is not None, f"{key} has fewer than 50 pages"
            after = decode(page.next_cursor)
    assert after is not None
    return after


class _Server:
    """The app on uvicorn in a thread of this process (``background``: with the reconciler and
    the webhook worker, as ``billing serve`` runs them)."""

    def __init__(self, settings: Settings, background: bool = False) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            create_app(settings, background=background),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def run(url: str, iterations: int, http_iterations: int) -> None:
    settings = Settings(database_url=url)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        counts: list[tuple[str, int]] = [
            (key, count)
            for key, count in session.execute(
                select(Call.api_key_id, func.count())
                .group_by(Call.api_key_id)
                .order_by(func.count().desc())
            )
            if key is not None
        ]
        total = sum(c for _, c in counts)
        entries = session.scalar(select(func.count()).select_from(LedgerEntry))
        rollup_rows = session.scalar(text("SELECT count(*) FROM usage_rollups"))
        all_key_rows = session.scalar(text("SELECT count(*) FROM usage_rollups_all_keys"))
        with_plans = bool(session.scalar(text("SELECT count(*) FROM key_assignments")))
    busiest, busiest_calls = counts[0]
    keys = [k for k, _ in counts]
    rng = random.Random(7)
    print(
        f"{engine.dialect.name}: {total:,} calls, {entries:,} ledger entries, "
        f"{rollup_rows:,} + {all_key_rows:,} rollup rows; busiest key {busiest} "
        f"({busiest_calls:,} calls), median key {counts[len(counts) // 2][1]:,} calls"
        + (f"; every key with a plan, {CUSTOMERS} customers" if with_plans else "")
    )
    randoms = [rng.choice(keys) for _ in range(iterations)]
    last_30 = (END - timedelta(days=30), END)

    def first_page(key_of: Callable[[int], str]) -> Callable[[int], Any]:
        def go(i: int) -> Any:
            with read_transaction(sessions) as session:
                return list_calls(session, CallsQuery(api_key_id=key_of(i))).as_json()

        return go

    def usage(make: Callable[[int], UsageQuery]) -> Callable[[int], Any]:
        def go(i: int) -> Any:
            with read_transaction(sessions) as session:
                return [row.as_json() for row in usage_rows(session, make(i))]

        return go

    cursor_50 = _page_50_position(sessions, busiest)

    def page_50(_i: int) -> Any:
        with read_transaction(sessions) as session:
            return list_calls(session, CallsQuery(api_key_id=busiest, after=cursor_50)).as_json()

    print(f"in-process (domain function + JSON), {iterations} runs each after a warm-up pass:")
    timed("calls: first page, busiest key", first_page(lambda i: busiest), iterations, 20)
    timed("calls: first page, random keys", first_page(lambda i: randoms[i]), iterations, 20)
    timed("calls: page 50 (limit 100), busiest key", page_50, iterations, 20)
    timed(
        "usage: busiest key, 30 days by day (UTC)",
        usage(lambda i: UsageQuery(*last_30, api_key_id=busiest, group_by=("day",))),
        iterations,
        20,
    )
    timed(
        "usage: random keys, 30 days by day (UTC)",
        usage(lambda i: UsageQuery(*last_30, api_key_id=randoms[i], group_by=("day",))),
        iterations,
        20,
    )
    timed(
        "usage: busiest key, 30 days by day (Asia/Kolkata)",
        usage(
            lambda i: UsageQuery(
                last_30[0] - timedelta(hours=5, minutes=30),
                last_30[1] - timedelta(hours=5, minutes=30),
                api_key_id=busiest,
                group_by=("day",),
                tz=KOLKATA,
            )
        ),
        iterations,
        20,
    )
    timed(
        "usage: all keys by model, October (UTC)",
        usage(lambda i: UsageQuery(*MONTH, group_by=("model",))),
        iterations,
        100,
    )
    timed(
        "usage: all keys by model, October (Asia/Kolkata)",
        usage(
            lambda i: UsageQuery(
                MONTH[0] - timedelta(hours=5, minutes=30),
                MONTH[1] - timedelta(hours=5, minutes=30),
                group_by=("model",),
                tz=KOLKATA,
            )
        ),
        iterations,
        100,
    )
    timed(
        "usage: all keys by model and day, October, booked",
        usage(lambda i: UsageQuery(*MONTH, group_by=("model", "day"), basis="booked")),
        iterations,
        100,
    )
    if with_plans:
        customer = customer_of(busiest)
        timed(
            f"usage: busiest key's customer ({customer}), 30 days by day (UTC)",
            usage(lambda i: UsageQuery(*last_30, group_by=("day",), customer_id=customer)),
            iterations,
            20,
        )
        timed(
            "usage: random customers, 30 days by day (UTC)",
            usage(
                lambda i: UsageQuery(
                    *last_30, group_by=("day",), customer_id=customer_of(randoms[i])
                )
            ),
            iterations,
            20,
        )
        timed(
            "usage: all keys by customer, October (UTC)",
            usage(lambda i: UsageQuery(*MONTH, group_by=("customer_id",))),
            iterations,
            100,
        )
    engine.dispose()

    if http_iterations <= 0:
        return
    with _Server(settings) as base, httpx.Client(base_url=base, timeout=30) as client:

        def get(path: str, params: Callable[[int], dict[str, str]]) -> Callable[[int], Any]:
            def go(i: int) -> Any:
                response = client.get(path, params=params(i))
                response.raise_for_status()
                return response.content

            return go

        def iso(t: datetime) -> str:
            return t.isoformat().replace("+00:00", "Z")

        cursor_text = encode(cursor_50)
        print(
            f"through HTTP (uvicorn + httpx, same process), {http_iterations} runs each "
            "after a warm-up pass:"
        )
        timed(
            "GET /v1/calls first page, busiest key",
            get("/v1/calls", lambda i: {"api_key_id": busiest}),
            http_iterations,
            20,
        )
        timed(
            "GET /v1/calls page 50, busiest key",
            get("/v1/calls", lambda i: {"api_key_id": busiest, "cursor": cursor_text}),
            http_iterations,
            20,
        )
        timed(
            "GET /v1/usage busiest key, 30 days by day",
            get(
                "/v1/usage",
                lambda i: {
                    "api_key_id": busiest,
                    "group_by": "day",
                    "since": iso(last_30[0]),
                    "until": iso(last_30[1]),
                },
            ),
            http_iterations,
            20,
        )
        timed(
            "GET /v1/usage all keys by model, October",
            get(
                "/v1/usage",
                lambda i: {"group_by": "model", "since": iso(MONTH[0]), "until": iso(MONTH[1])},
            ),
            http_iterations,
            100,
        )


def seed_arguments(parser: argparse.ArgumentParser, iterations: int) -> None:
    """The options of a benchmark over this script's seed: its size, the timed iterations and
    ``--reuse`` (shared by ``queries.py``, ``console.py`` and ``drift.py``)."""
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument(
        "--reuse", action="store_true", help="keep the database if it already holds --calls calls"
    )
    parser.add_argument(
        "--plans",
        action="store_true",
        help=f"assign every key a customer (of {CUSTOMERS}) and a plan before measuring",
    )


def seeded_url(name: str, args: argparse.Namespace) -> str:
    """The database URL (``BILLING_DATABASE_URL``, else ``$TMPDIR/billing-bench-{name}.db``),
    migrated and seeded with ``args.calls`` calls over ``args.keys`` keys unless ``--reuse`` finds
    them there."""
    default = Path(tempfile.gettempdir()) / f"billing-bench-{name}.db"
    url = os.environ.get("BILLING_DATABASE_URL", f"sqlite:///{default}")
    url = Settings(database_url=url).database_url
    upgrade_to_head(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        present = conn.scalar(text("SELECT count(*) FROM calls"))
        assigned = bool(conn.scalar(text("SELECT count(*) FROM key_assignments")))
        # The seed's keys are key_0001 ... key_{args.keys}: the last one there and no further.
        last, beyond = (
            conn.scalar(text("SELECT 1 FROM calls WHERE api_key_id = :k LIMIT 1"), {"k": k})
            for k in (f"key_{args.keys:04d}", f"key_{args.keys + 1:04d}")
        )
    same = present == args.calls and last is not None and beyond is None
    if not (args.reuse and same and assigned == getattr(args, "plans", False)):
        print(f"seeding {args.calls:,} calls into {engine.url.render_as_string()}")
        started = time.perf_counter()
        seed(engine, args.calls, args.keys, args.models, getattr(args, "plans", False))
        print(f"  seeded in {time.perf_counter() - started:.1f} s")
    engine.dispose()
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    seed_arguments(parser, iterations=200)
    parser.add_argument("--http-iterations", type=int, default=100)
    args = parser.parse_args()
    run(seeded_url("queries", args), args.iterations, args.http_iterations)


if __name__ == "__main__":
    main()
