"""Observability (CONTRACT "Observability and standard exports (v3)"): the ledger's totals that
``/metrics`` exposes, read from the rollups at scrape time (``collector.py``)."""
