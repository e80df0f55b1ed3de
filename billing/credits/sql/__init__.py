"""The SQL of prepaid credits (``billing.credits.repository``)."""
