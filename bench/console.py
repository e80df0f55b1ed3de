"""Benchmark of the console's pages: each page's server time on a seeded database.

Seeds ``--calls`` settled calls (default 1,000,000) exactly as ``bench/queries.py`` does (its
``seed``: Zipf-like keys, 10 models, 90 days, ledger entries, rollups rebuilt), then requests each
console page in-process through the ASGI app (Starlette's TestClient: routing, the read
transaction, the domain services, Jinja2 rendering; no sockets) in a process set up as
``billing serve``'s (``billing.cli.serve.serving_process``: the heap built at start frozen out of
the garbage collector's full passes), with no token configured (the console is open, as on
loopback), and prints p50/p95/p99 per page. Target: p95 under 100 ms for
every page (CONTRACT "Console (v2)", "Observability and standard exports (v3)"). Figures go to
``bench/README.md``.

Every page of ``billing/console/routes.py`` that reads the database is timed: Overview (the
seed's last 30 days, and its default range), Keys, Customers, Alerts, Calls (four ways) and a
call, Usage (four ways), Budgets (with its holds), Credits (the customers, and one customer's
balance, grants and draws), Drift and Exports. Before timing, as ``bench/holds.py`` prepares its
seed (``holds.prepare``, skipped with ``--reuse`` when present): ``--budgets`` monthly budgets
over the first keys, every customer (one of 100) with a prepaid grant and the draws of the
seed's entries; then ``--holds`` live authorization holds (``ttl_s`` 3,600) over budgeted keys
and an alert for each threshold of the first 200 budgets (no webhook: delivery ``none``).
With ``--plans`` the keys have those customers (else the customers have grants but no keys).

    python bench/console.py                      # SQLite file $TMPDIR/billing-bench-console.db
    BILLING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/bench python bench/console.py
    python bench/console.py --calls 20000 --iterations 20           # a smoke run
    python bench/console.py --reuse               # keep an already seeded database
    python bench/console.py --reuse --pages customers "credits: busiest"   # only those pages
    BILLING_DATABASE_URL=sqlite:////var/tmp/holds-seed.db python bench/console.py --reuse \
        --keys 10000 --plans --budgets 10000      # bench/holds.py's seed (10,000 budgets)
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote, urlencode

from fastapi.testclient import TestClient
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from holds import authorization, prepare, prepared  # noqa: E402
from queries import END, customer_of, seed_arguments, seeded_url, timed  # noqa: E402

from billing.budgets.authorize import authorize  # noqa: E402
from billing.budgets.schemas import AuthorizationIn  # noqa: E402
from billing.budgets.service import enqueue_alert, thresholds_of  # noqa: E402
from billing.calllog.queries import list_calls, parse_calls_query  # noqa: E402
from billing.cli.serve import serving_process  # noqa: E402
from billing.server.app import create_app  # noqa: E402
from billing.settings import Settings  # noqa: E402
from billing.storage.db import (  # noqa: E402
    make_engine,
    make_sessionmaker,
    read_transaction,
    write_transaction,
)
from billing.storage.models import Budget, Call  # noqa: E402

TARGET_MS = 100.0


def _iso(at: object) -> str:
    return str(at).replace(" ", "T").replace("+00:00", "Z")


def _deep_cursor(sessions: sessionmaker[Session], key: str, pages: int = 49) -> tuple[int, str]:
    """The cursor of page ``pages + 1`` of ``key``'s calls (walked as a client would; fewer
    pages on a small database), and that page's number."""
    cursor: str | None = None
    walked = 0
    with read_transaction(sessions) as session:
        while walked < pages:
            items = [("api_key_id", key)] + ([("cursor", cursor)] if cursor else [])
            page = list_calls(session, parse_calls_query(items))
            if page.next_cursor is None:
                break
            cursor, walked = page.next_cursor, walked + 1
    assert cursor is not None, f"{key} has a single page of calls"
    return walked + 1, cursor


def live_holds(sessions: sessionmaker[Session], budgets: int, holds: int) -> None:
    """``holds`` live authorization holds over budgeted keys (this benchmark's earlier ones
    deleted first), as the Budgets page lists them."""
    rng = random.Random(23)
    now = datetime.now(UTC)
    with write_transaction(sessions) as session:
        session.execute(text("DELETE FROM budget_holds WHERE request_id LIKE 'console-%'"))
        for i in range(holds):
            key = f"key_{rng.randrange(1, budgets + 1):04d}"
            rid = f"console-{now.timestamp():.0f}-{i}"
            body = authorization(rid, key, rng.randrange(10, 5000), 1000, ttl_s=3600)
            authorize(session, AuthorizationIn.model_validate(body), now)


#: Budgets given alerts (``alerts``).
ALERTED = 200


