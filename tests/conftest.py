"""Test databases built by the migrations: a SQLite file per test by default, or the PostgreSQL
database named by ``BILLING_TEST_DATABASE_URL`` (emptied between tests)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import settings as hypothesis_settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.migrate import upgrade_to_head
from billing.storage.models import Base
from billing.storage.models.by_database import POSTGRES_ONLY_TABLES
from tests.cli_runs import WAYS

# Property tests check values, not speed: no per-example deadline (Hypothesis' default of 200 ms
# failed a pure-function example on a loaded machine; speed is measured in bench/).
hypothesis_settings.register_profile("billing", deadline=None)
hypothesis_settings.load_profile("billing")

PG_URL = os.environ.get("BILLING_TEST_DATABASE_URL")
FIXTURES = Path(__file__).parent / "fixtures"


def pytest_report_header() -> str:
    where = f"PostgreSQL {PG_URL}" if PG_URL else "SQLite (a file per test)"
    return f"billing test database: {where}"


@pytest.fixture(autouse=True)
def _own_cache_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Each test's own ``XDG_CACHE_HOME``: the billing client's default spool
    (``billing.client.spool.default_spool_dir``) never reaches the user's cache, and a test's
    spooled events never replay into another test's service."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    upgrade_to_head(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def _pg_migrated() -> Iterator[str]:
    """The PostgreSQL database of this run at the migration head: ``BILLING_TEST_DATABASE_URL``'s
    own in a serial run; under pytest-xdist, one per worker beside it (``<name>_gw0``, …), made
    here and dropped at the end, since each test empties the database it is given."""
    assert PG_URL is not None
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        upgrade_to_head(PG_URL)
        yield PG_URL
        return
    url = make_url(PG_URL)
    name = f"{url.database}_{worker}"
    admin = create_engine(pg_admin_url(PG_URL), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        own = url.set(database=name).render_as_string(hide_password=False)
        upgrade_to_head(own)
        yield own
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _truncate_pg(url: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    names = [t.name for t in Base.metadata.sorted_tables] + list(POSTGRES_ONLY_TABLES)
    tables = ", ".join(names)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database at the migration head with no rows; SQLite or PostgreSQL as configured."""
    if PG_URL:
        url = request.getfixturevalue("_pg_migrated")
        _truncate_pg(url)
        yield url
        return
    template: Path = request.getfixturevalue("_sqlite_template")
    path = tmp_path / "billing.db"
    shutil.copyfile(template, path)
    yield f"sqlite:///{path}"


@pytest.fixture(params=WAYS)
def cli_way(request: pytest.FixtureRequest) -> str:
    """How the test runs ``billing`` commands (``tests.cli_runs.run_billing``): in process, or in
    a subprocess (slow)."""
    way: str = request.param
    return way


@pytest.fixture
def is_postgres() -> bool:
    return PG_URL is not None


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url)


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return create_app(settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        yield test_client


def _free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS's pick; released before it is returned)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class LiveServer:
    """A real uvicorn server for ``app`` on a loopback port, in a thread of this process."""

    def __init__(self, app: FastAPI) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_server(app: FastAPI) -> Iterator[LiveServer]:
    with LiveServer(app) as server:
        yield server


@pytest.fixture
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client


def pg_admin_url(url: str, database: str = "postgres") -> str:
    """``url`` pointed at another database of the same server (for CREATE/DROP DATABASE)."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)
