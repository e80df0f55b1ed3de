"""Provider report pages as the providers' admin APIs answer them (every field of their API
references, in their order), for the provider report and drift tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

DAY = timedelta(days=1)


def unix(at: datetime) -> int:
    return int(at.timestamp())


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def openai_usage_result(
    model: str | None,
    input_tokens: int,
    cached: int,
    output_tokens: int,
    requests: int,
    *,
    project_id: str | None = None,
    api_key_id: str | None = None,
    service_tier: str | None = None,
) -> dict[str, Any]:
    """An ``organization.usage.completions.result``: ``input_tokens`` includes ``cached``."""
    return {
        "object": "organization.usage.completions.result",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "input_cached_tokens": cached,
        "input_audio_tokens": 0,
        "output_audio_tokens": 0,
        "num_model_requests": requests,
        "project_id": project_id,
        "user_id": None,
        "api_key_id": api_key_id,
        "model": model,
        "batch": None,
        "service_tier": service_tier,
    }


def openai_cost_result(value: Any, line_item: str | None, project_id: str | None = None) -> Any:
    """An ``organization.costs.result``; ``value`` is put in the JSON as given (a float's
    text: pass the JSON text through ``json_text`` to keep its digits)."""
    return {
        "object": "organization.costs.result",
        "amount": {"value": value, "currency": "usd"},
        "line_item": line_item,
        "project_id": project_id,
        "organization_id": "org-test",
    }


def openai_page(
    buckets: list[tuple[datetime, list[dict[str, Any]]]],
    next_page: str | None = None,
    width: timedelta = DAY,
) -> dict[str, Any]:
    return {
        "object": "page",
        "data": [
            {
                "object": "bucket",
                "start_time": unix(start),
                "end_time": unix(start + width),
                "results": results,
            }
            for start, results in buckets
        ],
        "has_more": next_page is not None,
        "next_page": next_page,
    }


def anthropic_usage_result(
    model: str | None,
    uncached: int,
    cache_read: int,
    cache_5m: int,
    cache_1h: int,
    output_tokens: int,
    *,
    workspace_id: str | None = None,
    api_key_id: str | None = None,
    service_tier: str | None = None,
) -> dict[str, Any]:
    return {
        "api_key_id": api_key_id,
        "cache_creation": {
            "ephemeral_1h_input_tokens": cache_1h,
            "ephemeral_5m_input_tokens": cache_5m,
        },
        "cache_read_input_tokens": cache_read,
        "context_window": "0-200k",
        "model": model,
        "output_tokens": output_tokens,
        "server_tool_use": {"web_search_requests": 0},
        "service_tier": service_tier,
        "uncached_input_tokens": uncached,
        "workspace_id": workspace_id,
    }


def anthropic_cost_result(
    amount_cents: str,
    model: str | None,
    token_type: str | None,
    *,
    workspace_id: str | None = None,
    service_tier: str | None = "standard",
) -> dict[str, Any]:
    return {
        "amount": amount_cents,
        "context_window": "0-200k",
        "cost_type": "tokens",
        "currency": "USD",
        "description": f"{model} Usage - {token_type}",
        "model": model,
        "service_tier": service_tier,
        "token_type": token_type,
        "workspace_id": workspace_id,
    }


def anthropic_page(
    buckets: list[tuple[datetime, list[dict[str, Any]]]],
    next_page: str | None = None,
    width: timedelta = DAY,
) -> dict[str, Any]:
    return {
        "data": [
            {"starting_at": rfc3339(start), "ending_at": rfc3339(start + width), "results": r}
            for start, r in buckets
        ],
        "has_more": next_page is not None,
        "next_page": next_page,
    }