def alerts(sessions: sessionmaker[Session]) -> None:
    """Each threshold of the first ``ALERTED`` budgets crossed this month (once: the alerts are
    unique per budget, period and threshold), as the Alerts page lists them."""
    now = datetime.now(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    with write_transaction(sessions) as session:
        rows = session.scalars(select(Budget).order_by(Budget.id).limit(ALERTED))
        for budget in rows:
            for threshold in thresholds_of(budget):
                data = {"budget_id": budget.budget_id, "threshold": threshold}
                enqueue_alert(
                    session, budget, "budget.threshold_crossed", threshold, start, data, now
                )


def run(
    url: str, iterations: int, budgets: int, holds: int, reuse: bool, only: list[str] | None = None
) -> None:
    settings = Settings(database_url=url)
    if not (reuse and prepared(url, budgets)):
        prepare(settings, budgets)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    live_holds(sessions, budgets, holds)
    alerts(sessions)
    with sessions() as session:
        counts = [
            (key, count)
            for key, count in session.execute(
                select(Call.api_key_id, func.count())
                .group_by(Call.api_key_id)
                .order_by(func.count().desc())
            )
            if key is not None
        ]
        rng = random.Random(11)
        # random calls to open: request ids sampled by call number
        top = session.scalar(select(func.max(Call.call_no))) or 1
        numbers = [rng.randint(1, top) for _ in range(iterations)]
        call_ids = list(session.scalars(select(Call.request_id).where(Call.call_no.in_(numbers))))
    engine.dispose()
    busiest = counts[0][0]
    keys = [key for key, _ in counts]
    randoms = [rng.choice(keys) for _ in range(iterations)]
    print(
        f"{engine.dialect.name}: {sum(c for _, c in counts):,} calls; busiest key {busiest} "
        f"({counts[0][1]:,} calls)"
    )
    deep, cursor_deep = _deep_cursor(sessions, busiest)
    customer = customer_of(busiest)
    month = {"since": _iso(END - timedelta(days=30)), "until": _iso(END)}
    week = {"since": _iso(END - timedelta(days=7)), "until": _iso(END)}
    app = create_app(settings)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        serving_process()  # the process as `billing serve` runs it (its heap frozen)

        def page(make: Callable[[int], str]) -> Callable[[int], object]:
            def go(i: int) -> object:
                response = client.get(make(i))
                assert response.status_code == 200, (make(i), response.status_code)
                return response

            return go

        def q(params: dict[str, str]) -> str:
            return urlencode(params)

        pages: list[tuple[str, Callable[[int], str]]] = [
            ("overview: the seed's last 30 days", lambda i: f"/console/overview?{q(month)}"),
            ("overview: the default (30 days to today)", lambda i: "/console/overview"),
            ("keys: first page, 30 days", lambda i: f"/console/keys?{q(month)}"),
            ("customers: 30 days", lambda i: f"/console/customers?{q(month)}"),
            ("alerts", lambda i: "/console/alerts"),
            ("calls: first page, no filter", lambda i: "/console/calls"),
            ("calls: first page, busiest key", lambda i: f"/console/calls?api_key_id={busiest}"),
            ("calls: first page, random keys", lambda i: f"/console/calls?api_key_id={randoms[i]}"),
            (
                f"calls: page {deep}, busiest key",
                lambda i: f"/console/calls?{q({'api_key_id': busiest, 'cursor': cursor_deep})}",
            ),
            (
                f"calls: first page, busiest key's customer ({customer})",
                lambda i: f"/console/calls?customer_id={customer}",
            ),
            (
                "call: random calls",
                lambda i: f"/console/calls/{quote(call_ids[i % len(call_ids)], safe='')}",
            ),
            (
                "usage: busiest key, 30 days by day (UTC)",
                lambda i: f"/console/usage?{q({**month, 'api_key_id': busiest})}",
            ),
            (
                "usage: random keys, 30 days by day (Asia/Kolkata)",
                lambda i: (
                    f"/console/usage?{q({**month, 'api_key_id': randoms[i], 'tz': 'Asia/Kolkata'})}"
                ),
            ),
            (
                "usage: busiest key, 7 days by hour (Asia/Kolkata)",
                lambda i: (
                    "/console/usage?"
                    + q({**week, "api_key_id": busiest, "group_by": "hour", "tz": "Asia/Kolkata"})
                ),
            ),
            ("usage: all keys, 30 days by day (UTC)", lambda i: f"/console/usage?{q(month)}"),
            (
                f"usage: busiest key's customer ({customer}), 30 days by day",
                lambda i: f"/console/usage?{q({**month, 'customer_id': customer})}",
            ),
            (
                "usage: all customers, 30 days by customer",
                lambda i: f"/console/usage?{q({**month, 'group_by': 'customer_id'})}",
            ),
            ("budgets (with the holds)", lambda i: "/console/budgets"),
            ("credits: the customers", lambda i: "/console/credits"),
            (
                f"credits: busiest key's customer ({customer})",
                lambda i: f"/console/credits?customer_id={customer}",
            ),
            (
                "credits: random keys (their customer's)",
                lambda i: f"/console/credits?api_key_id={randoms[i]}",
            ),
            ("drift", lambda i: "/console/drift"),
            ("exports: a month's links", lambda i: f"/console/exports?{q(month)}"),
        ]
        print(f"in-process ASGI (route + services + template), {iterations} runs after a warm-up:")
        for label, make in pages:
            if only is None or any(word in label for word in only):
                timed(label, page(make), iterations, TARGET_MS)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    seed_arguments(parser, iterations=100)
    parser.add_argument("--budgets", type=int, default=100, help="over the first keys")
    parser.add_argument("--holds", type=int, default=20, help="live authorization holds")
    parser.add_argument(
        "--pages",
        nargs="+",
        metavar="WORDS",
        help="time only the pages whose label contains one of these (e.g. customers credits)",
    )
    args = parser.parse_args()
    if args.budgets > args.keys:
        parser.error("--budgets must be at most --keys (one budget per key)")
    url = seeded_url("console", args)
    run(url, args.iterations, args.budgets, args.holds, args.reuse, args.pages)


if __name__ == "__main__":
    main()
