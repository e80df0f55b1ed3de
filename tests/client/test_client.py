"""billing.client against the real service: real uvicorn, real HTTP, real database.

Two kinds of server: the app in a uvicorn thread of this process (wrapped by :class:`Recorder`,
which records every ``POST /v1/events`` and can fail the first ones), and ``billing serve`` as a
subprocess (:class:`ServeProcess`) for the tests that kill the service mid-run and restart it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from billing.client import (
    AsyncBillingClient,
    BillingClient,
    ClientClosedError,
    DeliveryError,
    new_event_id,
    utc_now,
)
from billing.client.delivery import Post as _Post
from billing.client.delivery import Sleep as _Sleep
from billing.client.engine import Engine as _Engine
from billing.client.spool import Item as _Item
from billing.server.app import create_app
from billing.settings import Settings
from tests.conftest import LiveServer, _free_port

ROOT = Path(__file__).resolve().parents[2]


# -- helpers -------------------------------------------------------------------------------------


def tokens_event(request_id: str, n: int) -> dict[str, Any]:
    """A valid ``stream.tokens`` event without ``event_id`` / ``occurred_at`` (the client fills
    them in)."""
    return {
        "request_id": request_id,
        "type": "stream.tokens",
        "output_tokens_generated": n,
        "output_tokens_delivered": n,
    }


def stored_event_ids(db_url: str) -> list[str]:
    """Every ``event_id`` row in the events table (duplicates would show twice)."""
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [row[0] for row in conn.execute(text("SELECT event_id FROM events"))]
    finally:
        engine.dispose()


def assert_stored_once(db_url: str, ids: list[str]) -> None:
    stored = stored_event_ids(db_url)
    assert len(stored) == len(set(stored)), "an event is stored twice"
    assert set(stored) == set(ids)
    assert len(stored) == len(ids)


@dataclass
class Post:
    status: int
    event_ids: list[str]


class Recorder:
    """ASGI middleware around the app: records each ``POST /v1/events`` (status and event ids).

    ``fail_before``: the first N posts are answered ``503`` with ``Retry-After: 0`` without
    reaching the app (nothing stored). ``fail_after``: the next N posts reach the app (and are
    stored), but the client gets a ``502`` instead of the app's answer (a lost answer).
    """

    def __init__(self, app: ASGIApp, *, fail_before: int = 0, fail_after: int = 0) -> None:
        self.app = app
        self.fail_before = fail_before
        self.fail_after = fail_after
        self.posts: list[Post] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/events"
        ):
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        ids = [event.get("event_id") for event in json.loads(body)["events"]]
        with self._lock:
            number = len(self.posts)
            post = Post(0, ids)
            self.posts.append(post)
        delivered = False

        async def replay_receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if number < self.fail_before:
            post.status = 503
            await _respond(send, 503, {"error": "injected"}, {"retry-after": "0"})
            return
        swallow = number < self.fail_before + self.fail_after

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                post.status = 502 if swallow else message["status"]
            if not swallow:
                await send(message)

        await self.app(scope, replay_receive, capture)
        if swallow:
            await _respond(send, 502, {"error": "injected after storing"}, {})

    def sizes(self) -> list[int]:
        return [len(post.event_ids) for post in self.posts]


async def _respond(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    raw = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    head += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": raw})


@pytest.fixture
def recorder(settings: Settings) -> Recorder:
    return Recorder(create_app(settings))


@pytest.fixture
def served(recorder: Recorder) -> Iterator[LiveServer]:
    with LiveServer(recorder) as server:  # type: ignore[arg-type]
        yield server


class ServeProcess:
    """``billing serve`` as a subprocess on ``port``, on the database ``db_url``."""

    def __init__(self, db_url: str, workdir: Path, port: int | None = None) -> None:
        self.db_url = db_url
        self.workdir = workdir
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / f"serve-{self.port}.log"
        self.starts = 0

    def start(self, wait: bool = True) -> None:
        env = dict(os.environ)
        env["BILLING_DATABASE_URL"] = self.db_url
        env["BILLING_LOG_LEVEL"] = "warning"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.starts += 1
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
                env=env,
                cwd=self.workdir,
                stdout=log,
                stderr=log,
            )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"billing serve exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"billing serve did not start: {self.log.read_text()[-2000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Iterator[ServeProcess]:
    with ServeProcess(db_url, tmp_path) as process:
        yield process


# -- the event itself (no service needed) --------------------------------------------------------


def _engine(**kwargs: Any) -> _Engine:
    options: dict[str, Any] = dict(
        token=None,
        batch_size=10,
        flush_interval_s=1.0,
        max_buffer=100,
        spool_path=None,
        max_retries=1,
        timeout_s=1.0,
        backoff_base_s=0.1,
        backoff_max_s=1.0,
        max_retry_after_s=5.0,
        on_error=None,
    )
    options.update(kwargs)
    return _Engine("http://127.0.0.1:9", **options)


@pytest.mark.nodb
def test_send_fills_event_id_and_occurred_at_without_touching_the_callers_dict() -> None:
    event = tokens_event("r", 1)
    event_id, payload = _engine().prepare(event)
    data = json.loads(payload)
    assert event_id.startswith("evt_") and len(event_id) == 36
    assert data["event_id"] == event_id
    assert data["occurred_at"].endswith("Z")
    moment = datetime.fromisoformat(data["occurred_at"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - moment).total_seconds()) < 5
    assert "event_id" not in event and "occurred_at" not in event


@pytest.mark.nodb
def test_send_keeps_given_fields_and_writes_aware_datetimes_in_utc() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) + timedelta(microseconds=7)
    event = {**tokens_event("r", 1), "event_id": "mine", "occurred_at": moment}
    event_id, payload = _engine().prepare(event)
    assert event_id == "mine"
    assert json.loads(payload)["occurred_at"] == "2026-01-02T03:04:05.000007Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        _engine().prepare({**event, "occurred_at": datetime(2026, 1, 1)})
    with pytest.raises(TypeError):
        _engine().prepare(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _engine().prepare({**event, "event_id": 7})
    with pytest.raises(TypeError, match="JSON"):
        _engine().prepare({**event, "metadata": object()})


@pytest.mark.nodb
def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        BillingClient("ftp://x")
    with pytest.raises(ValueError, match="batch_size"):
        BillingClient("http://127.0.0.1:9", batch_size=1001)


def _drive(
    engine: _Engine, events: list[dict[str, Any]], answer: Any
) -> tuple[Any, list[list[str]], list[float]]:
    """Run ``engine._deliver`` on ``events`` without a network: ``answer(ids)`` gives the
    response (or exception) for each post. Returns the outcome, the posted ids, the sleeps."""
    items = []
    for number, event in enumerate(events, 1):
        event_id, payload = engine.prepare(event)
        items.append(_Item(number, event_id, payload, 0.0))
    steps = engine._deliver(items)
    posts: list[list[str]] = []
    sleeps: list[float] = []
    action = next(steps)
    try:
        while True:
            if isinstance(action, _Post):
                ids = [e["event_id"] for e in json.loads(action.body)["events"]]
                posts.append(ids)
                action = steps.send(answer(ids))
            else:
                assert isinstance(action, _Sleep)
                sleeps.append(action.seconds)
                action = steps.send(None)
    except StopIteration as stop:
        return stop.value, posts, sleeps


def _ok(ids: list[str]) -> httpx.Response:
    return httpx.Response(200, json={"accepted": len(ids), "duplicates": 0})


@pytest.mark.nodb
def test_a_413_splits_the_batch_until_it_fits() -> None:
    engine = _engine()
    events = [tokens_event("r", i) for i in range(4)]
    outcome, posts, _ = _drive(
        engine, events, lambda ids: httpx.Response(413) if len(ids) > 2 else _ok(ids)
    )
    assert outcome == ("ok", [])
    assert [len(p) for p in posts] == [4, 2, 2]
    assert engine.stats().acknowledged == 4


@pytest.mark.nodb
def test_a_single_event_too_large_is_rejected() -> None:
    problems: list[DeliveryError] = []
    engine = _engine(on_error=problems.append)
    outcome, posts, _ = _drive(engine, [tokens_event("r", 1)], lambda ids: httpx.Response(413))
    assert outcome == ("ok", []) and len(posts) == 1
    assert [(p.kind, p.status) for p in problems] == [("rejected", 413)]


@pytest.mark.nodb
def test_network_errors_are_retried_with_backoff_then_given_up() -> None:
    problems: list[DeliveryError] = []
    engine = _engine(max_retries=3, backoff_base_s=0.1, backoff_max_s=0.3)
    engine.on_error = problems.append
    events = [tokens_event("r", i) for i in range(3)]

    def refuse(ids: list[str]) -> Exception:
        return httpx.ConnectError("connection refused")

    (outcome, rest), posts, sleeps = _drive(engine, events, refuse)
    assert outcome == "unreachable" and len(rest) == 3
    assert len(posts) == 4 and all(p == posts[0] for p in posts)  # the same ids every time
    assert 0.05 <= sleeps[0] <= 0.1 and 0.1 <= sleeps[1] <= 0.2 and 0.15 <= sleeps[2] <= 0.3
    assert [p.kind for p in problems] == ["unreachable"]
    assert "ConnectError" in problems[0].message
    assert engine.stats().retries == 3


@pytest.mark.nodb
def test_retry_after_is_honoured_for_429_and_5xx() -> None:
    engine = _engine(max_retries=5, backoff_base_s=9, backoff_max_s=9, max_retry_after_s=30)
    answers = iter(
        [
            httpx.Response(429, headers={"Retry-After": "1.5"}),
            httpx.Response(503, headers={"Retry-After": "120"}),  # capped at 30
            httpx.Response(408),
            httpx.Response(500, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        ]
    )
    (outcome, _), posts, sleeps = _drive(
        engine, [tokens_event("r", 1)], lambda ids: next(answers, None) or _ok(ids)
    )
    assert outcome == "ok" and len(posts) == 5
    assert sleeps[0] == 1.5 and sleeps[1] == 30 and 4.5 <= sleeps[2] <= 9 and sleeps[3] == 0


@pytest.mark.nodb
@pytest.mark.parametrize("status", [401, 403, 404])
def test_an_auth_or_url_error_is_reported_not_retried(status: int) -> None:
    problems: list[DeliveryError] = []
    engine = _engine(on_error=problems.append)
    (outcome, rest), posts, sleeps = _drive(
        engine,
        [tokens_event("r", 1)],
        lambda ids: httpx.Response(status, json={"error": "the bearer token is unknown"}),
    )
    assert outcome == "refused" and len(rest) == 1 and len(posts) == 1 and sleeps == []
    assert [(p.kind, p.status) for p in problems] == [("refused", status)]
    assert "bearer token is unknown" in problems[0].message


# -- batching ------------------------------------------------------------------------------------


def test_batches_by_size(served: LiveServer, recorder: Recorder, db_url: str) -> None:
    """250 events with batch_size 100: three posts (100, 100, 50), all stored once."""
    with BillingClient(served.url, batch_size=100, flush_interval_s=60) as client:
        ids = [client.send(tokens_event(f"req-{i // 10}", i % 10)) for i in range(250)]
        # the two full batches go without a flush
        deadline = time.monotonic() + 10
        while len(recorder.posts) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recorder.sizes() == [100, 100]
        assert client.flush(timeout=10) is True
        stats = client.stats()
    assert recorder.sizes() == [100, 100, 50]
    assert [post.status for post in recorder.posts] == [200, 200, 200]
    assert [i for post in recorder.posts for i in post.event_ids] == ids  # in order
    assert (stats.sent, stats.acknowledged, stats.accepted, stats.duplicates) == (250, 250, 250, 0)
    assert (stats.requests, stats.retries, stats.spooled, stats.pending) == (3, 0, 0, 0)
    assert client.sent == 250 and client.acknowledged == 250 and client.spooled == 0
    assert_stored_once(db_url, ids)


def test_batches_by_time(served: LiveServer, recorder: Recorder, db_url: str) -> None:
    """A batch that does not fill up is posted flush_interval_s after its first event."""
    with BillingClient(served.url, batch_size=100, flush_interval_s=0.2) as client:
        started = time.monotonic()
        ids = [client.send(tokens_event("req-t", i)) for i in range(5)]
        while not recorder.posts and time.monotonic() - started < 5:
            time.sleep(0.01)
        waited = time.monotonic() - started
        assert recorder.sizes() == [5]
        assert 0.15 <= waited < 3
        deadline = time.monotonic() + 5
        while client.acknowledged < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert_stored_once(db_url, ids)
    with pytest.raises(ClientClosedError):
        client.send(tokens_event("req-t", 9))


def test_large_events_are_split_under_the_body_limit(
    served: LiveServer, recorder: Recorder, db_url: str
) -> None:
    """Batches stay under the service's 1 MiB body limit whatever batch_size says."""
    big = {"a" * 60 + str(i): "x" * 250 for i in range(32)}  # ~10 KiB of metadata per event
    events = [
        {
            "request_id": f"req-big-{i}",
            "type": "stream.started",
            "api_key_id": "key_x",
            "model": "m",
            "protocol": "openai.chat_completions",
            "metadata": big,
        }
        for i in range(250)
    ]
    with BillingClient(served.url, batch_size=1000, flush_interval_s=60) as client:
        ids = [client.send(event) for event in events]
        assert client.flush(timeout=20) is True
    assert len(recorder.posts) >= 3
    assert all(post.status == 200 for post in recorder.posts)
    assert_stored_once(db_url, ids)


