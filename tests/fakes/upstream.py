"""A fake streaming LLM upstream on 127.0.0.1 that keeps generating after its client leaves.

It serves, with ``"stream": true``, the three protocols of CONTRACT.md "Background" in their
documented SSE shapes:

* ``POST /v1/chat/completions``: ``chat.completion.chunk`` objects (a first chunk with the
  ``role``, one ``content`` delta per chunk, a chunk with ``finish_reason``), then, when the
  request asks for ``stream_options.include_usage``, a chunk with ``"choices": []`` and
  ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``), then ``data: [DONE]``;
* ``POST /v1/responses``: ``response.created``, ``response.output_item.added``,
  ``response.content_part.added``, ``response.output_text.delta`` per chunk, the ``.done``
  events and ``response.completed`` with ``response.usage`` (``input_tokens``,
  ``output_tokens`` and their details);
* ``POST /v1/messages``: ``message_start`` (``usage.input_tokens``, ``output_tokens: 1``),
  ``content_block_start``, ``ping``, ``content_block_delta`` (``text_delta``) per chunk,
  ``content_block_stop``, ``message_delta`` (``usage.output_tokens``: the cumulative count) and
  ``message_stop``.

Without ``"stream": true`` it answers the whole response object of the protocol instead (a
``chat.completion``, a Responses ``response``, an Anthropic ``message``) with the same usage.
Every answer carries the provider's headers a gateway passes on: ``x-request-id`` (``req_`` and
the call's id) and ``x-ratelimit-remaining-requests``.

Like a real provider, generation runs in its own task, independent of the connection: when the
client disconnects the model goes on until the request's total, and every generated token is
recorded (what the provider would bill). :attr:`FakeUpstream.records` maps the request's id
(header ``X-Request-Id``: the call's id a gateway passes on; else the body's ``user`` /
``metadata.user_id``, else a new one) to one :class:`Generation` per upstream request (a
retried call has several).

Per-request settings, as headers, or in the body's ``x_fake`` object by the constructor's names
(``{"x_fake": {"total": 300}}``: what a gateway passes on untouched); defaults from the
constructor:

* ``X-Fake-Total``: output tokens to generate (int);
* ``X-Fake-Tokens-Per-Chunk``: tokens per content chunk (int; each token is the text ``" t"``);
* ``X-Fake-Delay-S``: seconds between two chunks (float);
* ``X-Fake-Input``: the prompt's input tokens reported in the usage (int);
* ``X-Fake-Stall-After``: stop sending (and generating) after this many tokens, keeping the
  connection open: a stalled upstream (``0``: before its first byte).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["FakeUpstream", "FakeUpstreamProcess", "Generation"]

TOKEN_TEXT = " t"


@dataclass
class Generation:
    """What the fake model generated for one upstream request (counts in tokens)."""

    request_id: str
    protocol: str
    total: int
    input_tokens: int
    generated: int = 0  # output tokens produced so far
    sent_chunks: int = 0  # content chunks the connection accepted
    finished: bool = False  # generation reached its end (total, or the stall point)
    client_left: bool = False  # the connection went away before the end
    body: dict[str, Any] = field(default_factory=dict, repr=False)  # the request's body
    done: threading.Event = field(default_factory=threading.Event, repr=False)


_SSE_END = object()


def _sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    body = data if isinstance(data, str) else orjson.dumps(data).decode()
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n".encode()


class _Shapes:
    """The SSE frames of one protocol: ``head`` before the content, ``chunk`` per content piece,
    ``tail`` with the final usage."""

    def __init__(self, protocol: str, model: str, gen: Generation, include_usage: bool) -> None:
        self.protocol, self.model, self.gen, self.include_usage = (
            protocol,
            model,
            gen,
            include_usage,
        )
        self.id = uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.seq = itertools.count()

    def head(self) -> list[bytes]:
        if self.protocol == "openai.chat_completions":
            return [self._chat({"role": "assistant", "content": ""}, None)]
        if self.protocol == "openai.responses":
            item = {"id": f"msg_{self.id}", "type": "message", "role": "assistant", "content": []}
            return [
                self._resp("response.created", response=self._response("in_progress")),
                self._resp("response.output_item.added", output_index=0, item=item),
                self._resp(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                ),
            ]
        start = {
            "type": "message_start",
            "message": {
                "id": f"msg_{self.id}",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": self.model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.gen.input_tokens, "output_tokens": 1},
            },
        }
        block = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        return [
            _sse(start, "message_start"),
            _sse(block, "content_block_start"),
            _sse({"type": "ping"}, "ping"),
        ]

    def chunk(self, text: str) -> bytes:
        if self.protocol == "openai.chat_completions":
            return self._chat({"content": text}, None)
        if self.protocol == "openai.responses":
            return self._resp(
                "response.output_text.delta",
                item_id=f"msg_{self.id}",
                output_index=0,
                content_index=0,
                delta=text,
            )
        delta = {"type": "content_block_delta", "index": 0}
        delta["delta"] = {"type": "text_delta", "text": text}
        return _sse(delta, "content_block_delta")

    def tail(self) -> list[bytes]:
        n = self.gen.generated
        if self.protocol == "openai.chat_completions":
            frames = [self._chat({}, "stop")]
            if self.include_usage:
                frames.append(self._chat_frame([], self._chat_usage(n)))
            return [*frames, _sse("[DONE]")]
        if self.protocol == "openai.responses":
            text = TOKEN_TEXT * n
            item_id = f"msg_{self.id}"
            done = self._completed(n)
            item = done["output"][0]
            part = item["content"][0]
            return [
                self._resp(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    text=text,
                ),
                self._resp(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    part=part,
                ),
                self._resp("response.output_item.done", output_index=0, item=item),
                self._resp("response.completed", response=done),
            ]
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": n},
        }
        return [
            _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            _sse(delta, "message_delta"),
            _sse({"type": "message_stop"}, "message_stop"),
        ]

    def whole(self) -> dict[str, Any]:
        """The non-streaming response object, of ``gen.total`` output tokens."""
        n, inp = self.gen.total, self.gen.input_tokens
        text = TOKEN_TEXT * n
        if self.protocol == "openai.chat_completions":
            message = {"role": "assistant", "content": text, "refusal": None}
            return {
                "id": f"chatcmpl-{self.id}",
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": self._chat_usage(n),
            }
        if self.protocol == "openai.responses":
            return self._completed(n)
        return {
            "id": f"msg_{self.id}",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": self.model,
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": inp, "output_tokens": n},
        }

    def _chat_usage(self, n: int) -> dict[str, Any]:
        """A Chat Completions usage of ``n`` output tokens."""
        inp = self.gen.input_tokens
        return {
            "prompt_tokens": inp,
            "completion_tokens": n,
            "total_tokens": inp + n,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    def _completed(self, n: int) -> dict[str, Any]:
        """The ``completed`` response object of ``n`` output tokens, with its output and usage."""
        inp = self.gen.input_tokens
        part = {"type": "output_text", "text": TOKEN_TEXT * n, "annotations": []}
        response = self._response("completed")
        response["output"] = [
            {"id": f"msg_{self.id}", "type": "message", "role": "assistant", "content": [part]}
        ]
        response["usage"] = {
            "input_tokens": inp,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": inp + n,
        }
        return response

    def _chat_frame(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> bytes:
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-{self.id}",
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return _sse(chunk)

    def _chat(self, delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self._chat_frame([choice], None)

    def _response(self, status: str) -> dict[str, Any]:
        return {
            "id": f"resp_{self.id}",
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": [],
            "usage": None,
        }

    def _resp(self, kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, "sequence_number": next(self.seq), **fields}, kind)


_HEADERS = {
    "total": "x-fake-total",
    "tokens_per_chunk": "x-fake-tokens-per-chunk",
    "delay_s": "x-fake-delay-s",
    "input_tokens": "x-fake-input",
}
_ROUTES = {
    "/v1/chat/completions": "openai.chat_completions",
    "/v1/responses": "openai.responses",
    "/v1/messages": "anthropic.messages",
}


class FakeUpstream:
    """The fake upstream, served by uvicorn in a thread of this process (a context manager).

    Args:
        total: output tokens per request (``X-Fake-Total`` overrides it).
        tokens_per_chunk: tokens per content chunk.
        delay_s: seconds between two content chunks.
        input_tokens: input tokens the usage reports.
        host: where to listen (loopback).
    """

    def __init__(
        self,
        *,
        total: int = 40,
        tokens_per_chunk: int = 1,
        delay_s: float = 0.005,
        input_tokens: int = 12,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.defaults = {
            "total": total,
            "tokens_per_chunk": tokens_per_chunk,
            "delay_s": delay_s,
            "input_tokens": input_tokens,
        }
        self.records: dict[str, list[Generation]] = {}
        #: When set, every request is answered with this status and an OpenAI error body, before
        #: a byte of stream (an upstream that fails before a byte); it is recorded all the same.
        self.fail_status: int | None = None
        self._lock = threading.Lock()
        self.host = host
        routes = [Route(p, self._handle, methods=["POST"]) for p in _ROUTES]
        routes.append(Route("/_fake/records", self._records, methods=["GET"]))
        app = Starlette(routes=routes)
        self._config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            # longer than a gateway keeps an idle connection: no request races the server's close
            timeout_keep_alive=60,
        )
        self._server = uvicorn.Server(self._config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="fake-upstream")
        self.port = 0

    @property
    def url(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``)."""
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake upstream did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @staticmethod
    def frames(
        protocol: str,
        *,
        total: int,
        tokens_per_chunk: int = 1,
        input_tokens: int = 12,
        model: str = "fake-model",
    ) -> list[bytes]:
        """The whole SSE body the fake sends for one request of ``protocol``, as frames, with no
        server (Chat Completions with ``include_usage``)."""
        gen = Generation("frames", protocol, total, input_tokens)
        shapes = _Shapes(protocol, model, gen, include_usage=True)
        frames = shapes.head()
        while gen.generated < total:
            n = min(tokens_per_chunk, total - gen.generated)
            gen.generated += n
            frames.append(shapes.chunk(TOKEN_TEXT * n))
        return frames + shapes.tail()

    # -- what the tests read -------------------------------------------------------------

    def requests(self, request_id: str) -> int:
        """Upstream requests made for the call ``request_id`` (0: the upstream was never
        called)."""
        with self._lock:
            return len(self.records.get(request_id, []))

    def generated(self, request_id: str) -> int:
        """Output tokens generated for the call ``request_id``, over all its upstream requests."""
        with self._lock:
            return sum(g.generated for g in self.records.get(request_id, []))

    def wait_finished(self, request_ids: list[str], timeout: float = 30.0) -> None:
        """Block until every upstream request of these calls has finished generating.

        Raises:
            TimeoutError: one did not finish in time.
        """
        deadline = time.monotonic() + timeout
        for rid in request_ids:
            while True:
                with self._lock:
                    gens = list(self.records.get(rid, []))
                if gens and all(g.done.wait(max(0.0, deadline - time.monotonic())) for g in gens):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"upstream request {rid} did not finish")
                time.sleep(0.01)

    # -- serving ---------------------------------------------------------------------------

    async def _records(self, request: Request) -> Response:
        """``GET /_fake/records``: ``{request_id: [{"generated", "finished", "client_left",
        "sent_chunks"}, ...]}`` (for a fake in another process, :class:`FakeUpstreamProcess`)."""
        with self._lock:
            data = {
                rid: [
                    {
                        "generated": g.generated,
                        "finished": g.finished,
                        "client_left": g.client_left,
                        "sent_chunks": g.sent_chunks,
                    }
                    for g in gens
                ]
                for rid, gens in self.records.items()
            }
        return JSONResponse(data)

    async def _handle(self, request: Request) -> Response:
        protocol = _ROUTES[request.url.path]
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return JSONResponse({"error": {"message": "body is not JSON"}}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "body is not an object"}}, 400)
        h = request.headers

        fake = body.get("x_fake")
        in_body: dict[str, Any] = fake if isinstance(fake, dict) else {}

        def settings(name: str, kind: Callable[[str], Any]) -> Any:
            return kind(h.get(_HEADERS[name], str(in_body.get(name, self.defaults[name]))))

        rid = h.get("x-request-id") or _body_user(body) or f"up-{uuid.uuid4().hex}"
        stall = h.get("x-fake-stall-after")
        gen = Generation(
            rid, protocol, settings("total", int), settings("input_tokens", int), body=body
        )
        with self._lock:
            self.records.setdefault(rid, []).append(gen)
        if self.fail_status is not None:
            gen.finished = True
            gen.done.set()
            error = {"message": "the fake upstream fails", "type": "server_error", "code": None}
            return JSONResponse({"error": error}, status_code=self.fail_status)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        shapes = _Shapes(protocol, str(body.get("model", "fake-model")), gen, include_usage)
        headers = {"x-request-id": f"req_{rid}", "x-ratelimit-remaining-requests": "99"}
        if body.get("stream") is not True:
            with self._lock:
                gen.generated = gen.total
            gen.finished = True
            gen.done.set()
            return JSONResponse(shapes.whole(), headers=headers)
        queue: asyncio.Queue[object] = asyncio.Queue()
        task = asyncio.get_running_loop().create_task(
            self._generate(
                gen,
                shapes,
                queue,
                per_chunk=settings("tokens_per_chunk", int),
                delay_s=settings("delay_s", float),
                stall_after=None if stall is None else int(stall),
            )
        )
        return StreamingResponse(
            _drain_queue(queue, gen, task), media_type="text/event-stream", headers=headers
        )

    async def _generate(
        self,
        gen: Generation,
        shapes: _Shapes,
        queue: asyncio.Queue[object],
        *,
        per_chunk: int,
        delay_s: float,
        stall_after: int | None,
    ) -> None:
        """The model: produces every token of the request, whether or not anyone reads them."""
        try:
            if stall_after == 0:
                return  # stalled before the first byte
            for frame in shapes.head():
                queue.put_nowait(frame)
            limit = gen.total if stall_after is None else min(gen.total, stall_after)
            while gen.generated < limit:
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                n = min(per_chunk, limit - gen.generated)
                with self._lock:
                    gen.generated += n
                queue.put_nowait(shapes.chunk(TOKEN_TEXT * n))
            if stall_after is not None and stall_after < gen.total:
                return  # stalled: nothing more is sent, the connection stays open
            for frame in shapes.tail():
                queue.put_nowait(frame)
            queue.put_nowait(_SSE_END)
        finally:
            gen.finished = True
            gen.done.set()


