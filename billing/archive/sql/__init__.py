"""The archive's SQL: ``common`` (both databases), ``sqlite`` and ``postgres``."""
