"""Code both router and replicas import: block hashing, cost model, wire protocol, prefix index."""

from shared.compiled_modules import install_finder

install_finder()  # before any compiled module (shared.costmodel, sim.simulator, ...) is imported
