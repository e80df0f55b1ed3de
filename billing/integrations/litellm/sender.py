"""The events the LiteLLM callback sends for a call (CONTRACT "Events"), through one
:class:`billing.client.BillingClient`: a thread, since LiteLLM may run its logging hooks outside
the loop that serves the stream."""

from __future__ import annotations

import atexit
from typing import Any

from billing.client import BillingClient
from billing.gateway.policy import DRAIN_SKIPPED, DrainPolicy
from billing.integrations.litellm.calls import Call, litellm_call_metadata
from billing.integrations.litellm.reading import usage_fields
from billing.integrations.litellm.settings import client_from_env

__all__ = ["Sender"]


class Sender:
    """Sends a call's events, each with its ``request_id`` and ``type`` (the client adds the
    envelope's other fields).

    Args:
        client: the billing client; by default one is made at the first event
            (:func:`billing.integrations.litellm.settings.client_from_env`) and closed at the
            process's exit.
        policy: the drain policy, recorded in each ``stream.started``'s metadata.
    """

    def __init__(self, client: BillingClient | None, policy: DrainPolicy) -> None:
        self._client = client
        self._policy = policy

    @property
    def client(self) -> BillingClient:
        """The billing client (made from the environment at first use)."""
        if self._client is None:
            self._client = client_from_env()
            # LiteLLM has no shutdown hook for callbacks: at the proxy's exit, deliver what is
            # queued (10 s at most), the rest goes to the spool.
            atexit.register(self._client.close, 10.0)
        return self._client

    def send(self, call: Call, kind: str, fields: dict[str, Any]) -> None:
        """One event of type ``kind`` for ``call`` with ``fields``."""
        self.client.send({"request_id": call.request_id, "type": kind, **fields})

    def started(self, call: Call, input_tokens: int | None) -> None:
        """``stream.started``, with the gateway's input count (tokens) when it has one, and
        LiteLLM's ``litellm_call_id`` in the metadata."""
        metadata = {
            "billing.gateway": "litellm",
            **self._policy.metadata(),
            **litellm_call_metadata(call.litellm_call_id),
        }
        fields: dict[str, Any] = {
            "api_key_id": call.api_key_id,
            "model": call.model,
            "protocol": call.protocol,
            "metadata": metadata,
        }
        if input_tokens is not None:
            fields["input_tokens"] = input_tokens
        call.started = True
        self.send(call, "stream.started", fields)

    def usage(self, call: Call, usage: Any, source: str, stop_reason: str | None = None) -> None:
        """``stream.usage`` from an OpenAI-shaped usage
        (:func:`billing.integrations.litellm.reading.usage_fields`); ``stop_reason`` is cut to
        64 characters."""
        fields: dict[str, Any] = {"source": source, **usage_fields(usage)}
        if stop_reason:
            fields["stop_reason"] = stop_reason[:64]
        self.send(call, "stream.usage", fields)
        call.usage_sent = True

    def whole(self, call: Call, fields: dict[str, Any]) -> None:
        """``stream.tokens`` (delivered = generated = the output) and ``stream.usage`` of a
        non-streamed call, its fields read whole (:func:`~billing.integrations.litellm.reading.
        whole_usage`)."""
        output = fields["output_tokens"]
        self.send(
            call,
            "stream.tokens",
            {"output_tokens_generated": output, "output_tokens_delivered": output},
        )
        self.send(call, "stream.usage", fields)
        call.usage_sent = True

    def estimate(self, call: Call, skipped: bool) -> None:
        """``stream.usage`` (``estimate``) of the output tokens received, flagged
        ``drain_skipped`` when the drain was cut short or not run."""
        fields: dict[str, Any] = {"source": "estimate", "output_tokens": call.received}
        if skipped:
            fields["anomalies"] = [DRAIN_SKIPPED]
        self.send(call, "stream.usage", fields)
        call.usage_sent = True
