"""Finance exports (CONTRACT "Export"): ``GET /v1/exports/usage.csv``, ``calls.csv`` and
``billing export``, on the ledger's booking time, byte for byte.

Ledger entries come from the real pipeline (``POST /v1/prices``, ``POST /v1/events``, then a
reconciliation pass with an explicit clock, which sets ``booked_at``), so settlements and
adjustments land in chosen periods.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sqlalchemy import select
from typer.testing import CliRunner

from billing import cli
from billing.calllog.buckets import Buckets
from billing.export import service
from billing.export.columns import CALLS_COLUMNS, PRICE_COLUMNS, TOKEN_COLUMNS, usage_columns
from billing.export.csvwriter import (
    CallsRenderer,
    ChunkWriter,
    csv_cell,
    neutralise,
    price_cell,
    pusd_cell,
    units_cell,
)
from billing.export.params import parse_params
from billing.export.repository import repository as export_repository
from billing.money import pusd_to_str, uusd_per_mtok_to_str
from billing.reconcile.runner import run_pass
from billing.settings import Settings, get_settings
from billing.storage.models import LedgerEntry
from billing.timefmt import rfc3339
from tests.cli_runs import run_on_a_terminal

HEADER_CALLS = (
    "entry_id,kind,reason,booked_at,request_id,api_key_id,model,protocol,status,input_tokens,"
    "cache_read_input_tokens,cache_creation_input_tokens,output_tokens_billed,"
    "output_tokens_delivered,output_tokens_undelivered,reasoning_tokens,input_usd_per_mtok,"
    "output_usd_per_mtok,cache_read_usd_per_mtok,cache_creation_usd_per_mtok,cost_usd\r\n"
)
HEADER_USAGE = (
    "day,api_key_id,model,calls,input_tokens,cache_read_input_tokens,"
    "cache_creation_input_tokens,output_tokens_billed,output_tokens_delivered,"
    "output_tokens_undelivered,reasoning_tokens,cost_usd\r\n"
)
FORMULA_KEY = '=HYPERLINK("http://x","y")'
SONNET = "claude-sonnet-5-5"
SONNET_PRICE = {
    "model": SONNET,
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "3",
    "output_usd_per_mtok": "15",
    "cache_read_usd_per_mtok": "0.3",
    "cache_creation_usd_per_mtok": "3.75",
}
DAY1 = {"since": "2026-03-01T00:00:00Z", "until": "2026-03-02T00:00:00Z"}
DAY5 = {"since": "2026-03-05T00:00:00Z", "until": "2026-03-06T00:00:00Z"}
MARCH = {"since": "2026-03-01T00:00:00Z", "until": "2026-04-01T00:00:00Z"}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ev(event_id: str, request_id: str, kind: str, occurred: str, **fields: Any) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "request_id": request_id,
        "type": kind,
        "occurred_at": occurred,
        **fields,
    }


def started(rid: str, occurred: str, key: str = "key_7f3a", model: str = SONNET,
            protocol: str = "anthropic.messages", **fields: Any) -> dict[str, Any]:  # fmt: skip
    return ev(f"{rid}-s", rid, "stream.started", occurred, api_key_id=key, model=model,
              protocol=protocol, **fields)  # fmt: skip


def usage_ev(event_id: str, rid: str, occurred: str, inp: int, out: int, **fields: Any) -> Any:
    return ev(event_id, rid, "stream.usage", occurred, input_tokens=inp, output_tokens=out,
              source="upstream", **fields)  # fmt: skip


def post(client: TestClient | httpx.Client, events: list[dict[str, Any]]) -> None:
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 200, response.text


def price(client: TestClient | httpx.Client, body: dict[str, Any]) -> None:
    response = client.post("/v1/prices", json=body)
    assert response.status_code in (200, 201), response.text


def reconcile(app: FastAPI, settings: Settings, now: str) -> None:
    run_pass(app.state.billing.sessions, settings, now=at(now))


def export(client: TestClient | httpx.Client, kind: str, **params: str) -> httpx.Response:
    response = client.get(f"/v1/exports/{kind}.csv", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    return response


def ledger(app: FastAPI) -> list[LedgerEntry]:
    with app.state.billing.sessions() as session:
        return list(session.scalars(select(LedgerEntry).order_by(LedgerEntry.entry_id)))


def rows_of(body: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(body.decode("utf-8"), newline="")))


@pytest.fixture
def day1(client: TestClient, app: FastAPI, settings: Settings) -> TestClient:
    """Two calls settled on 2026-03-01: a priced one whose client left, and an unpriced one
    whose api key is a spreadsheet formula."""
    price(client, SONNET_PRICE)
    post(client, [
        started("req-1", "2026-03-01T10:00:00Z"),
        ev("req-1-t", "req-1", "stream.tokens", "2026-03-01T10:00:01Z",
           output_tokens_generated=400, output_tokens_delivered=380),
        ev("req-1-d", "req-1", "stream.client_disconnected", "2026-03-01T10:00:02Z",
           output_tokens_delivered=380),
        usage_ev("req-1-u", "req-1", "2026-03-01T10:00:03Z", 22, 750,
                 cache_read_input_tokens=100, cache_creation_input_tokens=50),
    ])  # fmt: skip
    reconcile(app, settings, "2026-03-01T10:01:00Z")
    post(client, [
        started("req-2", "2026-03-01T10:05:00Z", key=FORMULA_KEY, model="gpt-x",
                protocol="openai.chat_completions", metadata={"team": "=1+2"}),
        ev("req-2-t", "req-2", "stream.tokens", "2026-03-01T10:05:01Z",
           output_tokens_generated=5, output_tokens_delivered=5),
        usage_ev("req-2-u", "req-2", "2026-03-01T10:05:02Z", 10, 5, reasoning_tokens=2),
    ])  # fmt: skip
    reconcile(app, settings, "2026-03-01T10:06:00Z")
    return client


DAY1_CALLS = (
    HEADER_CALLS
    + "1,settlement,settled: upstream usage for every attempt,2026-03-01T10:01:00Z,req-1,"
    "key_7f3a,claude-sonnet-5-5,anthropic.messages,client_disconnected,"
    "22,100,50,750,380,370,0,3,15,0.3,3.75,0.0115335\r\n"
    "2,settlement,settled: upstream usage for every attempt,2026-03-01T10:06:00Z,req-2,"
    '"\'=HYPERLINK(""http://x"",""y"")",gpt-x,openai.chat_completions,completed,'
    "10,0,0,5,5,0,2,,,,,\r\n"
).encode()
DAY1_USAGE = (
    HEADER_USAGE + '2026-03-01,"\'=HYPERLINK(""http://x"",""y"")",gpt-x,1,10,0,0,5,5,0,2,\r\n'
    "2026-03-01,key_7f3a,claude-sonnet-5-5,1,22,100,50,750,380,370,0,0.0115335\r\n"
).encode()
ADJUSTMENT_REASON = (
    "late events changed the usage: input_tokens +8, output_tokens_billed -50, "
    "output_tokens_undelivered -50"
)
DAY5_CALLS = (
    HEADER_CALLS + f'3,adjustment,"{ADJUSTMENT_REASON}",2026-03-05T12:00:00.000005Z,req-1,key_7f3a,'
    "claude-sonnet-5-5,anthropic.messages,client_disconnected,"
    "8,0,0,-50,0,-50,0,3,15,0.3,3.75,-0.000726\r\n"
).encode()
DAY5_USAGE = (
    HEADER_USAGE + "2026-03-05,key_7f3a,claude-sonnet-5-5,0,8,0,0,-50,0,-50,0,-0.000726\r\n"
).encode()


def late_usage(client: TestClient, app: FastAPI, settings: Settings) -> None:
    """A later upstream usage for req-1 (input 30, output 700) booked on 2026-03-05."""
    post(
        client,
        [
            usage_ev(
                "req-1-u2",
                "req-1",
                "2026-03-01T10:00:04Z",
                30,
                700,
                cache_read_input_tokens=100,
                cache_creation_input_tokens=50,
            )
        ],
    )
    reconcile(app, settings, "2026-03-05T12:00:00.000005Z")


# --- whole exports, byte for byte ---


def test_small_exports_match_literal_bytes(day1: TestClient) -> None:
    assert export(day1, "calls", **DAY1).content == DAY1_CALLS
    assert export(day1, "usage", **DAY1).content == DAY1_USAGE


def test_closed_period_is_byte_identical_after_a_late_adjustment(
    day1: TestClient, app: FastAPI, settings: Settings
) -> None:
    before = {kind: export(day1, kind, **DAY1) for kind in ("calls", "usage")}
    assert all(r.headers["x-billing-period"] == "closed" for r in before.values())
    late_usage(day1, app, settings)
    assert [e.kind for e in ledger(app)] == ["settlement", "settlement", "adjustment"]
    for kind in ("calls", "usage"):
        again = export(day1, kind, **DAY1)
        assert again.content == before[kind].content
        assert again.headers["x-billing-period"] == "closed"
    # The adjustment is in the period in which it was booked, with its signed deltas and cost.
    assert export(day1, "calls", **DAY5).content == DAY5_CALLS
    assert export(day1, "usage", **DAY5).content == DAY5_USAGE
    # Over both periods, the key's figures are the call's current figures.
    march = rows_of(export(day1, "usage", **MARCH, group_by="api_key_id").content)
    assert march[1] == {
        "api_key_id": "key_7f3a", "calls": "1", "input_tokens": "30",
        "cache_read_input_tokens": "100", "cache_creation_input_tokens": "50",
        "output_tokens_billed": "700", "output_tokens_delivered": "380",
        "output_tokens_undelivered": "320", "reasoning_tokens": "0", "cost_usd": "0.0108075",
    }  # fmt: skip
    call = day1.get("/v1/calls/req-1").json()
    assert call["cost_usd"] == "0.0108075"
    assert call["output_tokens_billed"] == 700


def test_half_open_periods_on_booking_time(day1: TestClient) -> None:
    # req-1 is booked at exactly 10:01:00: in [10:01, 10:06), not in [10:00, 10:01).
    first = export(day1, "calls", since="2026-03-01T10:00:00Z", until="2026-03-01T10:01:00Z")
    assert first.content == HEADER_CALLS.encode()
    both = export(day1, "calls", since="2026-03-01T10:01:00Z", until="2026-03-01T10:06:00.000001Z")
    assert [r["entry_id"] for r in rows_of(both.content)] == ["1", "2"]
    one = export(day1, "calls", since="2026-03-01T11:01:00+01:00", until="2026-03-01T10:06:00Z")
    assert [r["entry_id"] for r in rows_of(one.content)] == ["1"]
    assert export(day1, "usage", since="2026-03-02T00:00:00Z", until="2026-03-03T00:00:00Z"
                  ).content == HEADER_USAGE.encode()  # fmt: skip


def test_bounds_finer_than_a_microsecond_keep_the_period_half_open(day1: TestClient) -> None:
    """req-1 is booked at exactly 10:01:00.000000 (instants are stored to the microsecond): a
    ``since`` a tenth of a microsecond later leaves it out, an ``until`` that much later takes it
    in (digits beyond the sixth round up, never down)."""
    after = export(
        day1, "calls", since="2026-03-01T10:01:00.0000001Z", until="2026-03-01T10:06:00Z"
    )
    assert [r["entry_id"] for r in rows_of(after.content)] == []
    upto = export(
        day1, "calls", since="2026-03-01T10:00:00Z", until="2026-03-01T10:01:00.000000001Z"
    )
    assert [r["entry_id"] for r in rows_of(upto.content)] == ["1"]
    zeros = export(
        day1, "calls", since="2026-03-01T10:00:00Z", until="2026-03-01T10:01:00.0000000Z"
    )
    assert rows_of(zeros.content) == []


def test_formula_cells_are_neutralised_and_numbers_are_not(
    day1: TestClient, app: FastAPI, settings: Settings
) -> None:
    post(day1, [
        started("-req-3", "2026-03-05T09:00:00Z", key="@key", model="+model"),
        usage_ev("-req-3-u", "-req-3", "2026-03-05T09:00:01Z", 1, 1),
    ])  # fmt: skip
    late_usage(day1, app, settings)
    body = export(day1, "calls", **DAY5).content
    lines = body.split(b"\r\n")
    assert lines[1] == (
        b"3,settlement,settled: upstream usage for every attempt,2026-03-05T12:00:00.000005Z,"
        # No delivered count and no disconnect: it delivered what it billed (CONTRACT v2).
        b"'-req-3,'@key,'+model,anthropic.messages,completed,1,0,0,1,1,0,0,,,,,"
    )
    assert lines[2].endswith(b",8,0,0,-50,0,-50,0,3,15,0.3,3.75,-0.000726")
    usage = export(day1, "usage", **DAY5, group_by="api_key_id,model").content
    assert usage.split(b"\r\n")[1:3] == [
        b"'@key,'+model,1,1,0,0,1,1,0,0,",
        b"key_7f3a,claude-sonnet-5-5,0,8,0,0,-50,0,-50,0,-0.000726",
    ]
    formula = export(day1, "usage", **DAY1, group_by="api_key_id").content
    assert b'\r\n"\'=HYPERLINK(""http://x"",""y"")",1,10,' in formula
    assert b"=1+2" not in export(day1, "calls", **DAY1).content  # metadata is not exported


@pytest.mark.nodb
@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ("=1+2", "'=1+2"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("a=b", "a=b"),
        ("", ""),
        (None, None),
    ],
)
def test_neutralise(value: str | None, cell: str | None) -> None:
    assert neutralise(value) == cell


@pytest.mark.nodb
def test_csv_cells_quote_as_the_csv_module_does() -> None:
    assert csv_cell(FORMULA_KEY) == '"\'=HYPERLINK(""http://x"",""y"")"'
    assert csv_cell("\rx") == '"\'\rx"'
    assert csv_cell("a,b") == '"a,b"'
    assert csv_cell("-a\nb") == '"\'-a\nb"'
    assert csv_cell(None) == csv_cell("") == ""


# --- exact money ---


def test_usage_cost_column_sums_to_the_ledger_exactly(
    day1: TestClient, app: FastAPI, settings: Settings
) -> None:
    late_usage(day1, app, settings)
    # gpt-x gets a price: its call is re-priced through a reversal and a priced re-post.
    price(day1, {**SONNET_PRICE, "model": "gpt-x", "input_usd_per_mtok": "0.000001",
                 "output_usd_per_mtok": "100000", "cache_read_usd_per_mtok": "0",
                 "cache_creation_usd_per_mtok": "1.5"})  # fmt: skip
    for i in range(20):
        rid = f"bulk-{i}"
        minute = f"2026-03-0{2 + i % 7}T{i:02d}:30:00Z"
        post(day1, [
            started(rid, minute, key=f"key_{i % 3}", model=SONNET if i % 2 else "gpt-x"),
            usage_ev(f"{rid}-u", rid, minute, 1000 + i, 17 * i + 3,
                     cache_read_input_tokens=i * 11, cache_creation_input_tokens=i * 7),
        ])  # fmt: skip
        reconcile(app, settings, minute.replace(":30:00", ":45:00.000001"))
    entries = ledger(app)
    assert {e.kind for e in entries} == {"settlement", "adjustment"}
    assert any(e.cost_pusd is None for e in entries)
    for period, group_by, tz in [
        (MARCH, "day,api_key_id,model", "UTC"),
        (MARCH, "month", "Pacific/Chatham"),
        (MARCH, "hour,model", "Asia/Kathmandu"),
        ({"since": "2026-03-01T10:03:00Z", "until": "2026-03-06T07:45:00.000001Z"}, "model", "UTC"),
    ]:
        body = export(day1, "usage", **period, group_by=group_by, tz=tz).content
        exported = sum(Decimal(r["cost_usd"]) for r in rows_of(body) if r["cost_usd"])
        since, until = at(period["since"]), at(period["until"])
        booked = [e for e in entries if since <= e.booked_at < until]
        assert exported == Decimal(sum(e.cost_pusd or 0 for e in booked)) / 10**12
        for name in TOKEN_COLUMNS:
            assert sum(int(r[name]) for r in rows_of(body)) == sum(getattr(e, name) for e in booked)
        assert sum(int(r["calls"]) for r in rows_of(body)) == sum(
            e.kind == "settlement" for e in booked
        )
        calls = rows_of(export(day1, "calls", **period).content)
        assert [int(r["entry_id"]) for r in calls] == [
            e.entry_id for e in sorted(booked, key=lambda e: (e.booked_at, e.entry_id))
        ]


def test_every_calls_row_recomputes_its_cost(
    day1: TestClient, app: FastAPI, settings: Settings
) -> None:
    late_usage(day1, app, settings)
    price(day1, {**SONNET_PRICE, "model": "gpt-x", "input_usd_per_mtok": "1.234567",
                 "output_usd_per_mtok": "99999.999999"})  # fmt: skip
    reconcile(app, settings, "2026-03-07T00:00:00Z")
    rows = rows_of(export(day1, "calls", **MARCH).content)
    assert len(rows) == len(ledger(app)) == 5
    tokens = {"input_usd_per_mtok": "input_tokens",
              "cache_read_usd_per_mtok": "cache_read_input_tokens",
              "cache_creation_usd_per_mtok": "cache_creation_input_tokens",
              "output_usd_per_mtok": "output_tokens_billed"}  # fmt: skip
    priced = 0
    for row in rows:
        if row["cost_usd"] == "":
            assert all(row[p] == "" for p in PRICE_COLUMNS)
            continue
        priced += 1
        cost = sum(Decimal(row[t]) * Decimal(row[p]) for p, t in tokens.items()) / 10**6
        assert cost == Decimal(row["cost_usd"])
    assert priced == 3
    by_id = {e.entry_id: e for e in ledger(app)}
    for row in rows:
        entry = by_id[int(row["entry_id"])]
        assert row["cost_usd"] == (pusd_to_str(entry.cost_pusd) or "")
        assert row["booked_at"] == rfc3339(entry.booked_at)


def test_usage_csv_equals_booked_usage_query(
    day1: TestClient, app: FastAPI, settings: Settings
) -> None:
    """``GET /v1/usage?basis=booked`` holds exactly what usage.csv holds (skips while the
    endpoint does not exist)."""
    late_usage(day1, app, settings)
    probe = day1.get("/v1/usage", params={**MARCH, "basis": "booked"})
    if probe.status_code == 404:
        pytest.skip("GET /v1/usage is not there yet")
    for params in [
        {**MARCH, "group_by": "day,api_key_id,model"},
        {**MARCH, "group_by": "api_key_id,model"},
        {**DAY5, "group_by": "hour", "tz": "Asia/Kolkata"},
        {**MARCH, "group_by": "model,month", "tz": "America/New_York"},
    ]:
        response = day1.get("/v1/usage", params={**params, "basis": "booked"})
        assert response.status_code == 200, response.text
        expected = [
            {
                k: (units_cell(v) if k == "units" else "" if v is None else str(v))
                for k, v in row.items()
            }
            for row in response.json()["data"]
        ]
        # The v2 columns: the one-hour cache writes and the units, as the usage rows have them;
        # v3's leakage too.
        got = rows_of(export(day1, "usage", **params, format="v3").content)
        for row in got:
            if row.get("api_key_id", "").startswith("'"):
                row["api_key_id"] = row["api_key_id"][1:]
            # v2 groups by the customer and plan too: these keys have neither.
            assert (row.pop("customer_id"), row.pop("plan_id")) == ("", "")
            # v3: no provider reported its own cost (not a usage row's field).
            assert row.pop("provider_cost_usd") == ""
        assert got == expected


# --- buckets and zones ---


def test_buckets_across_daylight_saving_and_months(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    price(client, SONNET_PRICE)
    # Paris falls back on 2026-10-25 at 01:00Z: 02:30 happens at 00:30Z (+02:00) and 01:30Z.
    for rid, when, inp in [
        ("a", "2026-10-25T00:30:00Z", 1),
        ("b", "2026-10-25T01:30:00Z", 2),
        ("c", "2026-10-31T23:30:00Z", 4),
        ("d", "2026-10-24T21:59:59Z", 8),
    ]:
        post(client, [started(rid, when), usage_ev(f"{rid}-u", rid, when, inp, 0)])
        reconcile(app, settings, when)
    period = {"since": "2026-10-01T00:00:00Z", "until": "2026-11-30T00:00:00Z"}
    body = export(client, "usage", **period, group_by="month,day,hour", tz="Europe/Paris").content
    assert [(r["month"], r["day"], r["hour"], r["input_tokens"]) for r in rows_of(body)] == [
        ("2026-10", "2026-10-24", "2026-10-24T23:00:00+02:00", "8"),
        ("2026-10", "2026-10-25", "2026-10-25T02:00:00+02:00", "1"),
        ("2026-10", "2026-10-25", "2026-10-25T02:00:00+01:00", "2"),
        ("2026-11", "2026-11-01", "2026-11-01T00:00:00+01:00", "4"),
    ]
    utc = rows_of(export(client, "usage", **period, group_by="hour").content)
    assert [r["hour"] for r in utc] == [
        "2026-10-24T21:00:00+00:00", "2026-10-25T00:00:00+00:00", "2026-10-25T01:00:00+00:00",
        "2026-10-31T23:00:00+00:00",
    ]  # fmt: skip
    # Single days add up to the whole range, the 25-hour day included.
    zone = ZoneInfo("Europe/Paris")
    start = datetime(2026, 10, 20, tzinfo=zone)
    days = []
    for i in range(15):
        since = (start + timedelta(days=i)).astimezone(UTC)
        until = (start + timedelta(days=i + 1)).astimezone(UTC)
        days += rows_of(export(client, "usage", since=since.isoformat(), until=until.isoformat(),
                               group_by="day,model", tz="Europe/Paris").content)  # fmt: skip
    whole = rows_of(export(client, "usage", since=start.isoformat(),
                           until=(start + timedelta(days=15)).isoformat(),
                           group_by="day,model", tz="Europe/Paris").content)  # fmt: skip
    assert days == whole and len(whole) == 3


@pytest.mark.slow
@pytest.mark.nodb
@hsettings(max_examples=300, deadline=None)
@given(
    st.datetimes(min_value=datetime(1890, 1, 1), max_value=datetime(2040, 1, 1)),
    st.sampled_from(
        [
            "UTC",
            "Europe/Paris",
            "America/New_York",
            "Asia/Kathmandu",
            "Australia/Lord_Howe",
            "Pacific/Chatham",
            "America/St_Johns",
            "Europe/Amsterdam",
            "Africa/Monrovia",
        ]
    ),
    st.sampled_from([("hour",), ("day",), ("month",), ("hour", "day", "month")]),
    st.lists(st.integers(min_value=0, max_value=4 * 3600 * 10**6), min_size=1, max_size=30),
)
def test_bucket_memo_equals_labelling_each_instant(
    start: datetime, zone_name: str, keys: tuple[str, ...], steps: list[int]
) -> None:
    zone = ZoneInfo(zone_name)
    buckets = Buckets(zone, keys)
    instant = start.replace(tzinfo=UTC)
    for step in sorted(steps):
        moment = instant + timedelta(microseconds=step)
        text = moment.strftime("%Y-%m-%d %H:%M:%S.%f")
        assert buckets.labels(text) == Buckets(zone, keys).at(moment), text


# --- money and CSV rendering ---


@pytest.mark.nodb
@hsettings(max_examples=500)
@given(st.integers(min_value=-(10**22), max_value=10**22))
def test_money_cells_equal_the_contract_strings(amount: int) -> None:
    assert pusd_cell(amount) == pusd_to_str(amount)
    assert price_cell(abs(amount)) == uusd_per_mtok_to_str(abs(amount))


_TEXT = st.one_of(st.none(), st.text(alphabet=st.sampled_from('ab,"=+-@\t\r\n\x1f é'), max_size=6))


@pytest.mark.slow
@pytest.mark.nodb
@hsettings(max_examples=300)
@given(st.lists(st.tuples(
    st.integers(min_value=1, max_value=10**12), _TEXT, _TEXT, _TEXT, _TEXT, _TEXT, _TEXT, _TEXT,
    st.lists(st.integers(min_value=-(10**9), max_value=10**9), min_size=7, max_size=7),
    st.one_of(st.none(), st.integers(min_value=0, max_value=10**11)),
    st.one_of(st.none(), st.integers(min_value=-(10**20), max_value=10**20)),
), min_size=1, max_size=5))  # fmt: skip
def test_calls_rendering_equals_csv_writer(rows: list[Any]) -> None:
    raw = [
        (eid, kind, reason, "2026-03-01T10:00:00Z", rid, key, model, proto, status, *tokens,
         p, p, p, p, cost)
        for eid, kind, reason, rid, key, model, proto, status, tokens, p, cost in rows
    ]  # fmt: skip
    expected = ChunkWriter().text([CallsRenderer.cells(row) for row in raw])
    assert CallsRenderer().chunk(raw) == expected
    parsed = list(csv.reader(io.StringIO(expected, newline="")))
    assert [int(cells[9]) for cells in parsed] == [row[9] for row in raw]


# --- streaming in chunks ---


def test_chunked_streaming_gives_the_same_bytes(
    day1: TestClient, app: FastAPI, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    late_usage(day1, app, settings)
    whole = {k: export(day1, k, **MARCH).content for k in ("calls", "usage")}
    monkeypatch.setattr(service, "CHUNK_ROWS", 1)
    params = parse_params("calls", MARCH["since"], MARCH["until"])
    chunks = list(service.export_chunks(app.state.billing.sessions, params))
    assert len(chunks) == 3 and b"".join(chunks) == whole["calls"]
    assert chunks[0].startswith(HEADER_CALLS.encode() + b"1,")
    for kind in ("calls", "usage"):
        assert export(day1, kind, **MARCH).content == whole[kind]


def test_http_export_streams_over_a_real_server(day1: TestClient, http: httpx.Client) -> None:
    with http.stream("GET", "/v1/exports/calls.csv", params=DAY1) as response:
        assert response.status_code == 200
        assert response.headers["x-billing-period"] == "closed"
        assert "content-length" not in response.headers
        assert b"".join(response.iter_bytes()) == DAY1_CALLS


# --- closed and provisional ---


def test_period_headers_closed_and_provisional(client: TestClient, settings: Settings) -> None:
    assert settings.close_lag_s == 60
    now = datetime.now(UTC)

    def period(until: datetime) -> str:
        since = (until - timedelta(hours=1)).isoformat()
        headers = {export(client, k, since=since, until=until.isoformat()).headers[
            "x-billing-period"] for k in ("usage", "calls")}  # fmt: skip
        assert len(headers) == 1
        return headers.pop()

    assert period(now + timedelta(hours=1)) == "provisional"
    assert period(now - timedelta(seconds=5)) == "provisional"
    assert period(now - timedelta(seconds=120)) == "closed"
    assert period(datetime(2026, 3, 1, tzinfo=UTC)) == "closed"


def test_close_lag_setting(db_url: str) -> None:
    from billing.server.app import create_app

    until = datetime.now(UTC) - timedelta(seconds=600)
    params = {"since": "2026-01-01T00:00:00Z", "until": until.isoformat()}
    for lag, label in [(3600.0, "provisional"), (0.0, "closed")]:
        with TestClient(
            create_app(Settings(database_url=db_url, close_lag_s=lag)), base_url="http://127.0.0.1"
        ) as client:
            assert export(client, "calls", **params).headers["x-billing-period"] == label


# --- parameters ---


@pytest.mark.parametrize(
    ("params", "path", "words"),
    [
        ({"until": "2026-03-02T00:00:00Z"}, "query.since", "is required"),
        ({**DAY1, "since": "2026-03-01T00:00:00"}, "query.since", "offset"),
        ({**DAY1, "since": "2026-03-01"}, "query.since", "RFC 3339"),
        ({**DAY1, "until": "2026-02-30T00:00:00Z"}, "query.until", "not a valid"),
        ({**DAY1, "until": DAY1["since"]}, "query.until", "must be after since"),
        ({**DAY1, "tz": "Mars/Olympus"}, "query.tz", "unknown time zone"),
        ({**DAY1, "tz": "../etc/passwd"}, "query.tz", "unknown time zone"),
        ({**DAY1, "group_by": "week"}, "query.group_by", "unknown group key"),
        ({**DAY1, "group_by": "day,day"}, "query.group_by", "twice"),
        ({**DAY1, "group_by": ""}, "query.group_by", "at least one"),
    ],
)
def test_invalid_parameters_answer_422(
    client: TestClient, params: dict[str, str], path: str, words: str
) -> None:
    kinds = ("usage",) if path in ("query.tz", "query.group_by") else ("usage", "calls")
    for kind in kinds:
        response = client.get(f"/v1/exports/{kind}.csv", params=params)
        assert response.status_code == 422, response.text
        errors = response.json()["errors"]
        assert errors[0]["index"] is None and errors[0]["path"] == path
        assert words in errors[0]["message"]


@pytest.mark.parametrize(
    ("kind", "query", "path", "words"),
    [
        ("usage", "&foo=1", "query.foo", "not a known query parameter"),
        ("calls", "&group_by=hour", "query.group_by", "not a known query parameter"),
        ("calls", "&tz=Mars/X", "query.tz", "not a known query parameter"),
        ("calls", "&since=2026-02-01T00:00:00Z", "query.since", "given 2 times"),
        ("usage", "&tz=UTC&tz=Europe/Paris", "query.tz", "given 2 times"),
    ],
)
def test_unknown_or_repeated_parameters_answer_422(
    client: TestClient, kind: str, query: str, path: str, words: str
) -> None:
    """Finance gets the period and grouping it asked for, or a 422: never a silently ignored
    parameter or a silently chosen one of two values."""
    url = f"/v1/exports/{kind}.csv?since={DAY1['since']}&until={DAY1['until']}{query}"
    response = client.get(url)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["path"] == path and words in error["message"]


def test_an_offset_whose_plus_arrived_as_a_space_reads_as_that_offset(client: TestClient) -> None:
    """An unencoded ``+02:00`` in a query string arrives as `` 02:00`` (a ``+`` means a space in
    a URL query): it is read as the offset it was, as on /v1/calls and /v1/usage (one parser),
    and the export is the same as with the offset written ``%2B02:00`` or in UTC."""
    manifest = []
    for since in ("2026-03-01T02:00:00 02:00", "2026-03-01T02:00:00%2B02:00", DAY1["since"]):
        response = client.get(f"/v1/exports/calls.csv?since={since}&until={DAY1['until']}")
        assert response.status_code == 200, response.text
        manifest.append(response.content)
    assert manifest[0] == manifest[1] == manifest[2]


def test_both_missing_bounds_are_reported(client: TestClient) -> None:
    response = client.get("/v1/exports/calls.csv")
    assert response.status_code == 422
    assert [e["path"] for e in response.json()["errors"]] == ["query.since", "query.until"]


def test_export_role(client: TestClient, app: FastAPI) -> None:
    from billing.auth.tokens import create_token

    with app.state.billing.sessions() as session:
        secrets = {role: create_token(session, role, None, datetime.now(UTC))[0]
                   for role in ("export", "read", "admin")}  # fmt: skip
        session.commit()
    assert client.get("/v1/exports/calls.csv", params=DAY1).status_code == 401
    for role, status in [("export", 200), ("admin", 200), ("read", 403)]:
        headers = {"Authorization": f"Bearer {secrets[role]}"}
        for kind in ("usage", "calls"):
            response = client.get(f"/v1/exports/{kind}.csv", params=DAY1, headers=headers)
            assert response.status_code == status, (role, response.text)


# --- command line ---


@pytest.fixture
def cli_env(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("BILLING_DATABASE_URL", db_url)
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def test_cli_export_equals_http_and_manifest_proves_it(
    day1: TestClient, app: FastAPI, settings: Settings, cli_env: CliRunner, tmp_path: Path
) -> None:
    late_usage(day1, app, settings)
    cases = [
        ([], "usage", {}),
        (["usage"], "usage", {"group_by": "hour,model", "tz": "Asia/Kolkata"}),
        (["calls"], "calls", {}),
    ]
    for args, kind, extra in cases:
        http_bytes = export(day1, kind, **MARCH, **extra).content
        flags = ["--since", MARCH["since"], "--until", MARCH["until"]]
        for name, value in extra.items():
            flags += [f"--{name.replace('_', '-')}", value]
        result = cli_env.invoke(cli.app, ["export", *args, *flags])
        assert result.exit_code == 0, result.output
        assert result.stdout_bytes == http_bytes
        out = tmp_path / f"{kind}-{len(extra)}.csv"
        result = cli_env.invoke(cli.app, ["export", *args, *flags, "--output", str(out)])
        assert result.exit_code == 0, result.output
        assert result.stdout_bytes == b""
        assert out.read_bytes() == http_bytes
        manifest = json.loads((tmp_path / (out.name + ".manifest.json")).read_text())
        rows = rows_of(http_bytes)
        assert manifest["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
        assert manifest["bytes"] == len(http_bytes)
        assert manifest["file"] == out.name
        assert manifest["kind"] == kind
        assert (manifest["since"], manifest["until"]) == (MARCH["since"], MARCH["until"])
        assert manifest["period"] == "closed"
        assert manifest["rows"] == len(rows)
        assert manifest["ledger_entries"] == 3
        assert manifest["calls"] == 2
        assert manifest["unpriced_entries"] == 1
        assert manifest["tokens"] == {
            "input_tokens": 40, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 50,
            "output_tokens_billed": 705, "output_tokens_delivered": 385,
            "output_tokens_undelivered": 320, "reasoning_tokens": 2,
        }  # fmt: skip
        assert manifest["cost_usd"] == "0.0108075"
        if kind == "usage":
            assert manifest["group_by"] == (extra.get("group_by") or "day,api_key_id,model"
                                            ).split(",")  # fmt: skip
            assert manifest["tz"] == extra.get("tz", "UTC")
        else:
            assert manifest["group_by"] is None and manifest["tz"] is None
        assert not list(tmp_path.glob("*.partial"))


def test_cli_export_errors_are_one_line(day1: TestClient, cli_env: CliRunner) -> None:
    for args, words in [
        (["export", "--until", DAY1["until"]], "--since is required"),
        # (v3: a date alone is its midnight UTC; other shapes are refused)
        (["export", "calls", "--since", "03/01/2026", "--until", DAY1["until"]],
         "--since '03/01/2026' is not an RFC 3339 timestamp"),
        # (a command line takes a +: not the query string's %2B)
        (["export", "usage", "--since", "2026-03-01T00:00:00", "--until", DAY1["until"]],
         "no UTC offset; add one, such as 2026-03-08T00:00:00Z or 2026-03-08T00:00:00+05:30"),
        (["export", "usage", *("--since", DAY1["since"], "--until", DAY1["until"]),
          "--tz", "Nowhere"], "--tz unknown time zone"),
        (["export", "calls", *("--since", DAY1["since"], "--until", DAY1["until"]),
          "--group-by", "day"], "usage exports only"),
        (["export", "invoices", "--since", DAY1["since"], "--until", DAY1["until"]],
         "unknown export"),
    ]:  # fmt: skip
        result = cli_env.invoke(cli.app, args)
        assert result.exit_code != 0
        assert result.stdout_bytes == b""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("billing: ") and words in lines[0], lines
        assert "%2B" not in lines[0] and "query string" not in lines[0], lines


@pytest.mark.slow
def test_cli_shows_progress_only_on_a_terminal(day1: TestClient, db_url: str) -> None:
    billing = Path(sys.executable).parent / "billing"
    command = [str(billing), "export", "calls", "--since", DAY1["since"], "--until", DAY1["until"]]
    env = {**os.environ, "BILLING_DATABASE_URL": db_url}
    plain = subprocess.run(command, env=env, capture_output=True, check=True)
    assert plain.stdout == DAY1_CALLS
    assert plain.stderr.decode().splitlines() == ["billing: 2 row(s), closed period"]
    tty, seen = run_on_a_terminal(command, {**env, "COLUMNS": "100"})
    assert tty.returncode == 0
    assert tty.stdout == DAY1_CALLS
    assert b"exporting calls" in seen or b"\x1b[" in seen
    assert b"2 row(s), closed period" in seen


# --- columns ---


@pytest.mark.nodb
def test_column_order_is_the_documented_one() -> None:
    assert tuple(HEADER_CALLS.strip().split(",")) == CALLS_COLUMNS
    assert usage_columns(("day", "api_key_id", "model")) == tuple(HEADER_USAGE.strip().split(","))
    assert usage_columns(("model", "hour"))[:3] == ("model", "hour", "calls")


@pytest.mark.nodb
def test_random_instants_parse_like_fromisoformat() -> None:
    rng = random.Random(7)
    for _ in range(200):
        moment = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
            seconds=rng.randrange(10**8), microseconds=rng.randrange(10**6)
        )
        offset = timezone(timedelta(minutes=15 * rng.randrange(-48, 56)))
        text = moment.astimezone(offset).isoformat()
        assert parse_params("calls", text, "2099-01-01T00:00:00Z").since == moment


# --- database errors ---


def test_unreachable_database_answers_503_before_any_csv(is_postgres: bool) -> None:
    from billing.server.app import create_app

    url = (
        "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"
        if is_postgres
        else "sqlite:////nonexistent-directory/billing.db"
    )
    with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
        for kind in ("usage", "calls"):
            response = client.get(f"/v1/exports/{kind}.csv", params=DAY1)
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "2"
            assert not response.headers["content-type"].startswith("text/csv")


def test_driver_errors_surface_as_sqlalchemy_errors(app: FastAPI) -> None:
    from sqlalchemy.exc import DBAPIError

    params = parse_params("calls", DAY1["since"], DAY1["until"])
    with app.state.billing.sessions() as session:
        rows = export_repository(session)._chunks(
            session,
            "SELECT x FROM no_such_table WHERE :since < :until",
            params.since,
            params.until,
            service.CHUNK_ROWS,
        )
        with pytest.raises(DBAPIError):
            next(rows)


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({**DAY1, "since": ""}, "query.since"),
        ({**DAY1, "until": "2026-03-02T00:00:00Z" + "0" * 5000}, "query.until"),
        ({**DAY1, "tz": ""}, "query.tz"),
    ],
)
def test_empty_or_overlong_values_are_told_as_on_usage(
    client: TestClient, params: dict[str, str], path: str
) -> None:
    """The same words as /v1/usage, and a 5,000-character value is not echoed back."""
    message = "must be 1 to 256 characters long"
    for url in ("/v1/exports/usage.csv", "/v1/usage"):
        response = client.get(url, params=params)
        assert response.status_code == 422, (url, response.text)
        assert response.json() == {"errors": [{"index": None, "path": path, "message": message}]}