# -- rejections and retries ----------------------------------------------------------------------


def test_a_422_is_reported_and_not_retried(
    served: LiveServer, recorder: Recorder, db_url: str
) -> None:
    """The invalid event is dropped and reported, never posted again; the valid events of its
    batch (the service stored nothing of it) are posted once more and stored."""
    problems: list[DeliveryError] = []
    with BillingClient(
        served.url, batch_size=3, flush_interval_s=60, on_error=problems.append
    ) as client:
        good1 = client.send(tokens_event("req-a", 1))
        bad = client.send({**tokens_event("req-a", 2), "output_tokens_generated": -1})
        good2 = client.send(tokens_event("req-a", 3))
        assert client.flush(timeout=10) is False  # not everything was acknowledged
        assert client.flush(timeout=10) is True  # nothing new went wrong since
        stats = client.stats()
    assert [(p.status, p.event_ids) for p in recorder.posts] == [
        (422, [good1, bad, good2]),
        (200, [good1, good2]),
    ]
    assert len(problems) == 1
    problem = problems[0]
    assert (problem.kind, problem.status, problem.event_ids) == ("rejected", 422, [bad])
    assert problem.detail["errors"][0]["path"] == "events[1].output_tokens_generated"
    assert "output_tokens_generated" in problem.message
    assert (stats.rejected, stats.acknowledged, stats.retries) == (1, 2, 0)
    assert_stored_once(db_url, [good1, good2])


