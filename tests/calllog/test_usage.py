"""``GET /v1/usage`` (CONTRACT "Call log and usage queries") and the rollups behind it.

Exact figures for the zone cases of the issue (Asia/Kolkata, daylight-saving days in New York),
the booked basis against the ledger (adjustments land in their own booking period), and a
reference computed from the source rows for many zones, groupings and periods; the rollups the
reconciler keeps equal the ones rebuilt from ``calls`` and ``ledger_entries``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.calllog import buckets
from billing.calllog.usage import UsageQuery, units_of, usage_rows, usage_top
from billing.dimensions import TOKEN_FIELDS
from billing.money import pusd_to_str
from billing.rollups import buckets as rollup_buckets
from billing.rollups import service as rollups
from billing.storage.models import Call, LedgerEntry
from tests.calllog.test_calls_query import (
    M1_PRICE,
    M2_PRICE,
    call_events,
    errors,
    iso,
    post,
    reconcile_at,
)

UTC_ZONE = ZoneInfo("UTC")
ZONES = [
    "UTC",
    "Asia/Kolkata",
    "America/New_York",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "Europe/London",
    "Australia/Lord_Howe",
]


def usage(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"data"}
    rows: list[dict[str, Any]] = body["data"]
    return rows


def totals(
    calls: int,
    inp: int,
    out: int,
    cost: str | None,
    *,
    delivered: int | None = None,
    cache_read: int = 0,
) -> dict[str, Any]:
    """A row's totals (no cache writes or reasoning in these tests)."""
    delivered = out if delivered is None else delivered
    return {
        "calls": calls,
        "input_tokens": inp,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
        "output_tokens_billed": out,
        "output_tokens_delivered": delivered,
        "output_tokens_undelivered": out - delivered,
        "reasoning_tokens": 0,
        "cost_usd": cost,
        # v2: no key of these tests has a plan, so each row is charged its cost.
        "charge_usd": cost,
        # v3: nor a charge policy for failed calls: nothing left uncharged where there is a cost.
        "leakage_usd": None if cost is None else "0",
        "units": {},
    }


@pytest.fixture
def priced(client: TestClient) -> TestClient:
    for price in (M1_PRICE, M2_PRICE):
        assert client.post("/v1/prices", json=price).status_code == 201
    return client


@pytest.fixture
def session(client: TestClient) -> Iterator[Session]:
    with client.app.state.billing.sessions() as s:  # type: ignore[attr-defined]
        yield s
        s.rollback()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- exact figures ------------------------------------------------------------------------------


def test_a_kolkata_day_holds_the_calls_between_its_midnights(priced: TestClient) -> None:
    # Kolkata is UTC+05:30: its 11 March runs from 2026-03-10T18:30Z to 2026-03-11T18:30Z.
    post(
        priced,
        [
            *call_events("k0", at("2026-03-10T18:29:59Z"), inp=1000, out=100),  # 10th, 23:59:59
            *call_events("k1", at("2026-03-10T18:30:00Z"), inp=2000, out=200),  # 11th, 00:00
            *call_events("k2", at("2026-03-10T20:00:00Z"), inp=100, out=10),  # 11th, 01:30
            *call_events("k3", at("2026-03-11T02:00:00Z"), inp=200, out=20),  # 11th, 07:30
            *call_events("k4", at("2026-03-11T20:00:00Z"), inp=400, out=40),  # 12th, 01:30
        ],
    )
    reconcile_at(priced, at("2026-03-12T00:00:00Z"))
    period = {"since": "2026-03-10T00:00:00+05:30", "until": "2026-03-13T00:00:00+05:30"}
    assert usage(priced, **period, group_by="day", tz="Asia/Kolkata") == [
        {"day": "2026-03-10", **totals(1, 1000, 100, "0.0045")},  # 1000 × 3 + 100 × 15 µ$
        {"day": "2026-03-11", **totals(3, 2300, 230, "0.01035")},
        {"day": "2026-03-12", **totals(1, 400, 40, "0.0018")},
    ]
    # The same local day asked for on its own, and the call log for the same period.
    day = {"since": "2026-03-11T00:00:00+05:30", "until": "2026-03-12T00:00:00+05:30"}
    assert usage(priced, **day) == [totals(3, 2300, 230, "0.01035")]
    assert [c["request_id"] for c in priced.get("/v1/calls", params=day).json()["data"]] == [
        "k3",
        "k2",
        "k1",
    ]
    # In UTC the 10th holds k0, k1 and k2.
    assert usage(priced, **period, group_by="day") == [
        {"day": "2026-03-10", **totals(3, 3100, 310, "0.01395")},
        {"day": "2026-03-11", **totals(2, 600, 60, "0.0027")},
    ]
    # Hours carry the zone's offset.
    assert usage(priced, **day, group_by="hour", tz="Asia/Kolkata") == [
        {"hour": "2026-03-11T00:00:00+05:30", **totals(1, 2000, 200, "0.009")},
        {"hour": "2026-03-11T01:00:00+05:30", **totals(1, 100, 10, "0.00045")},
        {"hour": "2026-03-11T07:00:00+05:30", **totals(1, 200, 20, "0.0009")},
    ]
    assert usage(priced, **period, group_by="month", tz="Asia/Kolkata") == [
        {"month": "2026-03", **totals(5, 3700, 370, "0.01665")}
    ]


