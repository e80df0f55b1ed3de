"""The shared checker of the reliability tests: what must hold in any committed state.

``check_invariants(engine)`` reads the whole database (calls, call_attempts, ledger_entries, events
and the usage rollups) and raises ``AssertionError`` listing every broken rule (CONTRACT
"Reconciliation", "Cost", "Call log and usage queries"):

- no ``event_id`` is stored twice;
- every call has a number (``call_no``, unique) and every event has a call and carries its number
  (a call's events are found by it);
- every token figure is >= 0, on calls, attempts and per ledger line (no line goes negative);
- per ``call_attempts`` row: ``output_tokens_undelivered = max(0, billed - delivered)``; a call
  with more than one attempt has one row per attempt, its figures are their sum and ``attempts``
  counts them; a call with one attempt (or none yet) has no row (it is its attempt);
- ``settled`` <=> the call has a settlement entry; an open call has no ledger entry at all;
- per settled call: the ledger entries sum to the call's figures, every token bucket, and the cost
  when the call is priced (an unpriced call has an unpriced line);
- every entry's ``cost_pusd`` equals its own tokens times its own prices (null iff unpriced);
- one settlement entry per (call, line) unless that line was reversed since; a second settlement
  of a call follows a reversal; a call's ledger starts with a settlement;
- the rollups (``usage_rollups`` and ``usage_rollups_all_keys``) equal what the ledger (``booked``)
  and the settled calls (``call_start``) hold, bucket by bucket, at every level;
- ``drift_rollups`` equals the settled calls with a ``stream.started`` summed per UTC hour of
  their start, provider, model, upstream account and served tier, as the drift sums them.

Also here: ``ledger_sums`` (per-call sums, to compare a run with a clean run of the same events)
and ``scratch_database`` (a second database at the migration head, SQLite or PostgreSQL).
"""

from __future__ import annotations

import json
import os
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from billing.dimensions import TOKEN_FIELDS
from billing.rates import PART_OF, RATES
from billing.storage.migrate import upgrade_to_head
from billing.storage.models import (
    Call,
    CallAttempt,
    DriftRollup,
    Event,
    LedgerEntry,
    UsageRollup,
    UsageRollupAllKeys,
    UsageRollupKeyless,
)

#: (token column, ledger price column) pairs that make an entry's cost.
COST_PARTS = tuple((rate.bucket.name, rate.column) for rate in RATES)
ROLLUP_COUNTS = ("members", "calls", *TOKEN_FIELDS, "unpriced")
PICO = 10**12
STARTED_MISSING = "started_missing"
MAX_SHOWN = 25


@dataclass
class Report:
    """What the checker saw (for the figures the tests print) and what it could not check."""

    events: int = 0
    calls: int = 0
    settled: int = 0
    entries: int = 0
    settlements: int = 0
    adjustments: int = 0
    rollup_rows: int = 0
    notes: list[str] = field(default_factory=list)


def _tokens(row: Any) -> tuple[int, ...]:
    return tuple(int(getattr(row, name)) for name in TOKEN_FIELDS)


def _add(a: tuple[int, ...], b: tuple[int, ...], sign: int = 1) -> tuple[int, ...]:
    return tuple(x + sign * y for x, y in zip(a, b, strict=True))


ZERO = (0,) * len(TOKEN_FIELDS)


def _line(entry: Any) -> tuple[str | None, str | None, int | None]:
    return (entry.api_key_id, entry.model, entry.price_id)


def _entry_cost(entry: Any) -> int | None:
    prices = [getattr(entry, price) for _, price in COST_PARTS]
    if any(p is None for p in prices):
        return None
    cost = sum(
        int(getattr(entry, t)) * int(p) for (t, _), p in zip(COST_PARTS, prices, strict=True)
    )
    # A part of another bucket (one-hour cache writes) is billed at its own rate instead of its
    # whole's; units at their unit prices (micro-USD per unit), CONTRACT "Usage dimensions (v2)".
    for part, whole in PART_OF:
        cost -= int(getattr(entry, COST_PARTS[part][0])) * int(prices[whole])
    units = json.loads(entry.units) if getattr(entry, "units", None) else {}
    unit_prices = json.loads(entry.unit_prices) if getattr(entry, "unit_prices", None) else {}
    for name, count in units.items():
        if count and name not in unit_prices:
            return None
        cost += int(count) * int(unit_prices.get(name, 0)) * 10**6
    return int(cost)


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A connection whose statements all read one snapshot. On PostgreSQL READ COMMITTED (the
    default) each statement sees what was committed when it began, so a step committing between
    reading ``calls`` and reading ``call_attempts`` would look like a half-settled call; REPEATABLE
    READ reads every table as of the first statement. SQLite's read transaction is one snapshot."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        yield conn