def test_an_all_invalid_batch_is_posted_once(
    served: LiveServer, recorder: Recorder, db_url: str
) -> None:
    problems: list[DeliveryError] = []
    with BillingClient(served.url, flush_interval_s=60, on_error=problems.append) as client:
        ids = [client.send({**tokens_event("req-b", i), "type": "nope"}) for i in range(4)]
        assert client.flush(timeout=10) is False
        assert client.rejected == 4
    assert [(p.status, p.event_ids) for p in recorder.posts] == [(422, ids)]
    assert [p.kind for p in problems] == ["rejected"]
    assert stored_event_ids(db_url) == []


def test_a_conflict_drops_only_the_conflicting_event(
    served: LiveServer, recorder: Recorder, db_url: str
) -> None:
    problems: list[DeliveryError] = []
    with BillingClient(served.url, flush_interval_s=60, on_error=problems.append) as client:
        first = client.send({**tokens_event("req-c", 1), "event_id": "evt-fixed"})
        assert client.flush(timeout=10) is True
        other = client.send(tokens_event("req-c", 2))
        client.send({**tokens_event("req-c", 99), "event_id": "evt-fixed"})  # same id, new body
        assert client.flush(timeout=10) is False
    assert [p.status for p in recorder.posts] == [200, 409, 200]
    assert recorder.posts[2].event_ids == [other]
    assert [(p.kind, p.status, p.event_ids) for p in problems] == [("rejected", 409, ["evt-fixed"])]
    assert_stored_once(db_url, [first, other])


