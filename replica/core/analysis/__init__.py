"""What the cache saw: reuse distances, SHARDS, the LRU stack, shadow replays."""
