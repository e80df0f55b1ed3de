"""The SQL of keys and plans: the same statements on both databases (``common``)."""
