"""Tap for OpenAI Responses streams (``POST /v1/responses``, ``stream: true``).

Rules, from the OpenAI API reference ("Streaming events" of the Responses API):

* every event's JSON has a ``type`` (``response.created``, ``response.output_text.delta``, …);
  the ``event:`` line may be missing, the JSON ``type`` decides; there is no ``[DONE]``;
* events ``response.created`` / ``in_progress`` / ``completed`` / ``incomplete`` / ``failed``
  carry the ``response`` object: its ``model``, its ``status`` (the stop reason once it is
  neither ``in_progress`` nor ``queued``: ``completed``, ``incomplete``, ``failed``,
  ``cancelled``) and, at the end, its ``usage``;
* ``response.usage``: ``input_tokens`` INCLUDES ``input_tokens_details.cached_tokens``, so
  ``input_tokens = input_tokens - cached_tokens``; ``output_tokens`` includes
  ``output_tokens_details.reasoning_tokens``. ``response.incomplete`` and ``response.failed``
  may carry a usage too: it is billed like any other;
* every ``response.*.delta`` event with a non-empty ``delta`` (output text, refusal,
  function-call arguments, reasoning text and summaries, …) counts as one estimated output
  token; ``response.audio.delta`` is left out, its ``transcript`` twin is counted;
* ``response.service_tier`` is the tier that served the response: ``response.created`` echoes
  the requested value (``auto``, left out), the terminal response says which tier served it;
* hosted tools are billed per call, one unit per output item (``response.output_item.added``
  / ``.done`` and the terminal response's ``output``, counted once per item id): a
  ``web_search_call`` is one ``web_search_requests`` when its ``action`` is a ``search``
  (``open_page`` and ``find_in_page`` are free); an item whose action is not known (the
  ``.added`` event, which carries none, or an item of the tool before actions existed) counts
  as the search it then was, until a later report of the item names its action; a
  ``file_search_call`` is one ``file_search_calls``;
* a non-streaming response (:meth:`Tap.read_json`) is the ``response`` object itself, read as
  the terminal event's; OpenRouter's ``usage.cost`` (USD) is ``provider_cost_usd``, read
  exactly from the JSON text;
* errors: an ``error`` event (``{"type": "error", "code", "message", "param"}``, or with a
  nested ``error`` object), and a ``failed`` response's ``response.error``.
"""

from __future__ import annotations

from typing import Any

from billing.taps.base import Tap
from billing.taps.fields import (
    MalformedEventError,
    as_dict,
    error_from_event,
    opt_str,
    opt_tier,
    opt_tokens,
)

__all__ = ["ResponsesTap"]

_NOT_STOPPED = frozenset({"in_progress", "queued"})
_TERMINAL_KINDS = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
    "response.cancelled": "cancelled",
}
_UNCOUNTED_DELTAS = frozenset({"response.audio.delta"})
#: Output item types billed per item, and the unit each one counts as.
_ITEM_UNITS = {"web_search_call": "web_search_requests", "file_search_call": "file_search_calls"}
#: The actions of an item that are billed (an item of another type has none: always billed).
_BILLED_ACTIONS: dict[str, frozenset[str | None]] = {
    "web_search_call": frozenset({"search", None}),
}
#: The output parts whose non-empty text is generated output (counted for an estimate).
_TEXT_PARTS = {"output_text": "text", "refusal": "refusal", "summary_text": "text"}


def _output_pieces(output: list[Any]) -> int:
    """The generated pieces of a whole response's ``output`` (one per non-empty text part,
    reasoning summary or function-call arguments), as a stream's deltas would count them."""
    pieces = 0
    for item in output:
        if not isinstance(item, dict):
            continue
        arguments = item.get("arguments")
        if isinstance(arguments, str) and arguments:
            pieces += 1
        for key in ("content", "summary"):
            parts = item.get(key)
            for part in parts if isinstance(parts, list) else ():
                kind = part.get("type") if isinstance(part, dict) else None
                field = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
                if field is not None and isinstance(part.get(field), str) and part[field]:
                    pieces += 1
    return pieces