def test_a_503_is_retried_with_the_same_event_ids(settings: Settings, db_url: str) -> None:
    recorder = Recorder(create_app(settings), fail_before=2)
    with (
        LiveServer(recorder) as server,  # type: ignore[arg-type]
        BillingClient(server.url, flush_interval_s=60, backoff_base_s=5) as client,
    ):
        ids = [client.send(tokens_event("req-r", i)) for i in range(7)]
        started = time.monotonic()
        assert client.flush(timeout=10) is True
        elapsed = time.monotonic() - started  # Retry-After: 0 beats the 5 s backoff
        stats = client.stats()
    assert [p.status for p in recorder.posts] == [503, 503, 200]
    assert all(p.event_ids == ids for p in recorder.posts)
    assert elapsed < 3
    assert (stats.requests, stats.retries, stats.accepted, stats.duplicates) == (3, 2, 7, 0)
    assert_stored_once(db_url, ids)


def test_a_lost_answer_is_retried_and_counted_as_duplicates(
    settings: Settings, db_url: str
) -> None:
    """The service stored the batch but the answer was lost (502): the retry re-posts the same
    ids, the service answers ``duplicates``, and every event is stored once."""
    recorder = Recorder(create_app(settings), fail_after=1)
    with (
        LiveServer(recorder) as server,  # type: ignore[arg-type]
        BillingClient(server.url, flush_interval_s=60, backoff_base_s=0.01) as client,
    ):
        ids = [client.send(tokens_event("req-l", i)) for i in range(5)]
        assert client.flush(timeout=10) is True
        stats = client.stats()
    assert [p.status for p in recorder.posts] == [502, 200]
    assert recorder.posts[0].event_ids == recorder.posts[1].event_ids == ids
    assert (stats.accepted, stats.duplicates, stats.retries) == (0, 5, 1)
    assert_stored_once(db_url, ids)


