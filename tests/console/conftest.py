"""The console's data: the seed scenario (req-seed-1: 750 billed, 380 delivered, 370 undelivered),
250 calls of ``key_bulk`` over 2026-10-15 (UTC), and a call whose key and model are HTML, posted
through the API as a gateway would, then reconciled; and tokens for every role."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.auth.tokens import ROLES, create_token, revoke_token
from billing.dimensions import TOKEN_FIELDS
from billing.storage.db import write_transaction
from tests.conftest import FIXTURES

SEED = FIXTURES / "scenarios" / "01_seed_disconnect_billed_beyond_delivered.json"
BULK_KEY = "key_bulk"
BULK_CALLS = 250
XSS_KEY = "<script>alert(1)</script>"
XSS_MODEL = "<img src=x onerror=alert(2)>"
XSS_REQUEST = "req-<b>xss</b>"
BULK_START = datetime(2026, 10, 15, tzinfo=UTC)
#: The usage query the tests draw: key_bulk by hour in Kolkata over two local days.
KOLKATA_USAGE = {
    "api_key_id": BULK_KEY,
    "since": "2026-10-15T00:00:00+05:30",
    "until": "2026-10-17T00:00:00+05:30",
    "group_by": "hour",
    "tz": "Asia/Kolkata",
}


def _at(minutes: float) -> str:
    return (BULK_START + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def bulk_events() -> list[dict[str, Any]]:
    """250 settled calls of ``key_bulk``, one every 5 minutes from 2026-10-15T00:00Z."""
    events: list[dict[str, Any]] = []
    for i in range(BULK_CALLS):
        rid = f"bulk-{i:03d}"
        events.append(
            {
                "event_id": f"{rid}-s",
                "request_id": rid,
                "type": "stream.started",
                "occurred_at": _at(5 * i),
                "api_key_id": BULK_KEY,
                "model": "claude-sonnet-5-5",
                "protocol": "anthropic.messages",
                "input_tokens": 10 + i % 7,
            }
        )
        events.append(
            {
                "event_id": f"{rid}-u",
                "request_id": rid,
                "type": "stream.usage",
                "occurred_at": _at(5 * i + 1),
                "input_tokens": 10 + i % 7,
                "output_tokens": 100 + i,
                "source": "upstream",
            }
        )
    return events


def xss_events() -> list[dict[str, Any]]:
    """One call whose key, model and request id are HTML (its model has no price)."""
    return [
        {
            "event_id": "xss-s",
            "request_id": XSS_REQUEST,
            "type": "stream.started",
            "occurred_at": "2026-10-14T12:00:00Z",
            "api_key_id": XSS_KEY,
            "model": XSS_MODEL,
            "protocol": "openai.responses",
            "input_tokens": 5,
        },
        {
            "event_id": "xss-u",
            "request_id": XSS_REQUEST,
            "type": "stream.usage",
            "occurred_at": "2026-10-14T12:00:01Z",
            "input_tokens": 5,
            "output_tokens": 7,
            "source": "upstream",
        },
    ]


def seed(client: TestClient | httpx.Client, admin: str | None = None) -> None:
    """Post the prices and events through the API and reconcile, with the ``admin`` token (None:
    the service is open)."""
    headers = {"Authorization": f"Bearer {admin}"} if admin else {}
    scenario = json.loads(SEED.read_text())
    for price in scenario["prices"]:
        assert client.post("/v1/prices", json=price, headers=headers).status_code == 201
    events = scenario["events"] + bulk_events() + xss_events()
    for start in range(0, len(events), 500):
        batch = {"events": events[start : start + 500]}
        response = client.post("/v1/events", json=batch, headers=headers)
        assert response.status_code == 200, response.text
    response = client.post("/v1/reconcile", json={}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["settled"] == 1 + BULK_CALLS + 1


def make_tokens(app: FastAPI) -> dict[str, str]:
    """A token per role, and a revoked admin token under ``"revoked"``."""
    state = app.state.billing
    made: dict[str, str] = {}
    now = datetime.now(UTC)
    with write_transaction(state.sessions) as session:
        for role in ROLES:
            made[role], _ = create_token(session, role, f"console-{role}", now)
        made["revoked"], info = create_token(session, "admin", "console-revoked", now)
        revoke_token(session, info.id, now)
    return made


@pytest.fixture
def tokens(app: FastAPI) -> dict[str, str]:
    """Tokens for every role, made before the app answers anything (its guard caches counts)."""
    return make_tokens(app)


@pytest.fixture
def seeded(client: TestClient, tokens: dict[str, str]) -> TestClient:
    """The client of an app with the console's data and tokens for every role."""
    seed(client, tokens["admin"])
    return client


@dataclass
class Table:
    """A table of a page: header cells and body rows (cell texts, unescaped)."""

    head: list[str]
    rows: list[list[str]]


class _TableParser(HTMLParser):
    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id = table_id
        self.inside = False
        self.section = ""
        self.cell: list[str] | None = None
        self.row: list[str] = []
        self.table = Table([], [])

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("id", self.table_id) in attrs:
            self.inside = True
        elif self.inside and tag in ("thead", "tbody"):
            self.section = tag
        elif self.inside and tag == "tr":
            self.row = []
        elif self.inside and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if not self.inside:
            return
        if tag in ("td", "th") and self.cell is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr":
            if self.section == "thead":
                self.table.head = self.row
            else:
                self.table.rows.append(self.row)
        elif tag == "table":
            self.inside = False

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def table(page: str, table_id: str) -> Table:
    """The table ``table_id`` of the HTML ``page``."""
    parser = _TableParser(table_id)
    parser.feed(page)
    return parser.table


def usage_as_table(rows: list[dict[str, Any]], period: str) -> list[list[str]]:
    """``/v1/usage`` rows as the console's usage table shows them (null cost: "unpriced")."""
    fields = ["calls", *TOKEN_FIELDS, "cost_usd", "charge_usd"]
    return [
        [str(row[period])] + ["unpriced" if row[f] is None else str(row[f]) for f in fields]
        for row in rows
    ]


def escaped(text: str) -> str:
    """``text`` as the pages write it (HTML-escaped, quotes included)."""
    return html.escape(text, quote=True).replace("&#x27;", "&#39;")