async def _drain_queue(
    queue: asyncio.Queue[object], gen: Generation, task: asyncio.Task[None]
) -> AsyncIterator[bytes]:
    try:
        while True:
            frame = await queue.get()
            if frame is _SSE_END:
                return
            assert isinstance(frame, bytes)
            yield frame
            gen.sent_chunks += 1
    finally:
        if not task.done():
            gen.client_left = True  # the generation task goes on to its end regardless


def _body_user(body: dict[str, Any]) -> str | None:
    user = body.get("user")
    if isinstance(user, str) and user:
        return user
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        return str(metadata["user_id"])
    return None


class FakeUpstreamProcess:
    """The fake upstream in a process of its own (``python -m tests.fakes.upstream``), so that
    its work does not share the test process's interpreter; the same reading methods, over
    ``GET /_fake/records``. Arguments as :class:`FakeUpstream`."""

    def __init__(self, **settings: Any) -> None:
        self._settings = settings
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> FakeUpstreamProcess:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        args = [sys.executable, "-m", "tests.fakes.upstream", "--port", str(port)]
        for name, value in self._settings.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        root = Path(__file__).resolve().parents[2]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        }
        self._proc = subprocess.Popen(args, cwd=root, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/_fake/records", timeout=1)
                return self
            except httpx.HTTPError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the fake upstream process did not start") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """Per request id, one dict per upstream request (see ``GET /_fake/records``)."""
        data: dict[str, list[dict[str, Any]]] = httpx.get(self.url + "/_fake/records").json()
        return data

    def generated(self, request_id: str) -> int:
        """Output tokens generated for the call, over all its upstream requests."""
        return sum(g["generated"] for g in self.records().get(request_id, []))

    def wait_finished(self, request_ids: list[str], timeout: float = 30.0) -> None:
        """Block until every upstream request of these calls finished generating.

        Raises:
            TimeoutError: one did not finish in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            records = self.records()
            gens = [records.get(rid) for rid in request_ids]
            if all(g and all(x["finished"] for x in g) for g in gens):
                return
            if time.monotonic() > deadline:
                raise TimeoutError("upstream requests did not finish")
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.fakes.upstream --port P [--total N] [--tokens-per-chunk K]
    [--delay-s S] [--input-tokens I]``: serve the fake until terminated."""
    parser = argparse.ArgumentParser(description="the fake streaming upstream")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--total", type=int, default=40)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--delay-s", type=float, default=0.005)
    parser.add_argument("--input-tokens", type=int, default=12)
    args = parser.parse_args(argv)
    fake = FakeUpstream(
        total=args.total,
        tokens_per_chunk=args.tokens_per_chunk,
        delay_s=args.delay_s,
        input_tokens=args.input_tokens,
        port=args.port,
    )
    fake._server.run()  # uvicorn stops on SIGTERM


if __name__ == "__main__":
    main()