# -- the spool -----------------------------------------------------------------------------------


def _spool_lines(path: Path) -> int:
    total = 0
    for candidate in (path, path.with_name(path.name + ".replay")):
        if candidate.exists():
            total += len(candidate.read_bytes().splitlines())
    return total


def test_service_down_spools_then_replays_when_it_answers(
    recorder: Recorder, db_url: str, tmp_path: Path
) -> None:
    spool = tmp_path / "events.spool"
    problems: list[DeliveryError] = []
    server = LiveServer(recorder)  # type: ignore[arg-type]  # not started yet: nothing listens
    client = BillingClient(
        server.url,
        spool_path=spool,
        flush_interval_s=0.05,
        max_retries=1,
        backoff_base_s=0.01,
        on_error=problems.append,
    )
    try:
        ids = [client.send(tokens_event(f"req-s{i % 3}", i)) for i in range(30)]
        assert client.flush(timeout=10) is False  # unreachable: everything went to the spool
        assert client.stats().spooled == 30 and client.stats().pending == 0
        assert _spool_lines(spool) == 30
        assert problems and {p.kind for p in problems} == {"unreachable"}
        with server:
            assert client.flush(timeout=10) is True
            stats = client.stats()
            assert (stats.replayed, stats.acknowledged, stats.pending) == (30, 30, 0)
            assert not spool.with_name(spool.name + ".replay").exists()
            assert _spool_lines(spool) == 0
            assert_stored_once(db_url, ids)
            assert [i for p in recorder.posts for i in p.event_ids] == ids  # in order
    finally:
        client.close(timeout=1)


def test_a_full_buffer_goes_to_the_spool(recorder: Recorder, db_url: str, tmp_path: Path) -> None:
    """Memory stays bounded: past max_buffer, events go to the spool, and are delivered later."""
    spool = tmp_path / "events.spool"
    server = LiveServer(recorder)  # type: ignore[arg-type]
    with BillingClient(
        server.url,
        spool_path=spool,
        batch_size=5,
        max_buffer=10,
        flush_interval_s=60,
        max_retries=50,
        backoff_base_s=0.05,
        backoff_max_s=0.05,
    ) as client:
        ids = [client.send(tokens_event("req-f", i)) for i in range(200)]
        stats = client.stats()
        assert stats.pending <= 10
        assert stats.spooled >= 190
        with server:
            assert client.flush(timeout=15) is True
            assert client.stats().pending == 0
            assert _spool_lines(spool) == 0
            assert_stored_once(db_url, ids)


