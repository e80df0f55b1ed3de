"""Provider report pages stored once, versioned per bucket (CONTRACT "Provider reports and
drift"), over real HTTP on the test database (SQLite or PostgreSQL)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from billing.providers.schemas import parse_page
from tests.conftest import LiveServer
from tests.providers.pages import (
    anthropic_cost_result,
    anthropic_page,
    anthropic_usage_result,
    openai_page,
    openai_usage_result,
)

DAY = datetime(2026, 11, 1, tzinfo=UTC)


def _counts(db_url: str) -> tuple[int, int]:
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.connect() as conn:
        versions = conn.exec_driver_sql("SELECT count(*) FROM provider_report_versions").scalar()
        lines = conn.exec_driver_sql("SELECT count(*) FROM provider_report_lines").scalar()
    engine.dispose()
    return int(versions or 0), int(lines or 0)


def test_the_same_page_posted_by_8_threads_at_once_is_stored_once(
    live_server: LiveServer, db_url: str
) -> None:
    page = openai_page(
        [
            (
                DAY + timedelta(days=d),
                [openai_usage_result(f"m{m}", 100, 10, 50, 2) for m in range(3)],
            )
            for d in range(5)
        ]
    )
    body = {"provider": "openai", "kind": "usage", "report": page}
    barrier = threading.Barrier(8)
    answers: list[Any] = []
    lock = threading.Lock()

    def post() -> None:
        with httpx.Client(base_url=live_server.url, timeout=60) as client:
            barrier.wait()
            response = client.post("/v1/provider-reports", json=body)
        with lock:
            answers.append((response.status_code, response.json()))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _ in answers] == [200] * 8
    assert sum(a["new"] for _, a in answers) == 5
    assert sum(a["unchanged"] for _, a in answers) == 5 * 7
    assert all(a["buckets"] == 5 and a["changed"] == 0 for _, a in answers)
    assert _counts(db_url) == (5, 15)


def test_openai_usage_page_in_the_contracts_token_semantics() -> None:
    page = openai_page(
        [(DAY, [openai_usage_result("gpt-4o", 1000, 800, 500, 5, project_id="proj_1")])],
        next_page="AAAAAGdGxdEiJdKOAAAAAGcqsYA=",
    )
    parsed = parse_page("openai", "usage", page)
    assert parsed.next_page == "AAAAAGdGxdEiJdKOAAAAAGcqsYA="
    (bucket,) = parsed.buckets
    assert (bucket.start, bucket.end) == (DAY, DAY + timedelta(days=1))
    (line,) = bucket.lines
    assert (line.model, line.upstream_account, line.requests) == ("gpt-4o", "proj_1", 5)
    # input_tokens 1000 includes the 800 cached: 200 at the full rate.
    assert (line.input_tokens, line.cache_read_input_tokens, line.output_tokens) == (200, 800, 500)


def test_anthropic_pages_in_the_contracts_token_semantics() -> None:
    usage = anthropic_page(
        [
            (
                DAY,
                [
                    anthropic_usage_result(
                        "claude-sonnet-4-20250514",
                        1500,
                        200,
                        500,
                        1000,
                        500,
                        api_key_id="apikey_01",
                        workspace_id="wrkspc_01",
                        service_tier="standard",
                    )
                ],
            )
        ]
    )
    (line,) = parse_page("anthropic", "usage", usage).buckets[0].lines
    assert (line.upstream_account, line.service_tier, line.requests) == (
        "apikey_01",
        "standard",
        None,
    )
    assert (line.input_tokens, line.cache_read_input_tokens) == (1500, 200)
    assert (line.cache_creation_input_tokens, line.output_tokens) == (1500, 500)
    cost = anthropic_page(
        [
            (
                DAY,
                [
                    anthropic_cost_result(
                        "123.78912",
                        "claude-sonnet-4-20250514",
                        "uncached_input_tokens",
                        workspace_id="wrkspc_01",
                    )
                ],
            )
        ]
    )
    (line,) = parse_page("anthropic", "cost", cost).buckets[0].lines
    # "123.78912" cents is $1.2378912.
    assert line.cost_usd == Decimal("1.2378912")
    assert (line.model, line.upstream_account, line.input_tokens) == (
        "claude-sonnet-4-20250514",
        "wrkspc_01",
        None,
    )


def test_a_report_over_8_mib_is_a_413_and_nothing_is_stored(client: Any, db_url: str) -> None:
    big = b'{"provider": "openai", "kind": "usage", "report": {"pad": "' + b"x" * (8 << 20) + b'"}}'
    response = client.post(
        "/v1/provider-reports", content=big, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"].endswith(f"the limit is {8 << 20}")
    assert _counts(db_url) == (0, 0)
