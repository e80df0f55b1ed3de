"""Ready-made integrations of gateways that are not written against :mod:`billing.gateway`.

* :mod:`billing.integrations.litellm`: a LiteLLM proxy callback (``pip install
  'billing[litellm]'``), named in the proxy's config as
  ``litellm_settings: callbacks: billing.integrations.litellm.handler``.

Each integration posts the lifecycle events of CONTRACT.md "Events" through
:mod:`billing.client`, and is imported only by the gateway that names it (its third-party
package is an optional extra).
"""
