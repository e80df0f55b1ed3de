"""SVG geometry for the console's charts, computed on the server (no chart library, no script).

Values arrive as the exact strings or integers the API answers; geometry is computed with
``Decimal`` (never float) and written with two decimals. Each bar keeps its exact value for the
bar's ``<title>`` and for the table under the chart, so what a chart says is what ``/v1/usage``
says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from billing.console.people import count, usd

_PLACES = Decimal("0.01")
#: Plot area of a usage chart, in SVG user units (the SVG scales to its box).
WIDTH = Decimal(1000)
HEIGHT = Decimal(220)
#: Room on the left for the axis labels and below for the period labels.
LEFT = Decimal(90)
BOTTOM = Decimal(40)
TOP = Decimal(10)
#: At most this many period labels under the bars (every n-th period is labelled).
MAX_LABELS = 12


def _n(value: Decimal) -> str:
    return str(value.quantize(_PLACES))


@dataclass(frozen=True)
class Bar:
    """One bar: its box (SVG numbers as text), period label, series (name and index) and exact
    value."""

    x: str
    y: str
    width: str
    height: str
    period: str
    series: str
    value: str
    index: int


@dataclass(frozen=True)
class Tick:
    """A label under the bars at ``x``."""

    x: str
    text: str


@dataclass(frozen=True)
class Chart:
    """A grouped bar chart: bars, the value at the top of the axis (as its label says it to
    people, and exact), period labels, series."""

    title: str
    bars: list[Bar]
    axis_max: str
    axis_exact: str
    ticks: list[Tick]
    series: list[str]
    missing: list[str]
    width: str = _n(LEFT + WIDTH)
    height: str = _n(TOP + HEIGHT + BOTTOM)
    left: str = _n(LEFT)
    top: str = _n(TOP)
    base: str = _n(TOP + HEIGHT)


def bar_chart(
    title: str,
    periods: Sequence[str],
    series: Sequence[tuple[str, Mapping[str, str | int | None]]],
    short: Callable[[str], str] = str,
    say: Callable[[Decimal], str] | None = None,
) -> Chart:
    """A chart of ``series`` (name, value by period: an exact decimal string, an int, or None for
    unknown) over the time axis ``periods`` (every period, in order, labelled under the bars by
    ``short(period)``); the axis runs from 0 to the largest value, labelled ``say(value)``
    (by default ``billing.console.people``'s ``usd`` when every series is an amount, a ``*_usd``
    field, else ``count``: ``$4,100.00``, ``104,260``; never ``1.0426E+5``). A period a
    series has no value for (no usage) has no bar; an unknown value has none either and is
    listed in ``missing`` as "period (series)"."""
    top = max(
        (Decimal(v) for _, by_period in series for v in by_period.values() if v is not None),
        default=Decimal(0),
    )
    scale = HEIGHT / top if top > 0 else Decimal(0)
    slot = WIDTH / max(len(periods), 1)
    gap = slot / 10 if len(periods) > 1 else Decimal(0)
    bar_width = (slot - gap) / max(len(series), 1)
    bars: list[Bar] = []
    missing: list[str] = []
    for p, period in enumerate(periods):
        for s, (name, by_period) in enumerate(series):
            if period not in by_period:
                continue
            raw = by_period[period]
            if raw is None:
                missing.append(f"{period} ({name})")
                continue
            height = max(Decimal(raw), Decimal(0)) * scale
            bars.append(
                Bar(
                    x=_n(LEFT + slot * p + gap / 2 + bar_width * s),
                    y=_n(TOP + HEIGHT - height),
                    width=_n(bar_width),
                    height=_n(height),
                    period=period,
                    series=name,
                    value=str(raw),
                    index=s,
                )
            )
    every = max(1, -(-len(periods) // MAX_LABELS))
    ticks = [
        Tick(_n(LEFT + slot * p + slot / 2), short(period))
        for p, period in enumerate(periods)
        if p % every == 0
    ]
    return Chart(
        title=title,
        bars=bars,
        axis_max=(say or _say_for(series))(top),
        axis_exact=f"{top.normalize():f}" if top else "0",
        ticks=ticks,
        series=[name for name, _ in series],
        missing=missing,
    )


def _say_for(series: Sequence[tuple[str, object]]) -> Callable[[Decimal], str]:
    """Dollars for a chart of amounts (``cost_usd``, ``charge_usd``), else a count."""
    return usd if series and all(name.endswith("_usd") for name, _ in series) else count


@dataclass(frozen=True)
class Segment:
    """A part of the output bar: its share of the width in percent of the SVG, and its count."""

    name: str
    tokens: int
    x: str
    width: str


def output_bar(delivered: int, undelivered: int) -> list[Segment]:
    """The Call page's bar of billed output: delivered then undelivered, widths in percent of
    the bar (``delivered + undelivered`` is the whole; an empty bar for a call with none)."""
    whole = delivered + undelivered
    if whole <= 0:
        return []
    share = Decimal(100) * delivered / whole
    return [
        Segment("delivered", delivered, "0", _n(share)),
        Segment("undelivered", undelivered, _n(share), _n(Decimal(100) - share)),
    ]
