"""Ingest: validating lifecycle events and storing them exactly once."""