def test_daylight_saving_days_in_new_york(priced: TestClient) -> None:
    # 2026-03-08 has 23 hours (02:00 EST -> 03:00 EDT at 07:00Z); 2026-11-01 has 25 (02:00 EDT ->
    # 01:00 EST at 06:00Z).
    post(
        priced,
        [
            *call_events("s0", at("2026-03-08T04:59:59Z"), inp=1, out=1),  # 7th 23:59:59 EST
            *call_events("s1", at("2026-03-08T05:00:00Z"), inp=10, out=1),  # 8th 00:00 EST
            *call_events("s2", at("2026-03-08T06:30:00Z"), inp=20, out=1),  # 8th 01:30 EST
            *call_events("s3", at("2026-03-08T07:00:00Z"), inp=30, out=1),  # 8th 03:00 EDT
            *call_events("s4", at("2026-03-09T03:59:59Z"), inp=40, out=1),  # 8th 23:59:59 EDT
            *call_events("s5", at("2026-03-09T04:00:00Z"), inp=50, out=1),  # 9th 00:00 EDT
            *call_events("f1", at("2026-11-01T05:30:00Z"), inp=100, out=2),  # 1st 01:30 EDT
            *call_events("f2", at("2026-11-01T06:30:00Z"), inp=200, out=2),  # 1st 01:30 EST
            *call_events("f3", at("2026-11-02T04:59:59Z"), inp=300, out=2),  # 1st 23:59:59 EST
            *call_events("f4", at("2026-11-02T05:00:00Z"), inp=400, out=2),  # 2nd 00:00 EST
        ],
    )
    reconcile_at(priced, at("2026-11-03T00:00:00Z"))
    ny = {"tz": "America/New_York"}
    spring = {"since": "2026-03-07T00:00:00-05:00", "until": "2026-03-10T00:00:00-04:00"}
    assert [
        (r["day"], r["calls"], r["input_tokens"])
        for r in usage(priced, **spring, **ny, group_by="day")
    ] == [("2026-03-07", 1, 1), ("2026-03-08", 4, 100), ("2026-03-09", 1, 50)]
    the_8th = {"since": "2026-03-08T00:00:00-05:00", "until": "2026-03-09T00:00:00-04:00"}
    assert the_8th_is_23_hours(the_8th)
    assert usage(priced, **the_8th) == [totals(4, 100, 4, "0.00036")]
    assert [
        (r["hour"], r["input_tokens"]) for r in usage(priced, **the_8th, **ny, group_by="hour")
    ] == [
        ("2026-03-08T00:00:00-05:00", 10),
        ("2026-03-08T01:00:00-05:00", 20),
        ("2026-03-08T03:00:00-04:00", 30),
        ("2026-03-08T23:00:00-04:00", 40),
    ]
    fall = {"since": "2026-11-01T00:00:00-04:00", "until": "2026-11-03T00:00:00-05:00"}
    assert [
        (r["day"], r["calls"], r["input_tokens"])
        for r in usage(priced, **fall, **ny, group_by="day")
    ] == [("2026-11-01", 3, 600), ("2026-11-02", 1, 400)]
    assert [
        (r["hour"], r["input_tokens"])
        for r in usage(priced, **fall, **ny, group_by="day,hour")
        if r["day"] == "2026-11-01"
    ] == [
        ("2026-11-01T01:00:00-04:00", 100),
        ("2026-11-01T01:00:00-05:00", 200),
        ("2026-11-01T23:00:00-05:00", 300),
    ]
    # The range equals the sum of its days, both times.
    for period in (spring, fall):
        whole = usage(priced, **period)[0]
        days = usage(priced, **period, **ny, group_by="day")
        for name in ("calls", *TOKEN_FIELDS):
            assert whole[name] == sum(r[name] for r in days)


def the_8th_is_23_hours(period: dict[str, str]) -> bool:
    return at(period["until"]) - at(period["since"]) == timedelta(hours=23)


