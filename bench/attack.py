"""The attack's reproductions (issue 29) against a ``billing serve`` subprocess, from outside.

    python bench/attack.py                          # this checkout, SQLite, full size
    python bench/attack.py --checkout /path/to/old  # another checkout's billing (PYTHONPATH)
    python bench/attack.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/db
    python bench/attack.py --small                  # a smoke run: small sizes, seconds

Each attack starts its own server (``python -c "from billing.cli import main; main()" serve``
with ``PYTHONPATH`` at the checkout, in a scratch directory) and drives it only through sockets
and subprocesses, so the script runs against a checkout that predates it. Meanwhile another
client asks ``/healthz`` every 50 ms on a new connection. Printed per attack: the answers'
statuses, the server's CPU seconds and RSS growth during the attack, and ``/healthz`` latency.

- ``header``: one request with a 64 MiB header.
- ``bodies``: 100 requests of 4 MiB to ``POST /v1/prices`` without a token (a token exists).
- ``idle``: 500 connections that send nothing and 500 that send half a request line, held 30 s.
- ``blackhole`` (PostgreSQL only): the database behind a TCP proxy that forwards nothing for
  45 s while a gateway posts a batch every 0.5 s; then how long until posts succeed again.

Figures go to ``bench/README.md``; none are kept in code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """``billing serve`` of ``checkout`` on ``database_url``, in a scratch directory; ``env``
    adds ``BILLING_*`` settings. Its RSS and CPU are read from ``/proc``."""

    def __init__(
        self,
        database_url: str | None,
        checkout: Path = ROOT,
        env: dict[str, str] | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.checkout = checkout
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="billing-attack-"))
        self.database_url = database_url or f"sqlite:///{self.workdir / 'billing.db'}"
        self.port = free_port()
        self.extra = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.workdir / f"serve-{self.port}.log"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
        env["PYTHONPATH"] = str(self.checkout)
        env["BILLING_DATABASE_URL"] = self.database_url
        env["BILLING_LOG_LEVEL"] = "warning"
        env.update(self.extra)
        return env

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``billing`` command of the checkout on the same database."""
        return subprocess.run(
            [sys.executable, "-c", "from billing.cli import main; main()", *args],
            env=self._env(),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )

    def start(self) -> Server:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from billing.cli import main; main()",
                    "serve",
                    "--port",
                    str(self.port),
                ],
                env=self._env(),
                cwd=self.workdir,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"billing serve exited: {self.log.read_text()[-2000:]}")
            if get_status(self.port, "/healthz", timeout=1) == 200:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"billing serve did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK


def get_status(port: int, path: str, timeout: float = 5.0, host: str = "127.0.0.1") -> int | None:
    """The status of ``GET path`` on a new connection (None: no answer in time)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
            return status_of(read_some(sock))
    except OSError:
        return None


def read_some(sock: socket.socket, limit: int = 65536) -> bytes:
    """What the server answers, up to ``limit`` bytes or its close (b"" for none)."""
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < limit:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and _complete(data):
                break
    return data


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip() or 0)
    return False


def status_of(answer: bytes) -> int | None:
    parts = answer.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return None


@dataclass
class HealthProbe:
    """Another client: ``GET /healthz`` every ``every_s`` on a new connection, meanwhile."""

    port: int
    every_s: float = 0.05
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> HealthProbe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            status = get_status(self.port, "/healthz", timeout=5)
            if status == 200:
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
            else:
                self.failures += 1
            self._stop.wait(self.every_s)

    def summary(self) -> str:
        if not self.latencies_ms:
            return f"/healthz: no answer ({self.failures} failed)"
        ordered = sorted(self.latencies_ms)
        p50 = ordered[len(ordered) // 2]
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return (
            f"/healthz: {len(ordered)} answered, p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
            f"max {ordered[-1]:.1f} ms, {self.failures} failed"
        )


@contextlib.contextmanager
def measured(server: Server, name: str) -> Iterator[dict[str, Any]]:
    """Print the attack's figures: statuses (put in the yielded dict), server CPU and RSS."""
    figures: dict[str, Any] = {"statuses": Counter()}
    rss0, cpu0, t0 = server.rss_mb(), server.cpu_s(), time.monotonic()
    peak = [rss0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], server.rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with HealthProbe(server.port) as probe:
        yield figures
    stop.set()
    sampler.join()
    figures.update(
        cpu_s=server.cpu_s() - cpu0,
        rss_growth_mb=server.rss_mb() - rss0,
        rss_peak_growth_mb=peak[0] - rss0,
        wall_s=time.monotonic() - t0,
        health=probe,
    )
    print(f"\n== {name}")
    print(f"statuses: {dict(figures['statuses'])}")
    for key in ("cpu_s", "rss_growth_mb", "rss_peak_growth_mb", "wall_s"):
        print(f"{key}: {figures[key]:.2f}")
    shown = ("statuses", "cpu_s", "rss_growth_mb", "rss_peak_growth_mb", "wall_s", "health")
    for key, value in figures.items():
        if key not in shown:
            print(f"{key}: {value}")
    print(probe.summary())


