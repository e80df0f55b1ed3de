"""Keys and plans: set a key's customer and plan from a time on, add plan versions, list them,
and re-rate the settled calls a change reaches (CONTRACT "Keys, customers and plans (v2)")."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.errors import FieldError, NotFound, PlanConflict, ValidationFailed
from billing.paging import cut_page
from billing.plans.rating import assignment_at, failure_charges_of, plan_price_row
from billing.plans.repository import repository
from billing.plans.schemas import FailureCharges, KeyIn, PlanIn, check_key_id
from billing.pricing.prices import PriceRow, PriceVersion, unit_prices_text
from billing.rates import RATE_COLUMNS, RATE_FIELDS
from billing.storage.models import KeyAssignment, PlanPrice, PlanVersion
from billing.timefmt import rfc3339

# --- keys ----------------------------------------------------------------------------------------


def _version_json(row: KeyAssignment) -> dict[str, Any]:
    return {
        "customer_id": row.customer_id,
        "plan_id": row.plan_id,
        "name": row.name,
        "effective_from": rfc3339(row.effective_from),
    }


def key_json(api_key_id: str, history: list[KeyAssignment], now: datetime) -> dict[str, Any]:
    """The API form of a key (``KeyOut``): the assignment in force at ``now``, and its history."""
    current = assignment_at(history, now)
    return {
        "api_key_id": api_key_id,
        "customer_id": current.customer_id if current else None,
        "plan_id": current.plan_id if current else None,
        "name": current.name if current else None,
        "effective_from": rfc3339(current.effective_from) if current else None,
        "history": [_version_json(row) for row in history],
    }


def set_key(
    session: Session, api_key_id: str, key: KeyIn, now: datetime
) -> tuple[dict[str, Any], bool]:
    """Store the key's assignment from ``key.effective_from`` (default ``now``) on; returns
    ``(key object, created)``. The same assignment at the same instant again is a no-op; a
    different one there raises ``PlanConflict`` (409: assignments are versioned, put another
    ``effective_from``); a ``plan_id`` no plan has raises ``ValidationFailed`` (422 naming it).
    When new, the key's calls started since ``effective_from`` are re-reconciled (settled ones
    are re-rated through adjustments). The caller commits."""
    check_key_id(api_key_id)
    repo = repository(session)
    if key.plan_id is not None and not repo.plan_exists(session, key.plan_id):
        raise ValidationFailed(
            [
                FieldError(
                    None,
                    "body.plan_id",
                    f"no plan {key.plan_id!r} exists; post it to /v1/plans first",
                )
            ]
        )
    effective_from = key.effective_from or now
    history = repo.key_history(session, [api_key_id]).get(api_key_id, [])
    for row in history:
        if row.effective_from == effective_from:
            if (row.customer_id, row.plan_id, row.name) != (key.customer_id, key.plan_id, key.name):
                raise PlanConflict(
                    f"a different assignment of key {api_key_id!r} effective from "
                    f"{rfc3339(effective_from)} exists; assignments are versioned: put another "
                    "effective_from instead of changing a past one"
                )
            return key_json(api_key_id, history, now), False
    row = KeyAssignment(
        api_key_id=api_key_id,
        effective_from=effective_from,
        customer_id=key.customer_id,
        plan_id=key.plan_id,
        name=key.name,
        created_at=now,
    )
    repo.add_key_version(session, row)
    repo.mark_key_pending(session, api_key_id, effective_from)
    history = sorted([*history, row], key=lambda r: r.effective_from)
    return key_json(api_key_id, history, now), True


def get_key(session: Session, api_key_id: str, now: datetime) -> dict[str, Any]:
    """The key object; a key seen only in events has no customer and no plan; ``NotFound``
    (404) for a key neither assigned nor seen."""
    repo = repository(session)
    history = repo.key_history(session, [api_key_id]).get(api_key_id, [])
    if not history and not repo.key_seen(session, api_key_id):
        raise NotFound(f"no key {api_key_id!r}: it has no assignment and no call names it")
    return key_json(api_key_id, history, now)


def encode_id_cursor(tag: str, value: str) -> str:
    """The page cursor after the id ``value`` of a list tagged ``tag`` (URL-safe base64 of
    ``[tag, id]``): ``"k"`` keys, ``"c"`` customers (``billing.credits``)."""
    raw = json.dumps([tag, value]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_id_cursor(tag: str, text: str) -> str:
    """The id a cursor of ``encode_id_cursor(tag, …)`` names; ``ValueError`` in words
    otherwise."""
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if (
            isinstance(value, list)
            and len(value) == 2
            and value[0] == tag
            and isinstance(value[1], str)
            and 1 <= len(value[1]) <= 128
        ):
            return value[1]
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        pass
    raise ValueError(
        "is not a cursor from this endpoint; pass the next_cursor of the previous page "
        "unchanged, or leave cursor out for the first page"
    )


def encode_key_cursor(api_key_id: str) -> str:
    """The page cursor after ``api_key_id`` (URL-safe base64 of ``["k", id]``)."""
    return encode_id_cursor("k", api_key_id)


def decode_key_cursor(text: str) -> str:
    """The key a cursor of ``encode_key_cursor`` names; ``ValueError`` in words otherwise."""
    return decode_id_cursor("k", text)


def list_keys(
    session: Session, after: str | None, limit: int, now: datetime
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the keys, by ``api_key_id`` (those with an assignment and those seen only in
    events, which have no customer and no plan), and the cursor of the next page (None: the
    last)."""
    repo = repository(session)
    ids, last = cut_page(repo.key_page(session, after, limit + 1), limit)
    history = repo.key_history(session, ids)
    page = [key_json(k, history.get(k, []), now) for k in ids]
    return page, None if last is None else encode_key_cursor(last)


