"""Workload presets: each is a frozen dataclass of parameters with a ``plan(rng, duration_s)``
method returning a :class:`~loadgen.presets.common.SessionBatch`.  ``loadgen.workloads``
turns a batch into a trace; it is the public entry point."""