def send_header(port: int, size: int) -> int | str:
    """One ``GET /healthz`` with a header of ``size`` bytes; the status or what happened."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
            chunk = b"a" * (1024 * 1024)
            sent = 0
            while sent < size:
                piece = chunk[: size - sent]
                sock.sendall(piece)
                sent += len(piece)
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass  # the server answered and closed early: read what it said
        return status_of(read_some(sock)) or "closed without an answer"


def send_body(port: int, path: str, size: int, headers: dict[str, str] | None = None) -> int | str:
    """One ``POST path`` declaring and sending ``size`` bytes of JSON-ish body."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n"
    head += f"Content-Length: {size}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        try:
            sock.sendall(head.encode())
            chunk = b" " * (256 * 1024)
            sent = 0
            while sent < size:
                piece = chunk[: size - sent]
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass
        return status_of(read_some(sock)) or "closed without an answer"


def hold_connections(port: int, idle: int, half: int, hold_s: float) -> dict[str, int]:
    """Open ``idle`` connections that send nothing and ``half`` that send half a request line;
    after ``hold_s``, how many the server closed (and answered)."""
    socks: list[tuple[str, socket.socket]] = []
    for i in range(idle + half):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i >= idle:
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: 127.0")
            socks.append(("half", sock))
        else:
            socks.append(("idle", sock))
    time.sleep(hold_s)
    counts: Counter[str] = Counter()
    for kind, sock in socks:
        sock.setblocking(False)
        try:
            data = sock.recv(65536)
            counts[f"{kind} closed" if data == b"" else f"{kind} answered {status_of(data)}"] += 1
        except BlockingIOError:
            counts[f"{kind} still open"] += 1
        except OSError:
            counts[f"{kind} reset"] += 1
        sock.close()
    return dict(counts)


def _event_batch(prefix: str, n: int) -> bytes:
    events = [
        {
            "event_id": f"{prefix}-{i}",
            "request_id": f"{prefix}-r{i}",
            "type": "stream.started",
            "occurred_at": "2026-10-15T08:00:00Z",
            "api_key_id": "key_attack",
            "model": "m",
            "protocol": "openai.responses",
        }
        for i in range(n)
    ]
    return json.dumps({"events": events}, separators=(",", ":")).encode()


def post_json(
    port: int, path: str, body: bytes, timeout: float, token: str | None = None
) -> tuple[int | str, float]:
    """``POST path`` with a JSON body on a new connection (with ``token`` as its bearer, if
    given): (status or error, seconds)."""
    started = time.monotonic()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(head + body)
            answer = read_some(sock)
    except OSError as error:
        return type(error).__name__, time.monotonic() - started
    return status_of(answer) or "no answer", time.monotonic() - started


def attack_header(checkout: Path, url: str | None, size: int) -> None:
    with Server(url, checkout) as server, measured(server, f"header of {size >> 20} MiB") as f:
        f["statuses"][send_header(server.port, size)] += 1


