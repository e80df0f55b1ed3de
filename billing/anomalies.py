"""The anomaly codes a call may carry (CONTRACT "Reconciliation", "Cost", "Usage dimensions
(v2)"), declared once: the rule finds some, a gateway or tap reports others in
``stream.usage.anomalies``."""

from __future__ import annotations

from typing import Literal

#: Found by the rule (``billing.reconcile.rule``) and the pricing of its lines.
DELIVERED_EXCEEDS_BILLED = "delivered_exceeds_billed"
INPUT_UNKNOWN = "input_unknown"
USAGE_MISSING = "usage_missing"
STARTED_MISSING = "started_missing"
UNPRICED = "unpriced"

#: Reported in ``stream.usage.anomalies``; the rule carries each onto the call.
#: ``usage_inconsistent``: the upstream's figures contradicted themselves and were kept as far
#: as valid; ``drain_skipped``: the gateway cancelled the upstream after the client left,
#: without waiting for the final usage.
USAGE_INCONSISTENT = "usage_inconsistent"
DRAIN_SKIPPED = "drain_skipped"
REPORTED_ANOMALIES = (USAGE_INCONSISTENT, DRAIN_SKIPPED)
ReportedAnomaly = Literal["usage_inconsistent", "drain_skipped"]
