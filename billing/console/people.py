"""Money and shares written for people (every console page): ``$1,234.57``, ``$0.0115``,
``12.3 %``, and token counts (``104,260``).

The exact figure stays in the page beside each one (a ``data-exact`` attribute or a ``title``),
as the API answers it; these only round for reading, from the exact ``Decimal``.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal


def usd(value: str | Decimal | None) -> str:
    """``$1,234.57``; under a dollar (not zero) to 4 significant digits (``$0.01153``), since
    an LLM call often costs less than a cent, whole cents with both places (``$0.50``); ``—``
    for unknown."""
    if value is None:
        return "—"
    amount = Decimal(value)
    sign = "−" if amount < 0 else ""
    amount = abs(amount)
    if amount == 0 or amount >= 1:
        return f"{sign}${amount.quantize(Decimal('0.01'), ROUND_HALF_EVEN):,}"
    digits = amount.adjusted()  # -2 for 0.0115
    shown = amount.quantize(Decimal(1).scaleb(digits - 3), ROUND_HALF_EVEN).normalize()
    if shown == shown.quantize(Decimal("0.01")):  # whole cents keep both places: $0.50, not $0.5
        shown = shown.quantize(Decimal("0.01"))
    return f"{sign}${shown:f}"


def _percent_text(hundredths: Decimal, signed: bool = False) -> str:
    """A number of percent written with at most one decimal, ``.0`` left out (``90 %``,
    ``10.8 %``, ``1,250 %``); ``signed`` writes ``+`` before a positive or zero value. The
    console's one way of writing a percentage."""
    value = hundredths.quantize(Decimal("0.1"), ROUND_HALF_EVEN)
    digits = f"{abs(value):,.0f}" if value == value.to_integral_value() else f"{abs(value):,}"
    if value < 0:
        return f"−{digits} %"
    return f"+{digits} %" if signed else f"{digits} %"


def percent(fraction: str | Decimal | None) -> str:
    """A fraction (``fraction_used``, a threshold: ``"0.9"``, ``"0.10756"``) in percent:
    ``90 %``, ``10.8 %``; ``—`` for unknown."""
    if fraction is None:
        return "—"
    return _percent_text(Decimal(fraction) * 100)


def share(part: int | Decimal, whole: int | Decimal) -> str:
    """``part / whole`` in percent (``37.3 %``, ``50 %``); ``—`` when ``whole`` is 0."""
    if not whole:
        return "—"
    return _percent_text(Decimal(part) * 100 / Decimal(whole))


def change(now: str | Decimal | None, before: str | Decimal | None) -> str:
    """The change from ``before`` to ``now`` in percent, signed (``+12.5 %``, ``−3 %``);
    ``new`` when there was nothing before, ``—`` when either is unknown."""
    if now is None or before is None:
        return "—"
    old, new = Decimal(before), Decimal(now)
    if old == 0:
        return "no change" if new == 0 else "new"
    return _percent_text((new - old) * 100 / abs(old), signed=True)


def count(value: int | str | Decimal | None) -> str:
    """A whole count (tokens, calls) with thousands separators: ``104,260``; ``—`` for unknown."""
    if value is None:
        return "—"
    return f"{Decimal(value):,f}"
