"""The rollups' SQL: what both databases share (``common``), then each database's."""
