"""The prices' SQL: the same statements on both databases (``common``)."""
