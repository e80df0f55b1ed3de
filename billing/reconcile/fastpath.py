"""The common call settled by the database: the billing rule's result for its most frequent shape.

Most calls are one attempt: one ``stream.started``, progress records (``stream.tokens``),
perhaps one ``stream.client_disconnected``, and one ``stream.usage`` (the provider's,
``source: upstream``, or the gateway's ``estimate`` when the provider sent none); nothing else,
not settled before, on a priced model. For such a call the rule (``billing.reconcile.rule``,
CONTRACT "Reconciliation" and "Cost") comes down to a few columns:

- input, cache read, cache creation and reasoning tokens = the usage's (0 when absent);
  delivered = the largest ``output_tokens_delivered`` of the progress records and the disconnect
  (the billed output when there is neither: a normal end delivered it all); billed output =
  the upstream usage's ``output_tokens``, or for an estimate the largest of its
  ``output_tokens``, the ``output_tokens_generated`` counters and delivered;
  undelivered = billed − delivered;
- status ``client_disconnected`` with a disconnect, else ``completed``; usage source = the
  usage's; stop reason = the usage's; no error; anomalies none for upstream usage (a call whose
  delivered exceeds its upstream billed count has one, and is left to the rule), and
  ``usage_missing`` for an estimate;
- it settles now when the usage is upstream (``stream.started`` arrived and every attempt has
  upstream usage), and an estimate's call once its last event arrived ``settle_after`` ago; one
  ``settlement`` ledger entry at the price in force at the call's start (the latest
  ``effective_from`` at or before it), cost = Σ tokens × rate in exact integer picodollars;
- started at the ``stream.started``'s ``occurred_at``, ended at the latest ``occurred_at`` of its
  events; key, model, protocol and metadata from that ``stream.started``, as ingest wrote them on
  the ``calls`` row from the validated event (checked: the row's start must be the event's). Its
  body is not read again: a hand edit of a stored ``stream.started`` or ``stream.tokens`` body
  is not seen here (the rule reads the bodies).

``settle_common`` books the calls of a step that have this shape and settle now with a few
set-based statements (``ReconcileRepository.settle_common``: no event crosses into Python); the
reconciler (``billing.reconcile.service``) then gives every other call to the rule. Anything
outside the shape goes to the rule: several attempts, a failure, two usages, two
``stream.started`` or two disconnects, an unpriced model, a rate of 2,147 USD per million tokens
or more (the products could overflow 64 bits), a call settled before, an estimate's call that is
not due yet (it is reconciled open), a usage carrying a v2 field (one-hour cache writes, a
service tier, units, other models, reported anomalies: ``DECLINED_USAGE_FIELDS``) or an
estimate without input, a call whose price in force has long-context prices that its input
exceeds, (v2) a call whose key has an assignment in ``key_assignments`` (a customer or a plan:
the rule charges it; the statements charge every other call its cost; (v3) a key with prepaid
credit grants of its own is settled here, and the step draws them for the calls settled here
as for the rule's, ``billing.credits.draws.after_step``), (v2) a call whose row
has a served tier, units, other models, a customer or a plan already (the rule reconciled it open
so; the statements do not write those columns), a usage or disconnect
body that is not what ingest writes (not JSON, a value of another type, a count out of range, a
JSON ``null`` in the usage), (v3) an estimate with an input of 0 — where the rule decides (and
refuses what it refuses) — and every call with a SQLite library too old for ``UPDATE … FROM``.

``HANDLED`` declares the event types and fields the statements read; ``is_common`` states the
shape in Python. ``tests/reconcile/test_fastpath_property.py`` generates calls from the
event schemas and requires that the database settles exactly the calls ``is_common`` names, with the
same rows as the rule: an event field outside ``HANDLED`` makes ``is_common`` false, so a field
added to an event fails that property until the statements handle it (and ``HANDLED`` says so)
or decline such calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import get_args

from pydantic import BaseModel
from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.ingest.schemas import (
    StreamClientDisconnected,
    StreamStarted,
    StreamTokens,
    StreamUsage,
)
from billing.reconcile.ledger import SETTLED_COMPLETE, settled_timed_out
from billing.reconcile.repository import repository
from billing.reconcile.rows import CommonCharge
from billing.rollups.rows import BOOKED, CALL_START, PICO, Contributions
from billing.rollups.service import Deltas, Placed, Totals

_ENVELOPE = ("type", "event_id", "request_id", "occurred_at", "attempt")


def _fields(names: str) -> frozenset[str]:
    """The envelope's fields and the space-separated ``names``."""
    return frozenset((*_ENVELOPE, *names.split()))


#: The event types the fast path settles calls of, and the fields of each that its statements
#: read or may ignore (the rule ignores them too for a call of this shape: the started's
#: ``input_tokens`` counts only without usage, the usage's ``model`` never).
HANDLED: dict[type[BaseModel], frozenset[str]] = {
    StreamStarted: _fields(
        "api_key_id model protocol input_tokens metadata provider upstream_account"
    ),
    StreamTokens: _fields("output_tokens_generated output_tokens_delivered"),
    StreamClientDisconnected: _fields("output_tokens_delivered output_tokens_generated"),
    StreamUsage: _fields(
        "input_tokens output_tokens cache_read_input_tokens cache_creation_input_tokens "
        "reasoning_tokens source model stop_reason"
    ),
}


def _type_name(model: type[BaseModel]) -> str:
    """The ``type`` an event model is discriminated by (its ``Literal``)."""
    (name,) = get_args(model.model_fields["type"].annotation)
    return str(name)


