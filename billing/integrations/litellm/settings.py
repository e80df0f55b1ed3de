"""The LiteLLM callback's settings, read from the proxy's environment.

``BILLING_URL`` (default ``http://127.0.0.1:8000``), ``BILLING_TOKEN`` (an ``ingest`` token) and
``BILLING_SPOOL`` (``off`` turns the client's spool off) make the billing client;
``BILLING_DRAIN`` (``on`` | ``off``), ``BILLING_DRAIN_MAX_S``, ``BILLING_DRAIN_MAX_TOKENS`` and
``BILLING_DRAIN_MAX_CONCURRENT`` the drain policy (:class:`billing.gateway.DrainPolicy`);
``BILLING_AUTHORIZE`` (``on`` | ``off``, default ``off``) and ``BILLING_FAIL_OPEN`` (``on`` |
``off``, default ``on``) the authorization before each call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from billing.client import BillingClient
from billing.gateway.policy import DrainPolicy

__all__ = ["AuthorizeSettings", "authorize_from_env", "client_from_env", "policy_from_env"]


def _switch(env: Mapping[str, str], name: str, default: str) -> bool:
    """``True`` for ``on``, ``False`` for ``off``; raises ``ValueError`` naming ``name``."""
    switch = env.get(name, default).strip().lower()
    if switch not in ("on", "off"):
        raise ValueError(f"{name} must be 'on' or 'off', not {switch!r}")
    return switch == "on"


@dataclass(frozen=True, slots=True)
class AuthorizeSettings:
    """Authorize each call before LiteLLM calls the upstream (``enabled``), and call it anyway
    when the service is unavailable: 503, no answer (``fail_open``; a request the service
    refuses, 401, 409, 422, is refused whatever it says)."""

    enabled: bool = False
    fail_open: bool = True


def authorize_from_env(env: Mapping[str, str] = os.environ) -> AuthorizeSettings:
    """``BILLING_AUTHORIZE`` (default ``off``) and ``BILLING_FAIL_OPEN`` (default ``on``)."""
    return AuthorizeSettings(
        _switch(env, "BILLING_AUTHORIZE", "off"), _switch(env, "BILLING_FAIL_OPEN", "on")
    )


def policy_from_env(env: Mapping[str, str] = os.environ) -> DrainPolicy:
    """The drain policy from ``BILLING_DRAIN`` (``on`` | ``off``), ``BILLING_DRAIN_MAX_S``,
    ``BILLING_DRAIN_MAX_TOKENS`` and ``BILLING_DRAIN_MAX_CONCURRENT`` (defaults: those of
    :class:`DrainPolicy`). Raises ``ValueError`` naming the variable on a bad value."""
    default = DrainPolicy()
    enabled = _switch(env, "BILLING_DRAIN", "on")

    def number(name: str, kind: type[int] | type[float], fallback: float) -> Any:
        raw = env.get(name)
        if raw is None or raw == "":
            return fallback
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{name} must be a {kind.__name__}, not {raw!r}") from None

    return DrainPolicy(
        enabled=enabled,
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
