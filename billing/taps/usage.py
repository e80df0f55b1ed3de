"""What a tap reports, in the contract's token semantics (CONTRACT.md, "Token semantics"), one
for all protocols, every count in tokens:

* ``input_tokens`` is input billed at the full input rate: it EXCLUDES cache reads and cache
  writes;
* ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` are the cache reads / writes;
* ``output_tokens`` is all billed output, INCLUDING reasoning;
* ``reasoning_tokens`` is the part of ``output_tokens`` spent on reasoning, for information.

The field names are the ``stream.usage`` token fields (``billing.dimensions.USAGE_FIELDS``);
each tap translates its provider's fields into them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from billing.dimensions import USAGE_FIELDS

__all__ = ["InputUsage", "Usage"]


def _counts(usage: object, names: Iterable[str]) -> dict[str, int]:
    return {name: getattr(usage, name) for name in names}


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage of one attempt in the contract's token semantics (all counts in tokens, >= 0).

    ``input_tokens`` excludes cache reads and writes; ``output_tokens`` includes reasoning;
    ``reasoning_tokens`` is a subset of ``output_tokens``.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a dict keyed by the ``stream.usage`` fields, in ``USAGE_FIELDS`` order."""
        return _counts(self, USAGE_FIELDS)


@dataclass(frozen=True, slots=True)
class InputUsage:
    """The input side of a usage report (tokens), as far as the stream has reported it.

    Anthropic reports it in ``message_start`` before any output; OpenAI only with the final
    usage. Same semantics as :class:`Usage`: the three counts are disjoint.
    """

    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """The three counts as a dict keyed by the ``stream.usage`` fields."""
        return _counts(self, _INPUT_FIELDS)


_INPUT_FIELDS = tuple(f.name for f in fields(InputUsage))
#: The ``stream.usage`` token fields in the order a tap's payload lists them.
PAYLOAD_FIELDS = tuple(f.name for f in fields(Usage))
