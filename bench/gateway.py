"""The metered stream's CPU overhead (``billing.gateway``) against a plain relay, in one run.

Three FastAPI gateways, each in its own process, relay the same streams from the fake upstream
(``tests/fakes/upstream.py``, its own process): ``plain`` hands the upstream's bytes to a
``StreamingResponse`` as they come; ``response`` returns ``Meters.call(...).response(upstream)``
(the README's way: the tap, the progress events, the billing client posting to a sink in this
process); ``relay`` wraps the upstream in ``StreamingResponse(meter.relay(upstream))`` (the
generator form). Each metered gateway is measured beside a plain one, both at once under the
same load (``--streams`` concurrent clients each, from a client process of its own, reading
``--calls`` streams of ``--tokens`` output tokens), so that the machine's drift falls on both;
each gateway's CPU seconds (user + system, from ``/proc``) are read before and after. Reported:
CPU per call and per chunk of each, each metered form's overhead per call and per chunk, and that
overhead in % of its plain twin's CPU (target: under 5 % at 100 concurrent streams, for
``response``), in all and round by round.

    python bench/gateway.py                                   # the full run
    python bench/gateway.py --calls 200 --tokens 50 --streams 20   # a smoke run

With ``BENCH_GATEWAY_PROFILE=DIR`` each gateway process runs under ``cProfile`` and writes
``DIR/gateway-MODE.prof`` when it stops (a diagnosis aid: the
profiler's own cost inflates both CPU figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
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


MODES = ("plain", "response", "relay")


def gateway_app(mode: str, upstream: str, billing_url: str, protocol: str) -> FastAPI:
    """The gateway under test (one of :data:`MODES`), for ``protocol``'s path."""
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
        if mode == "response":
            return meter.response(response)
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


def _load_process(url: str, protocol: str, calls: int, streams: int, tag: str) -> int:
    return asyncio.run(load(url, protocol, calls, streams, tag))


def measure_pair(
    modes: tuple[str, str], upstream: str, sink: Sink, args: argparse.Namespace, round_no: int
) -> dict[str, float]:
    """The CPU seconds of two gateways (one per mode) under the same load at the same time,
    each from its own client process: whatever the machine does meanwhile, both bear it."""
    gateways = {mode: start_gateway(mode, upstream, sink.url, args.protocol) for mode in modes}
    spawn = multiprocessing.get_context("spawn")  # no fork of this process's threads
    try:
        with ProcessPoolExecutor(len(modes), mp_context=spawn) as pool:

            def run(calls: int, tag: str) -> None:
                futures = [
                    pool.submit(_load_process, url, args.protocol, calls, args.streams, tag + m)
                    for m, (_, url) in gateways.items()
                ]
                for future in futures:
                    future.result()

            run(min(args.streams, args.calls), f"warm{round_no}-")
            time.sleep(1.5)  # the billing client's flush of the warm-up
            cpu0 = {m: tree_cpu_s(proc.pid) for m, (proc, _) in gateways.items()}
            run(args.calls, f"r{round_no}-")
            time.sleep(1.5)  # the last events are posted (part of the metered cost)
            return {m: tree_cpu_s(proc.pid) - cpu0[m] for m, (proc, _) in gateways.items()}
    finally:
        for proc, _ in gateways.values():
            proc.terminate()
        for proc, _ in gateways.values():
            proc.wait(20)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="billing.gateway's overhead against a relay")
    parser.add_argument("--calls", type=int, default=1000, help="streams per gateway and round")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per stream")
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--delay-s", type=float, default=0.01, help="upstream s per chunk")
    parser.add_argument("--rounds", type=int, default=3, help="turns of the three gateways")
    parser.add_argument("--protocol", choices=list(PATHS), default="openai.chat_completions")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    parser.add_argument("--_serve", choices=MODES, help=argparse.SUPPRESS)
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
    upstream_settings = {
        "total": args.tokens,
        "tokens_per_chunk": args.tokens_per_chunk,
        "delay_s": args.delay_s,
    }
    metered_modes = MODES[1:]
    # per metered mode: its CPU and its paired plain relay's, summed over the rounds
    totals = {mode: {"plain": 0.0, mode: 0.0} for mode in metered_modes}
    per_round: list[dict[str, float]] = []
    with FakeUpstreamProcess(**upstream_settings) as fake, Sink() as sink:
        for round_no in range(args.rounds):
            figures: dict[str, float] = {}
            for mode in metered_modes:
                pair = measure_pair(("plain", mode), fake.url, sink, args, round_no)
                totals[mode]["plain"] += pair["plain"]
                totals[mode][mode] += pair[mode]
                figures[mode] = round((pair[mode] - pair["plain"]) / pair["plain"] * 100, 2)
            per_round.append(figures)
        events = sink.events
    calls = args.calls * args.rounds
    chunks = calls * chunks_per_call
    report: dict[str, Any] = {
        "machine": machine(),
        "load_average": load_average(),
        "protocol": args.protocol,
        "streams": args.streams,
        "calls_per_gateway": calls,
        "chunks_per_call": chunks_per_call,
        "billing_events_posted": events,
        "target_pct": TARGET_OVERHEAD_PCT,
        "rounds_overhead_pct": per_round,
    }
    for mode in metered_modes:
        plain, cpu = totals[mode]["plain"], totals[mode][mode]
        overhead = cpu - plain
        report[mode] = {
            "plain_cpu_s": round(plain, 3),
            "cpu_s": round(cpu, 3),
            "plain_us_per_chunk": round(plain / chunks * 1e6, 2),
            "us_per_chunk": round(cpu / chunks * 1e6, 2),
            "overhead_us_per_chunk": round(overhead / chunks * 1e6, 2),
            "overhead_us_per_call": round(overhead / calls * 1e6, 1),
            "overhead_pct": round(overhead / plain * 100, 2) if plain else None,
        }
    if args.json:
        print(json.dumps(report))
        return
    print(f"billing.gateway overhead - {report['machine']}, load {report['load_average']:.2f}")
    print(
        f"{args.protocol}: {calls} calls of {chunks_per_call} chunks per gateway, "
        f"{args.streams} concurrent streams each, {events} billing events posted"
    )
    print(f"{'':>18} {'CPU s':>8} {'us/chunk':>9} {'us/call':>8}")
    for mode in metered_modes:
        figures = report[mode]
        for name, cpu in ((f"plain (w/ {mode})", figures["plain_cpu_s"]), (mode, figures["cpu_s"])):
            print(f"{name:>18} {cpu:8.2f} {cpu / chunks * 1e6:9.2f} {cpu / calls * 1e6:8.0f}")
        print(
            f"{'overhead':>18} {figures['cpu_s'] - figures['plain_cpu_s']:8.2f} "
            f"{figures['overhead_us_per_chunk']:9.2f} {figures['overhead_us_per_call']:8.0f}"
            f"   = {figures['overhead_pct']} % of the plain relay"
        )
    rounds = "; ".join(", ".join(f"{m} {pct} %" for m, pct in r.items()) for r in per_round)
    print(f"overhead by round: {rounds}")
    print(f"target: response overhead < {TARGET_OVERHEAD_PCT} % of the plain relay's CPU")


if __name__ == "__main__":
    main()