def test_group_by_key_and_model_and_filters(priced: TestClient) -> None:
    t = at("2026-03-10T10:00:00Z")
    post(
        priced,
        [
            *call_events("a1", t, key="key_a", model="m1", inp=100, out=10),
            *call_events("a2", t + timedelta(hours=1), key="key_a", model="m2", inp=100, out=10),
            *call_events("b1", t + timedelta(hours=2), key="key_b", model="m1", inp=7, out=3),
            *call_events(
                "b2",
                t + timedelta(hours=3),
                key="key_b",
                model="m1",
                inp=5,
                out=1,
                status="client_disconnected",
            ),
            # Not settled (no upstream usage yet): not counted on either basis.
            *call_events("open", t, key="key_a", model="m1", with_usage=False),
        ],
    )
    reconcile_at(priced, t + timedelta(hours=5))
    period = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-11T00:00:00Z"}
    assert usage(priced, **period, group_by="api_key_id,model") == [
        {"api_key_id": "key_a", "model": "m1", **totals(1, 100, 10, "0.00045")},
        {"api_key_id": "key_a", "model": "m2", **totals(1, 100, 10, "0.00012")},
        {"api_key_id": "key_b", "model": "m1", **totals(2, 12, 4, "0.000096", delivered=3)},
    ]
    # Keys come in the order asked for.
    assert [list(r)[:2] for r in usage(priced, **period, group_by="model,api_key_id")] == [
        ["model", "api_key_id"]
    ] * 3
    assert usage(priced, **period, api_key_id="key_b") == [
        totals(2, 12, 4, "0.000096", delivered=3)
    ]
    assert usage(priced, **period, model="m1", group_by="api_key_id") == [
        {"api_key_id": "key_a", **totals(1, 100, 10, "0.00045")},
        {"api_key_id": "key_b", **totals(2, 12, 4, "0.000096", delivered=3)},
    ]
    assert usage(priced, **period, api_key_id="key_a", model="m2") == [
        totals(1, 100, 10, "0.00012")
    ]
    assert usage(priced, **period, api_key_id="key_c") == []
    # Off the quarter-hour edges: [10:07, 11:00:00.5) holds a2 only (it started at 11:00:00).
    assert usage(priced, since="2026-03-10T10:07:00Z", until="2026-03-10T11:00:00.5Z") == [
        totals(1, 100, 10, "0.00012")
    ]
    assert usage(priced, since="2026-03-10T10:00:00.000001Z", until="2026-03-10T12:00:00Z") == [
        totals(1, 100, 10, "0.00012")
    ]


def test_booked_basis_is_the_ledger_with_late_adjustments_in_their_period(
    priced: TestClient,
) -> None:
    started = at("2026-03-10T22:00:00Z")
    post(
        priced,
        [
            *call_events("late", started, inp=1000, out=100),
            *call_events("plain", started + timedelta(minutes=5), model="m2", inp=10, out=10),
        ],
    )
    reconcile_at(priced, at("2026-03-10T23:30:00Z"))  # settled on the 10th (UTC)
    # A later usage of the same attempt: 40 more output tokens, booked on the 11th.
    post(
        priced,
        [
            {
                "event_id": "late-usage-2",
                "request_id": "late",
                "type": "stream.usage",
                "occurred_at": iso(started + timedelta(seconds=9)),
                "input_tokens": 1000,
                "output_tokens": 140,
                "source": "upstream",
            }
        ],
    )
    reconcile_at(priced, at("2026-03-11T00:30:00Z"))
    entries = priced.get("/v1/calls/late").json()["ledger_entries"]
    assert [
        (e["kind"], e["booked_at"], e["output_tokens_billed"], e["cost_usd"]) for e in entries
    ] == [
        ("settlement", "2026-03-10T23:30:00Z", 100, "0.0045"),
        ("adjustment", "2026-03-11T00:30:00Z", 40, "0.0006"),
    ]
    period = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-12T00:00:00Z"}
    booked = usage(priced, **period, basis="booked", group_by="day")
    assert booked == [
        {"day": "2026-03-10", **totals(2, 1010, 110, "0.00453", delivered=110)},
        {"day": "2026-03-11", **totals(0, 0, 40, "0.0006", delivered=0)},
    ]
    # On the call_start basis the call has its current figures, on the day it started.
    assert usage(priced, **period, group_by="day") == [
        {"day": "2026-03-10", **totals(2, 1010, 150, "0.00513", delivered=110)}
    ]
    # In Kolkata both bookings fall on the 11th (05:00 and 06:00 local).
    assert usage(priced, **period, basis="booked", group_by="day", tz="Asia/Kolkata") == [
        {"day": "2026-03-11", **totals(2, 1010, 150, "0.00513", delivered=110)}
    ]
    # Booking periods of one hour around midnight.
    hours = usage(priced, **period, basis="booked", group_by="hour,model")
    assert [
        (r["hour"], r["model"], r["calls"], r["output_tokens_billed"], r["cost_usd"]) for r in hours
    ] == [
        ("2026-03-10T23:00:00+00:00", "m1", 1, 100, "0.0045"),
        ("2026-03-10T23:00:00+00:00", "m2", 1, 10, "0.00003"),
        ("2026-03-11T00:00:00+00:00", "m1", 0, 40, "0.0006"),
    ]


def test_unpriced_calls_and_a_price_that_comes_later(priced: TestClient) -> None:
    started = at("2026-03-10T09:00:00Z")
    post(
        priced,
        [
            *call_events("u1", started, model="m3", inp=1000, out=100),
            *call_events("p1", started, model="m1", inp=100, out=10),
        ],
    )
    reconcile_at(priced, at("2026-03-10T10:00:00Z"))
    period = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-12T00:00:00Z"}
    # Unknown cost, never silently free: null when any call of the row has no price.
    assert usage(priced, **period) == [totals(2, 1100, 110, None)]
    assert usage(priced, **period, group_by="model") == [
        {"model": "m1", **totals(1, 100, 10, "0.00045")},
        {"model": "m3", **totals(1, 1000, 100, None)},
    ]
    # The ledger: the unpriced entry adds no cost; a row with no priced entry has none.
    assert usage(priced, **period, basis="booked") == [totals(2, 1100, 110, "0.00045")]
    assert usage(priced, **period, basis="booked", model="m3") == [totals(1, 1000, 100, None)]
    price = {**M1_PRICE, "model": "m3", "input_usd_per_mtok": "0.5", "output_usd_per_mtok": "1"}
    assert priced.post("/v1/prices", json=price).status_code == 201
    reconcile_at(priced, at("2026-03-11T10:00:00Z"))
    assert usage(priced, **period, group_by="model") == [
        {"model": "m1", **totals(1, 100, 10, "0.00045")},
        {"model": "m3", **totals(1, 1000, 100, "0.0006")},  # 1000 × 0.5 + 100 × 1 µ$
    ]
    # Booked: the reversal (unpriced) and the re-pricing land on the 11th; the 10th is unchanged.
    assert usage(priced, **period, basis="booked", model="m3", group_by="day") == [
        {"day": "2026-03-10", **totals(1, 1000, 100, None)},
        {"day": "2026-03-11", **totals(0, 0, 0, "0.0006")},
    ]
    assert usage(priced, **period, basis="booked", model="m3") == [totals(1, 1000, 100, "0.0006")]


