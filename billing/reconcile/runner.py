"""A reconciliation pass: bounded steps, one transaction each, until no call needs work."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from billing.budgets import summed as budget_summed
from billing.credits import draws as credit_draws
from billing.metrics import Metrics
from billing.reconcile.repository import repository
from billing.reconcile.service import (
    StepResult,
    due_calls,
    lock_call,
    pending_horizon,
    reconcile_calls,
    reconcile_step,
)
from billing.settings import Settings
from billing.storage.db import is_unavailable, read_transaction, write_transaction

log = logging.getLogger("billing.reconcile")

#: A pass stops after this many steps even if work remains (the next pass goes on).
MAX_STEPS_PER_PASS = 10_000

#: While ingest is busy, a step is sized to take about this long (seconds): ingest waits for the
#: steps that hold what it writes (SQLite: the write lock; PostgreSQL: the locks of the step's
#: calls), so a whole step of ``reconcile_batch_size`` calls sets the p99 of ingest posts.
#: Smaller steps cost more per call (each has a fixed cost: its commit, the
#: rollup rows), so they are used only while ingest is busy.
BUSY_STEP_S = 0.05
#: The first step while busy, and the smallest (calls).
BUSY_FIRST_STEP = 500
BUSY_MIN_STEP = 100


#: The longest pause between background passes while the database is unavailable (seconds).
MAX_OUTAGE_PAUSE_S = 60.0


class Backoff:
    """The pause before the next background pass (``billing.server.app``'s loop).

    ``interval_s`` while passes succeed. While the database is unavailable (``failed`` with an
    error ``is_unavailable`` takes for an outage) the pause doubles after each failed pass, up
    to ``MAX_OUTAGE_PAUSE_S``, and the outage is logged in one line when it begins (a warning
    naming the error) and one when it ends (``succeeded``), not a traceback per pass.
    """

    def __init__(self, interval_s: float, max_pause_s: float = MAX_OUTAGE_PAUSE_S) -> None:
        self.interval_s = interval_s
        self.max_pause_s = max(max_pause_s, interval_s)
        self.failures = 0
        self.pause_s = interval_s

    def failed(self, error: BaseException) -> bool:
        """A pass failed with ``error``: True when it is an outage (logged and paused here),
        False for any other error (the caller logs it; the pause stays the interval)."""
        if not is_unavailable(error):
            return False
        self.failures += 1
        self.pause_s = min(self.interval_s * 2**self.failures, self.max_pause_s)
        if self.failures == 1:
            log.warning(
                "database unavailable (%s); reconciliation paused, retrying with growing pauses "
                "up to %g s",
                outage_line(error),
                self.max_pause_s,
            )
        return True

    def succeeded(self) -> None:
        """A pass succeeded: back to the interval, saying so when an outage ends."""
        if self.failures:
            log.warning(
                "database available again after %d failed passes; reconciliation resumed",
                self.failures,
            )
        self.failures = 0
        self.pause_s = self.interval_s


def outage_line(error: BaseException) -> str:
    """``error`` in one line: the driver's exception type and the first line of its message."""
    orig = getattr(error, "orig", None) or error
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first[:200]}" if first else type(orig).__name__


