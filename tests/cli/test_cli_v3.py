"""(v3 CLI) ``billing prices list``, ``billing tokens list`` (a header, expired tokens shown as
expired), dates alone for ``--since`` / ``--until`` and ``--period YYYY-MM`` where a command
takes times, and the ``rich`` progress of ``billing providers pull`` on a terminal."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from billing import cli
from billing.auth.tokens import create_token, revoke_token
from billing.storage.db import write_transaction
from tests.cli_runs import run_on_a_terminal
from tests.export.test_export import (  # noqa: F401
    MARCH,
    SONNET_PRICE,
    cli_env,
    day1,
    export,
    price,
)
from tests.providers.test_pull import ADMIN_KEY, OPENAI_PAGES, FakeProvider


@pytest.fixture
def runner(cli_env: CliRunner) -> CliRunner:  # noqa: F811
    """``billing`` in process on the test database (``tests/export``'s ``cli_env``)."""
    return cli_env


def run(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(cli.app, list(args))
    assert result.exit_code == 0, result.stderr
    return result.stdout_bytes.decode()


def refused(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(cli.app, list(args))
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("billing: "), lines
    return lines[0]


def test_prices_list_has_a_header_and_a_line_per_price(
    client: TestClient, runner: CliRunner
) -> None:
    price(client, SONNET_PRICE)
    tools = {**SONNET_PRICE, "model": "m-tools", "service_tier": "priority",
             "effective_from": "2026-02-01T00:00:00Z", "cache_creation_1h_usd_per_mtok": "6",
             "unit_prices": {"web_search_requests": "0.01"}}  # fmt: skip
    price(client, tools)
    assert run(runner, "prices", "list").splitlines() == [
        "model\tservice_tier\teffective_from\tinput_usd_per_mtok\toutput_usd_per_mtok\t"
        "cache_read_usd_per_mtok\tcache_creation_usd_per_mtok\tcache_creation_1h_usd_per_mtok\t"
        "long_context_above_input_tokens\tunit_prices",
        "claude-sonnet-5-5\t-\t2026-01-01T00:00:00Z\t3\t15\t0.3\t3.75\t3.75\t-\t-",
        "m-tools\tpriority\t2026-02-01T00:00:00Z\t3\t15\t0.3\t3.75\t6\t-\t"
        '{"web_search_requests":"0.01"}',
    ]
    assert len(run(runner, "prices", "list", "--model", "m-tools").splitlines()) == 2


def test_tokens_list_has_a_header_and_shows_expired_and_revoked_tokens(
    app: FastAPI, runner: CliRunner
) -> None:
    now = datetime.now(UTC)
    with write_transaction(app.state.billing.sessions) as session:
        _, live = create_token(session, "read", "ops", now, None)
        past = now - timedelta(days=2)
        _, expired = create_token(session, "export", "fin", past, past + timedelta(days=1))
        _, revoked = create_token(session, "admin", None, now, None)
        revoke_token(session, revoked.id, now)
    lines = run(runner, "tokens", "list").splitlines()
    assert lines[0] == "id\trole\tname\tcreated\tstatus\texpires\tlast_used"
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert rows[live.id][1:3] + rows[live.id][4:6] == ["read", "ops", "active", "never"]
    assert [*rows[expired.id][1:3], rows[expired.id][4]] == ["export", "fin", "expired"]
    assert rows[revoked.id][4].startswith("revoked 20")
    assert len(rows) == 3


def test_dates_alone_and_a_period_give_the_bytes_of_the_full_times(
    day1: TestClient,  # noqa: F811
    runner: CliRunner,
) -> None:
    by_day = run(runner, "export", "calls", "--since", "2026-03-01", "--until", "2026-03-02")
    full = export(day1, "calls", since="2026-03-01T00:00:00Z", until="2026-03-02T00:00:00Z")
    assert by_day.encode() == full.content and by_day.count("\n") == 3
    month = run(runner, "export", "usage", "--period", "2026-03")
    assert month.encode() == export(day1, "usage", **MARCH).content
    focus = run(runner, "export", "focus", "--period", "2026-03")
    assert focus.encode() == day1.get("/v1/exports/focus.csv?period=2026-03").content
    assert focus.count("\n") == 1 + 6  # req-1: 4 token classes; req-2: 2 (unpriced)
    drift_json = run(runner, "drift", "--period", "2026-03", "--format", "json")
    assert drift_json == run(runner, "drift", "--since", "2026-03-01", "--until", "2026-04-01",
                             "--format", "json")  # fmt: skip
    assert "--period" in refused(runner, "export", "usage", "--period", "2026-3")
    assert "not both" in refused(
        runner, "export", "usage", "--period", "2026-03", "--since", "2026-03-01"
    )
    assert "--period" in refused(runner, "export", "focus", "--period", "2026-13")
    assert "--period" in refused(runner, "drift", "--period", "March")


@pytest.mark.slow
def test_providers_pull_shows_rich_progress_on_a_terminal(db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "BILLING_DATABASE_URL": db_url, "OPENAI_ADMIN_KEY": ADMIN_KEY,
           "COLUMNS": "100"}  # fmt: skip
    with FakeProvider(OPENAI_PAGES, throttle="none") as fake:
        command = [str(Path(sys.executable).parent / "billing"), "providers", "pull",
                   "--provider", "openai", "--kind", "usage", "--period", "2026-11",
                   "--base-url", fake.url]  # fmt: skip
        done, seen = run_on_a_terminal(command, env, tmp_path)
        assert done.returncode == 0, seen
        # The month as the dates of its bounds (--period), the pages, and the bar drawn.
        first = fake.requests[0][1]
        assert first["start_time"] == [str(int(datetime(2026, 11, 1, tzinfo=UTC).timestamp()))]
        assert first["end_time"] == [str(int(datetime(2026, 12, 1, tzinfo=UTC).timestamp()))]
    assert b"pulling openai usage" in seen and b"\x1b[" in seen
    assert b"billing: page 3:" in seen
    assert ADMIN_KEY.encode() not in seen + done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["prices", "list"],
        ["tokens", "list"],
        ["keys", "list"],
        ["budgets", "list"],
        ["credits", "balance", "--customer", "acme"],
        ["export", "usage", "--since", "2026-11-01", "--until", "2026-12-01"],
        ["export", "focus", "--period", "2026-11", "--output", "focus.csv"],
        ["drift", "--since", "2026-11-01", "--until", "2026-12-01"],
    ],
)
def test_a_command_that_reads_makes_no_database_where_there_is_none(
    tmp_path: Path, args: list[str]
) -> None:
    # Run from another directory, it listed a new empty billing.db (and exited 0).
    from tests.cli_runs import run_billing, text

    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    done = text(run_billing("in process", args, env, tmp_path))
    assert done.returncode == 1, (args, done.stdout, done.stderr)
    assert done.stderr == (
        f"billing: no database at {tmp_path / 'billing.db'}: run the command where `billing "
        "serve` keeps its billing.db, or set BILLING_DATABASE_URL\n"
    )
    assert list(tmp_path.iterdir()) == []
