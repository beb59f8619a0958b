"""The block pool, its eviction policies, and the metrics and costs they share."""
