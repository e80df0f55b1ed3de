"""Drift (CONTRACT "Provider reports and drift"): our calls against the providers' reports, per
day or hour, model, upstream account and tier (``service``; ours' SQL behind ``repository``)."""
