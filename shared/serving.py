"""What both server processes (router, replica) share: binding, body limits, connection caps,
timeouts and the cluster token, as one frozen record each process's settings nest."""

from __future__ import annotations

from dataclasses import dataclass, fields

from shared.auth import check_bind
from shared.errors import InputError
from shared.http_server import ConnLimits
from shared.offload import OffloadSettings
from shared.validate import check_positive_int

_TIMEOUTS = ("header_timeout_s", "body_timeout_s", "write_timeout_s")
_POSITIVE = ("max_body_bytes", "max_prompt_tokens", "max_output_tokens", "offload_bytes", "large_bodies_per_client",
             "max_connections")


@dataclass(frozen=True, slots=True)
class ServingSettings:
    host: str = "127.0.0.1"  # loopback only unless given (beyond it the cluster token is required)
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_tokens: int = 1_048_576
    max_output_tokens: int = 65_536
    parse_workers: int = 1  # processes that parse big bodies off the event loop (0 = inline)
    offload_bytes: int = 256 * 1024  # bodies from this size on are parsed in those processes
    large_bodies_per_client: int = 2  # big bodies one client address may have being parsed (429 beyond)
    max_connections: int = 4096  # beyond it a new connection gets a 503 and is closed
    # At that cap, an address holding fewer than this takes a connection from the address holding
    # the most, if that one holds more (shared.http_server.ConnGuard.make_room). None: a quarter of the cap.
    max_connections_per_client: int | None = None
    header_timeout_s: float = 10.0  # a request head must arrive within this
    body_timeout_s: float = 30.0  # a request body must arrive within this (408 otherwise)
    write_timeout_s: float = 30.0  # a client that keeps the send buffer full (reads nothing) this long is cut off
    cluster_token: str | None = None  # guards /kv/* and raw session ids; required beyond loopback (shared/auth.py)

    def __post_init__(self) -> None:
        for name in _TIMEOUTS:
            if not 0 < getattr(self, name) < float("inf"):
                raise InputError(name, f"must be a positive number of seconds, got {getattr(self, name)}")
        for name in _POSITIVE:
            check_positive_int(name, getattr(self, name))
        if self.max_connections_per_client is not None:
            check_positive_int("max_connections_per_client", self.max_connections_per_client)
        if not 0 <= self.parse_workers <= 64:
            raise InputError("parse_workers", f"must be 0-64, got {self.parse_workers}")
        check_bind(self.host, self.cluster_token)

    def offload(self) -> OffloadSettings:
        return OffloadSettings(self.parse_workers, self.offload_bytes, self.large_bodies_per_client)

    def conn_limits(self) -> ConnLimits:
        # A quarter: loopback clients (a router's pool, a load generator) all come from one address and
        # may still fill the whole cap; at the cap, four greedy addresses cannot lock out a fifth.
        share = self.max_connections_per_client or max(1, self.max_connections // 4)
        return ConnLimits(self.max_connections, self.header_timeout_s, self.body_timeout_s, self.write_timeout_s,
                          max_connections_per_client=share)


# The defaults, read by the flags (kvemu/options/serving.py) so a flag cannot drift from its field.
SERVING_DEFAULTS = {f.name: f.default for f in fields(ServingSettings)}
