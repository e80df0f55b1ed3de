"""The metered stream's CPU overhead (``billing.gateway``) against a plain relay, in one run.

Two FastAPI gateways, each in its own process, relay the same streams from the fake upstream
(``tests/fakes/upstream.py``, its own process): ``plain`` hands the upstream's bytes to a
``StreamingResponse`` as they come, ``metered`` does the same through ``Meters.call(...).relay``
(the tap, the progress events, the billing client posting to a sink in this process). The load
(``--streams`` concurrent clients reading ``--calls`` streams of ``--tokens`` output tokens each)
is sent to one gateway, then the other; each gateway's CPU seconds (user + system, from
``/proc``) are read before and after. Reported: CPU per call and per chunk of both, the
metered stream's overhead per call and per chunk, and that overhead in % of the plain relay's
CPU (target: under 5 % at 100 concurrent streams).

    python bench/gateway.py                                   # the full run
    python bench/gateway.py --calls 200 --tokens 50 --streams 20   # a smoke run

With ``BENCH_GATEWAY_PROFILE=DIR`` each gateway process runs under ``cProfile`` and writes
``DIR/gateway-plain.prof`` / ``DIR/gateway-metered.prof`` when it stops (a diagnosis aid: the
profiler's own cost inflates both CPU figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
from common import free_port, load_average, machine, tree_cpu_s
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from billing.client import AsyncBillingClient  # noqa: E402
from billing.gateway import Meters  # noqa: E402
from tests.fakes.upstream import FakeUpstream, FakeUpstreamProcess  # noqa: E402

TARGET_OVERHEAD_PCT = 5.0
PATHS = {
    "openai.chat_completions": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
}


def gateway_app(mode: str, upstream: str, billing_url: str, protocol: str) -> FastAPI:
    """The gateway under test: ``plain`` or ``metered``, for ``protocol``'s path."""
    http = httpx.AsyncClient(
        base_url=upstream,
        timeout=60,
        limits=httpx.Limits(max_connections=1000, keepalive_expiry=2),
    )
    billing = AsyncBillingClient(billing_url, token=None)
    meters = Meters(billing)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await billing.close(5)
        await http.aclose()

    app = FastAPI(lifespan=lifespan)

    async def plain(response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    @app.post(PATHS[protocol])
    async def relay(request: Request) -> Response:
        body = await request.json()
        rid = request.headers["x-request-id"]
        upstream_request = http.build_request(
            "POST", PATHS[protocol], json=body, headers={"X-Request-Id": rid}
        )
        response = await http.send(upstream_request, stream=True)
        if mode == "plain":
            return StreamingResponse(plain(response), media_type="text/event-stream")
        meter = meters.call(request_id=rid, api_key_id="key_bench", model="m", protocol=protocol)
        return StreamingResponse(meter.relay(response), media_type="text/event-stream")

    @app.get("/_ready")
    async def ready() -> Response:
        return JSONResponse({"ok": True})

    return app


class Sink:
    """A billing service stand-in in this process: answers every post as accepted."""

    def __init__(self) -> None:
        self.events = 0

        async def events(request: Request) -> Response:
            n = len(orjson.loads(await request.body())["events"])
            self.events += n
            return JSONResponse({"accepted": n, "duplicates": 0})

        app = FastAPI()
        app.post("/v1/events")(events)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Sink:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def start_gateway(mode: str, upstream: str, billing: str, protocol: str) -> tuple[Any, str]:
    port = free_port()
    args = [sys.executable, __file__, "--_serve", mode, "--port", str(port)]
    args += ["--upstream", upstream, "--billing", billing, "--protocol", protocol]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url + "/_ready", timeout=1)
            return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} gateway did not start") from None
            time.sleep(0.1)


async def load(url: str, protocol: str, calls: int, streams: int, tag: str) -> int:
    """``calls`` streams through ``url``, ``streams`` at a time; returns the bytes read."""
    body: dict[str, Any] = {"model": "m", "stream": True}
    if protocol == "openai.chat_completions":
        body["stream_options"] = {"include_usage": True}
    # a connection per stream: no request races a server's close of an idle connection
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=0)
    total = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(calls):
        queue.put_nowait(i)

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal total
        while not queue.empty():
            i = queue.get_nowait()
            headers = {"X-Request-Id": f"{tag}-{i}"}
            async with http.stream("POST", url + PATHS[protocol], json=body, headers=headers) as r:
                async for chunk in r.aiter_raw():
                    total += len(chunk)

    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(worker(http) for _ in range(streams)))
    return total