def test_a_call_without_stream_started_and_its_late_start(priced: TestClient) -> None:
    t = at("2026-03-10T09:00:00Z")
    post(
        priced,
        [
            {
                "event_id": "nk-usage",
                "request_id": "nk",
                "type": "stream.usage",
                "occurred_at": iso(t),
                "input_tokens": 100,
                "output_tokens": 10,
                "source": "upstream",
            }
        ],
    )
    state = priced.app.state.billing  # type: ignore[attr-defined]
    settle = datetime.now(UTC) + timedelta(seconds=state.settings.settle_after_s + 1)
    reconcile_at(priced, settle)  # settles on what it has: started_missing, no key, no model
    period = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-11T00:00:00Z"}
    # No disconnect and no delivered count: it delivered what it billed (CONTRACT v2).
    assert usage(priced, **period, group_by="api_key_id,model") == [
        {"api_key_id": None, "model": None, **totals(1, 100, 10, None)}
    ]
    # The stream.started arrives, a minute earlier: the call moves to its key, model and start.
    post(priced, call_events("nk", t - timedelta(minutes=1), key="key_n", with_usage=False))
    assert usage(priced, **period, group_by="api_key_id,model") == [
        {"api_key_id": None, "model": None, **totals(1, 100, 10, None)}
    ]
    reconcile_at(priced, settle)
    assert usage(priced, **period, group_by="api_key_id,model,hour") == [
        {
            "api_key_id": "key_n",
            "model": "m1",
            "hour": "2026-03-10T08:00:00+00:00",
            **totals(1, 100, 10, "0.00045"),
        }
    ]
    assert_rollups_rebuild_alike(priced)


def test_query_errors_get_422_in_words(priced: TestClient) -> None:
    period = {"since": "2026-03-10T00:00:00Z", "until": "2026-03-11T00:00:00Z"}
    found = errors(priced.get("/v1/usage"))
    assert sorted(e["path"] for e in found) == ["query.since", "query.until"]
    assert all("required" in e["message"] for e in found)
    cases = [
        ({"tz": "Mars/Olympus"}, "query.tz", "IANA"),
        ({"tz": "../../etc/passwd"}, "query.tz", "IANA"),
        ({"group_by": "week"}, "query.group_by", "api_key_id"),
        ({"group_by": "day,day"}, "query.group_by", "once"),
        ({"basis": "paid"}, "query.basis", "call_start"),
        ({"since": "2026-03-11T00:00:00Z"}, "query.until", "after since"),
        ({"since": "2026-03-10T00:00:00"}, "query.since", "offset"),
        ({"group": "day"}, "query.group", "not a known query parameter"),
        ({"since": "1900-01-01T00:00:00Z", "group_by": "hour"}, "query.group_by", "periods"),
        (
            {"until": "8999-01-01T00:00:00Z", "group_by": "month"},
            "query.group_by",
            "more than 20000 periods",
        ),
        ({"since": "0001-01-02T00:00:00Z"}, "query.since", "between 1900-01-01T00:00:00Z and 9000"),
        ({"since": "0001-01-01T00:00:00+05:30"}, "query.since", "out of range"),
        ({"until": "9999-12-31T23:59:59Z"}, "query.until", "and 9000-01-01T00:00:00Z"),
        ({"until": "9999-12-31T23:59:59-05:00"}, "query.until", "out of range"),
    ]
    for extra, path, words in cases:
        found = errors(priced.get("/v1/usage", params={**period, **extra}))
        assert [e["path"] for e in found] == [path], extra
        assert words in found[0]["message"], (extra, found)


@pytest.mark.slow
def test_a_zone_with_historic_offsets_off_the_quarter_hour_is_answered(client: TestClient) -> None:
    """Africa/Monrovia was at -00:44:30 until 1972: every local day edge is off the 15-minute
    grid, so each leaves a short raw window (18,262 days: 36,524 windows). They are read in
    statements of a bounded size: one OR of them all was refused by SQLite (expression tree too
    deep) and answered as a database outage (503)."""
    for basis in ("call_start", "booked"):
        response = client.get(
            "/v1/usage",
            params={
                "since": "1920-01-01T00:00:00Z",
                "until": "1970-01-01T00:00:00Z",
                "tz": "Africa/Monrovia",
                "group_by": "day",
                "basis": basis,
            },
        )
        assert response.status_code == 200, response.text
        assert response.json() == {"data": []}


