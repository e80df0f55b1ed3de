"""Benchmark of the drift: 31 days of our calls against provider reports, on a seeded database.

Seeds ``--calls`` settled calls (default 1,000,000) over 90 days with ``bench/queries.py``'s
``seed`` (the same keys, models, prices, ledger and rollups), gives each call a provider (from
its protocol) and one of ``--accounts`` upstream accounts (default 4) and rebuilds the drift's
rollup (``billing.rollups.drift``) over those labels, then imports one OpenAI
and one Anthropic usage and cost report per day of the last 31 (a bucket per day, a result per
model and account, built from our own figures with one model a day off by 370 output tokens),
and times ``billing.drift.service.drift_rows`` over those 31 days in-process (one read
transaction per query, as ``GET /v1/drift`` runs it; each query run once untimed first):

- by day and model (the default ``group_by``);
- by day, model and upstream account.

Target at 1M calls: p95 under 500 ms on both databases.

    python bench/drift.py                       # SQLite file $TMPDIR/billing-bench-drift.db
    BILLING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/bench python bench/drift.py
    python bench/drift.py --calls 20000         # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))

from queries import END, seed_arguments, seeded_url, timed

from billing.drift.schemas import DriftQuery
from billing.drift.service import drift_rows
from billing.providers.schemas import parse_page
from billing.providers.service import import_buckets
from billing.rollups import drift as drift_rollup
from billing.settings import Settings
from billing.storage.db import (
    make_engine,
    make_sessionmaker,
    read_transaction,
    write_transaction,
)

SINCE = END - timedelta(days=31)
#: The provider and upstream account of each seeded call, per database (its request id's last
#: character picks the account).
_LABEL = {
    "sqlite": (
        "UPDATE calls SET provider = CASE WHEN protocol = 'anthropic.messages' THEN 'anthropic' "
        "ELSE 'openai' END, upstream_account = 'acct_' || (unicode(substr(request_id, -1)) % :n)"
    ),
    "postgresql": (
        "UPDATE calls SET provider = CASE WHEN protocol = 'anthropic.messages' THEN 'anthropic' "
        "ELSE 'openai' END, upstream_account = 'acct_' || (ascii(right(request_id, 1)) % :n)"
    ),
}


def label(url: str, accounts: int) -> None:
    """Set every seeded call's provider and upstream account."""
    engine = create_engine(url)
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text(_LABEL[engine.dialect.name]), {"n": accounts})
        conn.execute(text("DELETE FROM provider_report_lines"))
        conn.execute(text("DELETE FROM provider_report_versions"))
    # The labels were written behind the reconciler's back: the drift's rollup is summed again.
    with Session(engine) as session, session.begin():
        drift_rollup.rebuild(session)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE calls"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    engine.dispose()
    print(
        f"  providers, accounts and the drift rollup set in {time.perf_counter() - started:.1f} s"
    )


def _unix(day: str) -> int:
    return int(datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp())


def reports(sessions: Any) -> None:
    """One usage and one cost page per provider for the 31 days, from our own figures (one
    model a day off by 370 output tokens), imported as ``POST /v1/provider-reports`` would."""
    query = DriftQuery(SINCE, END, None, ("day", "model", "upstream_account"))
    with read_transaction(sessions) as session:
        rows = drift_rows(session, query)
    days: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        days[(row["provider"], row["day"])].append(row)
    pages: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for (provider, day), group in sorted(days.items()):
        usage, cost = [], []
        for n, row in enumerate(group):
            ours = row["ours"]
            output = ours["output_tokens"] + (370 if n == 0 else 0)
            cents = Decimal(ours["cost_usd"]) * 100
            if provider == "openai":
                usage.append(
                    {
                        "object": "organization.usage.completions.result",
                        "input_tokens": ours["input_tokens"] + ours["cache_read_input_tokens"],
                        "output_tokens": output,
                        "input_cached_tokens": ours["cache_read_input_tokens"],
                        "num_model_requests": ours["requests"],
                        "model": row["model"],
                        "project_id": row["upstream_account"],
                    }
                )
                cost.append(
                    {
                        "object": "organization.costs.result",
                        "amount": {"value": Decimal(ours["cost_usd"]), "currency": "usd"},
                        "line_item": f"{row['model']}, input",
                        "project_id": row["upstream_account"],
                    }
                )
            else:
                usage.append(
                    {
                        "uncached_input_tokens": ours["input_tokens"],
                        "cache_read_input_tokens": ours["cache_read_input_tokens"],
                        "cache_creation": {
                            "ephemeral_5m_input_tokens": ours["cache_creation_input_tokens"],
                            "ephemeral_1h_input_tokens": 0,
                        },
                        "output_tokens": output,
                        "model": row["model"],
                        "workspace_id": row["upstream_account"],
                    }
                )
                cost.append(
                    {
                        "amount": str(cents),
                        "currency": "USD",
                        "model": row["model"],
                        "workspace_id": row["upstream_account"],
                    }
                )
        start, end = _unix(day), _unix(day) + 86_400
        for kind, results in (("usage", usage), ("cost", cost)):
            if provider == "openai":
                bucket: dict[str, Any] = {
                    "object": "bucket",
                    "start_time": start,
                    "end_time": end,
                    "results": results,
                }
            else:
                bucket = {
                    "starting_at": f"{day}T00:00:00Z",
                    "ending_at": datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "results": results,
                }
            pages[(provider, kind)].append(bucket)
    started = time.perf_counter()
    buckets = 0
    for (provider, kind), data in pages.items():
        page: dict[str, Any] = {"data": data, "has_more": False, "next_page": None}
        if provider == "openai":
            page["object"] = "page"
        parsed = parse_page(provider, kind, page)
        with write_transaction(sessions) as session:
            result = import_buckets(session, provider, kind, parsed.buckets, datetime.now(UTC))
        buckets += result.buckets
    print(f"  {buckets} provider buckets imported in {time.perf_counter() - started:.1f} s")


def run(url: str, iterations: int) -> None:
    settings = Settings(database_url=url)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    reports(sessions)
    with read_transaction(sessions) as session:
        calls = session.execute(
            text("SELECT count(*) FROM calls WHERE started_at >= :s AND started_at < :u"),
            {"s": SINCE, "u": END},
        ).scalar()
    print(
        f"{engine.dialect.name}: {calls:,} calls in the 31 days {SINCE:%Y-%m-%d} .. {END:%Y-%m-%d}"
    )
    for label_, group_by in (
        ("drift: 31 days by day and model", ("day", "model")),
        ("drift: 31 days by day, model and upstream account", ("day", "model", "upstream_account")),
    ):
        query = DriftQuery(SINCE, END, None, group_by)

        def once(_i: int, query: DriftQuery = query) -> Any:
            with read_transaction(sessions) as session:
                return drift_rows(session, query)

        rows = once(0)
        statuses: dict[str, int] = defaultdict(int)
        for row in rows:
            statuses[row["status"]] += 1
        print(f"  {len(rows)} rows: {dict(statuses)}")
        timed(label_, once, iterations, 500)
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    seed_arguments(parser, iterations=20)
    parser.add_argument("--accounts", type=int, default=4)
    args = parser.parse_args()
    url = seeded_url("drift", args)
    label(url, args.accounts)
    run(url, args.iterations)


if __name__ == "__main__":
    main()