def measure(
    mode: str, upstream: str, sink: Sink, args: argparse.Namespace, round_no: int
) -> dict[str, float]:
    proc, url = start_gateway(mode, upstream, sink.url, args.protocol)
    try:
        asyncio.run(load(url, args.protocol, min(args.streams, args.calls), args.streams, "warm"))
        time.sleep(1.5)  # the billing client's flush of the warm-up
        cpu0, t0 = tree_cpu_s(proc.pid), time.monotonic()
        read = asyncio.run(load(url, args.protocol, args.calls, args.streams, f"{mode}{round_no}"))
        wall = time.monotonic() - t0
        time.sleep(1.5)  # the last events are posted (part of the metered cost)
        cpu = tree_cpu_s(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(20)
    return {"cpu_s": cpu, "wall_s": wall, "bytes": read}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="billing.gateway's overhead against a relay")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per stream")
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--delay-s", type=float, default=0.01, help="upstream s per chunk")
    parser.add_argument("--rounds", type=int, default=2, help="plain/metered alternations")
    parser.add_argument("--protocol", choices=list(PATHS), default="openai.chat_completions")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    parser.add_argument("--_serve", choices=["plain", "metered"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--billing", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._serve:
        app = gateway_app(args._serve, args.upstream, args.billing, args.protocol)
        profile_dir = os.environ.get("BENCH_GATEWAY_PROFILE")  # a diagnosis aid, off by default
        if not profile_dir:
            uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
            return
        import cProfile
        import signal

        # uvicorn re-raises the SIGTERM it caught once it has shut down: end the profile then
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        profiler = cProfile.Profile()
        try:
            profiler.runcall(
                uvicorn.run, app, host="127.0.0.1", port=args.port, log_level="warning"
            )
        finally:
            profiler.dump_stats(str(Path(profile_dir) / f"gateway-{args._serve}.prof"))
        return

    chunks_per_call = len(
        FakeUpstream.frames(
            args.protocol, total=args.tokens, tokens_per_chunk=args.tokens_per_chunk
        )
    )
    totals = {"plain": {"cpu_s": 0.0, "wall_s": 0.0}, "metered": {"cpu_s": 0.0, "wall_s": 0.0}}
    upstream_settings = {
        "total": args.tokens,
        "tokens_per_chunk": args.tokens_per_chunk,
        "delay_s": args.delay_s,
    }
    with FakeUpstreamProcess(**upstream_settings) as fake, Sink() as sink:
        for round_no in range(args.rounds):
            for mode in ("plain", "metered"):
                result = measure(mode, fake.url, sink, args, round_no)
                totals[mode]["cpu_s"] += result["cpu_s"]
                totals[mode]["wall_s"] += result["wall_s"]
        events = sink.events
    calls = args.calls * args.rounds
    chunks = calls * chunks_per_call
    plain, metered = totals["plain"]["cpu_s"], totals["metered"]["cpu_s"]
    overhead = metered - plain
    report = {
        "machine": machine(),
        "load_average": load_average(),
        "protocol": args.protocol,
        "streams": args.streams,
        "calls": calls,
        "chunks_per_call": chunks_per_call,
        "plain_cpu_s": round(plain, 3),
        "metered_cpu_s": round(metered, 3),
        "plain_us_per_chunk": round(plain / chunks * 1e6, 2),
        "metered_us_per_chunk": round(metered / chunks * 1e6, 2),
        "overhead_us_per_chunk": round(overhead / chunks * 1e6, 2),
        "overhead_us_per_call": round(overhead / calls * 1e6, 1),
        "overhead_pct": round(overhead / plain * 100, 2) if plain else None,
        "target_pct": TARGET_OVERHEAD_PCT,
        "billing_events_posted": events,
    }
    if args.json:
        print(json.dumps(report))
        return
    print(f"billing.gateway overhead - {report['machine']}, load {report['load_average']:.2f}")
    print(
        f"{args.protocol}: {calls} calls of {chunks_per_call} chunks, "
        f"{args.streams} concurrent streams, {events} billing events posted"
    )
    print(f"{'':>10} {'CPU s':>9} {'us/chunk':>9} {'us/call':>9}")
    for mode, cpu in (("plain", plain), ("metered", metered)):
        print(f"{mode:>10} {cpu:9.2f} {cpu / chunks * 1e6:9.2f} {cpu / calls * 1e6:9.0f}")
    print(
        f"{'overhead':>10} {overhead:9.2f} {report['overhead_us_per_chunk']:9.2f} "
        f"{report['overhead_us_per_call']:9.0f}   = {report['overhead_pct']} % of the relay "
        f"(target < {TARGET_OVERHEAD_PCT} %)"
    )


if __name__ == "__main__":
    main()