@pytest.mark.parametrize(
    ("extra", "name", "count"),
    [
        ("since=2026-03-10T06:00:00Z", "since", 2),
        ("until=2026-03-11T00:00:00Z", "until", 2),  # even the same value twice
        ("group_by=day&group_by=model", "group_by", 2),
        ("tz=UTC&tz=Asia/Kolkata&tz=UTC", "tz", 3),
        ("basis=booked&basis=call_start", "basis", 2),
        ("model=m1&model=m2", "model", 2),
    ],
)
def test_a_repeated_parameter_gets_422(
    priced: TestClient, extra: str, name: str, count: int
) -> None:
    """One of two values is never chosen silently: a repeated parameter is refused."""
    url = f"/v1/usage?since=2026-03-10T00:00:00Z&until=2026-03-11T00:00:00Z&{extra}"
    assert errors(priced.get(url)) == [
        {"index": None, "path": f"query.{name}", "message": f"is given {count} times; give it once"}
    ]


# -- against a reference computed from the source rows ------------------------------------------


def reference(session: Session, query: UsageQuery) -> list[dict[str, Any]]:
    """The usage rows computed naively from ``calls`` / ``ledger_entries`` (no rollups)."""
    if query.basis == "call_start":
        items = [
            (c.started_at, c.api_key_id, c.model, 1, c, c.cost_pusd, c.charge_pusd)
            for c in session.scalars(select(Call).where(Call.settled.is_(True)))
        ]
    else:
        items = [
            (
                e.booked_at,
                e.api_key_id,
                e.model,
                int(e.kind == "settlement"),
                e,
                e.cost_pusd,
                e.charge_pusd,
            )
            for e in session.scalars(select(LedgerEntry))
        ]
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for t, key, model, calls, row, cost, charge in items:
        if not query.since <= t < query.until:
            continue
        if query.api_key_id not in (None, key) or query.model not in (None, model):
            continue
        if query.customer_id not in (None, row.customer_id):
            continue
        local = t.astimezone(query.tz)
        labels: dict[str, Any] = {
            "api_key_id": key,
            "model": model,
            "customer_id": row.customer_id,
            "hour": local.replace(minute=0, second=0, microsecond=0).isoformat(),
            "day": local.date().isoformat(),
            "month": local.strftime("%Y-%m"),
        }
        group = tuple((name, labels[name]) for name in query.group_by)
        acc = groups.setdefault(
            group,
            {
                "calls": 0,
                **dict.fromkeys(TOKEN_FIELDS, 0),
                "costs": [],
                "charges": [],
                "leakage": 0,
                "units": {},
            },
        )
        acc["calls"] += calls
        for name in TOKEN_FIELDS:
            acc[name] += getattr(row, name)
        acc["costs"].append(cost)
        acc["charges"].append(charge)
        acc["leakage"] += row.leakage_pusd or 0
        units = row.units or {}
        for unit, count in (json.loads(units) if isinstance(units, str) else units).items():
            acc["units"][unit] = acc["units"].get(unit, 0) + count

    def order(group: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            datetime.fromisoformat(v)
            if n == "hour"
            else v
            if n in ("day", "month")
            else (v is not None, v or "")
            for n, v in group
        )

    rows = []
    for group in sorted(groups, key=order):
        acc = groups[group]
        units = {unit: n for unit, n in sorted(acc.pop("units").items()) if n}
        money = []
        for amounts in (acc.pop("costs"), acc.pop("charges")):
            known = [c for c in amounts if c is not None]
            if query.basis == "call_start":
                money.append(None if len(known) < len(amounts) else sum(known))
            else:
                money.append(sum(known) if known else None)
        cost, charge = money
        leakage = acc.pop("leakage")
        rows.append(
            {
                **dict(group),
                **acc,
                "cost_usd": pusd_to_str(cost),
                "charge_usd": pusd_to_str(charge),
                "leakage_usd": None if cost is None else pusd_to_str(leakage),
                "units": units,
            }
        )
    return rows


def rows_of(session: Session, query: UsageQuery) -> list[dict[str, Any]]:
    return [row.as_json() for row in usage_rows(session, query)]


def assert_rollups_rebuild_alike(client: TestClient) -> None:
    """The rollups the reconciler kept equal the ones rebuilt from the source rows."""
    with client.app.state.billing.sessions() as session:  # type: ignore[attr-defined]
        kept = rollups.dump(session)
        rollups.rebuild(session)
        session.flush()
        rebuilt = rollups.dump(session)
        session.rollback()
    assert kept == rebuilt


