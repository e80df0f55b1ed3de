"""What the tap tests compare: everything a tap reports."""

from __future__ import annotations

from typing import Any

from billing.taps import Tap


def state(tap: Tap) -> tuple[Any, ...]:
    """Everything a tap reports, for comparing two readings of the same bytes."""
    return (
        tap.usage,
        tap.input_reported,
        tap.stop_reason,
        tap.error,
        tap.model,
        tap.output_tokens,
        tap.output_tokens_is_estimate,
        tap.malformed_events,
        tap.final_events(),
    )
