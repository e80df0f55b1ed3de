"""The type checker proves that each database's class implements its room's repository: every
room's ``repository(session)`` factory holds its classes in a ``ByDialect[<Room>Repository]``
(``billing.storage.dialects``), so a method missing or misnamed in a class fails ``mypy``.

The proof is run on a copy of the package in which one method of each room's classes is renamed:
``mypy`` must fail at each room's factory (and pass on the copy as it is).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.nodb]

ROOT = Path(__file__).resolve().parents[2]

#: Per room: the module of one of its database classes and a method of its Protocol defined
#: there (renamed in the copy).
RENAMED = {
    "ingest": ("billing/ingest/sql/sqlite.py", "stored_hashes"),
    "reconcile": ("billing/reconcile/sql/sqlite.py", "write_calls"),
    "rollups": ("billing/rollups/sql/sqlite.py", "keep_keyless"),
    "calllog": ("billing/calllog/sql/sqlite.py", "rollup_sums"),
    "export": ("billing/export/sql/common.py", "totals"),
    "providers": ("billing/providers/sql/common.py", "current_lines"),
    "drift": ("billing/drift/sql/common.py", "ours"),
    "plans": ("billing/plans/sql/common.py", "key_history"),
    "budgets": ("billing/budgets/sql/alerts.py", "insert_alert"),
    "pricing": ("billing/pricing/sql/common.py", "rows_by_id"),
    "archive": ("billing/archive/sql/common.py", "open_calls"),
    "credits": ("billing/credits/sql/common.py", "owners_with_grants"),
    "observe": ("billing/observe/sql/common.py", "oldest_due"),
}


def _mypy(tree: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(tree / "pyproject.toml"),
            "--cache-dir",
            str(cache),
            "billing",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_mypy_fails_at_each_room_whose_database_class_lacks_a_method(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "billing", tree / "billing", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    cache = tmp_path / "mypy-cache"

    clean = _mypy(tree, cache)
    assert clean.returncode == 0, clean.stdout

    for module, method in RENAMED.values():
        path = tree / module
        source = path.read_text()
        renamed = re.sub(rf"\bdef {method}\(", f"def {method}_renamed(", source)
        assert renamed != source, (module, method)
        path.write_text(renamed)
    broken = _mypy(tree, cache)
    assert broken.returncode != 0
    for room in RENAMED:
        # The factory's ByDialect[<Room>Repository] refuses the class: the error names the
        # room's repository module.
        assert f"billing/{room}/repository.py" in broken.stdout, (room, broken.stdout)
