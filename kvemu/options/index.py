"""``--cluster``: the namespace of a shared Redis index's keys, the same on the router and every
replica of a cluster (``kvemu router``, ``kvemu replica``, and ``kvemu up``, which hands it to both).
``--index`` is not here: each command spells it its own way (``kvemu up`` turns its memory, redis
or URL into what the router and the replicas take)."""

from __future__ import annotations

from kvemu.options.option import Option

CLUSTER = Option("--cluster", "default", help="namespace of the Redis index keys (default: default)")
