"""The pure cache core of one emulated GPU, synchronous and free of I/O.

* ``cache``: the block pool (residency, pins, events, hit modes), its eviction policies, the
  hit / CSR metrics and the per-depth recompute costs they share;
* ``sched``: the continuous-batching scheduler, its request and step records, decode KV;
* ``tiers``: the memory hierarchy below HBM;
* ``analysis``: reuse distances, SHARDS, the exact LRU stack, the adaptive policy's shadow replays;
* ``compiled``: the C twins of the pool and the LRU stack, and what loads them;
* ``build``: the one builder (``build_core``) the live replica and the simulator share.
"""
