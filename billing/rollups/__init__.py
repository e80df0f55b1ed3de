"""Usage rollups: totals per UTC bucket on both bases, kept by the reconciler and read by
``GET /v1/usage`` (``service``: the logic; ``repository``: the Protocol of their SQL;
``buckets``: the UTC levels and the cover of a range)."""
