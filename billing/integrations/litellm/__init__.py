"""A LiteLLM proxy callback that posts each call's billing events (CONTRACT.md "Events").

Name it in the proxy's config (LiteLLM imports ``module.instance`` from ``callbacks``)::

    litellm_settings:
      callbacks: billing.integrations.litellm.handler

and give it the service's address and an ``ingest`` token in the proxy's environment:
``BILLING_URL`` (default ``http://127.0.0.1:8000``) and ``BILLING_TOKEN``. The drain after a
disconnect is on by default; ``BILLING_DRAIN=off`` turns it off, ``BILLING_DRAIN_MAX_S``,
``BILLING_DRAIN_MAX_TOKENS`` and ``BILLING_DRAIN_MAX_CONCURRENT`` bound it
(:class:`billing.gateway.DrainPolicy`). ``BILLING_SPOOL=off`` turns the client's spool off.
``BILLING_AUTHORIZE=on`` reserves each call against the budgets in the pre-call hook and refuses
a call over budget with the proxy's budget-exceeded error (``BILLING_FAIL_OPEN``: what to do
when the service cannot decide; :mod:`~billing.integrations.litellm.holds`).

What each of LiteLLM's hooks sends, for a streamed ``/v1/chat/completions`` call (``request_id``
= an id of the callback's own, ``llm-`` and 32 hex digits, minted in ``async_pre_call_hook``
and carried to the later hooks in the request's LiteLLM metadata, never LiteLLM's
``litellm_call_id``: a client sets that one with the ``x-litellm-call-id`` header, and one id
sent with several requests would make them one call billed once; LiteLLM's id is the call's
metadata ``litellm_call_id``, :mod:`~billing.integrations.litellm.calls`; ``api_key_id`` = the
virtual key's alias, else its hash, else ``default_api_key_id``; ``model`` = the model name the
client asked for, as prices are named):

* ``async_post_call_streaming_iterator_hook`` (it wraps the stream LiteLLM relays):
  ``stream.started`` when the stream opens (with the gateway's input count: LiteLLM's
  ``token_counter`` over the messages, its bundled tokenizer) and ``stream.client_disconnected``
  when the client leaves (``GeneratorExit`` / ``CancelledError`` at a chunk), with the output
  tokens handed to the client and those received from the upstream so far. The upstream is read
  by a task of its own, not by the client's generator, so that a disconnect does not cancel it:
  the task drains the upstream to its final usage chunk (the provider's count, what it bills)
  and sends that ``stream.usage`` (``source: upstream``). Past a bound of the drain policy, or
  with the drain off, the upstream is cancelled and the attempt settles on the tokens received
  by then (``source: estimate``, anomaly ``drain_skipped``).
* ``async_log_success_event``: ``stream.tokens`` (delivered = generated = the output: a
  stream that ended normally delivered everything) and ``stream.usage`` of a call that was not
  cut short, from the usage
  LiteLLM logs: ``source: upstream`` when the upstream sent its usage (LiteLLM asks for it with
  ``stream_options.include_usage``), ``estimate`` when LiteLLM had to count. For a call the
  client left, LiteLLM logs its own count of the cut stream: that one is not sent (the drain
  reports). A call that was not streamed (no iterator) gets its ``stream.started`` here too.
* ``async_log_failure_event``: ``stream.failed`` (``error_type`` from LiteLLM's exception:
  ``stalled`` for a timeout, ``upstream_disconnect`` for a connection error (LiteLLM reports it
  as a 500 caused by one), ``overloaded_error`` for 429/503/529, else ``api_error``), after a
  ``stream.started`` if none was sent.

Token counts inside the stream (delivered, and received without usage) are counted per chunk
with LiteLLM's bundled ``cl100k_base`` tokenizer, so they are estimates; billed output comes
from the provider's usage whenever the drain reaches it.

The package: the hooks (:mod:`~billing.integrations.litellm.callback`), the calls followed
(:mod:`~billing.integrations.litellm.calls`), the events sent
(:mod:`~billing.integrations.litellm.sender`), the pump and the drain
(:mod:`~billing.integrations.litellm.stream`), what is read off LiteLLM's objects
(:mod:`~billing.integrations.litellm.reading`), the authorizations
(:mod:`~billing.integrations.litellm.holds`) and the settings
(:mod:`~billing.integrations.litellm.settings`).

``async_post_call_response_headers_hook`` names the call's id to the client in the proxy's
answer (header ``x-billing-request-id``, streamed or not, a failure too).

A call that never went through the pre-call hook (LiteLLM used as a library, through
``litellm.callbacks``) gets its own id at its first logging hook; the iterator hook relays such a
stream untouched, and the success hook bills it.

Not covered: LiteLLM retries inside one call (router ``num_retries``, fallbacks) are one
attempt here; the iterator hook runs for ``/v1/chat/completions`` (LiteLLM's documented scope
of that hook), so other routes are billed from the success hook only (no delivered count, no
disconnect).
"""

from __future__ import annotations

from billing.integrations.litellm.callback import BillingCallback

# The readers, also under the private names by which tests/integrations imports them.
from billing.integrations.litellm.calls import protocol_of as _protocol  # noqa: F401
from billing.integrations.litellm.reading import chunk_tokens as _chunk_tokens  # noqa: F401
from billing.integrations.litellm.reading import error_type as _error_type  # noqa: F401
from billing.integrations.litellm.settings import policy_from_env

__all__ = ["BillingCallback", "handler", "policy_from_env"]

#: The instance a proxy config names: ``callbacks: billing.integrations.litellm.handler``.
handler = BillingCallback()
