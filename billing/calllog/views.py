"""JSON shapes of the call log (CONTRACT "Call log and usage queries")."""

from __future__ import annotations

from typing import Any

import orjson

from billing.dimensions import tokens_of
from billing.money import pusd_to_str, uusd_per_mtok_to_str
from billing.rates import RATES
from billing.storage.models import Call, Event, LedgerEntry
from billing.timefmt import rfc3339


def _stream(row: Call | LedgerEntry) -> dict[str, Any]:
    """What a call and each of its ledger entries say of the stream, in the contract's order."""
    return {
        "api_key_id": row.api_key_id,
        "model": row.model,
        "protocol": row.protocol,
        "status": row.status,
    }


def call_json(call: Call) -> dict[str, Any]:
    """The contract's call object; tokens as integers, ``cost_usd`` as an exact decimal string."""
    return {
        "request_id": call.request_id,
        **_stream(call),
        "settled": call.settled,
        "usage_source": call.usage_source,
        "started_at": rfc3339(call.started_at),
        "ended_at": rfc3339(call.ended_at),
        "attempts": call.attempts,
        **tokens_of(call).as_dict(),
        "cost_usd": pusd_to_str(call.cost_pusd),
        "error_type": call.error_type,
        "stop_reason": call.stop_reason,
        "metadata": call.metadata_ or {},
        "anomalies": list(call.anomalies or []),
        "service_tier": call.service_tier,
        "units": dict(call.units or {}),
        "other_models": list(call.other_models or []),
        "customer_id": call.customer_id,
        "plan_id": call.plan_id,
        "charge_usd": pusd_to_str(call.charge_pusd),
        "leakage_usd": pusd_to_str(call.leakage_pusd),
        "provider_cost_usd": pusd_to_str(call.provider_cost_pusd),
        "cost_drift_usd": pusd_to_str(cost_drift_pusd(call.cost_pusd, call.provider_cost_pusd)),
        "counters": dict(call.counters or {}),
        "inference_geo": call.inference_geo,
    }


def cost_drift_pusd(cost_pusd: int | None, provider_cost_pusd: int | None) -> int | None:
    """The provider's own cost less ours, where both are known and differ (v3: "drift shows
    per call where they differ"); else None."""
    if cost_pusd is None or provider_cost_pusd is None or cost_pusd == provider_cost_pusd:
        return None
    return provider_cost_pusd - cost_pusd


def event_json(event: Event) -> dict[str, Any]:
    """An event as the gateway sent it, with ``occurred_at`` in UTC and its arrival time."""
    body: dict[str, Any] = orjson.loads(event.body)
    body["occurred_at"] = rfc3339(event.occurred_at)
    body.setdefault("attempt", event.attempt)
    body["received_at"] = rfc3339(event.received_at)
    return body


def ledger_entry_json(entry: LedgerEntry) -> dict[str, Any]:
    """A ledger entry: kind, reason, booking time, signed token deltas, prices used and cost."""
    return {
        "entry_id": entry.entry_id,
        "request_id": entry.request_id,
        "kind": entry.kind,
        "reason": entry.reason,
        "booked_at": rfc3339(entry.booked_at),
        **_stream(entry),
        **tokens_of(entry).as_dict(),
        **{rate.field: uusd_per_mtok_to_str(getattr(entry, rate.column)) for rate in RATES},
        "cost_usd": pusd_to_str(entry.cost_pusd),
        "units": orjson.loads(entry.units) if entry.units else {},
        "unit_prices": (
            {n: uusd_per_mtok_to_str(int(v)) for n, v in orjson.loads(entry.unit_prices).items()}
            if entry.unit_prices
            else {}
        ),
        "customer_id": entry.customer_id,
        "plan_id": entry.plan_id,
        "plan_prices": _plan_prices(entry),
        "markup_pct": entry.markup_pct,
        "charge_usd": pusd_to_str(entry.charge_pusd),
        "failure_charge": entry.failure_charge,
        "leakage_usd": pusd_to_str(entry.leakage_pusd),
        "provider_cost_usd": pusd_to_str(entry.provider_cost_pusd),
    }


def _plan_prices(entry: LedgerEntry) -> dict[str, Any] | None:
    """The plan's own prices an entry was charged at (USD per million tokens, unit prices in USD
    per unit), or None when it was charged at the markup or at cost (v2)."""
    if entry.plan_price_id is None:
        return None
    text = entry.plan_unit_prices
    return {
        **{
            rate.field: uusd_per_mtok_to_str(getattr(entry, f"plan_{rate.column}"))
            for rate in RATES
        },
        "unit_prices": (
            {n: uusd_per_mtok_to_str(int(v)) for n, v in orjson.loads(text).items()} if text else {}
        ),
    }