def check_invariants(engine: Engine, *, rollups: bool = True) -> Report:
    """Check every invariant on the committed state of ``engine``'s database; raise
    ``AssertionError`` listing the broken ones (at most ``MAX_SHOWN`` shown). Returns counts."""
    report = Report()
    problems: list[str] = []
    with _snapshot(engine) as conn:
        events, distinct = conn.execute(
            select(func.count(), func.count(func.distinct(Event.event_id)))
        ).one()
        report.events = int(events)
        if events != distinct:
            problems.append(f"events: {events} rows but {distinct} distinct event_ids")
        calls = {c.request_id: c for c in conn.execute(select(Call))}
        attempts: dict[str, list[Any]] = defaultdict(list)
        for attempt in conn.execute(select(CallAttempt)):
            attempts[attempt.request_id].append(attempt)
        entries: dict[str, list[Any]] = defaultdict(list)
        for entry in conn.execute(
            select(LedgerEntry).order_by(LedgerEntry.request_id, LedgerEntry.seq)
        ):
            entries[entry.request_id].append(entry)
        keyless = {
            r.request_id: r.started_at.astimezone(UTC)
            for r in conn.execute(select(UsageRollupKeyless))
        }
        report.calls = len(calls)
        numbers = [c.call_no for c in calls.values()]
        if None in numbers:
            problems.append("calls: a call without a call_no")
        if len(set(numbers)) != len(numbers):
            problems.append("calls: two calls with the same call_no")
        for request_id, call_no, count in conn.execute(
            select(Event.request_id, Event.call_no, func.count()).group_by(
                Event.request_id, Event.call_no
            )
        ):
            call = calls.get(request_id)
            if call is None:
                problems.append(f"{request_id}: {count} event(s) of a call that does not exist")
            elif call_no != call.call_no:
                problems.append(
                    f"{request_id}: {count} event(s) with call_no {call_no}, "
                    f"the call's is {call.call_no}"
                )
        for rid in sorted(set(entries) - set(calls)):
            problems.append(f"{rid}: ledger entries for a call that does not exist")
        for rid in sorted(set(attempts) - set(calls)):
            problems.append(f"{rid}: call_attempts rows for a call that does not exist")
        for rid, call in calls.items():
            _check_call(rid, call, attempts.get(rid, []), entries.get(rid, []), problems, report)
        report.settled = sum(1 for c in calls.values() if c.settled)
        if rollups:
            _check_rollups(conn, calls, entries, keyless, problems, report)
            _check_drift_rollup(conn, calls, problems)
    if problems:
        shown = "\n  ".join(problems[:MAX_SHOWN])
        more = f"\n  … and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
        raise AssertionError(f"{len(problems)} invariant(s) broken:\n  {shown}{more}")
    return report


