"""Metered streams for Python gateways: relay an upstream stream and post its billing events.

Typical use in a FastAPI / Starlette gateway (asyncio)::

    billing = AsyncBillingClient(BILLING_URL, token=BILLING_TOKEN)
    meters = Meters(billing)                      # drains after disconnects by default

    upstream = await http.send(http.build_request("POST", url, json=body), stream=True)
    meter = meters.call(api_key_id=key_id, model=body["model"],
                        protocol="openai.chat_completions",
                        client_request_id=request.headers.get("x-request-id"))
    return meter.response(upstream)

The call's id is the gateway's own (``meter.request_id``: ``gw-`` and 32 hex digits, unless
the gateway's code passes ``request_id=``), never a header the client chose: a reused one would
make several generations one billed call. The client's ``X-Request-Id`` is only the call's
metadata ``client_request_id``; the response's ``X-Request-Id`` is the call's id.

(or ``StreamingResponse(meter.relay(upstream))``, the generator form), and in a sync gateway,
``meter.relay_sync(response)`` with a :class:`billing.client.BillingClient`. The meter reads
tokens with the protocol's tap (:mod:`billing.taps`) and sends the call's lifecycle events
(CONTRACT.md, "Events") through the client; see :meth:`Meter.relay`.

With ``Meters(billing, authorize=True)``, ``meter.response(lambda: http.send(request,
stream=True))`` reserves the call's estimate first and opens the upstream only when allowed.

Modules: ``meters.py`` (:class:`Meters`, the lifespan and shutdown), ``meter.py`` (one call's
:class:`Meter`: the response's attempts, both relays, the non-streaming response),
``authorize.py`` (the reservation before the upstream), ``response.py`` (the ASGI response),
``account.py`` (one call's counts and events, sans-IO), ``pump.py`` (the asyncio reader task
and its hand-off to the client: a queue to the relay, or the response's ``send``; it drains
after a disconnect), ``drain.py`` (the drain decision, bounds, the sync drain thread),
``policy.py`` (:class:`DrainPolicy`), ``slots.py`` (the bound on concurrent drains),
``upstream.py`` (the byte streams accepted), ``headers.py`` and ``hidden.py`` (what of the
upstream's head and usage chunk the client gets).
"""

from __future__ import annotations

from billing.gateway.meter import Meter
from billing.gateway.meters import Meters
from billing.gateway.policy import DRAIN_SKIPPED, DrainPolicy

__all__ = ["DRAIN_SKIPPED", "DrainPolicy", "Meter", "Meters"]
