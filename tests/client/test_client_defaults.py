"""No silent loss with the client's defaults: an event the service rejects, or one lost at
``close()``, is logged at WARNING and seen on standard error by a program that configured no
logging at all; the spool is on by default, in the per-user cache directory, one file per
process and service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from billing.client import BillingClient, default_spool_dir
from tests.conftest import LiveServer, _free_port

ROOT = Path(__file__).resolve().parents[2]


def _gateway(script: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter with no logging configured (nothing but the
    client), with ``XDG_CACHE_HOME`` at ``cache``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache)}
    prologue = "from billing.client import BillingClient\n"
    return subprocess.run(
        [sys.executable, "-c", prologue + textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def _stored(db_url: str) -> list[str]:
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn:
        ids = [row[0] for row in conn.execute(text("SELECT event_id FROM events ORDER BY 1"))]
    engine.dispose()
    return ids


def _tokens(event_id: str, generated: int) -> dict[str, object]:
    return {
        "event_id": event_id,
        "request_id": "req-defaults",
        "type": "stream.tokens",
        "output_tokens_generated": generated,
        "output_tokens_delivered": 0,
    }


def test_a_rejected_event_is_on_stderr_without_any_logging_setup(
    live_server: LiveServer, db_url: str, tmp_path: Path
) -> None:
    good, bad = _tokens("evt-good", 3), _tokens("evt-bad", -1)
    done = _gateway(
        f"""
        with BillingClient({live_server.url!r}) as client:
            client.send({good!r})
            client.send({bad!r})
        """,
        tmp_path / "cache",
    )
    assert done.stderr.splitlines() == [
        "billing client: the service rejected 1 event(s) (HTTP 422: "
        "events[1].output_tokens_generated: must be ≥ 0: token counts are never negative); "
        "dropped"
    ]
    assert _stored(db_url) == ["evt-good"]


def test_an_event_dropped_at_close_is_on_stderr(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    done = _gateway(
        f"""
        client = BillingClient({down!r}, spool_path=None, max_retries=0)
        client.send({_tokens("evt-lost", 1)!r})
        client.close(timeout=2)
        """,
        tmp_path / "cache",
    )
    assert done.stderr.splitlines()[-1] == (
        "billing client: 1 event(s) dropped: the client was closed before these events were "
        "delivered and no spool_path is configured"
    ), done.stderr
    assert not (tmp_path / "cache" / "billing").exists()  # spool off: nothing written


def test_the_default_spool_keeps_what_close_could_not_deliver_and_replays_it(
    db_url: str, tmp_path: Path, settings: object
) -> None:
    """A gateway stops while the service is down: its events land in the default spool (and
    stderr says where); the next gateway process started against the service delivers them."""
    cache = tmp_path / "cache"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    done = _gateway(
        f"""
        client = BillingClient({url!r}, max_retries=0)
        for n in range(3):
            client.send({{**{_tokens("x", 0)!r}, "event_id": f"evt-spooled-{{n}}",
                          "output_tokens_generated": n}})
        client.close(timeout=2)
        """,
        cache,
    )
    spool_dir = cache / "billing" / "spool"
    (spooled,) = spool_dir.glob("*.jsonl")
    assert spooled.name.startswith(f"127-0-0-1-{port}-") and spooled.name.endswith("-0.jsonl")
    lines = [json.loads(line) for line in spooled.read_text().splitlines()]
    assert [e["event_id"] for e in lines] == [f"evt-spooled-{n}" for n in range(3)]
    assert f"billing client: 3 event(s) written to the spool {spooled}" in done.stderr

    from billing.server.app import create_app

    server = LiveServer(create_app(settings))  # type: ignore[arg-type]
    server.port, server.url = port, url
    server.server.config.port = port
    with server:
        _gateway(
            f"""
            with BillingClient({url!r}) as client:
                assert client.flush(timeout=20)
            """,
            cache,
        )
    assert _stored(db_url) == [f"evt-spooled-{n}" for n in range(3)]
    assert not spooled.exists() or spooled.stat().st_size == 0


def test_each_client_of_a_process_has_its_own_default_spool_file(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    first = BillingClient(url, max_retries=0)
    second = BillingClient(url, max_retries=0)
    try:
        assert first._engine.spool is not None and second._engine.spool is not None
        paths = {first._engine.spool.path, second._engine.spool.path}
        assert {p.name[-8:] for p in paths} == {"-0.jsonl", "-1.jsonl"}
        assert all(p.parent == default_spool_dir() for p in paths)
        assert str(default_spool_dir()).startswith(os.environ["XDG_CACHE_HOME"])
    finally:
        first.close(timeout=1)
        second.close(timeout=1)
    third = BillingClient(url, max_retries=0)  # slot 0 is free again
    assert third._engine.spool is not None and third._engine.spool.path.name.endswith("-0.jsonl")
    third.close(timeout=1)
