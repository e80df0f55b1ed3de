"""Money and shares written for people (the Overview): ``$1,234.57``, ``$0.0115``, ``12.3 %``.

The exact figure stays in the page beside each one (a ``data-exact`` attribute or a ``title``),
as the API answers it; these only round for reading, from the exact ``Decimal``.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal


def usd(value: str | Decimal | None) -> str:
    """``$1,234.57``; under a dollar (not zero) to 4 significant digits (``$0.01153``), since
    an LLM call often costs less than a cent; ``—`` for unknown."""
    if value is None:
        return "—"
    amount = Decimal(value)
    sign = "−" if amount < 0 else ""
    amount = abs(amount)
    if amount == 0 or amount >= 1:
        return f"{sign}${amount.quantize(Decimal('0.01'), ROUND_HALF_EVEN):,}"
    digits = amount.adjusted()  # -2 for 0.0115
    shown = amount.quantize(Decimal(1).scaleb(digits - 3), ROUND_HALF_EVEN)
    return f"{sign}${shown.normalize():f}"


def share(part: int | Decimal, whole: int | Decimal) -> str:
    """``part / whole`` in percent with one decimal (``37.3 %``); ``—`` when ``whole`` is 0."""
    if not whole:
        return "—"
    value = (Decimal(part) * 100 / Decimal(whole)).quantize(Decimal("0.1"), ROUND_HALF_EVEN)
    return f"{value} %"


def change(now: str | Decimal | None, before: str | Decimal | None) -> str:
    """The change from ``before`` to ``now`` in percent, signed (``+12.5 %``, ``−3.0 %``);
    ``new`` when there was nothing before, ``—`` when either is unknown."""
    if now is None or before is None:
        return "—"
    old, new = Decimal(before), Decimal(now)
    if old == 0:
        return "no change" if new == 0 else "new"
    value = ((new - old) * 100 / abs(old)).quantize(Decimal("0.1"), ROUND_HALF_EVEN)
    return f"+{value} %" if value >= 0 else f"−{abs(value)} %"
