"""What the benchmarks share: the PostgreSQL default, fresh databases, the machine's facts, the
process tree's CPU and memory from ``/proc``, and the calm between runs."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432"


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of sorted values, nearest rank; NaN when there are none."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def tree_rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` and its descendants, in KiB."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its descendants."""
    ticks = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    return os.getloadavg()[0]


#: Seconds of calm before each measured run (after the flushes of ``quiesce``).
QUIESCE_S = 2.0


def quiesce(url: str | None) -> None:
    """Let the writes of the previous run reach the disk before the next run is measured, so no
    run pays for another's: the kernel's write-back (``sync``) and, on PostgreSQL, a
    ``CHECKPOINT`` (skipped for a role that may not run one). Ceilings and the service alike."""
    os.sync()
    if url and url.startswith("postgresql"):
        from sqlalchemy import create_engine, exc, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text("CHECKPOINT"))
        except exc.DBAPIError:
            pass
        finally:
            engine.dispose()
    time.sleep(QUIESCE_S)


class Databases:
    """Fresh databases for one run: SQLite files in a temporary directory, PostgreSQL databases."""

    def __init__(self, pg_base: str, keep: bool) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-ingest-")
        self.pg_base = pg_base.rstrip("/")
        self.keep = keep
        self.created: list[str] = []
        self.n = 0

    def fresh(self, kind: str) -> str:
        from billing.storage.migrate import upgrade_to_head

        self.n += 1
        if kind == "sqlite":
            url = f"sqlite:///{self.tmp}/bench-{self.n}.db"
        else:
            from sqlalchemy import create_engine, text

            name = f"billing_bench_{os.getpid()}_{self.n}"
            admin = create_engine(f"{self.pg_base}/postgres", isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
                conn.execute(text(f"CREATE DATABASE {name}"))
            admin.dispose()
            self.created.append(name)
            url = f"{self.pg_base}/{name}"
        upgrade_to_head(url)
        return url

    def done(self, url: str) -> None:
        """Drop one database as soon as its runs are over (unless ``--keep``): PostgreSQL's
        autovacuum would otherwise work on it during the next runs."""
        if self.keep:
            return
        if url.startswith("sqlite"):
            path = url.removeprefix("sqlite:///")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path + suffix)
            return
        from sqlalchemy import create_engine, text

        name = url.rsplit("/", 1)[1]
        admin = create_engine(f"{self.pg_base}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
        self.created.remove(name)

    def cleanup(self) -> None:
        if self.keep:
            print(f"kept: {self.tmp} {' '.join(self.created)}")
            return
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.created:
            from sqlalchemy import create_engine, text

            admin = create_engine(f"{self.pg_base}/postgres", isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                for name in self.created:
                    conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            admin.dispose()


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}); Python {sys.version.split()[0]}"