def keys_in_force_of(
    session: Session, customer_ids: Sequence[str], now: datetime
) -> dict[str, tuple[int, list[str]]]:
    """For each of ``customer_ids`` that has any: how many keys have an assignment in force at
    ``now`` (``assignment_at``: the latest at or before it) that names it, and the plans those
    assignments name, sorted (the console's Customers page; counted in SQL, not read key by
    key)."""
    found: dict[str, tuple[int, list[str]]] = {}
    for customer_id, plan_id, keys in sorted(
        repository(session).customers_keys_in_force(session, customer_ids, now),
        key=lambda row: (row[0], row[1] or ""),
    ):
        count, plans = found.get(customer_id, (0, []))
        found[customer_id] = (count + keys, [*plans, plan_id] if plan_id else plans)
    return found


# --- plans ---------------------------------------------------------------------------------------


def _posted_rows(plan: PlanIn) -> list[PriceRow]:
    """The price rows of a posted plan version (ids 0), long-context rows after their price."""
    rows = []
    for price in plan.prices:
        units = dict(price.unit_prices or {})
        rates = [getattr(price, f) for f in RATE_FIELDS]
        rows.append(
            PriceRow(
                0,
                price.model,
                plan.effective_from,
                *rates,
                service_tier=price.service_tier,
                unit_prices=units,
                inference_geo=price.inference_geo,
            )
        )
        if price.long_context is not None:
            long = price.long_context
            rows.append(
                PriceRow(
                    0,
                    price.model,
                    plan.effective_from,
                    *(getattr(long, f) for f in RATE_FIELDS),
                    service_tier=price.service_tier,
                    above_input_tokens=long.above_input_tokens,
                    unit_prices=units,
                    inference_geo=price.inference_geo,
                )
            )
    return rows


def _shape(markup: str, rows: list[PriceRow], failures: str | None) -> tuple[Any, ...]:
    return (markup, sorted((r._key()[1:] for r in rows), key=repr), failures)


def _failures_text(plan: PlanIn) -> str | None:
    """The plan's ``failure_charges`` as stored: compact sorted JSON of the categories not at
    ``bill``; None when every one is."""
    policy = {k: v for k, v in plan.failure_charges.model_dump().items() if v != "bill"}
    return json.dumps(dict(sorted(policy.items())), separators=(",", ":")) if policy else None


def plan_json(version: PlanVersion, prices: list[PlanPrice]) -> dict[str, Any]:
    """The API form of a plan version (``PlanOut``)."""
    rows = [plan_price_row(p, version.effective_from) for p in prices]
    base = [r for r in rows if not r.above_input_tokens]
    long = {(r.model, r.service_tier, r.inference_geo): r for r in rows if r.above_input_tokens}
    return {
        "plan_id": version.plan_id,
        "effective_from": rfc3339(version.effective_from),
        "markup_pct": version.markup_pct,
        "prices": [
            PriceVersion(r, long.get((r.model, r.service_tier, r.inference_geo))).as_json()
            for r in base
        ],
        "failure_charges": FailureCharges(
            **dict(failure_charges_of(version.failure_charges))
        ).model_dump(),
    }


def add_plan(session: Session, plan: PlanIn, now: datetime) -> tuple[dict[str, Any], bool]:
    """Store a plan version; returns ``(plan object, created)``. The same (plan_id,
    effective_from) with the same markup and prices is a no-op; with others it raises
    ``PlanConflict`` (409). When new, the calls started since ``effective_from`` of every key
    assigned the plan are re-reconciled (settled ones re-rated through adjustments). The caller
    commits."""
    repo = repository(session)
    posted = _posted_rows(plan)
    failures = _failures_text(plan)
    for version, prices in repo.plan_versions(session, [plan.plan_id]):
        if version.effective_from != plan.effective_from:
            continue
        stored = [plan_price_row(p, version.effective_from) for p in prices]
        if _shape(version.markup_pct, stored, version.failure_charges) != _shape(
            plan.markup_pct, posted, failures
        ):
            raise PlanConflict(
                f"a different version of plan {plan.plan_id!r} effective from "
                f"{rfc3339(plan.effective_from)} exists; plans are versioned: post a new "
                "effective_from instead of changing a past one"
            )
        return plan_json(version, prices), False
    version = PlanVersion(
        plan_id=plan.plan_id,
        effective_from=plan.effective_from,
        markup_pct=plan.markup_pct,
        created_at=now,
        failure_charges=failures,
    )
    prices = [
        PlanPrice(
            model=row.model,
            service_tier=row.service_tier or "",
            inference_geo=row.inference_geo or "",
            above_input_tokens=row.above_input_tokens,
            unit_prices=unit_prices_text(row.unit_prices),
            **dict(zip(RATE_COLUMNS, row.rates, strict=True)),
        )
        for row in posted
    ]
    repo.add_plan_version(session, version, prices)
    repo.mark_plan_pending(session, plan.plan_id, plan.effective_from)
    return plan_json(version, prices), True


def list_plans(session: Session, plan_id: str | None = None) -> list[dict[str, Any]]:
    """Every plan version (or ``plan_id``'s), by plan, then ``effective_from``."""
    repo = repository(session)
    versions = repo.plan_versions(session, None if plan_id is None else [plan_id])
    return [plan_json(v, p) for v, p in versions]
