"""The cluster token: internal endpoints (a replica's event feed and resync) and raw session
ids in operator views need it; routers and replicas of one cluster share it.

Without a token a process may only bind loopback (settings refuse anything else), so an
open internal endpoint is reachable from this host only. Session ids in ``/stats`` and
``/cluster`` are shown as keyed hashes (the same on every process of a cluster, so they can
be matched across views); ``?sessions=raw`` with the token shows them as sent.
"""

from __future__ import annotations

import hmac
import ipaddress

import xxhash
from aiohttp import web


def bearer_ok(request: web.Request, *tokens: str | None) -> bool:
    """The one bearer-token check: ``Authorization: Bearer <t>`` for one of the configured
    ``tokens`` (None or empty ones never match), compared in constant time."""
    given = request.headers.get("Authorization", "").encode()
    return any(t and hmac.compare_digest(given, f"Bearer {t}".encode()) for t in tokens)


def require_cluster_token(request: web.Request, token: str | None, admin_token: str | None = None) -> None:
    """Open without a configured token (loopback only); else the cluster (or admin) token."""
    if token and not bearer_ok(request, token, admin_token):
        raise web.HTTPUnauthorized(reason="internal endpoint: missing or wrong cluster token",
                                   headers={"WWW-Authenticate": "Bearer"})


def wants_raw_sessions(request: web.Request, token: str | None) -> bool:
    """``?sessions=raw`` shows session ids as sent; it needs a configured token, presented."""
    if request.query.get("sessions", "hashed") != "raw":
        return False
    if not token:
        raise web.HTTPForbidden(reason="sessions=raw needs a cluster token (start with --cluster-token)")
    if not bearer_ok(request, token):
        raise web.HTTPUnauthorized(reason="sessions=raw: missing or wrong cluster token",
                                   headers={"WWW-Authenticate": "Bearer"})
    return True


def session_label(session: str | None, token: str | None) -> str | None:
    """What a public view shows for a session id: a keyed hash, stable across the cluster."""
    if session is None:
        return None
    return "s-" + xxhash.xxh3_64_hexdigest(session.encode(), seed=xxhash.xxh3_64_intdigest((token or "").encode()))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Beyond loopback, internal endpoints need a token: refuse to start without one."""
    from shared.errors import InputError

    if not token and not is_loopback(host):
        raise InputError("cluster_token", f"required to bind {host} (beyond loopback): set --cluster-token "
                                          "or KVEMU_CLUSTER_TOKEN, the same on every router and replica")
