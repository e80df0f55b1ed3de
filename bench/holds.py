"""Benchmark of authorizations, holds and prepaid credit balances against one ``billing serve``
(CONTRACT "Authorizations and holds (v3)", "Prepaid credits (v3)"; issues #39 and #40):

1. **The race**: ``--gateways`` (16) gateway threads authorize against one $1 budget of a key of
   its own, each with its own HTTP connection, and run the call of every allowed authorization:
   ``stream.started``, then (after ``--race-call-s`` seconds, a random value in the range) a
   ``stream.usage`` whose cost is at most the estimate (the estimate's input, at most its
   ``max_output_tokens``; so the estimates bound the real cost; the ``stream.started`` carries
   the input count, as ``billing.gateway``'s does). A gateway stops at a final
   denial, retries a retryable one after 50 ms and gives up after ``--race-attempts``. Twice:
   calls of 0.2-1 s, then back to back (0 s). After the reconciler settled every call: the
   admitted calls, the denials by reason and the admitted spend (the key's ledger) against the
   limit. Target: admitted spend ≤ the limit, on both databases.
2. **Authorization latency**: ``POST /v1/authorizations`` over HTTP (httpx, one connection) for
   random budgeted keys (token estimates of a priced model), each allowed call then posted (its
   ``stream.started`` and ``stream.usage``, untimed, converting the hold as a gateway's call
   does), while a thread ingests ``--rate`` events a second. Target: p95 < 5 ms at 1,000,000
   calls and 10,000 budgets.
3. **Ingest with and without holds**: ``--rounds`` alternating runs of ``--writers`` threads
   posting ``--run-calls`` completed calls in batches of 50 (at most ``--seconds``). "With":
   every call posted was authorized first (its hold live, ``ttl_s`` 600), by ``--writers``
   threads before the timed run (the denied ones are not posted); "without": calls without an
   authorization. The budgets are in force in both. Medians
   compared; target: with holds within 10 % of without. The authorizations' own rate and server
   CPU are printed beside.
4. **Credit balance latency**: ``GET /v1/credits/balance`` over HTTP for random customers (half of
   them ``credit_required``), while a thread ingests ``--rate`` events a second, and the same in
   process (``billing.credits.service.balance`` in a read transaction). Target: p95 < 5 ms.

The seed is ``bench/queries.py``'s with ``--plans`` (every key with a customer, of 100, and a
plan), default ``--keys 10000``; then ``--budgets`` monthly budgets over the first keys (as
``bench/spend.py``), each customer a prepaid grant in force from before the first call (larger
than its calls' charges) and the draws of every settled ledger entry of the seed, booked
set-based (``credit_entries``), as the reconciler would have booked them: the balances read a
year of draws.

Ingest adds calls, so a database is good for one run. ``--seed-only`` prepares a database (seed,
budgets, credits) and stops; ``--template URL`` copies such a database over the working one
before the run (a file copy; ``CREATE DATABASE … TEMPLATE`` on PostgreSQL), so the slow seed is
made once:

    BILLING_DATABASE_URL=sqlite:////var/tmp/holds-seed.db python bench/holds.py --seed-only
    python bench/holds.py --template sqlite:////var/tmp/holds-seed.db --reuse
    BILLING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/holds_seed \\
        python bench/holds.py --seed-only
    BILLING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/holds_run python \\
        bench/holds.py --template postgresql+psycopg://postgres@127.0.0.1:5432/holds_seed --reuse
    python bench/holds.py --calls 20000 --keys 200 --budgets 100 --iterations 100 \\
        --run-calls 2000 --rounds 1                                            # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_average, quiesce
from queries import CUSTOMERS, _prices, percentiles, seed_arguments, seeded_url
from spend import (
    BUDGET_TABLES,
    RECONCILE_INTERVAL_S,
    SETTLE_AFTER_S,
    Serve,
    create_budgets,
    drained,
    vacuum,
)

from billing.credits.rows import Owner
from billing.credits.schemas import CustomerIn, GrantIn
from billing.credits.service import balance, post_grant, put_customer
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker, read_transaction, write_transaction

TARGET_MS = 5.0
#: Each customer's grant: more than a year of its calls' charges at the seed's prices.
GRANT_USD = "1000000"
GRANT_FROM = "2025-01-01T00:00:00Z"
CREDIT_TABLES = ("credit_entries", "credit_grants", "customers", "budget_holds")
#: The model every authorization and posted call of the benchmark uses (the seed prices it).
MODEL = "model-00"
PROTOCOL = "openai.chat_completions"
#: ``ttl_s`` of the benchmark's authorizations (the contract's default).
TTL_S = 600


# --- the database -----------------------------------------------------------------------------


def working_url() -> str:
    default = Path(tempfile.gettempdir()) / "billing-bench-holds.db"
    return Settings(
        database_url=os.environ.get("BILLING_DATABASE_URL", f"sqlite:///{default}")
    ).database_url


def copy_template(template: str, target: str) -> None:
    """Replace the database ``target`` by a copy of ``template`` (same kind)."""
    source, dest = make_url(template), make_url(target)
    if source.get_backend_name() != dest.get_backend_name():
        raise SystemExit("--template and BILLING_DATABASE_URL must be of the same database")
    began = time.perf_counter()
    if source.get_backend_name() == "sqlite":
        assert source.database and dest.database
        with contextlib.closing(sqlite3.connect(source.database)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(dest.database + suffix)
        shutil.copyfile(source.database, dest.database)
    else:
        if source.database == dest.database:
            raise SystemExit("--template must name another database than BILLING_DATABASE_URL")
        admin = create_engine(
            dest.set(database="postgres").render_as_string(hide_password=False),
            isolation_level="AUTOCOMMIT",
        )
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{dest.database}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{dest.database}" TEMPLATE "{source.database}"'))
        admin.dispose()
    print(f"  copied {template} in {time.perf_counter() - began:.1f} s")


def prepared(url: str, budgets: int) -> bool:
    """Whether ``url`` holds this benchmark's budgets and credits already (``--seed-only``)."""
    engine = create_engine(url)
    with engine.connect() as conn:
        found = conn.scalar(text("SELECT count(*) FROM budgets WHERE budget_id LIKE 'bench-%'"))
        grants = conn.scalar(text("SELECT count(*) FROM credit_grants"))
        draws = conn.scalar(text("SELECT 1 FROM credit_entries WHERE kind = 'draw' LIMIT 1"))
    engine.dispose()
    return bool(found == budgets and grants == CUSTOMERS and draws)


