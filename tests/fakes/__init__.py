"""Fake servers on 127.0.0.1 that tests run real clients and gateways against (no network)."""