def _check_call(
    rid: str,
    call: Any,
    attempts: list[Any],
    entries: list[Any],
    problems: list[str],
    report: Report,
) -> None:
    figures = _tokens(call)
    if any(v < 0 for v in figures):
        problems.append(f"{rid}: negative figures {dict(zip(TOKEN_FIELDS, figures, strict=True))}")
    # attempts: rows only for a call with several (a call with one is its attempt)
    if call.attempts <= 1 and attempts:
        problems.append(f"{rid}: attempts = {call.attempts} but {len(attempts)} attempt rows")
    elif call.attempts > 1:
        total = ZERO
        for a in attempts:
            t = _tokens(a)
            total = _add(total, t)
            if any(v < 0 for v in t):
                problems.append(f"{rid}/attempt {a.attempt}: negative figures")
            expect = max(0, a.output_tokens_billed - a.output_tokens_delivered)
            if a.output_tokens_undelivered != expect:
                problems.append(
                    f"{rid}/attempt {a.attempt}: undelivered {a.output_tokens_undelivered} != "
                    f"max(0, billed {a.output_tokens_billed} - delivered "
                    f"{a.output_tokens_delivered}) = {expect}"
                )
        if total != figures:
            problems.append(f"{rid}: call figures {figures} != sum of its attempts {total}")
        if call.attempts != len(attempts):
            problems.append(f"{rid}: attempts = {call.attempts} but {len(attempts)} attempt rows")
    # ledger
    report.entries += len(entries)
    settlements = [e for e in entries if e.kind == "settlement"]
    report.settlements += len(settlements)
    report.adjustments += sum(1 for e in entries if e.kind == "adjustment")
    if call.settled and not settlements:
        problems.append(f"{rid}: settled without a settlement entry (half-settled)")
    if not call.settled and entries:
        problems.append(f"{rid}: open (not settled) but has {len(entries)} ledger entries")
    if not entries:
        return
    seqs = [e.seq for e in entries]
    if len(set(seqs)) != len(seqs):
        problems.append(f"{rid}: ledger seq repeated: {seqs}")
    if entries[0].kind != "settlement":
        problems.append(f"{rid}: the ledger starts with a {entries[0].kind}, not a settlement")
    net: dict[Any, tuple[int, ...]] = {}
    settled_lines: set[Any] = set()
    reversed_since_settlement = False
    first_booked = entries[0].booked_at
    cost_sum = 0
    unpriced_entry = False
    for e in entries:
        if e.kind not in ("settlement", "adjustment"):
            problems.append(f"{rid}/seq {e.seq}: unknown kind {e.kind!r}")
        own = _entry_cost(e)
        if e.cost_pusd is None:
            unpriced_entry = True
            if own is not None:
                problems.append(f"{rid}/seq {e.seq}: priced entry without a cost")
        else:
            cost_sum += int(e.cost_pusd)
            if own != int(e.cost_pusd):
                problems.append(
                    f"{rid}/seq {e.seq}: cost {e.cost_pusd} != its tokens times its prices ({own})"
                )
        line = _line(e)
        before = net.get(line, ZERO)
        after = _add(before, _tokens(e))
        net[line] = after
        if any(v < 0 for v in after):
            problems.append(f"{rid}/seq {e.seq}: line {line} goes negative: {after}")
        if e.kind == "settlement":
            if line in settled_lines:
                problems.append(
                    f"{rid}/seq {e.seq}: a second settlement of line {line} "
                    "without a reversal of it in between (billed twice)"
                )
            if e.booked_at != first_booked and not reversed_since_settlement:
                problems.append(f"{rid}/seq {e.seq}: a new settlement not preceded by a reversal")
            settled_lines.add(line)
            reversed_since_settlement = False
        elif e.reason.startswith("reversal") or (before != ZERO and after == ZERO):
            # A reversal (or a re-pricing) empties a line; a line at zero tokens is reversed by
            # an entry of zero tokens, told by its reason.
            settled_lines.discard(line)
            reversed_since_settlement = True
    if call.settled:
        total = ZERO
        for tokens in net.values():
            total = _add(total, tokens)
        if total != figures:
            problems.append(
                f"{rid}: ledger sums {dict(zip(TOKEN_FIELDS, total, strict=True))} != call "
                f"figures {dict(zip(TOKEN_FIELDS, figures, strict=True))}"
            )
        if call.cost_pusd is not None:
            live_unpriced = [ln for ln, t in net.items() if ln[2] is None and t != ZERO]
            if live_unpriced:
                problems.append(f"{rid}: priced call with unpriced ledger lines {live_unpriced}")
            if cost_sum != int(call.cost_pusd):
                problems.append(f"{rid}: ledger cost {cost_sum} != call cost {call.cost_pusd}")
        elif not unpriced_entry:
            problems.append(f"{rid}: unpriced call (cost null) whose ledger lines are all priced")


# -- rollups -------------------------------------------------------------------------------------


def _floor(level: int, t: datetime) -> datetime:
    t = t.astimezone(UTC)
    if level == 0:
        return t.replace(minute=t.minute - t.minute % 15, second=0, microsecond=0)
    if level == 1:
        return t.replace(minute=0, second=0, microsecond=0)
    if level == 2:
        return t.replace(hour=0, minute=0, second=0, microsecond=0)
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _place(
    rows: dict[tuple[Any, ...], list[int]],
    basis: str,
    at: datetime,
    key: str | None,
    model: str | None,
    calls: int,
    tokens: tuple[int, ...],
    cost: int | None,
) -> None:
    for level in range(4):
        row = rows.setdefault(
            (basis, key or "", level, _floor(level, at), model or ""),
            [0] * (len(ROLLUP_COUNTS) + 1),
        )
        values = (1, calls, *tokens, 1 if cost is None else 0, cost or 0)
        for i, v in enumerate(values):
            row[i] += v


