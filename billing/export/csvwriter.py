"""CSV cells and encoding for the exports: RFC 4180 via the stdlib ``csv`` module, UTF-8.

- Every row ends with ``\\r\\n``; a cell is quoted only when it holds a comma, a double quote, CR
  or LF (``csv.QUOTE_MINIMAL``), and a double quote inside is doubled.
- Text cells that a spreadsheet would run as a formula (whose first character after any spaces
  and ``;`` is ``=``, ``+``, ``-``, ``@``, a full-width ``＝ ＋ － ＠``, tab, CR or LF) get a
  leading ``'`` (:func:`neutralise`, the one definition every CSV writer uses). Numeric cells
  (token counts, prices, costs, negative adjustments too) are written as they are and never
  altered.
- Money is exact: prices and costs are stored as integers (micro-USD per million tokens,
  picodollars) and written as plain decimals with trailing zeros removed, exactly as
  :func:`billing.money.pusd_to_str` writes them, with integer and string operations only.
- An empty cell means null (an unknown key, an unpriced entry).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

from billing.dimensions import V1_TOKEN_FIELDS
from billing.export.columns import V2Column
from billing.rates import V1_RATES

#: First characters that make a spreadsheet treat a cell as a formula (OWASP "CSV injection"),
#: the full-width forms too (a spreadsheet may fold them).
FORMULA_STARTS: Final[frozenset[str]] = frozenset("=+-@\t\r\n\uff1d\uff0b\uff0d\uff20")
#: What a spreadsheet skips before it looks for a formula: spaces (the ideographic one too) and
#: ``;`` (a separator some spreadsheets accept in a cell).
_SKIPPED = " ;\u3000"


def neutralise(value: str | None) -> str | None:
    """A text cell made inert for spreadsheets: ``'`` before it when its first character after
    any spaces and ``;`` is one of ``FORMULA_STARTS``.

    None (an empty cell) and every other text stay as they are.
    """
    if value and value.lstrip(_SKIPPED)[:1] in FORMULA_STARTS:
        return "'" + value
    return value


def _scaled(amount: int, digits: int) -> str:
    """``amount / 10**digits`` as plain decimal text without trailing zeros."""
    if amount < 0:
        sign = "-"
        text = str(-amount)
    else:
        sign = ""
        text = str(amount)
    if len(text) <= digits:
        fraction = text.rjust(digits, "0").rstrip("0")
        return f"{sign}0.{fraction}" if fraction else "0"
    whole = text[:-digits]
    fraction = text[-digits:].rstrip("0")
    return f"{sign}{whole}.{fraction}" if fraction else f"{sign}{whole}"


def pusd_cell(pusd: int | None) -> str | None:
    """Picodollars → exact USD text (``"0.011316"``, ``"-0.0000075"``, ``"0"``); None stays None."""
    return None if pusd is None else _scaled(pusd, 12)


def price_cell(micro: int | None) -> str | None:
    """Micro-USD per Mtok → USD per million tokens text (``"3"``, ``"0.3"``); None stays None."""
    return None if micro is None else _scaled(micro, 6)


class PriceCells(dict[int | None, str]):
    """A memo of :func:`price_cell` (an export sees few distinct prices); None → ``""``."""

    def __missing__(self, key: int | None) -> str:
        value = price_cell(key) or ""
        self[key] = value
        return value


def csv_cell(value: str | None) -> str:
    """A text cell as ``csv.writer`` writes it inside a row (``QUOTE_MINIMAL``, the default
    dialect): neutralised, then, when it holds a comma, a double quote, CR or LF, enclosed in
    double quotes with each double quote doubled; None → ``""``. A pure function: exports stream
    on several threads at once, so nothing here is shared between calls (a test compares a
    concurrent export's bytes with a serial one's)."""
    text = neutralise(value)
    if not text:
        return ""
    if "," in text or '"' in text or "\r" in text or "\n" in text:
        return '"' + text.replace('"', '""') + '"'
    return text


class TextCells(dict[str | None, str]):
    """A bounded memo of :func:`csv_cell` for repeated texts (kinds, reasons, keys, models)."""

    def __missing__(self, key: str | None) -> str:
        if len(self) >= 100_000:
            self.clear()
        value = csv_cell(key)
        self[key] = value
        return value


class ChunkWriter:
    """Formats rows with ``csv.writer`` into text or UTF-8 byte chunks, one chunk per call."""

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)

    def text(self, rows: Iterable[Sequence[Any]]) -> str:
        """The CSV text of ``rows`` (None cells are written empty)."""
        self._writer.writerows(rows)
        data = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return data

    def encode(self, rows: Iterable[Sequence[Any]]) -> bytes:
        """The CSV bytes (UTF-8) of ``rows``."""
        return self.text(rows).encode("utf-8")

    def header(self, columns: Sequence[str]) -> bytes:
        """The header row's bytes."""
        return self.encode([columns])