def prepare(settings: Settings, budgets: int) -> None:
    """The budgets, the customers (every other one ``credit_required``), a grant per customer
    and the draws of the seed's settled entries; the call numbers' sequence after the seed's."""
    engine = make_engine(settings)
    with engine.begin() as conn:
        for table in (*BUDGET_TABLES, *CREDIT_TABLES):
            conn.execute(text(f"DELETE FROM {table}"))
        if engine.dialect.name == "postgresql":
            # The seed numbers its calls itself: ingest's sequence goes on after them.
            conn.execute(
                text("SELECT setval('calls_call_no_seq', (SELECT max(call_no) FROM calls))")
            )
    create_budgets(settings, budgets)
    sessions = make_sessionmaker(engine)
    now = datetime.now(UTC)
    began = time.perf_counter()
    with write_transaction(sessions) as session:
        for i in range(CUSTOMERS):
            customer = f"cust_{i:03d}"
            put_customer(session, customer, CustomerIn(credit_required=i % 2 == 0), now)
            body = GrantIn(
                grant_id=f"bench-{customer}",
                customer_id=customer,
                amount_usd=GRANT_USD,
                effective_at=GRANT_FROM,
                kind="purchased",
            )
            post_grant(session, body, now)
    # Not the service's engine: its statement deadline would interrupt this bulk insert.
    with create_engine(settings.database_url).begin() as conn:
        # The draws the reconciler would have booked for the seed's entries (each a draw of its
        # customer's one grant, which is larger than them all).
        drawn = conn.execute(
            text(
                "INSERT INTO credit_entries (kind, booked_at, customer_id, api_key_id, grant_id, "
                "amount_pusd, request_id, ledger_seq) "
                "SELECT 'draw', booked_at, customer_id, NULL, 'bench-' || customer_id, "
                "charge_pusd, request_id, seq FROM ledger_entries "
                "WHERE customer_id IS NOT NULL AND charge_pusd > 0"
            )
        ).rowcount
    print(
        f"  {CUSTOMERS} customers with a grant and {drawn:,} draws booked in "
        f"{time.perf_counter() - began:.1f} s"
    )
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {', '.join(CREDIT_TABLES)}"))
    engine.dispose()
    vacuum(settings)


