"""The sans-IO account of one metered call: its attempts' taps, counts and lifecycle events.

Every form of the metered stream (:mod:`billing.gateway.meter`: the response, both relays)
drives it; it decides which events to send (CONTRACT.md, "Events") and sends them through the
billing client's ``send`` (never blocking on the network). Counts are output tokens, by the
protocol's tap (:mod:`billing.taps`): the provider's running or final count when the stream
carries one, else one per content delta.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from billing.fields import printable_text
from billing.gateway.policy import DRAIN_SKIPPED
from billing.taps import Tap, open_tap

#: ``stream.failed``'s ``error_type`` for a stream the gateway's own shutdown cut (the server
#: cancelled the response, or :meth:`billing.gateway.Meters.shutdown` gave the upstream up).
GATEWAY_SHUTDOWN = "gateway_shutdown"

__all__ = ["CallAccount"]

Send = Callable[[Mapping[str, Any]], object]

#: Events the billing client refused (at WARNING: visible with no logging configured).
log = logging.getLogger("billing.gateway")


class CallAccount:
    """The events of one call, one attempt at a time.

    ``send`` takes a contract event without ``event_id`` / ``occurred_at`` (the billing client
    fills them); an event it refuses (a closed client raises) is logged at WARNING and the
    stream goes on. Every method is cheap and safe to call once per chunk.
    """

    def __init__(
        self,
        send: Send,
        *,
        request_id: str,
        api_key_id: str,
        model: str,
        protocol: str,
        input_tokens: int | None,
        metadata: Mapping[str, str],
        progress_every: int,
    ) -> None:
        open_tap(protocol)  # ValueError now, for an unknown protocol
        self._send = send
        self.request_id = request_id
        self.api_key_id = api_key_id
        self.model = model
        self.protocol = protocol
        self.input_tokens = input_tokens
        self.metadata = dict(metadata)
        self.progress_every = progress_every
        self.attempt = 0
        self.tap: Tap = open_tap(protocol)
        self.delivered = 0  # output tokens handed to the client, this attempt
        self.bytes_relayed = 0  # bytes handed to the client, all attempts
        self.disconnected = False
        #: the gateway's shutdown cut the client's stream (not the client): the attempt ends
        #: in ``stream.failed`` ``gateway_shutdown``, no ``stream.client_disconnected``
        self.shut_down = False
        self.settled = False  # the attempt's closing events are sent
        self.next_progress = progress_every

    def _event(self, kind: str, payload: Mapping[str, Any]) -> None:
        try:
            self._send(
                {"request_id": self.request_id, "attempt": self.attempt, "type": kind, **payload}
            )
        except Exception as error:  # e.g. the billing client is closed: the stream goes on
            log.warning("%s of call %s not sent: %r", kind, self.request_id, error)

    def start_attempt(self) -> None:
        """A new upstream attempt: a fresh tap and its ``stream.started``."""
        self.attempt += 1
        self.tap = open_tap(self.protocol)
        self.delivered = 0
        self.settled = False
        self.next_progress = self.progress_every
        started: dict[str, Any] = {
            "api_key_id": self.api_key_id,
            "model": self.model,
            "protocol": self.protocol,
        }
        if self.input_tokens is not None:
            started["input_tokens"] = self.input_tokens
        if self.metadata:
            started["metadata"] = self.metadata
        self._event("stream.started", started)

    def whole(self, body: bytes) -> None:
        """A non-streaming response: one attempt whose whole body is ``body`` (the protocol's
        response object), read by the tap (:meth:`billing.taps.Tap.read_json`) and settled at
        once, delivered in full (CONTRACT "Non-streaming calls, hosted-tool fees,
        provider-reported cost": delivered = the output count)."""
        self.start_attempt()
        self.tap.read_json(body)
        self.bytes_relayed += len(body)
        self.settle()

    def fed(self) -> int:
        """After a chunk was fed to the tap: sends progress when due; returns generated tokens.

        The relays inline it (``tap.output_tokens``, then :meth:`progress` once
        ``next_progress`` is reached): it runs for every chunk."""
        generated = self.tap.output_tokens
        if generated >= self.next_progress:
            self.progress(generated)
        return generated

    def progress(self, generated: int) -> None:
        """A ``stream.tokens`` progress event at ``generated`` output tokens; the next one is
        due ``progress_every`` tokens later."""
        self.next_progress = generated + self.progress_every
        self._event(
            "stream.tokens",
            {"output_tokens_generated": generated, "output_tokens_delivered": self.delivered},
        )

    def client_left(self) -> None:
        """The client went away: ``stream.client_disconnected`` with the counts now (once)."""
        if self.disconnected:
            return
        self.disconnected = True
        self._event(
            "stream.client_disconnected",
            {
                "output_tokens_delivered": self.delivered,
                "output_tokens_generated": max(self.tap.output_tokens, self.delivered),
            },
        )

    def settle(
        self, *, skipped: bool = False, error_type: str | None = None, message: str | None = None
    ) -> None:
        """The attempt ended: its last counts, ``stream.usage`` and any ``stream.failed`` (once).

        ``skipped``: the upstream was cancelled after a disconnect, before its final usage
        (the usage then carries the anomaly ``drain_skipped``). ``error_type``: the attempt
        failed on the gateway's side (``stalled``, ``upstream_disconnect``,
        ``gateway_shutdown``, the last also when :attr:`shut_down`); an error the stream itself
        carried is reported by the tap.
        """
        if self.settled:
            return
        self.settled = True
        if error_type is None and self.shut_down:
            error_type, message = GATEWAY_SHUTDOWN, "the gateway shut down"
        tap = self.tap
        tap.close()
        generated = tap.output_tokens
        if not self.disconnected and error_type is None:
            self.delivered = max(self.delivered, generated)  # a normal end delivered it all
        self._event(
            "stream.tokens",
            {
                "output_tokens_generated": max(generated, self.delivered),
                "output_tokens_delivered": self.delivered,
            },
        )
        events = tap.final_events(fallback_input_tokens=self.input_tokens)
        usage = events[0]
        if skipped and usage.get("source") != "upstream":
            usage["anomalies"] = [DRAIN_SKIPPED]
        for event in events:
            kind = event.pop("type")
            self._event(kind, event)
        if error_type is not None and len(events) == 1:
            failed: dict[str, Any] = {
                "error_type": error_type,
                "output_tokens_generated": generated,
            }
            if message:
                failed["message"] = printable_text(message[:1000])
            self._event("stream.failed", failed)