class ResponsesTap(Tap):
    """Tap for ``openai.responses`` streams; see the module doc for the rules."""

    protocol = "openai.responses"

    def __init__(self) -> None:
        super().__init__()
        # unit -> the output items of it seen (by id) -> the latest action reported for each
        self._items: dict[str, dict[object, str | None]] = {}

    def _on_event(self, kind: str, sse_event: str | None, data: dict[str, Any]) -> None:
        response = data.get("response")
        if (
            kind == "error"
            or sse_event == "error"
            or (response is None and isinstance(data.get("error"), dict) and data["error"])
        ):
            self._set_error(error_from_event(data))
            return
        item = data.get("item")
        if kind.startswith("response.output_item.") and item is not None:
            self._on_item(as_dict(item, "item"), data.get("output_index"))
        if response is not None:
            self._on_response(kind, as_dict(response, "response"), ("response",))
        elif kind in _TERMINAL_KINDS:
            self._set_stop_reason(_TERMINAL_KINDS[kind])
            self._mark_malformed()  # a terminal event without its response object
        if (
            kind.startswith("response.")
            and kind.endswith(".delta")
            and kind not in _UNCOUNTED_DELTAS
            and isinstance(data.get("delta"), str | list | dict)
            and data["delta"]
        ):
            self._count_deltas(1)

    def _on_body(self, data: dict[str, Any]) -> None:
        if "output" not in data and "status" not in data and data.get("error"):
            self._set_error(error_from_event(data))  # an error body, not a response
            return
        output = data.get("output")
        if isinstance(output, list):
            self._count_deltas(_output_pieces(output))
        self._on_response("", data, ())

    def _on_response(self, kind: str, response: dict[str, Any], at: tuple[str, ...]) -> None:
        """Read a ``response`` object (at ``at`` in the event's JSON text)."""
        self._set_model(opt_str(response, "model"))
        self._set_service_tier(opt_tier(response))
        status = opt_str(response, "status") or _TERMINAL_KINDS.get(kind)
        if status is not None and status not in _NOT_STOPPED:
            self._set_stop_reason(status)
        output = response.get("output")
        if isinstance(output, list):
            for index, item in enumerate(output):
                if isinstance(item, dict):
                    self._on_item(item, index)
        usage = response.get("usage")
        if usage is not None:
            self._on_usage(as_dict(usage, "response.usage"), (*at, "usage", "cost"))
        if status == "failed":
            error = response.get("error")
            self._set_error(error if error else {"message": "response failed"})

    def _on_item(self, item: dict[str, Any], output_index: object) -> None:
        kind = item.get("type")
        unit = _ITEM_UNITS.get(kind) if isinstance(kind, str) else None
        if unit is None:
            return
        item_id = item.get("id")
        key: object = item_id if isinstance(item_id, str) and item_id else ("at", output_index)
        if key == ("at", None):
            raise MalformedEventError("an output item without id or output_index")
        action = item.get("action")
        named = action.get("type") if isinstance(action, dict) else None
        seen = self._items.setdefault(unit, {})
        if isinstance(named, str) or key not in seen:
            seen[key] = named if isinstance(named, str) else None
        billed = _BILLED_ACTIONS.get(str(kind))
        count = sum(1 for done in seen.values() if billed is None or done in billed)
        self._set_stream_unit(unit, count)

    def _on_usage(self, usage: dict[str, Any], cost_at: tuple[str, ...]) -> None:
        input_total = opt_tokens(usage, "input_tokens")
        output = opt_tokens(usage, "output_tokens")
        cached = cache_write = reasoning = None
        details = usage.get("input_tokens_details")
        if details is not None:
            details = as_dict(details, "input_tokens_details")
            cached = opt_tokens(details, "cached_tokens")
            cache_write = opt_tokens(details, "cache_write_tokens")
            if cache_write is None:
                cache_write = opt_tokens(details, "cache_creation_tokens")
        details = usage.get("output_tokens_details")
        if details is not None:
            reasoning = opt_tokens(as_dict(details, "output_tokens_details"), "reasoning_tokens")
        self._set_openai_usage(
            input_total,
            cached,
            cache_write,
            output,
            reasoning,
            cost_path=cost_at if usage.get("cost") is not None else None,
        )
