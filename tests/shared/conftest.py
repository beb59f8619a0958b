"""The ``make`` fixture: every prefix index test body runs against both backends."""

from __future__ import annotations

import uuid

import pytest

from shared.index import MemoryIndex, RedisIndex


@pytest.fixture(params=["memory", "redis"])
def make(request):
    """A factory of fresh indexes of one backend; Redis ones share a per-test cluster."""
    if request.param == "memory":
        return lambda gc_chunk=None, **kw: MemoryIndex(**kw)  # gc_chunk: a Redis-only knob
    server = request.getfixturevalue("redis_server")
    cluster = f"t{uuid.uuid4().hex[:12]}"
    return lambda **kw: RedisIndex(server.url, cluster=cluster, **kw)
