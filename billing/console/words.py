"""What the console says of codes: anomalies and event types in plain words."""

from __future__ import annotations

from billing.anomalies import (
    DELIVERED_EXCEEDS_BILLED,
    INPUT_UNKNOWN,
    STARTED_MISSING,
    UNPRICED,
    USAGE_MISSING,
)

#: Anomaly code → a sentence (CONTRACT "Reconciliation", "Cost", "Usage dimensions").
ANOMALIES: dict[str, str] = {
    DELIVERED_EXCEEDS_BILLED: (
        "The provider billed fewer output tokens than the gateway delivered to the client; "
        "the provider's count is what is billed."
    ),
    INPUT_UNKNOWN: "No event gave the input token count, so the call counts 0 input tokens.",
    USAGE_MISSING: (
        "At least one attempt has no usage reported by the provider: its figures are the "
        "gateway's estimate."
    ),
    STARTED_MISSING: (
        "No stream.started event arrived before the call settled, so its key and model are unknown."
    ),
    UNPRICED: "The model (or one of its units) has no price, so the cost is unknown, not zero.",
    "usage_inconsistent": "The provider's usage figures contradict each other.",
}

#: Event type → a short title for the timeline.
EVENT_TITLES: dict[str, str] = {
    "stream.started": "Started",
    "stream.tokens": "Progress",
    "stream.client_disconnected": "Client disconnected",
    "stream.usage": "Usage reported",
    "stream.failed": "Failed",
}


def anomaly_words(code: str) -> str:
    """The sentence for an anomaly ``code`` (an unknown code is named as it is)."""
    return ANOMALIES.get(code, f"Anomaly {code}.")


def event_title(event_type: str) -> str:
    """The timeline's title for an event of ``event_type``."""
    return EVENT_TITLES.get(event_type, event_type)