def _check_rollups(
    conn: Any,
    calls: dict[str, Any],
    entries: dict[str, list[Any]],
    keyless: dict[str, datetime],
    problems: list[str],
    report: Report,
) -> None:
    expected: dict[tuple[Any, ...], list[int]] = {}
    for rows in entries.values():
        for e in rows:
            _place(
                expected,
                "booked",
                e.booked_at,
                e.api_key_id,
                e.model,
                1 if e.kind == "settlement" else 0,
                _tokens(e),
                e.cost_pusd,
            )
    for rid, c in calls.items():
        if not c.settled or c.started_at is None:
            continue
        if STARTED_MISSING in (c.anomalies or ()):
            start = keyless.get(rid, c.started_at)
            _place(expected, "call_start", start, None, None, 1, _tokens(c), c.cost_pusd)
        else:
            _place(
                expected,
                "call_start",
                c.started_at,
                c.api_key_id,
                c.model,
                1,
                _tokens(c),
                c.cost_pusd,
            )
    expected = {k: v for k, v in expected.items() if any(v)}
    actual: dict[tuple[Any, ...], list[int]] = {}
    for r in conn.execute(select(UsageRollup)):
        values = [int(getattr(r, n)) for n in ROLLUP_COUNTS]
        values.append(int(r.cost_whole_usd) * PICO + int(r.cost_frac_pusd))
        if any(values):
            actual[(r.basis, r.api_key_id, r.level, r.bucket_start.astimezone(UTC), r.model)] = (
                values
            )
    report.rollup_rows = len(actual)
    _diff("usage_rollups", expected, actual, problems)
    summed: dict[tuple[Any, ...], list[int]] = {}
    for (basis, _key, level, start, model), values in expected.items():
        row = summed.setdefault((basis, level, start, model), [0] * len(values))
        for i, v in enumerate(values):
            row[i] += v
    all_keys: dict[tuple[Any, ...], list[int]] = {}
    for r in conn.execute(select(UsageRollupAllKeys)):
        values = [int(getattr(r, n)) for n in ROLLUP_COUNTS]
        values.append(int(r.cost_whole_usd) * PICO + int(r.cost_frac_pusd))
        if any(values):
            all_keys[(r.basis, r.level, r.bucket_start.astimezone(UTC), r.model)] = values
    _diff(
        "usage_rollups_all_keys",
        {k: v for k, v in summed.items() if any(v)},
        all_keys,
        problems,
    )


def _check_drift_rollup(conn: Any, calls: dict[str, Any], problems: list[str]) -> None:
    expected: dict[tuple[Any, ...], list[int]] = {}
    for c in calls.values():
        if not c.settled or c.started_at is None or STARTED_MISSING in (c.anomalies or ()):
            continue
        labels = (c.provider or "", c.model or "", c.upstream_account or "", c.service_tier or "")
        figures = [1, max(c.attempts, 1), c.input_tokens, c.cache_read_input_tokens]
        figures += [c.cache_creation_input_tokens, c.output_tokens_billed, c.cost_pusd or 0]
        figures += [int(c.cost_pusd is None)]
        for level, floor in ((0, 1), (1, 2)):
            row = expected.setdefault((level, _floor(floor, c.started_at), *labels), [0] * 8)
            for i, v in enumerate(figures):
                row[i] += v
    actual: dict[tuple[Any, ...], list[int]] = {}
    for r in conn.execute(select(DriftRollup).where(DriftRollup.calls != 0)):
        start = r.bucket_start.astimezone(UTC)
        labels = (r.provider, r.model, r.upstream_account, r.service_tier)
        actual[(r.level, start, *labels)] = [
            r.calls,
            r.requests,
            r.input_tokens,
            r.cache_read_input_tokens,
            r.cache_creation_input_tokens,
            r.output_tokens,
            int(r.cost_whole_usd) * PICO + int(r.cost_frac_pusd),
            r.unpriced_calls,
        ]
    for key in sorted(set(expected) | set(actual), key=repr):
        want, got = expected.get(key), actual.get(key)
        if want != got:
            problems.append(f"drift_rollups {key}: (calls, rollup) differ: {want} {got}")


def _diff(
    name: str, expected: dict[Any, list[int]], actual: dict[Any, list[int]], problems: list[str]
) -> None:
    names = (*ROLLUP_COUNTS, "cost_pusd")
    for key in sorted(set(expected) | set(actual), key=repr):
        want, got = expected.get(key), actual.get(key)
        if want != got:
            diff = {
                n: (w, g)
                for n, w, g in zip(
                    names, want or [0] * len(names), got or [0] * len(names), strict=True
                )
                if w != g
            }
            problems.append(f"{name} {key}: (ledger/calls, rollup) differ: {diff}")


# -- comparing runs ------------------------------------------------------------------------------


