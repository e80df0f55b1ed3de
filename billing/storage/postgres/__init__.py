"""The PostgreSQL store: every room's repository in PostgreSQL's dialect, one module per room, each
ending with its ``REPOSITORY`` (``billing.storage.store`` puts them together)."""
