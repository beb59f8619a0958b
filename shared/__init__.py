"""Code both router and replicas import: block hashing, cost model, wire protocol, prefix index."""