def test_a_spool_left_by_an_earlier_client_is_replayed(
    recorder: Recorder, db_url: str, tmp_path: Path
) -> None:
    spool = tmp_path / "events.spool"
    server = LiveServer(recorder)  # type: ignore[arg-type]
    first = BillingClient(server.url, spool_path=spool, max_retries=0, flush_interval_s=60)
    ids = [first.send(tokens_event("req-p", i)) for i in range(12)]
    assert first.close(timeout=5) is False  # unreachable: left in the spool
    assert _spool_lines(spool) == 12
    # a crash mid-append leaves half a line: it is skipped and reported, not fatal
    with open(spool, "ab") as file:
        file.write(b'{"event_id": "half')
    problems: list[DeliveryError] = []
    with server, BillingClient(server.url, spool_path=spool, on_error=problems.append) as second:
        assert second.flush(timeout=10) is False  # the half line was lost
        assert [p.kind for p in problems] == ["spool_corrupt"]
        assert second.stats().replayed == 12
        assert_stored_once(db_url, ids)
        assert _spool_lines(spool) == 0


# -- the service stopped mid-run and restarted ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("spooled", [True, False], ids=["spool", "memory"])
def test_service_killed_and_restarted_every_event_stored_once(
    serve: ServeProcess, db_url: str, tmp_path: Path, spooled: bool
) -> None:
    """2,000 events over ~3 s; ``billing serve`` is SIGKILLed after 700 and restarted on the same
    port a second later while the gateway keeps sending; after flush() the database holds every
    event exactly once. With a spool, what the retries cannot deliver during the outage goes to
    the spool and is replayed; without one, it waits in memory and is posted again."""
    serve.start()
    problems: list[DeliveryError] = []
    client = BillingClient(
        serve.url,
        batch_size=100,
        flush_interval_s=0.05,
        spool_path=tmp_path / "spool" if spooled else None,
        max_retries=3,
        backoff_base_s=0.1,
        on_error=problems.append,
    )
    ids: list[str] = []
    killed_at: float | None = None
    try:
        for i in range(2000):
            ids.append(client.send(tokens_event(f"req-k{i % 50}", i // 50)))
            if i == 700:
                serve.kill(signal.SIGKILL)
                killed_at = time.monotonic()
            if killed_at is not None and serve.starts == 1 and time.monotonic() - killed_at > 1:
                serve.start(wait=False)
            if i % 20 == 19:
                time.sleep(0.03)
        if serve.starts == 1:
            serve.start(wait=False)
        serve.wait_ready()
        assert client.flush(timeout=30) is True, problems
        stats = client.stats()
    finally:
        client.close(timeout=5)
    assert serve.starts == 2
    assert stats.sent == 2000 and stats.rejected == 0 and stats.dropped == 0
    assert stats.acknowledged >= 2000
    assert stats.retries > 0  # the outage was noticed
    assert (stats.spooled > 0) is spooled and stats.replayed == stats.spooled
    assert_stored_once(db_url, ids)


# -- the asyncio client --------------------------------------------------------------------------


def test_async_batches_by_size(served: LiveServer, recorder: Recorder, db_url: str) -> None:
    async def main() -> tuple[list[str], bool]:
        async with AsyncBillingClient(served.url, batch_size=100, flush_interval_s=60) as client:
            ids = [client.send(tokens_event(f"req-{i // 10}", i % 10)) for i in range(250)]
            for _ in range(500):
                if len(recorder.posts) >= 2:
                    break
                await asyncio.sleep(0.01)
            assert recorder.sizes() == [100, 100]
            ok = await client.flush(timeout=10)
            assert client.acknowledged == 250
        return ids, ok

    ids, ok = asyncio.run(main())
    assert ok is True
    assert recorder.sizes() == [100, 100, 50]
    assert_stored_once(db_url, ids)


def test_async_retries_a_503_with_the_same_ids(settings: Settings, db_url: str) -> None:
    recorder = Recorder(create_app(settings), fail_before=1)

    async def main(url: str) -> list[str]:
        async with AsyncBillingClient(url, flush_interval_s=0.05) as client:
            ids = [client.send(tokens_event("req-ar", i)) for i in range(6)]
            assert await client.flush(timeout=10) is True
            assert client.stats().retries == 1
        return ids

    with LiveServer(recorder) as server:  # type: ignore[arg-type]
        ids = asyncio.run(main(server.url))
    assert [p.status for p in recorder.posts] == [503, 200]
    assert recorder.posts[0].event_ids == recorder.posts[1].event_ids == ids
    assert_stored_once(db_url, ids)


@pytest.mark.slow
def test_async_service_stopped_and_restarted_every_event_stored_once(
    serve: ServeProcess, db_url: str, tmp_path: Path
) -> None:
    """Same as the sync restart test with the asyncio client and a SIGTERM (graceful stop)."""
    serve.start()

    async def main() -> tuple[list[str], bool, Any]:
        ids: list[str] = []
        client = AsyncBillingClient(
            serve.url,
            batch_size=50,
            flush_interval_s=0.05,
            spool_path=tmp_path / "aspool",
            max_retries=3,
            backoff_base_s=0.1,
        )
        async with client:
            stopped_at: float | None = None
            for i in range(1000):
                ids.append(client.send(tokens_event(f"req-a{i % 20}", i // 20)))
                if i == 300:
                    await asyncio.to_thread(serve.kill, signal.SIGTERM)
                    stopped_at = time.monotonic()
                if (
                    stopped_at is not None
                    and serve.starts == 1
                    and time.monotonic() > stopped_at + 1
                ):
                    serve.start(wait=False)
                if i % 20 == 19:
                    await asyncio.sleep(0.02)
            if serve.starts == 1:
                serve.start(wait=False)
            await asyncio.to_thread(serve.wait_ready)
            ok = await client.flush(timeout=30)
            stats = client.stats()
        return ids, ok, stats

    ids, ok, stats = asyncio.run(main())
    assert ok is True
    assert serve.starts == 2
    assert stats.sent == 1000 and stats.rejected == 0 and stats.dropped == 0
    assert_stored_once(db_url, ids)


def test_async_spool_then_replay(recorder: Recorder, db_url: str, tmp_path: Path) -> None:
    spool = tmp_path / "a.spool"
    server = LiveServer(recorder)  # type: ignore[arg-type]

    async def main() -> list[str]:
        client = AsyncBillingClient(
            server.url, spool_path=spool, max_retries=0, flush_interval_s=0.05
        )
        async with client:
            ids = [client.send(tokens_event("req-as", i)) for i in range(8)]
            assert await client.flush(timeout=10) is False
            assert client.spooled == 8
            await asyncio.to_thread(server.__enter__)
            try:
                assert await client.flush(timeout=10) is True
                assert client.stats().replayed == 8
            finally:
                await asyncio.to_thread(server.__exit__, None, None, None)
        return ids

    ids = asyncio.run(main())
    assert _spool_lines(spool) == 0
    assert_stored_once(db_url, ids)


@pytest.mark.nodb
def test_event_ids_are_uuid4_hex_and_now_is_rfc3339_utc_microseconds() -> None:
    ids = {new_event_id() for _ in range(2000)}
    assert len(ids) == 2000
    for event_id in ids:
        assert event_id.startswith("evt_") and len(event_id) == 36
        value = uuid.UUID(event_id[4:])
        assert value.version == 4 and value.variant == uuid.RFC_4122
        assert value.hex == event_id[4:]
    before = datetime.now(UTC)
    now = utc_now()
    after = datetime.now(UTC)
    assert len(now) == len("2026-10-15T08:00:00.123456Z") and now.endswith("Z")
    moment = datetime.fromisoformat(now.replace("Z", "+00:00"))
    assert before - timedelta(milliseconds=1) <= moment <= after + timedelta(milliseconds=1)
