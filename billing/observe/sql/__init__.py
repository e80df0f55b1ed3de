"""The observability room's SQL: the same statements on both databases (``common.py``)."""
