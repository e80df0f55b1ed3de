"""The ``focus-validator`` package (FOCUS 1.2) in a venv of its own: its 2.x needs Python ≥ 3.12
and pins NumPy < 2, while this project runs on 3.11. ``.ci/run`` makes the venv
(``BILLING_FOCUS_VENV``, default ``~/.cache/billing/focus-validator``); a test makes it when it
is missing and a Python 3.12 is found (``python3.12`` on the path, or pyenv's).

The validator always exits 0, so its JUnit report is read rule by rule: a rule that fails or
errors is a problem unless another rule of the same column and check (``InvoiceId-C-004-C``
"null when there is no invoice" against ``InvoiceId-C-005-C`` "not null when there is one")
passes: those are alternatives, one of which applies.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

#: What the venv holds (``.ci/run`` installs the same).
REQUIREMENTS = ("focus-validator==2.2.1", "numpy<2", "pyarrow<22")
VERSION = "1.2.0.1"


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "billing" / "focus-validator"
    return Path(os.environ.get("BILLING_FOCUS_VENV", default))


def _python312() -> str | None:
    found = shutil.which("python3.12")
    if found:
        return found
    candidates = sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12")))
    return candidates[-1] if candidates else None


def validator() -> Path | None:
    """The venv's ``focus-validator``, made first if need be; None without a Python 3.12."""
    venv = venv_dir()
    exe = venv / "bin" / "focus-validator"
    if exe.exists():
        return exe
    python = _python312()
    if python is None:
        return None
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--disable-pip-version-check", *REQUIREMENTS], check=True)
    return exe


def problems(exe: Path, csv_file: Path, report: Path) -> list[str]:
    """The rules the CSV fails (with their alternatives taken into account), as text."""
    site = next((exe.parent.parent / "lib").glob("python3*/site-packages"))
    # It opens its rule files (currency codes) by a path relative to its package's parent, and
    # reads its bundled rule set only (``--block-download``: no network).
    subprocess.run(
        [
            str(exe), "--data-file", str(csv_file), "--validate-version", VERSION,
            "--block-download", "--output-type", "unittest",
            "--output-destination", str(report),
        ],
        cwd=site, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    outcomes: dict[str, bool] = {}
    for case in ET.parse(report).iter("testcase"):
        name = case.get("name", "")
        if case.find("skipped") is not None:
            continue
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[name] = not failed
    assert len(outcomes) > 100, f"the report holds only {len(outcomes)} rules that ran"

    def group(name: str) -> tuple[str, str]:
        rule, _, check = name.partition(" :: ")
        return rule.split("-C-")[0], check

    passed = {group(name) for name, ok in outcomes.items() if ok}
    return sorted(name for name, ok in outcomes.items() if not ok and group(name) not in passed)
