"""A wheel built from the project (not an editable install) runs ``billing migrate`` and
``billing serve`` (CONTRACT "Operations", "Command line"): the Alembic scripts ship inside it.

Offline: the wheel is built with pip's build isolation from a local wheelhouse
(``BILLING_WHEELHOUSE``, default ``/opt/pypi/files``, which must hold a ``setuptools`` wheel),
and installed with ``--no-deps`` into a fresh venv that sees this venv's site-packages (its
dependencies) through a ``.pth`` line, but not its editable ``billing``.
"""

from __future__ import annotations

import os
import shutil
import site
import sqlite3
import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx
import pytest

from billing.storage.migrate import head_revision
from tests.conftest import _free_port
from tests.extras import skip_unless_ci

pytestmark = [pytest.mark.slow, pytest.mark.nodb]

ROOT = Path(__file__).resolve().parents[2]
_NOT_SOURCE = (".git", ".venv", "build", "*.egg-info", "__pycache__", "*_cache", "*.db")
WHEELHOUSE = Path(os.environ.get("BILLING_WHEELHOUSE", "/opt/pypi/files"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the project's wheel installed; returns its ``bin`` folder."""
    if not any(WHEELHOUSE.glob("setuptools-*.whl")):
        skip_unless_ci(
            f"no setuptools wheel in {WHEELHOUSE} (set BILLING_WHEELHOUSE) to build offline"
        )
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: the build writes build/ and billing.egg-info beside it
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    dist = tmp / "dist"
    env = _env(tmp)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "-w",
            str(dist),
            "-q",
            "--no-index",
            "--find-links",
            str(WHEELHOUSE),
        ],
        check=True,
        cwd=tmp,
        env=env,
    )
    (wheel,) = dist.glob("billing-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            "--no-index",
            str(wheel),
        ],
        check=True,
        cwd=tmp,
        env=env,
    )
    # Installed first, so that pip does not take the shared venv's billing for this one.
    # This venv's dependencies, as plain path entries: the .pth files there (the editable
    # billing's finder among them) are not run, so `import billing` finds only the wheel.
    (Path(purelib) / "shared_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return env_dir / "bin"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BILLING_", "PYTHON"))}
    env["BILLING_DATABASE_URL"] = f"sqlite:///{tmp_path / 'wheel.db'}"
    return env


def test_the_installed_package_is_the_wheel(installed: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [
            str(installed / "python"),
            "-c",
            "import billing, billing.storage.migrate as m; "
            "print(billing.__file__); print(m.MIGRATIONS_DIR)",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
    ).stdout.split()
    venv_dir = str(installed.parent)
    assert where[0].startswith(venv_dir), where
    assert where[1] == str(Path(where[0]).parent / "_migrations") or where[1].startswith(venv_dir)
    assert Path(where[1], "versions").is_dir()


def test_wheel_runs_migrate_and_serve(installed: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    done = subprocess.run(
        [str(installed / "billing"), "migrate"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(tmp_path / "wheel.db") as conn:
        (version,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert version == head_revision()

    port = _free_port()
    server = subprocess.Popen(
        [str(installed / "billing"), "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "billing serve did not answer"
                time.sleep(0.2)
        assert health.status_code == 200
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
    finally:
        server.terminate()
        server.wait(timeout=20)
