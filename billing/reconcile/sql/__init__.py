"""The reconciler's SQL: the reads and writes of a step (``common``, then each database's
``sqlite`` and ``postgres``) and the fast path's statements (``fastpath``, then each database's
``sqlite_fastpath`` and ``postgres_fastpath``)."""
