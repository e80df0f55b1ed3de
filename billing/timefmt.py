"""RFC 3339 formatting of timezone-aware timestamps."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(value: datetime | None) -> str | None:
    """``2026-10-15T08:00:00Z`` (UTC, microseconds only when present); None stays None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