@pytest.fixture
def busy(priced: TestClient) -> TestClient:
    """~180 calls over two keys, three models (one priced late), around the daylight-saving days
    of March and October/November; booked in several passes, with late adjustments."""
    rng = random.Random(20261129)
    spans = [(at("2026-03-06T00:00:00Z"), 26), (at("2026-10-23T00:00:00Z"), 12)]
    plans = []
    for start, days in spans:
        for i in range(90):
            moment = start + timedelta(seconds=rng.randrange(days * 86400))
            if i % 7 == 0:  # some right on a quarter-hour edge, and just before one
                moment = rollup_buckets.floor(rollup_buckets.QUARTER, moment) - timedelta(
                    microseconds=rng.choice([0, 1])
                )
            plans.append((moment, rng.choice(["key_a", "key_b"]), rng.choice(["m1", "m2", "m3"])))
    plans.sort()
    for chunk in range(0, len(plans), 30):
        events = []
        for i, (moment, key, model) in enumerate(plans[chunk : chunk + 30], start=chunk):
            status = ["completed", "completed", "failed", "client_disconnected"][i % 4]
            events += call_events(
                f"b{i:03d}",
                moment,
                key=key,
                model=model,
                inp=rng.randrange(1, 5000),
                out=rng.randrange(1, 900),
                status=status,
            )
        post(priced, events)
        last = plans[min(chunk + 29, len(plans) - 1)][0]
        reconcile_at(priced, last + timedelta(minutes=rng.randrange(1, 600)))
    # Late usages (bigger counts) for every fifth call, booked days later.
    late = []
    for i in range(0, len(plans), 5):
        moment = plans[i][0]
        late.append(
            {
                "event_id": f"b{i:03d}-late",
                "request_id": f"b{i:03d}",
                "type": "stream.usage",
                "occurred_at": iso(moment + timedelta(seconds=30)),
                "input_tokens": 5000 + i,
                "output_tokens": 1000 + i,
                "source": "upstream",
            }
        )
    post(priced, late)
    reconcile_at(priced, at("2026-03-29T00:59:00Z"))  # London changes its clocks at 01:00Z
    # m3 gets a price from 20 March: its later calls are re-priced, booked on 1 November.
    m3 = {
        **M1_PRICE,
        "model": "m3",
        "effective_from": "2026-03-20T00:00:00Z",
        "input_usd_per_mtok": "0.25",
        "output_usd_per_mtok": "1.25",
    }
    assert priced.post("/v1/prices", json=m3).status_code == 201
    reconcile_at(priced, at("2026-11-01T06:30:00Z"))
    return priced


def local_days(zone: ZoneInfo, first: date, last: date) -> list[tuple[datetime, datetime]]:
    days = []
    day = first
    while day < last:
        start = datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)
        end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone).astimezone(UTC)
        days.append((start, end))
        day += timedelta(days=1)
    return days


@pytest.mark.slow
@pytest.mark.parametrize("basis", ["call_start", "booked"])
def test_every_zone_sums_its_days_and_matches_the_source_rows(
    busy: TestClient, session: Session, basis: str
) -> None:
    for name in ZONES:
        zone = ZoneInfo(name)
        for first, last in (
            (date(2026, 3, 5), date(2026, 4, 1)),
            (date(2026, 10, 22), date(2026, 11, 5)),
        ):
            days = local_days(zone, first, last)
            since, until = days[0][0], days[-1][1]
            whole = UsageQuery(since, until, tz=zone, basis=basis)
            assert rows_of(session, whole) == reference(session, whole), name
            summed = {n: 0 for n in ("calls", *TOKEN_FIELDS)}
            for start, end in days:
                one = UsageQuery(start, end, tz=zone, basis=basis)
                for row in rows_of(session, one):
                    for field in summed:
                        summed[field] += row[field]
            (total,) = rows_of(session, whole)
            assert summed == {n: total[n] for n in summed}, name
            by_day = UsageQuery(since, until, group_by=("day",), tz=zone, basis=basis)
            assert rows_of(session, by_day) == reference(session, by_day), name


@pytest.mark.slow
@pytest.mark.parametrize("basis", ["call_start", "booked"])
def test_groupings_filters_and_odd_periods_match_the_source_rows(
    busy: TestClient, session: Session, basis: str
) -> None:
    groupings = [
        (),
        ("hour",),
        ("day", "model"),
        ("month", "api_key_id", "model"),
        ("api_key_id",),
        ("model", "day", "hour"),
        ("month",),
    ]
    periods = [
        (at("2026-03-01T00:00:00Z"), at("2026-12-01T00:00:00Z")),
        (at("2026-03-07T10:07:13Z"), at("2026-03-09T23:59:59.999999Z")),  # off the edges
        (at("2026-10-31T18:15:00Z"), at("2026-11-02T06:45:00Z")),
        (at("2026-03-28T23:00:00Z"), at("2026-03-29T03:00:00Z")),
    ]
    filters: list[dict[str, Any]] = [
        {},
        {"api_key_id": "key_a"},
        {"model": "m3"},
        {"api_key_id": "key_b", "model": "m1"},
    ]
    for name in ("UTC", "Asia/Kolkata", "America/New_York", "Asia/Kathmandu", "Europe/London"):
        for since, until in periods:
            for group_by in groupings:
                for extra in filters:
                    query = UsageQuery(
                        since, until, group_by=group_by, tz=ZoneInfo(name), basis=basis, **extra
                    )
                    assert rows_of(session, query) == reference(session, query), query


