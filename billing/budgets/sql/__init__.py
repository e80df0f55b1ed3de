"""The budgets' SQL: versions, counters and alerts (both databases), then each database's
dialect (``sqlite``, ``postgres``)."""
