"""The settings of kvemu's vLLM KV-event publisher (``--kv-events-config``): vLLM's
``KVEventsConfig`` keys with vLLM's meanings, and three of kvemu's (``event_encoding``,
``hash_algo``, ``hash_seed``). The publisher itself is ``replica.vllm_events``; these settings live
here, below it, so the command-line vocabulary can validate the flag without importing a process."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from shared import vllm_hashing
from shared.errors import InputError

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
ENCODINGS = ("map", "array")


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None  # vLLM: "zmq" when enabled, "null" otherwise
    endpoint: str | None = None  # None: bind DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    event_encoding: str = "map"
    hash_algo: str = vllm_hashing.DEFAULT_HASH_ALGO
    hash_seed: str = vllm_hashing.DEFAULT_SEED

    def __post_init__(self) -> None:
        field = "--kv-events-config"
        if self.enable_kv_cache_events is not True:
            raise InputError(field, "enable_kv_cache_events is not true, so nothing would be published;"
                                    " set it to true or leave the flag out")
        if self.publisher not in (None, "zmq"):
            raise InputError(field, f"publisher {self.publisher!r} publishes nothing here; kvemu publishes with \"zmq\"")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "://" not in value):
                raise InputError(field, f"{name} must be a ZMQ address such as tcp://127.0.0.1:5557, got {value!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
                raise InputError(field, f"{name} must be an integer 1-10000000, got {value!r}")
        if not isinstance(self.topic, str) or len(self.topic) > 256:
            raise InputError(field, f"topic must be a string of at most 256 characters, got {self.topic!r:.60}")
        if self.event_encoding not in ENCODINGS:
            raise InputError(field, f"event_encoding must be one of {', '.join(ENCODINGS)}, got {self.event_encoding!r}")
        if self.hash_algo not in vllm_hashing.HASH_ALGOS:
            raise InputError(field, f"hash_algo must be one of {', '.join(vllm_hashing.HASH_ALGOS)},"
                                    f" got {self.hash_algo!r}")
        if not isinstance(self.hash_seed, str) or len(self.hash_seed) > 256:
            raise InputError(field, "hash_seed must be a string of at most 256 characters")

    @classmethod
    def parse(cls, text: str) -> KvEventsConfig:
        """The flag's JSON object; unknown keys and wrong types are one-line errors naming them."""
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError("--kv-events-config", f"is not JSON ({str(exc)[:80]}); give an object such as"
                                                   " '{\"enable_kv_cache_events\": true}'") from None
        if not isinstance(obj, dict):
            raise InputError("--kv-events-config", f"must be a JSON object, got {type(obj).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise InputError("--kv-events-config", f"unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**obj)

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)
                           if getattr(self, f.name) != f.default or f.name == "enable_kv_cache_events"})

    def for_rank(self, rank: int) -> KvEventsConfig:
        """This config for replica ``rank`` of a cluster: tcp ports offset by the rank (vLLM's rule for DP ranks)."""
        import dataclasses

        return dataclasses.replace(self, endpoint=offset_port(self.endpoint or DEFAULT_ENDPOINT, rank),
                                   replay_endpoint=offset_port(self.replay_endpoint, rank))


def offset_port(endpoint: str | None, rank: int) -> str | None:
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("inproc://") or endpoint.startswith("ipc://"):
        return f"{endpoint}_dp{rank}"
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        raise InputError("--kv-events-config", f"cannot offset the port of {endpoint!r} for replica {rank}")
    return f"{base}:{int(port) + rank}"