# --- calls ------------------------------------------------------------------------------------


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def started(rid: str, key: str, at: datetime, input_tokens: int | None = None) -> dict[str, Any]:
    """A ``stream.started`` (with the gateway's input count when given)."""
    event: dict[str, Any] = {
        "event_id": f"{rid}-s",
        "request_id": rid,
        "type": "stream.started",
        "occurred_at": _stamp(at),
        "api_key_id": key,
        "model": MODEL,
        "protocol": PROTOCOL,
    }
    if input_tokens is not None:
        event["input_tokens"] = input_tokens
    return event


def usage(rid: str, at: datetime, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "event_id": f"{rid}-u",
        "request_id": rid,
        "type": "stream.usage",
        "occurred_at": _stamp(at),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "source": "upstream",
    }


def authorization(
    rid: str, key: str, input_tokens: int, max_output: int, ttl_s: int = TTL_S
) -> dict[str, Any]:
    return {
        "request_id": rid,
        "api_key_id": key,
        "model": MODEL,
        "estimate": {"input_tokens": input_tokens, "max_output_tokens": max_output},
        "ttl_s": ttl_s,
    }


class Call:
    """A call to post: its request id, key and usage (``max_output`` its estimate's bound)."""

    __slots__ = ("input", "key", "max_output", "output", "rid")

    def __init__(self, rid: str, key: str, rng: random.Random) -> None:
        self.rid, self.key = rid, key
        self.input = rng.randrange(10, 5000)
        self.max_output = 1000
        self.output = rng.randrange(1, self.max_output + 1)

    def events(self, at: datetime) -> list[dict[str, Any]]:
        return [started(self.rid, self.key, at), usage(self.rid, at, self.input, self.output)]


@contextlib.contextmanager
def steady_ingest(base: str, keys: list[str], rate: float) -> Iterator[None]:
    """A thread posting ``rate`` events a second (5 completed calls a post) meanwhile."""
    stop = threading.Event()

    def feed() -> None:
        rng = random.Random(5)
        with httpx.Client(base_url=base, timeout=60) as http:
            n = 0
            while not stop.is_set():
                began = time.monotonic()
                at = datetime.now(UTC) - timedelta(seconds=1)
                calls = [
                    Call(f"steady-{os.getpid()}-{n}-{i}", rng.choice(keys), rng) for i in range(5)
                ]
                n += 1
                http.post("/v1/events", json={"events": [e for c in calls for e in c.events(at)]})
                stop.wait(max(0.0, 10 / rate - (time.monotonic() - began)))

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        yield
    finally:
        stop.set()
        feeder.join(timeout=30)


def report(label: str, samples: list[float], target_ms: float = TARGET_MS) -> None:
    p50, p95, p99 = percentiles(samples)
    verdict = "ok" if p95 < target_ms else f"OVER {target_ms:g} ms"
    print(f"  {label:<40} p50 {p50:7.2f}  p95 {p95:7.2f}  p99 {p99:7.2f} ms   {verdict}")


# --- 1. the race ------------------------------------------------------------------------------


