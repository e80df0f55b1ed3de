"""Plain usages: a ``stream.usage`` body that carries only the v1 fields (CONTRACT "Events"),
flagged once at ingest (``events.plain_usage``, migration 0012).

The reconciler's fast path (``billing.reconcile.fastpath``) settles calls whose usage is plain;
a usage that carries any v2 field (one-hour cache writes, a served tier, units, other models,
reported anomalies: ``V2_USAGE_KEYS``) or a JSON ``null`` goes to the rule.
"""

from __future__ import annotations

import re

from billing.dimensions import USAGE_FIELDS
from billing.ingest.schemas import StreamUsage

#: The fields of a plain ``stream.usage``: the envelope, the v1 token fields, its source, the
#: model the upstream reported (informational) and the stop reason.
PLAIN_USAGE_FIELDS = frozenset(
    (
        "type",
        "event_id",
        "request_id",
        "occurred_at",
        "attempt",
        "source",
        *USAGE_FIELDS,
        "stop_reason",
        "model",
    )
)
#: Every other field of ``stream.usage``: a usage that names one is not plain.
V2_USAGE_KEYS: tuple[str, ...] = tuple(
    name for name in StreamUsage.model_fields if name not in PLAIN_USAGE_FIELDS
)

#: Lower case ASCII, as SQLite's ``LIKE`` compares (PostgreSQL's is case-sensitive: this declines
#: at least what either declines).
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
#: The keys of ``V2_USAGE_KEYS`` (``"name":``) and ``:null`` as one search; ``_`` matches
#: any one character, as in the ``LIKE`` patterns that migration 0012 fills the stored rows' flags
#: with (at worst a call goes to the rule).
_DECLINED = re.compile(
    "|".join((":null", *(f'"{re.escape(name).replace("_", ".")}":' for name in V2_USAGE_KEYS))),
    re.DOTALL,
)


def plain_usage(body: str) -> bool:
    """Whether a ``stream.usage`` body (the JSON text ingest stores) is plain as far as its
    text goes: no key of ``V2_USAGE_KEYS`` and no ``:null`` anywhere (a JSON null), ASCII case
    ignored. Ingest stores it in ``events.plain_usage`` (migration 0012), which the fast path
    reads instead of searching every usage body again at each settlement (the values' types it
    still checks in the body)."""
    return _DECLINED.search(body.translate(_LOWER)) is None