def _declared(handled: dict[type[BaseModel], frozenset[str]]) -> dict[str, frozenset[str]]:
    """``handled`` by event type name, checked against the schemas (a renamed or removed field
    fails at import)."""
    for model, fields in handled.items():
        unknown = fields - set(model.model_fields)
        if unknown:
            raise AssertionError(f"{model.__name__} has no fields {sorted(unknown)}")
    return {_type_name(model): fields for model, fields in handled.items()}


#: ``HANDLED`` by event type name.
HANDLED_FIELDS = _declared(HANDLED)


def is_common(events: Iterable[BaseModel]) -> bool:
    """Whether the fast path settles a call with these (validated, distinct) events, once it is
    due, if it is not settled yet and its model is priced at rates below its limit.

    The shape of the module docstring: one attempt; exactly one ``stream.started`` and one
    ``stream.usage``, at most one ``stream.client_disconnected``, the rest ``stream.tokens``;
    every event's fields within ``HANDLED``; no field of the usage sent as JSON ``null`` and no
    text of it containing ``:null`` (the statements find a null by that text in the stored
    body); an upstream usage counting at least the tokens delivered. An estimate's call settles
    on the clock (``settle_after``), the others at once.
    """
    events = list(events)
    if not events or len({e.attempt for e in events}) != 1:  # type: ignore[attr-defined]
        return False
    counts: dict[str, int] = {}
    for event in events:
        kind = event.type  # type: ignore[attr-defined]
        handled = HANDLED_FIELDS.get(kind)
        if handled is None or not event.model_fields_set <= handled:
            return False
        counts[kind] = counts.get(kind, 0) + 1
    if counts.get("stream.started") != 1 or counts.get("stream.usage") != 1:
        return False
    if counts.get("stream.client_disconnected", 0) > 1:
        return False
    (usage,) = (e for e in events if isinstance(e, StreamUsage))
    if usage.input_tokens is None:  # an estimate without input: the rule reads stream.started
        return False
    if usage.source == "estimate" and usage.input_tokens == 0:  # v3: "not known" either
        return False
    for name in usage.model_fields_set:
        value = getattr(usage, name)
        if value is None or (isinstance(value, str) and ":null" in value):
            return False
    if usage.source != "upstream":
        return True
    delivered = max(
        (
            e.output_tokens_delivered
            for e in events
            if isinstance(e, StreamTokens | StreamClientDisconnected)
        ),
        default=0,
    )
    return usage.output_tokens >= delivered


def settle_common(
    session: Session,
    request_ids: Sequence[str],
    now: datetime,
    settle_after_s: float,
    deltas: Deltas,
    drift: Contributions | None = None,
    charged: list[CommonCharge] | None = None,
) -> list[str]:
    """Settle, inside the caller's transaction, those of the (locked) ``request_ids`` that have
    the common shape (see the module docstring) and settle now: their ``calls`` row and
    settlement ledger entry are written by the database (a call of one attempt has no
    ``call_attempts`` row, see ``CallAttempt``), and their rollup contributions (both bases) are
    added to ``deltas`` for the step to write, and their contributions to ``drift_rollups`` (which
    holds every call settled here: each has a ``stream.started``) to ``drift`` when given (keyed
    and summed as ``billing.rollups.drift.Contributions``), so that the step need not read them
    back from ``calls``, and each call's key, charge and number (``CommonCharge``) to ``charged``
    when given (the step's credit draws take them from there). Returns the calls settled (in no
    particular order); the others are untouched, for the rule. ``now`` (aware UTC) is the step's
    clock (``booked_at``, ``settled_at``); a call with an estimate settles once its last event
    arrived ``settle_after_s`` seconds before ``now`` or earlier. Raises the driver's error for a
    body PostgreSQL cannot read as JSON (as the rule raises for it: the caller's step fails)."""
    if not request_ids:
        return []
    cutoff = now - timedelta(seconds=settle_after_s)
    reasons = (SETTLED_COMPLETE, settled_timed_out(settle_after_s))
    settled, groups = repository(session).settle_common(session, request_ids, now, cutoff, reasons)
    if charged is not None:
        charged.extend(settled)
    for api_key_id, model, quarter, hour, provider, account, calls, *sums in groups:
        *tokens, whole_usd, pico, disconnected = (int(value) for value in sums)
        # Charged at cost (the statements settle no call whose key has a customer or a plan).
        cost = whole_usd * PICO + pico
        totals = Totals([calls, calls, *tokens, 0, 0], cost, cost)
        statuses = (("completed", calls - disconnected), ("client_disconnected", disconnected))
        deltas.add(CALL_START, Placed(quarter, api_key_id, model, totals, None, statuses))
        deltas.add(BOOKED, Placed(now, api_key_id, model, totals))
        if drift is not None:
            # One attempt each, priced, no served tier (the statements decline a usage with one).
            key = (hour, provider, model, account, "")
            row = [calls, calls, *(tokens[i] for i in _DRIFT_TOKENS), whole_usd, pico, 0]
            summed = drift.get(key)
            if summed is not None:
                row = [a + b for a, b in zip(summed, row, strict=True)]
            drift[key] = row
    return [rid for rid, _, _, _ in settled]


#: The positions in ``TOKEN_FIELDS`` of the token sums ``drift_rollups`` keeps (its input, cache
#: read, cache creation and output columns: ``billing.drift.repository.RollupSums``).
_DRIFT_TOKENS = tuple(
    TOKEN_FIELDS.index(name)
    for name in (
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens_billed",
    )
)
