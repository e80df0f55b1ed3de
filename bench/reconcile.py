"""Reconcile benchmark: settle N open calls (default 200,000) with ``run_pass`` and report calls/s.

Seeding goes through the ingest path itself (``parse_batch`` → ``prepare_batch`` → ``write_group``,
5,000 events per transaction, then ``VACUUM ANALYZE`` on PostgreSQL, as autovacuum would, and a
flush of the writes to disk), so the events and calls are exactly what ``POST /v1/events`` stores:
per call a ``stream.started`` (500 keys, 8 priced models), 2-8 cumulative ``stream.tokens``, a
client disconnect on 5 %, a failed first attempt and a retry on 2 %, and the final
``stream.usage`` (``upstream``; ``estimate`` on 5 %, which leaves those calls open until
``settle_after`` — the pass's clock is set past it, so every seeded call settles). Then one
``run_pass`` settles them all, timed; a second, smaller seeded database is settled under cProfile
(and pyinstrument, if installed) and the top of the profile is printed.

With ``--credits`` (CONTRACT "Prepaid credits (v3)": reconcile throughput with credits in force
within 10 % of without), each database runs ``--rounds`` pairs of passes, alternately without and
with credits (a fresh database and seed for each pass, the same calls): "with" gives each of the
workload's 500 keys (keys without a customer) a prepaid grant larger than its calls' cost before
the seed, so every reconciliation step books the draws of the calls it settles. The medians are
compared. Calls of a key with grants of its own are settled by the fast path
(``billing.reconcile.fastpath``) and drawn after it; calls of a key with a customer go to the
rule: with ``--customers`` every key is assigned a customer (one of 100, no plan) in both passes
and the grants are the customers', so both passes take the rule and the difference is the draws'
own cost.

    python bench/reconcile.py                       # SQLite and PostgreSQL, 200,000 calls
    python bench/reconcile.py --db sqlite --calls 50000 --batch-size 2000
    python bench/reconcile.py --profile-calls 0     # no profile
    python bench/reconcile.py --credits --profile-calls 0   # without / with credits, alternately
    python bench/reconcile.py --credits --customers --profile-calls 0   # both through the rule

The reconciler is only measured here (billing/reconcile/ is not changed by this benchmark).
The machine has 2 cores; the benchmark and the database share them, and the load average at the
start and the end is printed (other work on the machine skews the figures).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Databases, machine, quiesce  # noqa: E402
from lifecycles import KEYS, MODELS, Lifecycles  # noqa: E402

TARGET_CALLS_S = 20_000
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432"


#: Each owner's grant with ``--credits``: more than its calls cost (no overdraft), in USD.
GRANT_USD = "1000000"
#: With ``--customers``, key i belongs to customer ``i % CUSTOMERS``.
CUSTOMERS = 100
SINCE = "2020-01-01T00:00:00Z"


def _customer(i: int) -> str:
    return f"cust_{i % CUSTOMERS:03d}"


def assign_customers(sessions: Any, now: datetime) -> None:
    """Every workload key assigned a customer (no plan), from before the calls."""
    from billing.plans.schemas import KeyIn
    from billing.plans.service import set_key
    from billing.storage.db import write_transaction

    with write_transaction(sessions) as session:
        for i, key in enumerate(KEYS):
            set_key(session, key, KeyIn(customer_id=_customer(i), effective_from=SINCE), now)


def grant_credits(sessions: Any, now: datetime, customers: bool) -> None:
    """A prepaid grant for each owner, in force from before the calls, so every settled call
    draws one: each workload key (``lifecycles.KEYS``, keys without a customer) or, with
    ``customers``, each customer."""
    from billing.credits.schemas import GrantIn
    from billing.credits.service import post_grant
    from billing.storage.db import write_transaction

    owners = (
        [{"customer_id": _customer(i)} for i in range(min(CUSTOMERS, len(KEYS)))]
        if customers
        else [{"api_key_id": key} for key in KEYS]
    )
    with write_transaction(sessions) as session:
        for owner in owners:
            body = GrantIn.model_validate(
                {
                    **owner,
                    "grant_id": f"bench-{next(iter(owner.values()))}",
                    "amount_usd": GRANT_USD,
                    "effective_at": SINCE,
                    "kind": "purchased",
                }
            )
            post_grant(session, body, now)


def seed(url: str, calls: int, credits: bool = False, customers: bool = False) -> tuple[int, float]:
    """Store ``calls`` complete lifecycles through the ingest path (with ``customers``, every
    key assigned a customer first; with ``credits``, each owner given a grant); returns
    (events, seconds)."""
    from billing.ingest.service import prepare_batch, write_group
    from billing.ingest.validation import parse_batch
    from billing.pricing.schemas import PriceIn
    from billing.pricing.service import record_price
    from billing.settings import Settings
    from billing.storage.db import make_engine, make_sessionmaker, write_transaction

    engine = make_engine(Settings(database_url=url))
    sessions = make_sessionmaker(engine)
    now = datetime.now(UTC)
    with write_transaction(sessions) as session:
        for model in sorted({m for m, _ in MODELS}):
            price = PriceIn(
                model=model,
                effective_from="2020-01-01T00:00:00Z",
                input_usd_per_mtok="3",
                output_usd_per_mtok="15",
                cache_read_usd_per_mtok="0.30",
                cache_creation_usd_per_mtok="3.75",
            )
            record_price(session, price, now)
    if customers:
        assign_customers(sessions, now)
    if credits:
        grant_credits(sessions, now, customers)
    # One call in flight at a time per generator, so each call's events are complete and counted.
    gen = Lifecycles(11, inflight=1)
    started = time.perf_counter()
    events = 0
    done_calls = 0
    pending: list[Any] = []
    group_events = 0
    while done_calls < calls:
        body_events: list[bytes] = []
        while len(body_events) < 1000 and done_calls < calls:
            body_events.append(gen.next())
            # Every call has one stream.usage, its last event (a failed attempt has none).
            if b'"type":"stream.usage"' in body_events[-1]:
                done_calls += 1
        body = b'{"events":[' + b",".join(body_events) + b"]}"
        batch = prepare_batch(parse_batch(body, datetime.now(UTC)), datetime.now(UTC))
        pending.append(batch)
        group_events += len(body_events)
        events += len(body_events)
        if group_events >= 5000:
            write_group(sessions, pending)
            pending, group_events = [], 0
    if pending:
        write_group(sessions, pending)
    seconds = time.perf_counter() - started
    if engine.dialect.name == "postgresql":
        # The table as autovacuum leaves it within a minute of a bulk load: statistics (without
        # any, right after 1.4 million inserts, PostgreSQL guesses that thousands of call ids
        # match a large part of events and plans the reconciler's per-call lookups as scans of
        # the whole table) and the insert-triggered vacuum (else it runs during the
        # measurement, on the same 2 cores).
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()
    # The seed's writes reach the disk before the pass is timed (as bench/ingest.py does).
    quiesce(url)
    return events, seconds


def settle(url: str, batch_size: int, profile: bool = False) -> dict[str, Any]:
    from sqlalchemy import func, select
    from sqlalchemy.orm import configure_mappers

    from billing.reconcile.runner import run_pass
    from billing.settings import Settings
    from billing.storage.db import make_engine, make_sessionmaker
    from billing.storage.models import Call, CreditEntry, LedgerEntry

    settings = Settings(database_url=url, reconcile_batch_size=batch_size)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    # Past settle_after, so calls without upstream usage settle too (every seeded call settles).
    clock = datetime.now(UTC) + timedelta(seconds=settings.settle_after_s + 1)
    # The ORM's mappers configured before the pass, as `billing serve` does at start
    # (``serving_process``): else the first ORM statement of the pass pays for it (20-40 ms,
    # the pass with credits only).
    configure_mappers()
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    cpu_started = time.process_time()
    if profiler:
        profiler.enable()
    result = run_pass(sessions, settings, None, clock)
    if profiler:
        profiler.disable()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    with sessions() as session:
        open_left = session.scalar(select(func.count()).where(Call.settled.is_(False)))
        entries = session.scalar(select(func.count()).select_from(LedgerEntry))
        draws = session.scalar(
            select(func.count()).select_from(CreditEntry).where(CreditEntry.kind == "draw")
        )
    engine.dispose()
    out: dict[str, Any] = {
        "settled": result.settled,
        "examined": result.examined,
        "seconds": elapsed,
        "calls_per_s": result.settled / elapsed if elapsed else 0.0,
        # The benchmark process's CPU (on SQLite the database's too): less skewed by other work.
        "cpu_us_per_call": cpu / result.settled * 1e6 if result.settled else 0.0,
        "open_left": open_left,
        "ledger_entries": entries,
        "draws": draws,
    }
    if profiler:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(25)
        out["profile_tottime"] = text.getvalue()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(30)
        out["profile_cumulative"] = text.getvalue()
    return out


def pyinstrument_profile(url: str, batch_size: int) -> str | None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    from billing.reconcile.runner import run_pass
    from billing.settings import Settings
    from billing.storage.db import make_engine, make_sessionmaker

    settings = Settings(database_url=url, reconcile_batch_size=batch_size)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    clock = datetime.now(UTC) + timedelta(seconds=settings.settle_after_s + 1)
    profiler = Profiler(interval=0.001)
    profiler.start()
    run_pass(sessions, settings, None, clock)
    profiler.stop()
    engine.dispose()
    text: str = profiler.output_text(unicode=True, color=False, show_all=False)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgres", help="sqlite, postgres, or both")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=None, help="reconcile_batch_size")
    parser.add_argument("--profile-calls", type=int, default=20_000)
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", PG_DEFAULT))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--profile-out", help="write the profiles to this file")
    parser.add_argument(
        "--credits", action="store_true", help="passes without and with credits, alternately"
    )
    parser.add_argument("--rounds", type=int, default=2, help="with --credits: pairs of passes")
    parser.add_argument(
        "--customers",
        action="store_true",
        help=f"every key assigned a customer (of {CUSTOMERS}), the grants theirs",
    )
    args = parser.parse_args()
    kinds = [d.strip() for d in args.db.split(",") if d.strip()]
    if kinds == ["both"]:
        kinds = ["sqlite", "postgres"]
    unknown = sorted(set(kinds) - {"sqlite", "postgres"})
    if unknown or not kinds:
        parser.error(
            f"--db: unknown database {', '.join(unknown) or '(none)'}; use sqlite, postgres or both"
        )
    from billing.settings import Settings

    batch_size = args.batch_size or Settings().reconcile_batch_size
    load_start = os.getloadavg()
    dbs = Databases(args.pg_url, args.keep)
    rows = []
    profiles = []
    # Without --credits one pass per database; with it, --rounds pairs without / with credits.
    variants = [False, True] * args.rounds if args.credits else [False]
    try:
        for kind in kinds:
            for credits in variants:
                url = dbs.fresh(kind)
                events, seconds = seed(url, args.calls, credits, args.customers)
                label = f"{kind}{', credits' if credits else ''}"
                print(
                    f"[{label}] seeded {args.calls:,} calls ({events:,} events) through the "
                    f"ingest path in {seconds:.1f} s ({events / seconds:,.0f} events/s)",
                    file=sys.stderr,
                    flush=True,
                )
                result = settle(url, batch_size)
                print(
                    f"[{label}] settled {result['settled']:,} calls in {result['seconds']:.1f} s "
                    f"= {result['calls_per_s']:,.0f} calls/s, {result['cpu_us_per_call']:.0f} µs "
                    f"CPU per call in this process; open left {result['open_left']}, "
                    f"ledger entries {result['ledger_entries']:,}, draws {result['draws']:,}",
                    file=sys.stderr,
                    flush=True,
                )
                dbs.done(url)
                rows.append((kind, credits, events, result))
            if args.profile_calls:
                purl = dbs.fresh(kind)
                seed(purl, args.profile_calls, args.credits, args.customers)
                prof = settle(purl, batch_size, profile=True)
                profiles.append((kind, prof))
                dbs.done(purl)
                purl2 = dbs.fresh(kind)
                seed(purl2, args.profile_calls, args.credits, args.customers)
                profiles.append((kind, {"pyinstrument": pyinstrument_profile(purl2, batch_size)}))
                dbs.done(purl2)
    finally:
        dbs.cleanup()
    print(f"reconcile benchmark on {machine()}; benchmark and database share the cores")
    print(f"reconcile_batch_size {batch_size}; one run_pass over every open call")
    # Other work on the machine takes cores from the benchmark: a load above 2 skews the figures.
    load_end = os.getloadavg()
    print(
        "load average (1, 5, 15 min) at start "
        + ", ".join(f"{x:.2f}" for x in load_start)
        + "; at end "
        + ", ".join(f"{x:.2f}" for x in load_end)
    )
    print("| database | credits | calls | events | draws | seconds | calls/s | target |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, credits, events, r in rows:
        ok = "OK" if r["calls_per_s"] >= TARGET_CALLS_S else "BELOW TARGET"
        name = "SQLite" if kind == "sqlite" else "PostgreSQL"
        print(
            f"| {name} | {'with' if credits else 'without'} | {r['settled']:,} | {events:,} "
            f"| {r['draws']:,} | {r['seconds']:.1f} "
            f"| {r['calls_per_s']:,.0f} | ≥ {TARGET_CALLS_S:,}: {ok} |"
        )
    if args.credits and args.rounds:
        for kind in kinds:
            without, with_credits = (
                statistics.median(r["calls_per_s"] for k, c, _, r in rows if k == kind and c == on)
                for on in (False, True)
            )
            change = (with_credits - without) / without * 100 if without else float("nan")
            verdict = "ok" if change > -10 else "OVER 10 %"
            print(
                f"{kind}: median without credits {without:,.0f}, with {with_credits:,.0f} "
                f"calls/s: {change:+.1f} %   {verdict}"
            )
    text = []
    for kind, prof in profiles:
        if "profile_tottime" in prof:
            text.append(
                f"== {kind}: cProfile of run_pass over {args.profile_calls:,} calls "
                f"({prof['calls_per_s']:,.0f} calls/s under the profiler), by tottime"
            )
            text.append(prof["profile_tottime"])
            text.append(f"== {kind}: by cumulative time")
            text.append(prof["profile_cumulative"])
        elif prof.get("pyinstrument"):
            text.append(f"== {kind}: pyinstrument")
            text.append(prof["pyinstrument"])
    if args.profile_out:
        Path(args.profile_out).write_text("\n".join(text))
        print(f"profiles written to {args.profile_out}")
    else:
        print("\n".join(text))


if __name__ == "__main__":
    main()
