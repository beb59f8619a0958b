"""Compute backends of a replica. The emulated one is the cost model (no code here); ``torch``
runs the model's real layer stack over a real paged KV tensor (needs ``kvemu[torch]``)."""
