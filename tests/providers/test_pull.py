"""``billing providers pull`` against a fake provider on 127.0.0.1 that serves recorded pages:
it follows the pages, survives a 429 with ``Retry-After``, and never shows the admin key."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from tests.cli_runs import run_billing, text
from tests.providers.pages import (
    anthropic_page,
    anthropic_usage_result,
    openai_page,
    openai_usage_result,
)

ADMIN_KEY = "sk-admin-Zq8vT3pL0wXy7Rm2Kd5N"
DAY = datetime(2026, 11, 1, tzinfo=UTC)


def _days(first: int, count: int, model: str = "gpt-4o") -> list[tuple[datetime, Any]]:
    return [
        (DAY + timedelta(days=d), [openai_usage_result(model, 150, 50, 200 + d, 1 + d)])
        for d in range(first, first + count)
    ]


#: Recorded pages by the ``page`` cursor that asks for them (None: the first request).
OPENAI_PAGES = {
    None: openai_page(_days(0, 2), next_page="cGFnZTI="),
    "cGFnZTI=": openai_page(_days(2, 2), next_page="cGFnZTM="),
    "cGFnZTM=": openai_page(_days(4, 1)),
}
ANTHROPIC_PAGES = {
    None: anthropic_page(
        [(DAY, [anthropic_usage_result("claude-sonnet-4-5", 10, 0, 0, 0, 5)])], next_page="p2"
    ),
    "p2": anthropic_page(
        [(DAY + timedelta(days=1), [anthropic_usage_result("claude-sonnet-4-5", 20, 0, 0, 0, 6)])],
        next_page="p3",
    ),
    "p3": anthropic_page(
        [(DAY + timedelta(days=2), [anthropic_usage_result("claude-sonnet-4-5", 30, 0, 0, 0, 7)])]
    ),
}


class FakeProvider:
    """A provider admin API on a loopback port: serves ``pages`` by their cursor, answers the
    first request for ``throttle`` with 429 and ``Retry-After: 1``, and records every
    request's path, query, headers and time."""

    def __init__(self, pages: dict[str | None, Any], throttle: str) -> None:
        self.pages = pages
        self.throttle = throttle
        self.throttled = False
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str], float]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                fake.requests.append((url.path, query, dict(self.headers), time.monotonic()))
                cursor = query.get("page", [None])[0]
                if cursor == fake.throttle and not fake.throttled:
                    fake.throttled = True
                    self._answer(429, {"error": {"message": "rate limited"}}, {"Retry-After": "1"})
                    return
                self._answer(200, fake.pages[cursor], {})

            def _answer(self, status: int, body: Any, headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> FakeProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def openai_fake() -> Iterator[FakeProvider]:
    with FakeProvider(OPENAI_PAGES, throttle="cGFnZTI=") as fake:
        yield fake


def pull(
    way: str, db_url: str, tmp_path: Path, provider: str, base_url: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    env.update(
        BILLING_DATABASE_URL=db_url,
        BILLING_LOG_LEVEL="debug",
        OPENAI_ADMIN_KEY=ADMIN_KEY,
        ANTHROPIC_ADMIN_KEY=ADMIN_KEY,
    )
    args = [
        "providers",
        "pull",
        "--provider",
        provider,
        "--kind",
        "usage",
        "--since",
        "2026-11-01T00:00:00Z",
        "--until",
        "2026-11-06T00:00:00Z",
        "--base-url",
        base_url,
    ]
    return text(run_billing(way, args, env, tmp_path, 120))


def test_pull_follows_3_pages_survives_a_429_and_never_shows_the_key(
    cli_way: str, db_url: str, tmp_path: Path, openai_fake: FakeProvider
) -> None:
    done = pull(cli_way, db_url, tmp_path, "openai", openai_fake.url)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "pages": 3,
        "buckets": 5,
        "new": 5,
        "changed": 0,
        "unchanged": 0,
    }
    # The key went to the provider, in the header only, and nowhere else.
    assert ADMIN_KEY not in done.stdout
    assert ADMIN_KEY not in done.stderr
    assert ADMIN_KEY[7:] not in done.stdout + done.stderr
    paths = [(path, query.get("page")) for path, query, _, _ in openai_fake.requests]
    assert paths == [
        ("/v1/organization/usage/completions", None),
        ("/v1/organization/usage/completions", ["cGFnZTI="]),
        ("/v1/organization/usage/completions", ["cGFnZTI="]),
        ("/v1/organization/usage/completions", ["cGFnZTM="]),
    ]
    for _, query, headers, _ in openai_fake.requests:
        assert headers["Authorization"] == f"Bearer {ADMIN_KEY}"
        assert query["start_time"] == [str(int(DAY.timestamp()))]
        assert query["bucket_width"] == ["1d"]
        assert query["group_by"] == ["model", "project_id", "service_tier"]
        assert all(ADMIN_KEY not in v for values in query.values() for v in values)
    # The retry waited the second the provider asked for.
    assert openai_fake.requests[2][3] - openai_fake.requests[1][3] >= 1.0
    assert "HTTP 429; retry 1 in 1.0 s" in done.stderr
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn:
        outputs = conn.exec_driver_sql(
            "SELECT l.output_tokens FROM provider_report_lines l "
            "JOIN provider_report_versions v ON v.id = l.version_id ORDER BY v.bucket_start"
        ).scalars()
        assert list(outputs) == [200, 201, 202, 203, 204]
    engine.dispose()

    # Pulling again stores nothing new.
    openai_fake.throttled = True
    again = pull(cli_way, db_url, tmp_path, "openai", openai_fake.url)
    assert json.loads(again.stdout)["unchanged"] == 5, again.stderr


def test_pull_anthropic_sends_its_key_header_and_rfc3339_times(
    cli_way: str, db_url: str, tmp_path: Path
) -> None:
    with FakeProvider(ANTHROPIC_PAGES, throttle="p3") as fake:
        done = pull(cli_way, db_url, tmp_path, "anthropic", fake.url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pages"] == 3
    assert ADMIN_KEY not in done.stdout + done.stderr
    path, query, headers, _ = fake.requests[0]
    assert path == "/v1/organizations/usage_report/messages"
    assert headers["x-api-key"] == ADMIN_KEY
    assert "Authorization" not in headers
    assert query["starting_at"] == ["2026-11-01T00:00:00Z"]
    assert query["group_by[]"] == ["model", "workspace_id", "service_tier"]


def test_pull_without_the_key_in_the_environment_fails_in_one_line(
    cli_way: str, db_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_ADMIN_KEY",)}
    env["BILLING_DATABASE_URL"] = db_url
    args = [
        "providers",
        "pull",
        "--provider",
        "openai",
        "--kind",
        "usage",
        "--since",
        "2026-11-01T00:00:00Z",
        "--until",
        "2026-11-02T00:00:00Z",
        "--base-url",
        "http://127.0.0.1:9",
    ]
    done = text(run_billing(cli_way, args, env, tmp_path, 60))
    assert done.returncode == 2
    assert done.stderr == (
        "billing: set OPENAI_ADMIN_KEY to the provider's admin key (it is read from there only)\n"
    )
