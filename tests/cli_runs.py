"""``billing`` commands run by the tests: in a subprocess, as an operator runs them, or in this
process with Typer's runner, which answers alike without the second of interpreter start and
imports. A test that takes the ``cli_way`` fixture (tests/conftest.py) runs both ways: in
process in the fast run, in a subprocess in the slow one.
"""

from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from billing.cli import app
from billing.settings import get_settings

#: The ``cli_way`` fixture's parameters: the subprocess is the slow way.
WAYS = ["in process", pytest.param("subprocess", marks=pytest.mark.slow)]


def run_billing(
    way: str, args: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """``billing ARGS`` in ``cwd`` with ``env`` as its whole environment, ``way``: its exit
    code, stdout and stderr (bytes), as ``subprocess.run(..., capture_output=True)`` gives them."""
    if way == "in process":
        return run_in_process(args, env, cwd)
    assert way == "subprocess", way
    command = [sys.executable, "-c", "from billing.cli import main; main()", *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, timeout=timeout)


def text(done: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    """``done`` with its output decoded, as ``subprocess.run(..., text=True)`` gives it."""
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def run_in_process(
    args: Sequence[str], env: Mapping[str, str], cwd: Path
) -> subprocess.CompletedProcess[bytes]:
    """``billing ARGS`` in ``cwd`` with ``env`` as the whole environment, as
    ``subprocess.run(..., env=env, cwd=cwd, capture_output=True)`` runs it: its exit code, and
    its stdout and stderr as bytes."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name not in env:
                patch.delenv(name)
        for name, value in env.items():
            if os.environ.get(name) != value:
                patch.setenv(name, value)
        patch.chdir(cwd)
        get_settings.cache_clear()
        loggers = _loggers()
        try:
            result = CliRunner().invoke(app, list(args), catch_exceptions=False)
        finally:
            get_settings.cache_clear()
            _restore(loggers)
    return subprocess.CompletedProcess(
        list(args), result.exit_code, result.stdout_bytes, result.stderr_bytes
    )


_LoggerState = tuple[logging.Logger, list[logging.Handler], int, bool, bool]


def _loggers() -> list[_LoggerState]:
    """Every logger's handlers, level, propagation and disabled flag: the commands that log
    (``billing providers pull``, ``migrate``) configure logging for their process."""
    loggers = [logging.getLogger()]
    loggers += [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    return [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]


def _restore(states: list[_LoggerState]) -> None:
    known = set()
    for logger, handlers, level, propagate, disabled in states:
        known.add(logger.name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
        logger.disabled = disabled
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger.name not in known:
            logger.handlers.clear()
            logger.setLevel(logging.NOTSET)
            logger.propagate = True


def run_on_a_terminal(
    command: Sequence[str], env: Mapping[str, str], cwd: Path | None = None, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    """``command`` with its standard error on a pseudo-terminal (so that it draws its progress
    bars) and its standard output captured: the finished process and what the terminal got."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            list(command), env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=follower,
            timeout=timeout,
        )  # fmt: skip
        os.close(follower)
        seen = b""
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            seen += data
    finally:
        os.close(leader)
    return done, seen