@pytest.fixture
def with_units(priced: TestClient) -> TestClient:
    """60 calls over two keys and two models in three days, two in three with units (some on a
    quarter-hour edge or just before one, among calls without); every fourth call's units
    changed by a late usage, booked a day later as an adjustment."""
    rng = random.Random(27)
    events: list[dict[str, Any]] = []
    plans = []
    for i in range(60):
        moment = at("2026-03-10T00:00:00Z") + timedelta(seconds=rng.randrange(3 * 86400))
        if i % 6 == 0:
            moment = rollup_buckets.floor(rollup_buckets.QUARTER, moment) - timedelta(
                microseconds=rng.choice([0, 1])
            )
        key, model = rng.choice(["key_a", "key_b"]), rng.choice(["m1", "m2"])
        plans.append(moment)
        call = call_events(f"u{i:02d}", moment, key=key, model=model, inp=100 + i, out=10 + i)
        if i % 3:
            call[-1]["units"] = {"web_search_requests": rng.randrange(1, 5)}
            if i % 5 == 0:
                call[-1]["units"]["code_execution_requests"] = 1
        events += call
    post(priced, events)
    reconcile_at(priced, at("2026-03-13T06:07:00Z"))
    late = [
        {
            "event_id": f"u{i:02d}-late",
            "request_id": f"u{i:02d}",
            "type": "stream.usage",
            "occurred_at": iso(plans[i] + timedelta(seconds=30)),
            "input_tokens": 500 + i,
            "output_tokens": 50 + i,
            "source": "upstream",
            **({"units": {"web_search_requests": 1 + i % 7}} if i % 8 else {}),
        }
        for i in range(0, 60, 4)
    ]
    post(priced, late)
    reconcile_at(priced, at("2026-03-14T10:00:00Z"))
    return priced


