"""Issue 44: a cell a spreadsheet would run as a formula after leading spaces or ``;``, or with a
full-width trigger, is made inert (``'`` before it) by the one definition every CSV writer uses
(``billing.export.csvwriter.neutralise``); numbers and ordinary text are untouched."""

from __future__ import annotations

import csv
import io

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.export.csvwriter import neutralise
from billing.settings import Settings
from tests.export.test_export import export, post, reconcile, started, usage_ev

HOSTILE = [
    " =SUM(A1)",
    ";=cmd|' /C calc'!A0",
    "  ; +1",
    "\uff1d1+1",
    "\uff0bx",
    "\uff20x",
    "\uff0d1",
]


@pytest.mark.nodb
@pytest.mark.parametrize("value", [*HOSTILE, "\u3000=1", " \t=1", "\n=1"])
def test_a_hidden_formula_is_neutralised(value: str) -> None:
    assert neutralise(value) == "'" + value


@pytest.mark.nodb
@pytest.mark.parametrize("value", ["a=b", "key 1", " key", ";a", "1", "\uff41"])
def test_ordinary_text_is_unchanged(value: str) -> None:
    assert neutralise(value) == value


def test_the_exports_neutralise_hidden_formulas(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    events = []
    for i, key in enumerate(HOSTILE):
        rid = f"req-{i}"
        events += [
            started(rid, "2026-03-01T10:00:00Z", key=key, model="m"),
            usage_ev(f"{rid}-u", rid, "2026-03-01T10:00:01Z", 1, 1),
        ]
    post(client, events)
    reconcile(app, settings, "2026-03-01T10:01:00Z")
    day = {"since": "2026-03-01T00:00:00Z", "until": "2026-03-02T00:00:00Z"}
    for kind, params in (("calls", day), ("usage", {**day, "group_by": "api_key_id"})):
        text = export(client, kind, **params).text
        rows = list(csv.DictReader(io.StringIO(text)))
        assert sorted(row["api_key_id"] for row in rows) == sorted("'" + k for k in HOSTILE)
