"""Settings from the environment, and the command line's one clear line when one is wrong."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from billing.settings import Settings, SettingsError, describe_error, get_settings

pytestmark = [pytest.mark.nodb, pytest.mark.slow]


def _billing_command() -> list[str]:
    script = shutil.which("billing", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-c", "from billing.cli import main; main()"]


def run_billing(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """``billing ARGS`` in an empty working directory with only the given BILLING_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    env.setdefault("BILLING_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    env.update(settings)
    return subprocess.run(
        [*_billing_command(), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


BAD_SETTINGS = {
    "negative settle_after": ("BILLING_SETTLE_AFTER_S", "-1"),
    "zero settle_after": ("BILLING_SETTLE_AFTER_S", "0"),
    "settle_after not a number": ("BILLING_SETTLE_AFTER_S", "five minutes"),
    "mysql database": ("BILLING_DATABASE_URL", "mysql://x"),
    "not a URL": ("BILLING_DATABASE_URL", "billing.db"),
    "negative close lag": ("BILLING_CLOSE_LAG_S", "-60"),
    "unknown log level": ("BILLING_LOG_LEVEL", "loud"),
    "busy timeout not an integer": ("BILLING_SQLITE_BUSY_TIMEOUT_MS", "abc"),
    "zero retry-after": ("BILLING_DB_RETRY_AFTER_S", "0"),
}


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS.values(), ids=BAD_SETTINGS.keys())
@pytest.mark.parametrize("command", ["migrate", "serve"])
def test_a_bad_setting_is_one_line_naming_it(
    tmp_path: Path, command: str, name: str, value: str
) -> None:
    done = run_billing(tmp_path, command, **{name: value})

    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert name in lines[0]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no database was created


def test_two_bad_settings_are_still_one_line_naming_both(tmp_path: Path) -> None:
    done = run_billing(
        tmp_path, "migrate", BILLING_SETTLE_AFTER_S="-1", BILLING_DATABASE_URL="mysql://x"
    )
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "BILLING_SETTLE_AFTER_S" in lines[0] and "BILLING_DATABASE_URL" in lines[0]


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    done = run_billing(
        tmp_path,
        "migrate",
        BILLING_DATABASE_URL="postgresql+psycopg://postgres:secret@127.0.0.1:1/x",
    )
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "127.0.0.1:1" in lines[0]
    assert "secret" not in lines[0]  # the password is never printed


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BILLING_SETTLE_AFTER_S", "12.5")
    monkeypatch.setenv("BILLING_DATABASE_URL", "postgres://u@h/db")
    monkeypatch.setenv("BILLING_LOG_LEVEL", "DEBUG")
    settings = Settings()
    assert settings.settle_after_s == 12.5
    assert settings.database_url == "postgresql+psycopg://u@h/db"
    assert settings.log_level == "debug"


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("BILLING_"):
            monkeypatch.delenv(name)
    settings = Settings()
    assert settings.database_url == "sqlite:///billing.db"
    assert settings.settle_after_s == 300
    assert settings.close_lag_s == 60


def test_describe_error_is_one_line_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(settle_after_s=-1, database_url="mysql://x")
    line = describe_error(caught.value)
    assert "\n" not in line
    assert "BILLING_SETTLE_AFTER_S" in line and "BILLING_DATABASE_URL" in line

    monkeypatch.setenv("BILLING_SETTLE_AFTER_S", "-1")
    get_settings.cache_clear()
    try:
        with pytest.raises(SettingsError, match="BILLING_SETTLE_AFTER_S"):
            get_settings()
    finally:
        get_settings.cache_clear()


def test_the_serve_process_has_a_short_gil_switch_interval(tmp_path: Path) -> None:
    """``billing serve`` loads its app with ``server_app`` in each worker process, which sets
    the switch interval (``billing.cli.SWITCH_INTERVAL_S``: the ingest writer thread gets the
    GIL back within 0.1 ms instead of 5 ms); a plain import of the package leaves Python's."""
    code = (
        "import sys; from billing.cli import server_app; before = sys.getswitchinterval(); "
        "server_app(); print(before, sys.getswitchinterval())"
    )
    env = {**os.environ, "BILLING_DATABASE_URL": f"sqlite:///{tmp_path}/billing.db"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    before, after = (float(x) for x in done.stdout.split())
    # Python keeps the interval in whole microseconds.
    assert (round(before * 1e6), round(after * 1e6)) == (5000, 100)