class StepSizer:
    """How many calls the next step of a pass takes (see ``BUSY_STEP_S``).

    ``limit(busy)``: ``batch_size`` while ingest is idle; while it is busy, the number of calls
    that took ``BUSY_STEP_S`` at the pace of the last step (``observe``), between
    ``BUSY_MIN_STEP`` and ``batch_size``; ``BUSY_FIRST_STEP`` before any step was observed.
    Steps have a fixed cost, so the pace of a small step is slower per call: the size settles
    where a step takes ``BUSY_STEP_S``.
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._busy_limit = min(batch_size, BUSY_FIRST_STEP)

    def limit(self, busy: bool) -> int:
        """Calls for the next step."""
        return self._busy_limit if busy else self.batch_size

    def observe(self, examined: int, seconds: float) -> None:
        """A step examined ``examined`` calls in ``seconds`` (wall time)."""
        if examined <= 0 or seconds <= 0:
            return
        paced = int(examined * BUSY_STEP_S / seconds)
        self._busy_limit = max(min(paced, self.batch_size), min(BUSY_MIN_STEP, self.batch_size))


def run_pass(
    sessions: sessionmaker[Session],
    settings: Settings,
    metrics: Metrics | None = None,
    now: datetime | None = None,
    busy: Callable[[], bool] | None = None,
) -> StepResult:
    """Run steps of ``settings.reconcile_batch_size`` calls until none is due.

    ``busy`` tells whether ingest in this process is writing; while it says so, steps are sized
    to take about ``BUSY_STEP_S`` (``StepSizer``), so that posts do not wait for long steps.
    With ``busy`` given (the background passes), a pass takes the calls pending when it began
    (up to their latest ``last_received_at``, ``pending_horizon``), not those made pending by
    events arriving meanwhile (with short steps it would chase them: a call still streaming
    reconciled again after nearly every event); the next pass takes those.

    ``now`` (timezone-aware UTC) fixes the clock for the whole pass; by default each step reads the
    current time. Each step commits on its own, so a pass killed midway leaves whole steps only.
    Where the database runs steps at once (``ReconcileRepository.steps_at_once``: PostgreSQL),
    ``settings.reconcile_threads`` threads run steps at once: each step locks its
    calls (``FOR UPDATE SKIP LOCKED``), so no call is in two steps, and the rollup rows are
    locked in one order (no deadlock). Returns the totals of the pass; raises the database's
    error when it is unavailable.
    """
    with read_transaction(sessions) as session:
        credits = credit_draws.credits_exist(session)
    if credits:  # (a gateway without credits opens no transaction for them)
        with write_transaction(sessions) as session:
            # Grants expired since the last pass book their remainders (at their expires_at).
            credit_draws.on_pass(session, now or datetime.now(UTC))
    threads = settings.reconcile_threads
    bind = sessions.kw.get("bind")
    if threads <= 1 or bind is None or not repository(bind).steps_at_once:
        total = _run_steps(sessions, settings, metrics, now, busy)
    else:
        results: list[StepResult] = []
        errors: list[BaseException] = []

        def work() -> None:
            try:
                results.append(_run_steps(sessions, settings, metrics, now, busy))
            except BaseException as error:  # handed to the caller below
                errors.append(error)

        helpers = [
            threading.Thread(target=work, name="billing-reconcile-step", daemon=True)
            for _ in range(threads - 1)
        ]
        for helper in helpers:
            helper.start()
        work()
        for helper in helpers:
            helper.join()
        if errors:
            raise errors[0]
        total = StepResult()
        for result in results:
            total.add(result)
    # (v3) Rolling budgets' windows slide without a step: their crossings resolve here.
    budget_summed.on_pass(sessions, now or datetime.now(UTC))
    if total.settled or total.adjusted:
        log.info("reconciled: %d settled, %d adjusted", total.settled, total.adjusted)
    return total


def _run_steps(
    sessions: sessionmaker[Session],
    settings: Settings,
    metrics: Metrics | None,
    now: datetime | None,
    busy: Callable[[], bool] | None,
) -> StepResult:
    """Steps until one finds fewer calls due than it could take (see ``run_pass``)."""
    total = StepResult()
    sizer = StepSizer(settings.reconcile_batch_size)
    pending_before = None
    if busy is not None:
        with read_transaction(sessions) as session:
            # No call pending now: those made pending during the pass wait for the next one.
            pending_before = pending_horizon(session) or datetime.min.replace(tzinfo=UTC)
    for _ in range(MAX_STEPS_PER_PASS):
        clock = now or datetime.now(UTC)
        limit = sizer.limit(busy is not None and busy())
        try:
            with write_transaction(sessions) as session:
                # Paced from inside the transaction: not the wait for SQLite's write lock
                # behind ingest, which would shrink every step while ingest is busy.
                started = time.monotonic()
                step = reconcile_step(
                    session, clock, settings.settle_after_s, limit, pending_before=pending_before
                )
        except Exception as error:
            if is_unavailable(error):
                raise
            # One call that cannot be booked must not hold back the others: redo this step one
            # call per transaction, leave the failing ones pending, and end the pass.
            log.exception("reconciliation step failed; retrying its calls one by one")
            step = _one_by_one(sessions, settings, clock)
            _count(metrics, step)
            total.add(step)
            break
        sizer.observe(step.examined, time.monotonic() - started)
        _count(metrics, step)
        total.add(step)
        if step.examined < limit:
            break
    return total


def _count(metrics: Metrics | None, step: StepResult) -> None:
    if metrics is not None:
        metrics.settled.inc(step.settled)
        metrics.adjustments.inc(step.adjusted)


def _one_by_one(sessions: sessionmaker[Session], settings: Settings, clock: datetime) -> StepResult:
    """Reconcile the due calls each in its own transaction; a failing call is logged and skipped
    (it stays pending, so the next pass tries it again)."""
    with read_transaction(sessions) as session:
        request_ids = due_calls(
            session, clock, settings.settle_after_s, settings.reconcile_batch_size, lock=False
        )
    total = StepResult()
    for request_id in request_ids:
        try:
            with write_transaction(sessions) as session:
                if lock_call(session, request_id):
                    total.add(
                        reconcile_calls(session, [request_id], clock, settings.settle_after_s)
                    )
        except Exception as error:
            if is_unavailable(error):
                raise
            log.exception("call %r could not be reconciled; it stays pending", request_id)
    return total