def race(
    base: str,
    settings: Settings,
    name: str,
    gateways: int,
    attempts: int,
    call_s: tuple[float, float],
    price: tuple[int, int],
) -> None:
    """``gateways`` threads authorizing and calling against one $1 budget of key ``name``."""
    limit_pusd = 10**12
    with httpx.Client(base_url=base, timeout=30) as http:
        response = http.post(
            "/v1/budgets",
            json={
                "budget_id": name,
                "scope": {"api_key_id": name},
                "limit_usd": "1",
                "period": "month",
            },
        )
        assert response.status_code in (200, 201), response.text
    # About 5 cents an estimate at the model's price: input at the input rate, the output bound
    # at the output rate (µUSD per Mtok is pUSD per token).
    p_in, p_out = price
    max_output = max(1, (5 * 10**10 // 2) // p_out)
    input_tokens = max(1, (5 * 10**10 // 2) // p_in)
    estimate_pusd = input_tokens * p_in + max_output * p_out
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(gateways)

    def gateway(g: int) -> None:
        rng = random.Random(1000 + g)
        with httpx.Client(base_url=base, timeout=60) as http:
            barrier.wait()
            for n in range(attempts):
                rid = f"{name}-{os.getpid()}-{g}-{n}"
                answer = http.post(
                    "/v1/authorizations", json=authorization(rid, name, input_tokens, max_output)
                ).json()
                if answer["decision"] != "allow":
                    with lock:
                        outcomes[f"deny {answer['reason']}"] += 1
                    if not answer["retryable"]:
                        return
                    time.sleep(0.05)
                    continue
                with lock:
                    outcomes["allow"] += 1
                at = datetime.now(UTC)
                started_at = started(rid, name, at, input_tokens)
                http.post("/v1/events", json={"events": [started_at]})
                if call_s[1] > 0:
                    time.sleep(rng.uniform(*call_s))
                output = rng.randrange(max_output // 2, max_output + 1)
                end = datetime.now(UTC)
                http.post("/v1/events", json={"events": [usage(rid, end, input_tokens, output)]})
            with lock:
                outcomes["gave up"] += 1

    threads = [threading.Thread(target=gateway, args=(g,)) for g in range(gateways)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - began
    drained(settings)
    engine = make_engine(settings)
    with engine.connect() as conn:
        spent = int(
            conn.scalar(
                text(
                    "SELECT coalesce(sum(cost_pusd), 0) FROM ledger_entries WHERE api_key_id = :k"
                ),
                {"k": name},
            )
        )
        calls = conn.scalar(text("SELECT count(*) FROM calls WHERE api_key_id = :k"), {"k": name})
    engine.dispose()
    verdict = "ok" if spent <= limit_pusd else "OVER THE LIMIT"
    label = f"{call_s[0]:g}-{call_s[1]:g} s calls" if call_s[1] > 0 else "back-to-back calls"
    print(
        f"  race, {gateways} gateways, {label}: {seconds:.1f} s; estimate "
        f"${estimate_pusd / 10**12:.6f} a call; {dict(sorted(outcomes.items()))}; {calls} calls"
    )
    print(
        f"    admitted spend (ledger) ${spent / 10**12:.6f} of the $1 limit "
        f"({(spent - limit_pusd) / limit_pusd * 100:+.1f} %)   {verdict}"
    )


# --- 2. authorization latency -----------------------------------------------------------------


def authorization_latency(
    base: str, keys: list[str], iterations: int, rate: float, server_cpu: Callable[[], float]
) -> None:
    rng = random.Random(9)
    picks = [Call(f"lat-{os.getpid()}-{i}", rng.choice(keys), rng) for i in range(2 * iterations)]
    denials: Counter[str] = Counter()
    with steady_ingest(base, keys, rate), httpx.Client(base_url=base, timeout=30) as http:

        def one(call: Call) -> float:
            body = authorization(call.rid, call.key, call.input, call.max_output)
            began = time.perf_counter()
            response = http.post("/v1/authorizations", json=body)
            took = time.perf_counter() - began
            assert response.status_code == 200, response.text
            answer = response.json()
            if answer["decision"] == "allow":
                at = datetime.now(UTC)
                http.post("/v1/events", json={"events": call.events(at)})
            else:
                denials[answer["reason"]] += 1
            return took

        for call in picks[:iterations]:  # untimed: the pages in memory
            one(call)
        cpu = server_cpu()
        samples = [one(call) for call in picks[iterations:]]
        cpu = server_cpu() - cpu
    report("POST /v1/authorizations over HTTP", samples)
    print(
        f"    server CPU {cpu / iterations * 1000:.2f} ms an authorization and its call "
        f"(steady ingest included); denials {dict(denials) or 'none'}"
    )


# --- 3. ingest with and without holds ---------------------------------------------------------


def authorize_all(base: str, calls: list[Call], writers: int) -> tuple[list[Call], float]:
    """Authorize ``calls`` with ``writers`` threads; the allowed ones, and authorizations/s."""
    allowed: list[list[Call]] = [[] for _ in range(writers)]

    def work(w: int) -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            for call in calls[w::writers]:
                body = authorization(call.rid, call.key, call.input, call.max_output)
                if http.post("/v1/authorizations", json=body).json()["decision"] == "allow":
                    allowed[w].append(call)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = len(calls) / (time.perf_counter() - began)
    return [c for part in allowed for c in part], rate


def throughput(base: str, calls: list[list[Call]], seconds: float) -> tuple[float, int]:
    """Events a second accepted while each writer posts its ``calls`` in batches of 50 for
    ``seconds`` (or until they run out), and the calls posted."""
    writers = len(calls)
    accepted = [0] * writers
    posted = [0] * writers
    stop = time.monotonic() + seconds

    def write(w: int) -> None:
        mine = calls[w]
        with httpx.Client(base_url=base, timeout=60) as http:
            while time.monotonic() < stop and posted[w] < len(mine):
                batch = mine[posted[w] : posted[w] + 50]
                at = datetime.now(UTC) - timedelta(seconds=1)
                events = [e for c in batch for e in c.events(at)]
                response = http.post("/v1/events", json={"events": events})
                posted[w] += len(batch)
                if response.status_code == 200:
                    accepted[w] += response.json()["accepted"]

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(accepted) / (time.perf_counter() - began), sum(posted)


def calm(settings: Settings) -> None:
    """Before a timed ingest run: the reconciler drained (``drained``), then the previous run's
    writes on disk (``common.quiesce``: ``sync``, PostgreSQL's ``CHECKPOINT``) and, on SQLite,
    the WAL checkpointed into the database and truncated, so that no run starts with another's
    writes still to do (a run of 10,000 events lasts a few seconds; before this, the SQLite
    rounds of one side spread from 4,001 to 15,288 events/s in one run)."""
    drained(settings)
    url = settings.database_url
    if url.startswith("sqlite"):
        engine = make_engine(settings)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            engine.dispose()
    quiesce(url)


def ingest_rounds(
    base: str,
    settings: Settings,
    keys: list[str],
    args: argparse.Namespace,
    server_cpu: Callable[[], float],
) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    rng = random.Random(13)
    # The same work in every run: --run-calls calls (the seconds a cap).
    size = args.run_calls
    # Untimed: the server's first posts (its caches, the budgets' first read) fall on no run.
    warm = [Call(f"warm-{os.getpid()}-{i}", rng.choice(keys), rng) for i in range(1000)]
    throughput(base, [warm[w :: args.writers] for w in range(args.writers)], args.seconds)
    for r in range(args.rounds):
        for holds in (False, True):
            calm(settings)
            label = f"{'with' if holds else 'without'} holds {r + 1}"
            calls = [Call(f"{label}-{os.getpid()}-{i}", rng.choice(keys), rng) for i in range(size)]
            note = ""
            if holds:
                cpu = server_cpu()
                calls, auth_rate = authorize_all(base, calls, args.writers)
                per = (server_cpu() - cpu) / size * 1000
                note = (
                    f"; {size:,} authorized first at {auth_rate:,.0f}/s ({per:.2f} ms server CPU "
                    f"each), {len(calls):,} allowed"
                )
                calm(settings)
            cpu = server_cpu()
            parts = [calls[w :: args.writers] for w in range(args.writers)]
            rate, posted = throughput(base, parts, args.seconds)
            rates[holds].append(rate)
            short = "" if posted >= len(calls) else f"  (stopped at {args.seconds:g} s)"
            print(
                f"  ingest {label:<16} {rate:10,.0f} events/s ({posted:,} calls); server CPU "
                f"{server_cpu() - cpu:.1f} s{note}{short}"
            )
    calm(settings)
    without, with_holds = (statistics.median(rates[on]) for on in (False, True))
    change = (with_holds - without) / without * 100 if without else float("nan")
    verdict = "ok" if change > -10 else "OVER 10 %"
    print(
        f"  median: without {without:,.0f}, with {with_holds:,.0f} events/s: ingest with holds "
        f"vs without {change:+.1f} %   {verdict}"
    )


# --- 4. credit balances -----------------------------------------------------------------------


def balance_latency(
    base: str,
    settings: Settings,
    keys: list[str],
    iterations: int,
    rate: float,
    server_cpu: Callable[[], float],
) -> None:
    rng = random.Random(17)
    customers = [f"cust_{rng.randrange(CUSTOMERS):03d}" for _ in range(iterations)]
    with steady_ingest(base, keys, rate), httpx.Client(base_url=base, timeout=30) as http:
        for customer in customers:  # untimed: the pages in memory
            http.get("/v1/credits/balance", params={"customer_id": customer})
        samples = []
        cpu = server_cpu()
        for customer in customers:
            began = time.perf_counter()
            response = http.get("/v1/credits/balance", params={"customer_id": customer})
            samples.append(time.perf_counter() - began)
            assert response.status_code == 200, response.text
        cpu = server_cpu() - cpu
        report("GET /v1/credits/balance over HTTP", samples)
        print(f"    server CPU {cpu / iterations * 1000:.2f} ms a balance (steady ingest included)")
        sessions = make_sessionmaker(make_engine(settings))
        samples = []
        for customer in customers:
            began = time.perf_counter()
            with read_transaction(sessions) as session:
                balance(session, Owner(customer, None), datetime.now(UTC))
            samples.append(time.perf_counter() - began)
        report("balance in-process", samples)
    busiest = customers[0]
    with httpx.Client(base_url=base, timeout=30) as http:
        shown = http.get("/v1/credits/balance", params={"customer_id": busiest}).json()
    print(
        f"    e.g. {busiest}: balance {shown['balance_usd']}, held {shown['held_usd']}, "
        f"pending {shown['pending_usd']}"
    )


# --- main -------------------------------------------------------------------------------------

PHASES = ("race", "authorize", "ingest", "balance")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    seed_arguments(parser, iterations=2000)
    parser.set_defaults(keys=10_000, plans=True)
    parser.add_argument("--budgets", type=int, default=10_000)
    parser.add_argument("--gateways", type=int, default=16)
    parser.add_argument("--race-attempts", type=int, default=200, help="per gateway and race")
    parser.add_argument("--run-calls", type=int, default=20_000, help="calls of each ingest run")
    parser.add_argument("--seconds", type=float, default=60.0, help="each ingest run at most")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="of ingest without / with holds")
    parser.add_argument("--rate", type=float, default=500.0, help="events/s beside the latencies")
    parser.add_argument("--only", default=",".join(PHASES), help=f"of {', '.join(PHASES)}")
    parser.add_argument("--template", help="a database prepared by --seed-only, copied first")
    parser.add_argument("--seed-only", action="store_true", help="seed and prepare, then stop")
    args = parser.parse_args()
    args.plans = True  # the customers hold the credit
    phases = [p.strip() for p in args.only.split(",") if p.strip()]
    if set(phases) - set(PHASES):
        parser.error(f"--only: of {', '.join(PHASES)}")
    if args.budgets > args.keys:
        parser.error("--budgets must be at most --keys (one budget per key)")
    if args.template:
        copy_template(Settings(database_url=args.template).database_url, working_url())
    os.environ["BILLING_DATABASE_URL"] = working_url()
    url = seeded_url("holds", args)
    settings = Settings(
        database_url=url, reconcile_interval_s=RECONCILE_INTERVAL_S, settle_after_s=SETTLE_AFTER_S
    )
    if not (args.reuse and prepared(url, args.budgets)):
        prepare(settings, args.budgets)
    if args.seed_only:
        return
    keys = [f"key_{rank:04d}" for rank in range(1, args.budgets + 1)]
    p_in, p_out, _, _ = _prices(args.models)[0]
    print(f"  load average {load_average():.2f}")
    server = Serve(url)
    with server as base:
        if "race" in phases:
            for name, call_s in (("race-long", (0.2, 1.0)), ("race-short", (0.0, 0.0))):
                race(base, settings, name, args.gateways, args.race_attempts, call_s, (p_in, p_out))
        if "authorize" in phases:
            authorization_latency(base, keys, args.iterations, args.rate, server.cpu_s)
        if "ingest" in phases:
            ingest_rounds(base, settings, keys, args, server.cpu_s)
        if "balance" in phases:
            drained(settings)
            balance_latency(base, settings, keys, args.iterations, args.rate, server.cpu_s)
    print(f"  load average {load_average():.2f}")


if __name__ == "__main__":
    main()
