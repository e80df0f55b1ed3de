"""Archives of the raw events of closed months (CONTRACT "Replicas, failover and archives (v3)"):
``billing archive --before YYYY-MM`` moves them to Parquet, ``billing archive restore FILE``
puts them back."""
