"""The finance exports' SQL: the columns both databases read (``common``), then each
database's statements."""
