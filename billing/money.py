"""Exact money: prices in micro-USD per million tokens, costs in picodollars, shown as decimals.

Source: CONTRACT "Cost". A price has at most 6 decimal places (USD per million tokens), so a price
in micro-USD per million tokens is an integer, and it is also the price of one token in
picodollars (1e-12 USD). ``tokens × price`` is then an exact integer cost in picodollars: no
rounding anywhere, and sums in SQL stay exact on SQLite too.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

PICO = Decimal(10) ** 12
MICRO = Decimal(10) ** 6
#: The highest price accepted, USD per million tokens.
#: The largest amount stored (a BIGINT of picodollars: about 9.2 million USD). A line or call
#: whose exact cost or charge is larger has none (``unpriced``): it cannot be booked, and a
#: call must never stay pending for it.
MAX_PUSD = 2**63 - 1

MAX_PRICE_USD_PER_MTOK = Decimal(100_000)
#: The most decimal places a price may be written with (CONTRACT "Cost"), trailing zeros too.
MAX_PRICE_DECIMALS = 6


#: A plain decimal: digits with an optional fraction ("0.30", "15", "0.000001").
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_price(value: object) -> int:
    """A price in USD per million tokens (a decimal string, or an integer) → micro-USD per Mtok.

    Raises ``ValueError`` with a sentence for floats, non-numbers, negatives, more than 6 decimal
    places, or more than ``MAX_PRICE_USD_PER_MTOK``.
    """
    if isinstance(value, float):
        raise ValueError('must be a decimal string such as "0.30" (binary floats are not exact)')
    if isinstance(value, bool):
        raise ValueError('must be a decimal string such as "0.30", not true or false')
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError('must be a decimal string such as "0.30"')
    if value.startswith("-") and _DECIMAL.fullmatch(value[1:]):
        raise ValueError("must not be negative")
    # Only plain digits with an optional fraction: Python's Decimal would also read " 1", "1_000",
    # "1e3" and "+1", which a price list must not contain by accident.
    if not _DECIMAL.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a plain decimal number; send digits with an optional fraction "
            'such as "0.30"'
        )
    # Counted in the text: Decimal() rounds to 28 digits, so "1.0000000000000000000000000001"
    # would read as 1 and pass.
    if len(value.partition(".")[2]) > MAX_PRICE_DECIMALS:
        raise ValueError(f"has more than {MAX_PRICE_DECIMALS} decimal places")
    try:
        amount = Decimal(value)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        raise ValueError(f'{value!r} is not a decimal number; send one such as "0.30"') from None
    if amount > MAX_PRICE_USD_PER_MTOK:
        raise ValueError(f"must be at most {MAX_PRICE_USD_PER_MTOK} USD per million tokens")
    micro = amount * MICRO
    if micro != micro.to_integral_value():
        raise ValueError("has more than 6 decimal places")
    return int(micro)


#: The most decimal places an amount in USD may be written with: a picodollar, the unit costs
#: are kept in.
MAX_USD_DECIMALS = 12


def parse_usd(value: object) -> str:
    """An amount in USD sent as a decimal string ("0.0042") → its canonical text
    (``format_usd``: "0.1" for "0.10"), exact to the picodollar.

    Raises ``ValueError`` with a sentence for numbers (a JSON float is not exact), anything but
    plain digits with an optional fraction, a negative amount, more than ``MAX_USD_DECIMALS``
    decimal places, or more than ``MAX_PUSD`` picodollars."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(
            'must be a decimal string such as "0.0042" (a JSON number may not be exact)'
        )
    if value.startswith("-") and _DECIMAL.fullmatch(value[1:]):
        raise ValueError("must not be negative")
    if not _DECIMAL.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a plain decimal number; send digits with an optional fraction "
            'such as "0.0042"'
        )
    if len(value.partition(".")[2]) > MAX_USD_DECIMALS:
        raise ValueError(
            f"has more than {MAX_USD_DECIMALS} decimal places (amounts are exact to the "
            "picodollar, 0.000000000001 USD)"
        )
    amount = Decimal(value)
    if amount * PICO > MAX_PUSD:
        raise ValueError(f"must be at most {format_usd(pusd_to_decimal(MAX_PUSD))} USD")
    return format_usd(amount)


def usd_to_pusd(text: str) -> int:
    """An amount in USD as ``parse_usd`` accepts it → picodollars (exact)."""
    return int(Decimal(text) * PICO)


def format_usd(amount: Decimal) -> str:
    """A Decimal in plain positional form with trailing zeros removed: ``"0.0000075"``, ``"0"``.

    Never exponent notation (CONTRACT "Cost").
    """
    if amount == 0:
        return "0"
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def pusd_to_decimal(pusd: int) -> Decimal:
    """Picodollars (int) → USD as an exact Decimal."""
    return Decimal(pusd).scaleb(-12)


def pusd_to_str(pusd: int | None) -> str | None:
    """Picodollars → the contract's USD string (None stays None)."""
    return None if pusd is None else format_usd(pusd_to_decimal(pusd))


def uusd_per_mtok_to_str(micro: int | None) -> str | None:
    """A stored price (micro-USD per Mtok) → its USD-per-million-tokens string."""
    return None if micro is None else format_usd(Decimal(micro).scaleb(-6))
