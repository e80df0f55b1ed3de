"""Finance exports of the ledger as CSV (CONTRACT "Export").

``GET /v1/exports/usage.csv``, ``GET /v1/exports/calls.csv`` and ``billing export`` share one
generator, :func:`billing.export.service.export_chunks`, so the HTTP and command-line bytes are
the same for the same parameters. Columns and their order: :mod:`billing.export.columns`; cells,
quoting and formula neutralisation: :mod:`billing.export.csvwriter`; time buckets and their
labels (shared with ``GET /v1/usage``): :mod:`billing.calllog.buckets`; parameters:
:mod:`billing.export.params`.
"""
