"""The provider reports' SQL: what both databases share (``common``), then each database's."""
