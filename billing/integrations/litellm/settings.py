"""The LiteLLM callback's settings, read from the proxy's environment.

``BILLING_URL`` (default ``http://127.0.0.1:8000``), ``BILLING_TOKEN`` (an ``ingest`` token) and
``BILLING_SPOOL`` (``off`` turns the client's spool off) make the billing client;
``BILLING_DRAIN`` (``on`` | ``off``), ``BILLING_DRAIN_MAX_S``, ``BILLING_DRAIN_MAX_TOKENS`` and
``BILLING_DRAIN_MAX_CONCURRENT`` the drain policy (:class:`billing.gateway.DrainPolicy`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from billing.client import BillingClient
from billing.gateway.policy import DrainPolicy

__all__ = ["client_from_env", "policy_from_env"]


def policy_from_env(env: Mapping[str, str] = os.environ) -> DrainPolicy:
    """The drain policy from ``BILLING_DRAIN`` (``on`` | ``off``), ``BILLING_DRAIN_MAX_S``,
    ``BILLING_DRAIN_MAX_TOKENS`` and ``BILLING_DRAIN_MAX_CONCURRENT`` (defaults: those of
    :class:`DrainPolicy`). Raises ``ValueError`` naming the variable on a bad value."""
    default = DrainPolicy()
    switch = env.get("BILLING_DRAIN", "on").strip().lower()
    if switch not in ("on", "off"):
        raise ValueError(f"BILLING_DRAIN must be 'on' or 'off', not {switch!r}")

    def number(name: str, kind: type[int] | type[float], fallback: float) -> Any:
        raw = env.get(name)
        if raw is None or raw == "":
            return fallback
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{name} must be a {kind.__name__}, not {raw!r}") from None

    return DrainPolicy(
        enabled=switch == "on",
        max_seconds=number("BILLING_DRAIN_MAX_S", float, default.max_seconds),
        max_tokens=number("BILLING_DRAIN_MAX_TOKENS", int, default.max_tokens),
        max_concurrent=number("BILLING_DRAIN_MAX_CONCURRENT", int, default.max_concurrent),
    )


def client_from_env(env: Mapping[str, str] = os.environ) -> BillingClient:
    """A billing client for ``BILLING_URL`` with ``BILLING_TOKEN`` (none when unset or empty),
    its spool on (in the user's cache directory) unless ``BILLING_SPOOL=off``."""
    spool = env.get("BILLING_SPOOL", "").strip().lower()
    options: dict[str, Any] = {"spool_path": None} if spool == "off" else {}
    return BillingClient(
        env.get("BILLING_URL", "http://127.0.0.1:8000"),
        token=env.get("BILLING_TOKEN") or None,
        **options,
    )
