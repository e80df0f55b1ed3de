"""Provider reports (CONTRACT "Provider reports and drift"): the providers' own usage and cost
pages, parsed (``schemas``), stored per bucket with their history (``service``, SQL behind
``repository``) and fetched from the providers' admin APIs (``pull``)."""
