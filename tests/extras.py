"""Optional test requirements: skipped on a developer's machine without them, required in CI.

In CI (``CI=true``) every test runs: a missing extra (the ``litellm`` package, a wheelhouse) is
an error there, never a skip (.ci/run installs ``.[test,litellm]``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


def import_or_skip(name: str, reason: str) -> ModuleType:
    """``name`` imported; outside CI a missing module skips the test module with ``reason``."""
    if IN_CI:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=reason)


def skip_unless_ci(reason: str) -> None:
    """Skip with ``reason``, except in CI, where the missing requirement fails the test."""
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)
