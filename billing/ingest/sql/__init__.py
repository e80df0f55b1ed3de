"""Ingest's SQL: the columns both databases write (``common``), then each database's
statements."""