#: The token and price cells of a ``calls.csv`` row: after the nine identity cells, before the cost.
_TOKENS_AT = 9
_PRICES_AT = _TOKENS_AT + len(V1_TOKEN_FIELDS)
_COST_AT = _PRICES_AT + len(V1_RATES)


class CallsRenderer:
    """Renders ``calls.csv`` rows as CSV text: the bytes ``csv.writer`` gives for the same cells,
    without the stdlib writer's work on every character.

    A row arrives as the ledger columns in ``CALLS_COLUMNS`` order, ``booked_at`` already as
    RFC 3339 text. Every text cell goes through :func:`csv_cell` (neutralised, and quoted by
    ``csv`` when it needs quoting; memoised for repeated texts); numeric cells and the timestamp
    never need quoting. The cells are then joined by commas, one line per row, CRLF after each.
    """

    def __init__(self) -> None:
        self._texts = TextCells()
        self._prices = PriceCells()

    @staticmethod
    def cells(row: Sequence[Any]) -> tuple[Any, ...]:
        """The cells of one row as ``csv.writer`` would receive them (the reference rendering)."""
        eid, kind, reason, booked, rid, key, model, proto, status = row[:_TOKENS_AT]
        return (
            eid, neutralise(kind), neutralise(reason), booked, neutralise(rid), neutralise(key),
            neutralise(model), neutralise(proto), neutralise(status), *row[_TOKENS_AT:_PRICES_AT],
            *(price_cell(p) for p in row[_PRICES_AT:_COST_AT]),
            pusd_cell(row[_COST_AT]),
        )  # fmt: skip

    def chunk(self, rows: Sequence[Sequence[Any]]) -> str:
        """The CSV text of ``rows``, each line ending with CRLF."""
        text = self._texts
        price = self._prices.__getitem__
        lines = []
        for row in rows:
            eid, kind, reason, booked, rid, key, model, proto, status = row[:_TOKENS_AT]
            cells = (
                str(eid), text[kind], text[reason], booked, csv_cell(rid), text[key],
                text[model], text[proto], text[status], *map(str, row[_TOKENS_AT:_PRICES_AT]),
                *map(price, row[_PRICES_AT:_COST_AT]), pusd_cell(row[_COST_AT]) or "",
            )  # fmt: skip
            lines.append(",".join(cells))
        lines.append("")
        return "\r\n".join(lines)


def units_cell(units: dict[str, int]) -> str:
    """Units (name → count) as their one canonical CSV cell (v2): compact JSON sorted by name,
    without the zeros, ``{}`` for none (``{"web_search_requests":3}``), so that the columns stay
    fixed whatever units appear (docs/ARCHITECTURE.md)."""
    return json.dumps(
        {name: count for name, count in sorted(units.items()) if count}, separators=(",", ":")
    )


def merge_units(into: dict[str, int], text: str | None) -> None:
    """Add the units of a ledger entry (its stored JSON text, or None) to ``into``."""
    if text:
        for name, count in json.loads(text).items():
            into[name] = into.get(name, 0) + int(count)


def unit_prices_cell(text: str | None) -> str:
    """Unit prices used (stored JSON: name → micro-USD per unit) as the canonical v2 cell: USD
    per unit as decimal strings (``{"web_search_requests":"0.01"}``), ``{}`` for none."""
    prices = json.loads(text) if text else {}
    return json.dumps(
        {name: price_cell(int(micro)) for name, micro in sorted(prices.items())},
        separators=(",", ":"),
    )


class V2Cells:
    """The cells of the columns a v2 export adds (``billing.export.columns.V2Column``), as
    ``csv.writer`` receives them: per ledger entry (``cells``) or for a usage group's totals
    (``totals``)."""

    def __init__(self, columns: Sequence[V2Column]) -> None:
        self._kinds = [c.kind for c in columns]

    def cells(self, values: Sequence[Any]) -> list[Any]:
        """One entry's cells from its stored values, in column order."""
        out: list[Any] = []
        for kind, value in zip(self._kinds, values, strict=True):
            if kind == "count":
                out.append(int(value or 0))
            elif kind == "units":
                merged: dict[str, int] = {}
                merge_units(merged, value)
                out.append(units_cell(merged))
            elif kind == "price":
                out.append(price_cell(value))
            elif kind == "money":
                out.append(pusd_cell(value))
            elif kind == "text":
                out.append(neutralise(value))
            else:
                out.append(unit_prices_cell(value))
        return out

    def totals(self, totals: Sequence[Any]) -> list[Any]:
        """A usage group's cells from its totals (counts, units as a dict, money as ``[sum,
        entries with an amount]``: empty when none has one)."""
        out: list[Any] = []
        for kind, value in zip(self._kinds, totals, strict=True):
            if kind == "units":
                out.append(units_cell(value))
            elif kind == "money":
                out.append(pusd_cell(value[0]) if value[1] else None)
            else:
                out.append(value)
        return out
