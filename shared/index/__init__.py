"""Global prefix index: which replica holds which prefix of block hashes.

``make_index("memory")`` for one process, ``make_index("redis://host:port/db?cluster=name")``
for routers on several processes or hosts.  Contract and rules: ``shared.index.base``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from shared.errors import InputError
from shared.index.base import (
    KINDS,
    ApplyResult,
    EventBatch,
    IndexEvent,
    IndexUnavailable,
    PrefixIndex,
    ReplicaIndexState,
    StoreScope,
)
from shared.index.memory import MemoryIndex

if TYPE_CHECKING:
    from shared.index.redis_index import RedisIndex

__all__ = [
    "KINDS", "ApplyResult", "EventBatch", "IndexEvent", "IndexUnavailable", "MemoryIndex",
    "PrefixIndex", "RedisIndex", "ReplicaIndexState", "StoreScope", "make_index",
]

_INT_OPTIONS = ("max_entries", "max_replicas")


def __getattr__(name: str) -> Any:
    """``RedisIndex`` on first use: the redis client takes a tenth of a second to import, and the
    simulator and most commands never reach Redis."""
    if name == "RedisIndex":
        from shared.index.redis_index import RedisIndex

        return RedisIndex
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_index(spec: str, **kwargs: Any) -> PrefixIndex:
    """Build an index from ``memory[?max_entries=N]`` or
    ``redis://host:port/db[?cluster=name&max_entries=N&max_replicas=N]``.

    Keyword arguments are passed to the backend; options in the spec override them.
    """
    if not isinstance(spec, str):
        raise InputError("index", f"expected a string, got {type(spec).__name__}")
    parts = urlsplit(spec)
    try:
        if parts.scheme in ("redis", "rediss", "unix"):
            options = _options(parts.query, ("cluster", *_INT_OPTIONS))
            url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", parts.fragment))
            from shared.index.redis_index import RedisIndex

            return RedisIndex(url, **{**kwargs, **options})
        if spec.split("?", 1)[0] == "memory":
            return MemoryIndex(**{**kwargs, **_options(spec.partition("?")[2], _INT_OPTIONS)})
    except InputError as e:
        raise InputError("index", f"{e.field}: {e.message}") from None
    raise InputError("index", f"expected 'memory' or 'redis://host:port/db[?cluster=name]', got {spec!r}")


def _options(query: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in allowed:
            raise InputError(key, f"unknown option; valid: {', '.join(allowed)}")
        if key in _INT_OPTIONS:
            if not value.isdigit():
                raise InputError(key, f"must be a positive integer, got {value!r}")
            out[key] = int(value)
        else:
            out[key] = value
    return out