def ledger_sums(engine: Engine) -> dict[str, dict[str, Any]]:
    """Per call: the sum of its ledger entries per token bucket, ``cost_pusd`` (the sum of the
    priced entries' costs), ``unpriced`` (whether a line without a price still counts),
    ``settlements`` (how many settlement entries) and ``lines`` (the lines holding tokens: key,
    model and rates, with their net tokens)."""
    sums: dict[str, dict[str, Any]] = {}
    entries: dict[str, list[Any]] = defaultdict(list)
    with engine.connect() as conn:
        for e in conn.execute(
            select(LedgerEntry).order_by(LedgerEntry.request_id, LedgerEntry.seq)
        ):
            row = sums.setdefault(
                e.request_id, {**dict.fromkeys(TOKEN_FIELDS, 0), "cost_pusd": 0, "settlements": 0}
            )
            for name in TOKEN_FIELDS:
                row[name] += int(getattr(e, name))
            row["cost_pusd"] += int(e.cost_pusd or 0)
            row["settlements"] += e.kind == "settlement"
            entries[e.request_id].append(e)
    for rid, row in sums.items():
        row["unpriced"] = _has_live_unpriced_line(entries[rid])
        row["lines"] = _live_lines(entries[rid])
    return sums


def _live_lines(entries: list[Any]) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """The lines that hold tokens: ``(api_key_id, model, rates or None) -> net tokens``, rates
    being the entry's (input, output, cache read, cache creation) prices."""
    net: dict[tuple[Any, ...], tuple[int, ...]] = {}
    for e in entries:
        rates = (
            None
            if e.price_id is None
            else (
                e.input_uusd_per_mtok,
                e.output_uusd_per_mtok,
                e.cache_read_uusd_per_mtok,
                e.cache_creation_uusd_per_mtok,
            )
        )
        line = (e.api_key_id, e.model, rates)
        net[line] = _add(net.get(line, ZERO), _tokens(e))
    return {line: tokens for line, tokens in net.items() if tokens != ZERO}


def _has_live_unpriced_line(entries: list[Any]) -> bool:
    """Whether a line without a price still counts: it holds tokens, or it was booked at zero
    tokens and neither emptied since nor followed by a priced line of the same key and model (a
    call of an unpriced model with no tokens is still unpriced)."""
    net: dict[Any, tuple[int, ...]] = {}
    touched: set[Any] = set()
    for e in entries:
        line = _line(e)
        net[line] = _add(net.get(line, ZERO), _tokens(e))
        if _tokens(e) != ZERO:
            touched.add(line)
    for line, tokens in net.items():
        if line[2] is not None:
            continue
        if tokens != ZERO:
            return True
        last_seq = max(e.seq for e in entries if _line(e) == line)
        repriced = any(
            e.seq > last_seq and e.price_id is not None and (e.api_key_id, e.model) == line[:2]
            for e in entries
        )
        if line not in touched and not repriced:
            return True
    return False


def compare_sums(
    got: dict[str, dict[str, Any]],
    want: dict[str, dict[str, Any]],
    keys: tuple[str, ...] = (*TOKEN_FIELDS, "cost_pusd", "unpriced", "lines"),
) -> list[str]:
    """Calls whose ledger sums differ between two runs (one line each, empty when equal)."""
    out = []
    for rid in sorted(set(got) | set(want)):
        a, b = got.get(rid), want.get(rid)
        if a is None or b is None:
            out.append(f"{rid}: ledger {'missing' if a is None else 'unexpected'} in this run")
            continue
        diff = {k: (a[k], b[k]) for k in keys if a[k] != b[k]}
        if diff:
            out.append(f"{rid}: (this run, clean run) {diff}")
    return out


def stored_event_ids(engine: Engine) -> list[str]:
    """Every stored event_id, one per row (a duplicate would show twice)."""
    with engine.connect() as conn:
        return list(conn.scalars(select(Event.event_id)))


def engine_for(url: str) -> Engine:
    """A pool-less engine for checks (nothing left open between uses)."""
    return create_engine(url, poolclass=NullPool)


@contextmanager
def scratch_database(like_url: str, workdir: Path, name: str) -> Iterator[str]:
    """A new, empty database at the migration head on the same kind of server as ``like_url``:
    a SQLite file in ``workdir``, or a PostgreSQL database on the same server (dropped after)."""
    if like_url.startswith("sqlite"):
        path = workdir / f"{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        url = f"sqlite:///{path}"
        upgrade_to_head(url)
        yield url
        return
    dbname = f"billing_rel_{name}_{os.getpid()}_{uuid.uuid4().hex[:6]}".lower()
    admin = create_engine(
        make_url(like_url).set(database="postgres").render_as_string(hide_password=False),
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
    )
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{dbname}"'))
        url = make_url(like_url).set(database=dbname).render_as_string(hide_password=False)
        try:
            upgrade_to_head(url)
            yield url
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
    finally:
        admin.dispose()
