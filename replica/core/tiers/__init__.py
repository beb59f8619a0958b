"""The KV memory hierarchy below HBM."""