@pytest.mark.parametrize("basis", ["call_start", "booked"])
def test_units_for_a_key_or_a_model_match_the_source_rows(
    with_units: TestClient, session: Session, basis: str
) -> None:
    """Units read through the partial indexes by key and by model, over periods off the
    15-minute edges, in a zone off the hour."""
    periods = [
        (at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z")),
        (at("2026-03-10T10:07:13Z"), at("2026-03-12T23:59:59.999999Z")),
        (at("2026-03-11T00:00:00.000001Z"), at("2026-03-14T10:00:00.000001Z")),
    ]
    filters: list[dict[str, Any]] = [
        {},
        {"api_key_id": "key_a"},
        {"api_key_id": "key_b"},
        {"model": "m2"},
        {"api_key_id": "key_a", "model": "m1"},
    ]
    seen = 0
    for since, until in periods:
        for group_by in [("day",), ("hour", "model"), ("api_key_id",)]:
            for extra in filters:
                query = UsageQuery(
                    since,
                    until,
                    group_by=group_by,
                    tz=ZoneInfo("Asia/Kolkata"),
                    basis=basis,
                    **extra,
                )
                rows = rows_of(session, query)
                assert rows == reference(session, query), query
                seen += sum(1 for row in rows if row["units"])
    assert seen > 50  # the units are there to be summed


def test_units_read_once_serve_the_overviews_groupings(
    with_units: TestClient, session: Session
) -> None:
    """(#43) The Overview reads a period's units once (``units_of``) for its groupings and its
    top keys and customers: each answer is the one with its own units read, and the source
    rows'; a period off the 15-minute edges too."""
    periods = [
        (at("2026-03-10T00:00:00Z"), at("2026-03-13T00:00:00Z")),
        (at("2026-03-10T10:07:13Z"), at("2026-03-12T23:59:59.999999Z")),
    ]
    seen = 0
    for since, until in periods:
        units = units_of(session, UsageQuery(since, until))
        assert len(units) == len(units_of(session, UsageQuery(since, until, group_by=("day",))))
        for group_by in [(), ("model",), ("day", "model"), ("api_key_id",), ("customer_id",)]:
            query = UsageQuery(since, until, group_by=group_by)
            shared = [row.as_json() for row in usage_rows(session, query, units)]
            assert shared == rows_of(session, query) == reference(session, query), query
            seen += sum(1 for row in shared if row["units"])
            if group_by in [("api_key_id",), ("customer_id",)]:
                (dim,) = group_by
                top = [row.as_json() for row in usage_top(session, query, dim, 15, units)]
                alone = [row.as_json() for row in usage_top(session, query, dim, 15)]
                assert top == alone == reference(session, query), query
    assert seen > 10  # the units are there to be summed


def test_rollups_kept_by_the_reconciler_equal_rebuilt_ones(busy: TestClient) -> None:
    assert_rollups_rebuild_alike(busy)


def test_usage_over_http_matches_the_domain_function(busy: TestClient, session: Session) -> None:
    query = UsageQuery(
        at("2026-03-01T00:00:00Z"),
        at("2026-04-01T00:00:00Z"),
        group_by=("day", "api_key_id"),
        tz=ZoneInfo("Pacific/Chatham"),
        basis="booked",
    )
    assert (
        usage(
            busy,
            since="2026-03-01T00:00:00Z",
            until="2026-04-01T00:00:00Z",
            group_by="day,api_key_id",
            tz="Pacific/Chatham",
            basis="booked",
        )
        == rows_of(session, query)
        != []
    )


# -- the bucket arithmetic, without a database --------------------------------------------------


@pytest.mark.slow
@pytest.mark.nodb
def test_cover_splits_a_range_exactly_into_the_coarsest_buckets() -> None:
    rng = random.Random(5)
    base = at("2026-01-01T00:00:00Z")
    for _ in range(300):
        since = base + timedelta(
            seconds=rng.randrange(400 * 86400), microseconds=rng.choice([0, 0, 1, 999_999])
        )
        if rng.random() < 0.5:
            since = rollup_buckets.floor(rollup_buckets.QUARTER, since)
        until = since + timedelta(seconds=rng.randrange(1, 100 * 86400))
        zone = ZoneInfo(rng.choice(ZONES))
        dim = rng.choice([None, "hour", "day", "month"])
        segments = buckets.segments(dim, since, until, zone)
        assert segments[0].start == since and segments[-1].end == until
        assert all(a.end == b.start for a, b in pairwise(segments))
        runs, windows = rollup_buckets.cover([(s.start, s.end) for s in segments])
        pieces = sorted(
            [(r.start, r.end, r.seg) for r in runs] + [(w.start, w.end, w.seg) for w in windows]
        )
        assert pieces[0][0] == since and pieces[-1][1] == until
        assert all(a[1] == b[0] for a, b in pairwise(pieces))
        for start, end, seg in pieces:
            assert segments[seg].start <= start < end <= segments[seg].end
        assert all(len([r for r in runs if r.seg == i]) <= 7 for i in range(len(segments)))
        for run in runs:
            assert rollup_buckets.floor(run.level, run.start) == run.start
            assert rollup_buckets.floor(run.level, run.end) == run.end
        assert all(w.end - w.start < timedelta(minutes=15) for w in windows)
        assert len(windows) <= 2  # every zone in use today: only since/until can be off-edge


@pytest.mark.nodb
def test_a_utc_month_by_day_reads_day_buckets_and_a_kolkata_one_mixes_levels() -> None:
    utc = buckets.segments("day", at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z"), UTC_ZONE)
    runs, windows = rollup_buckets.cover([(s.start, s.end) for s in utc])
    assert [(r.seg, r.level, r.end - r.start) for r in runs] == [
        (day, rollup_buckets.DAY, timedelta(days=1)) for day in range(31)
    ]
    assert windows == []
    whole, _ = rollup_buckets.cover([(at("2025-12-31T23:45:00Z"), at("2027-01-01T00:15:00Z"))])
    assert [(r.level, iso(r.start), iso(r.end)) for r in whole] == [
        (rollup_buckets.QUARTER, "2025-12-31T23:45:00Z", "2026-01-01T00:00:00Z"),
        (rollup_buckets.MONTH, "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        (rollup_buckets.QUARTER, "2027-01-01T00:00:00Z", "2027-01-01T00:15:00Z"),
    ]
    kolkata = buckets.segments(
        "day", at("2026-03-10T18:30:00Z"), at("2026-03-12T18:30:00Z"), ZoneInfo("Asia/Kolkata")
    )
    runs, _ = rollup_buckets.cover([(s.start, s.end) for s in kolkata])
    assert [(r.seg, r.level, iso(r.start), iso(r.end)) for r in runs] == [
        (0, rollup_buckets.QUARTER, "2026-03-10T18:30:00Z", "2026-03-10T19:00:00Z"),
        (0, rollup_buckets.HOUR, "2026-03-10T19:00:00Z", "2026-03-11T18:00:00Z"),
        (0, rollup_buckets.QUARTER, "2026-03-11T18:00:00Z", "2026-03-11T18:30:00Z"),
        (1, rollup_buckets.QUARTER, "2026-03-11T18:30:00Z", "2026-03-11T19:00:00Z"),
        (1, rollup_buckets.HOUR, "2026-03-11T19:00:00Z", "2026-03-12T18:00:00Z"),
        (1, rollup_buckets.QUARTER, "2026-03-12T18:00:00Z", "2026-03-12T18:30:00Z"),
    ]


def test_units_for_a_customer_match_the_source_rows(
    with_units: TestClient, session: Session
) -> None:
    """Units of one customer's calls (SQLite reads them through the partial index of the calls
    with units by customer, ``billing.calllog.sql.sqlite``), alone and with a key or a model,
    over periods off the 15-minute edges, in a zone off the hour."""
    body = {"customer_id": "cust_a", "effective_from": "2026-01-01T00:00:00Z"}
    assert with_units.put("/v1/keys/key_a", json=body).status_code == 201
    reconcile_at(with_units, at("2026-03-14T11:00:00Z"))  # the calls are charged to it again
    session.expire_all()
    periods = [
        (at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z")),
        (at("2026-03-10T10:07:13Z"), at("2026-03-12T23:59:59.999999Z")),
    ]
    filters: list[dict[str, Any]] = [
        {"customer_id": "cust_a"},
        {"customer_id": "cust_a", "model": "m2"},
        {"customer_id": "cust_a", "api_key_id": "key_a", "model": "m1"},
        {"customer_id": "cust_a", "api_key_id": "key_b"},
    ]
    seen = 0
    for since, until in periods:
        for group_by in [("day",), ("hour", "model")]:
            for extra in filters:
                query = UsageQuery(
                    since, until, group_by=group_by, tz=ZoneInfo("Asia/Kolkata"), **extra
                )
                rows = rows_of(session, query)
                assert rows == reference(session, query), query
                seen += sum(1 for row in rows if row["units"])
    assert seen > 20  # the customer's units are there to be summed