def attack_bodies(checkout: Path, url: str | None, count: int, size: int) -> None:
    server = Server(url, checkout)
    server.cli("tokens", "create", "--role", "admin")
    with server, measured(server, f"{count} x {size >> 20} MiB unauthenticated bodies") as f:
        lock = threading.Lock()

        def one() -> None:
            status = send_body(server.port, "/v1/prices", size)
            with lock:
                f["statuses"][status] += 1

        threads = [threading.Thread(target=one) for _ in range(count)]
        for i in range(0, count, 10):  # ten at a time
            batch = threads[i : i + 10]
            for thread in batch:
                thread.start()
            for thread in batch:
                thread.join()


def attack_idle(checkout: Path, url: str | None, count: int, hold_s: float) -> None:
    with (
        Server(url, checkout) as server,
        measured(server, f"{count} idle + {count} half-sent connections held {hold_s:g} s") as f,
    ):
        f["connections"] = hold_connections(server.port, count, count, hold_s)
        f["statuses"][get_status(server.port, "/healthz")] += 1


def attack_blackhole(checkout: Path, url: str, hold_s: float) -> None:
    sys.path.insert(0, str(ROOT))
    from sqlalchemy.engine import make_url

    from tests.tcp_proxy import TcpProxy

    target = make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        via = target.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        server = Server(via, checkout)
        server.cli("migrate")
        # the bodies attack made a token on this database: the posts here carry one of their own
        made = server.cli("tokens", "create", "--role", "ingest").stdout
        token = re.search(r"bt_[A-Za-z0-9_-]+", made)
        assert token is not None, made
        secret = token.group(0)
        with server, measured(server, f"database blackholed for {hold_s:g} s") as f:
            warm = post_json(server.port, "/v1/events", _event_batch("warm", 1), 30, secret)
            assert warm[0] == 200, warm
            proxy.blackhole()
            started = time.monotonic()
            answers: list[tuple[int | str, float]] = []
            lock = threading.Lock()
            threads = []
            n = 0
            while time.monotonic() - started < hold_s:

                def one(i: int = n) -> None:
                    answer = post_json(
                        server.port,
                        "/v1/events",
                        _event_batch(f"bh{i}", 10),
                        hold_s + 60,
                        secret,
                    )
                    with lock:
                        answers.append(answer)

                thread = threading.Thread(target=one)
                thread.start()
                threads.append(thread)
                n += 1
                time.sleep(0.5)
            proxy.resume()
            resumed = time.monotonic()
            after = _event_batch("after", 1)
            while post_json(server.port, "/v1/events", after, 30, secret)[0] != 200:
                if time.monotonic() - resumed > 120:
                    break
                time.sleep(0.2)
            f["recovered_after_resume_s"] = round(time.monotonic() - resumed, 2)
            for thread in threads:
                thread.join()
            for status, _ in answers:
                f["statuses"][status] += 1
            waits = sorted(seconds for _, seconds in answers)
            f["post_answer_s_p50_max"] = (
                (round(waits[len(waits) // 2], 2), round(waits[-1], 2)) if waits else None
            )
        text = server.log.read_text(errors="replace")
        print(f"serve log: {len(text.splitlines())} lines, {text.count('Traceback')} tracebacks")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file")
    parser.add_argument("--small", action="store_true", help="a smoke run at small sizes")
    parser.add_argument(
        "--only", default="header,bodies,idle,blackhole", help="comma-separated attacks"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    checkout = args.checkout.resolve()
    url = args.database_url
    print(f"checkout {checkout}, database {url or 'SQLite'}{' (small)' if args.small else ''}")
    if "header" in only:
        attack_header(checkout, url, (4 if args.small else 64) << 20)
    if "bodies" in only:
        attack_bodies(checkout, url, 10 if args.small else 100, 4 << 20)
    if "idle" in only:
        attack_idle(checkout, url, 50 if args.small else 500, 12.0 if args.small else 30.0)
    if "blackhole" in only:
        if url is None or not url.startswith("postgresql"):
            print(
                "\n== blackhole: skipped (PostgreSQL only: --database-url postgresql+psycopg://…)"
            )
        else:
            attack_blackhole(checkout, url, 8.0 if args.small else 45.0)


if __name__ == "__main__":
    main()
