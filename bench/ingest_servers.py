"""The servers of the ingest benchmark as subprocesses: ``billing serve`` and the HTTP ceiling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import free_port, tree_cpu_s

HERE = Path(__file__).resolve().parent


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become healthy")


def _wait_idle(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """Until the process tree uses under 5 % of a core over half a second: ``/healthz`` answers
    as soon as one worker is up, and the others' start-up (their imports, 0.4–0.6 s of CPU
    each) must not fall inside a measured window."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = tree_cpu_s(proc.pid)
        time.sleep(0.5)
        if tree_cpu_s(proc.pid) - before < 0.025:
            return


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    token: str | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _billing_env(url: str, reconciler: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["BILLING_DATABASE_URL"] = url
    env["BILLING_LOG_LEVEL"] = "warning"
    if not reconciler:
        env["BILLING_RECONCILE_INTERVAL_S"] = "86400"
    return env


def _billing_exe() -> str:
    exe = Path(sys.executable).with_name("billing")
    return str(exe) if exe.exists() else "billing"


@contextmanager
def billing_server(url: str, workers: int, reconciler: bool, cwd: str) -> Iterator[Server]:
    env = _billing_env(url, reconciler)
    created = subprocess.run(
        [_billing_exe(), "tokens", "create", "--role", "ingest", "--name", "bench"],
        env=env,
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    token = created.stdout.strip()
    port = free_port()
    proc = subprocess.Popen(
        [_billing_exe(), "serve", "--port", str(port), "--workers", str(workers)],
        env=env,
        cwd=cwd,
        stderr=subprocess.DEVNULL,
    )
    server = Server(proc, port, token)
    try:
        _wait_healthy(port, proc)
        _wait_idle(proc)
        yield server
    finally:
        server.stop()


@contextmanager
def ceiling_server(workers: int) -> Iterator[Server]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "ingest.py"),
            "--_ceiling-server",
            str(port),
            "--workers",
            str(workers),
        ],
        stderr=subprocess.DEVNULL,
    )
    server = Server(proc, port)
    try:
        _wait_healthy(port, proc)
        yield server
    finally:
        server.stop()
