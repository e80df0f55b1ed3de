"""The ingest benchmark's load generator, run in its own process (``ingest.py --_client``):
concurrent gateways posting lifecycles for a fixed time, with the acknowledgement latencies."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from common import percentile
from lifecycles import Lifecycles

HERE = Path(__file__).resolve().parent


async def _raw_worker(
    host: str, port: int, headers: bytes, gen: Lifecycles, size: int, state: dict[str, Any]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat: list[float] = state["lat"]
    try:
        while not state["stop"]:
            body = gen.body(size)
            request = headers + b"Content-Length: %d\r\n\r\n" % len(body) + body
            started = time.perf_counter()
            writer.write(request)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            reply = await reader.readexactly(length) if length else b""
            elapsed = time.perf_counter() - started
            status = int(status_line.split()[1]) if status_line else 0
            if not state["measuring"]:
                continue
            lat.append(elapsed)
            if status == 200 and orjson.loads(reply).get("accepted") == size:
                state["events"] += size
                state["requests"] += 1
            else:
                state["errors"] += 1
                if len(state["samples"]) < 5:
                    state["samples"].append(f"{status} {reply[:200]!r}")
    finally:
        writer.close()


async def _httpx_worker(
    client: Any,
    url: str,
    headers: dict[str, str],
    gen: Lifecycles,
    size: int,
    state: dict[str, Any],
) -> None:
    lat: list[float] = state["lat"]
    while not state["stop"]:
        body = gen.body(size)
        started = time.perf_counter()
        reply = await client.post(url, content=body, headers=headers)
        elapsed = time.perf_counter() - started
        if not state["measuring"]:
            continue
        lat.append(elapsed)
        if reply.status_code == 200 and reply.json().get("accepted") == size:
            state["events"] += size
            state["requests"] += 1
        else:
            state["errors"] += 1
            if len(state["samples"]) < 5:
                state["samples"].append(f"{reply.status_code} {reply.text[:200]}")


async def _load(config: dict[str, Any]) -> dict[str, Any]:
    host, port, size = config["host"], config["port"], config["size"]
    token = config.get("token")
    state: dict[str, Any] = {
        "stop": False,
        "measuring": False,
        "events": 0,
        "requests": 0,
        "errors": 0,
        "lat": [],
        "samples": [],
    }
    seed = config.get("seed", 1)
    workers = []
    client = None
    if config.get("client") == "httpx":
        import httpx

        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=config["concurrency"]), timeout=60
        )
        hdrs = {"Content-Type": "application/json"}
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        url = f"http://{host}:{port}/v1/events"
        for i in range(config["concurrency"]):
            gen = Lifecycles(seed * 1000 + i, inflight=max(8, min(64, size // 2 + 8)))
            workers.append(_httpx_worker(client, url, hdrs, gen, size, state))
    else:
        head = b"POST /v1/events HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n" % (
            host.encode(),
            port,
        )
        if token:
            head += b"Authorization: Bearer " + token.encode() + b"\r\n"
        for i in range(config["concurrency"]):
            gen = Lifecycles(seed * 1000 + i, inflight=max(8, min(64, size // 2 + 8)))
            workers.append(_raw_worker(host, port, head, gen, size, state))
    tasks = [asyncio.ensure_future(w) for w in workers]
    await asyncio.sleep(config["warmup"])
    state["measuring"] = True
    started = time.perf_counter()
    per_interval: list[tuple[float, int]] = []
    interval = config.get("report_every") or 0
    deadline = started + config["duration"]
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        step = min(deadline - now, interval or deadline - now)
        await asyncio.sleep(step)
        if interval:
            per_interval.append((round(time.perf_counter() - started, 1), state["events"]))
            print(json.dumps({"progress": per_interval[-1]}), file=sys.stderr, flush=True)
    state["measuring"] = False
    elapsed = time.perf_counter() - started
    state["stop"] = True
    done, pending = await asyncio.wait(tasks, timeout=30)
    for task in pending:
        task.cancel()
    for task in done:
        if task.exception() is not None and not state["samples"]:
            state["samples"].append(repr(task.exception()))
    if client is not None:
        await client.aclose()
    lat = sorted(state["lat"])
    return {
        "size": size,
        "concurrency": config["concurrency"],
        "events": state["events"],
        "requests": state["requests"],
        "errors": state["errors"],
        "error_samples": state["samples"],
        "seconds": elapsed,
        "events_per_s": state["events"] / elapsed,
        "p50_ms": percentile(lat, 0.50) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
        "progress": per_interval,
    }


def client_main(config: dict[str, Any]) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    result = asyncio.run(_load(config))
    print(json.dumps(result))


def run_client(config: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Run the load generator in its own process; returns its result."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "ingest.py"), "--_client", json.dumps(config)],
        check=False,
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
