"""Reconciliation: the billing rule, settling calls, and the append-only ledger."""
