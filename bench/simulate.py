"""The long run of the seeded simulation (tests/system/test_simulation.py): many seeds, each on
a fresh database; a failing seed is printed with the command that replays it.

    python bench/simulate.py --seeds 200                 # seeds 1..200 on SQLite files
    python bench/simulate.py --seed 1234                 # replay one seed
    python bench/simulate.py --seeds 50 --start 1000 --steps 120 --calls 80
    python bench/simulate.py --seeds 50 --database-url postgresql+psycopg://postgres@127.0.0.1/x

With ``--database-url`` (PostgreSQL) a scratch database is created on that server for the run and
emptied between seeds; it is dropped at the end. Exit status: 0 when every seed passed, 1 if not.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from billing.storage.migrate import upgrade_to_head  # noqa: E402
from billing.storage.models import Base  # noqa: E402
from billing.storage.models.by_database import POSTGRES_ONLY_TABLES  # noqa: E402
from tests.invariants import scratch_database  # noqa: E402
from tests.system.test_simulation import SimulationFailure, run_seed  # noqa: E402


def _truncate(url: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    names = [t.name for t in Base.metadata.sorted_tables] + list(POSTGRES_ONLY_TABLES)
    tables = ", ".join(names)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds (default 200)")
    parser.add_argument("--start", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--seed", type=int, help="run this one seed only (a replay)")
    parser.add_argument("--steps", type=int, default=60, help="steps per seed (default 60)")
    parser.add_argument("--calls", type=int, default=40, help="calls per seed (default 40)")
    parser.add_argument("--database-url", help="a PostgreSQL URL: run there (scratch database)")
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first failure")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the service's own logs: only real trouble
    seeds = (
        [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    )
    workdir = Path(tempfile.mkdtemp(prefix="billing-simulate-"))
    failed: list[int] = []
    started = time.monotonic()
    totals: dict[str, int] = {}
    try:
        if args.database_url:
            with scratch_database(args.database_url, workdir, "simulate") as url:
                for seed in seeds:
                    _truncate(url)
                    if not _one(seed, url, args, totals, failed) and args.stop_at_first:
                        break
        else:
            template = workdir / "template.db"
            upgrade_to_head(f"sqlite:///{template}")
            for seed in seeds:
                # A new file per seed: the service may still hold the last one open for a moment
                # (its SQLite checkpointer thread), so it is never overwritten in place.
                path = workdir / f"sim-{seed}.db"
                shutil.copyfile(template, path)
                ok = _one(seed, f"sqlite:///{path}", args, totals, failed)
                for leftover in workdir.glob(f"sim-{seed - 2}.db*"):
                    leftover.unlink(missing_ok=True)
                if not ok and args.stop_at_first:
                    break
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    summary = ", ".join(f"{k} {v}" for k, v in totals.items())
    print(
        f"\n{len(seeds) - len(failed)} of {len(seeds)} seeds passed in {elapsed:.1f} s; {summary}"
    )
    if failed:
        print("failing seeds: " + " ".join(map(str, failed)))
        print(f"replay one: python bench/simulate.py --seed {failed[0]}")
        return 1
    return 0


def _one(
    seed: int, url: str, args: argparse.Namespace, totals: dict[str, int], failed: list[int]
) -> bool:
    began = time.monotonic()
    try:
        stats = run_seed(seed, url, steps=args.steps, calls=args.calls)
    except SimulationFailure as failure:
        failed.append(seed)
        print(f"seed {seed}: FAILED\n{failure}\n", flush=True)
        return False
    except Exception:
        failed.append(seed)
        print(f"seed {seed}: ERROR\n{traceback.format_exc()}", flush=True)
        print(f"replay: python bench/simulate.py --seed {seed}\n", flush=True)
        return False
    for key, value in vars(stats).items():
        if key != "seed":
            totals[key] = totals.get(key, 0) + value
    print(
        f"seed {seed}: ok in {time.monotonic() - began:.1f} s ({stats.events} events, "
        f"{stats.passes} passes, {stats.reconciler_crashes} reconciler crashes, "
        f"{stats.adjustments} adjustments)",
        flush=True,
    )
    return True


if __name__ == "__main__":
    sys.exit(main())
