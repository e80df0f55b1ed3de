"""The call log's SQL: what both databases share (``common``), then each database's."""
