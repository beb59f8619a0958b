"""The cluster token: internal endpoints (a replica's event feed and resync) and raw session
ids in operator views need it; routers and replicas of one cluster share it.

Internal endpoints are never open: a process started from the command line always has a token
(the one given, else on loopback the one its user's processes share through a private file,
``shared.runtime_dir``), and one built without any (a library caller's settings) refuses them.
Beyond loopback a token must be given (settings refuse to bind without one). Session ids in ``/stats`` and
``/cluster`` are shown as keyed hashes (the same on every process of a cluster, so they can
be matched across views); ``?sessions=raw`` with the token shows them as sent.
"""

from __future__ import annotations

import hmac
import ipaddress

import xxhash
from aiohttp import web

from shared.runtime_dir import cluster_token_path


def bearer(token: str) -> str:
    """The ``Authorization`` value that presents ``token``: the one spelling every side sends and checks."""
    return f"Bearer {token}"


def bearer_header(token: str | None) -> dict[str, str]:
    """The headers that present ``token`` to another process (none without one)."""
    return {"Authorization": bearer(token)} if token else {}


def bearer_matches(given: str, token: str) -> bool:
    """Whether an ``Authorization`` value presents ``token``, compared in constant time."""
    return hmac.compare_digest(given.encode(), bearer(token).encode())


def unauthorized(reason: str) -> web.HTTPUnauthorized:
    """The 401 that asks for a bearer token (``reason``: what to send)."""
    return web.HTTPUnauthorized(reason=reason, headers={"WWW-Authenticate": "Bearer"})


def bearer_ok(request: web.Request, *tokens: str | None) -> bool:
    """The one bearer-token check: ``Authorization: Bearer <t>`` for one of the configured
    ``tokens`` (None or empty ones never match), compared in constant time."""
    given = request.headers.get("Authorization", "")
    return any(t and bearer_matches(given, t) for t in tokens)


def require_cluster_token(request: web.Request, token: str | None) -> None:
    """The cluster token, always: 401 naming what to send without it; 403 where this process has none
    configured (nothing could open the endpoint). The admin token opens /admin/* only: each token its own
    endpoints, so a leaked one opens no more than its own."""
    if not token:
        raise web.HTTPForbidden(reason="internal endpoint: this process has no cluster token; start it with"
                                       " --cluster-token or KVEMU_CLUSTER_TOKEN (from the command line it finds or"
                                       " makes the shared one in its runtime directory)")
    if not bearer_ok(request, token):
        raise unauthorized(missing_token_reason(request, "internal endpoint"))


def missing_token_reason(request: web.Request, what: str) -> str:
    """The 401's message: what to send, and where the token is (the shared file's path only to a
    client on this host, where that file is the one that could have been used)."""
    where = (f", or where none was given the one in {cluster_token_path()}"
             if is_loopback(request.remote or "") else "")
    return (f"{what}: missing or wrong cluster token; send 'Authorization: Bearer <token>' with the token this"
            f" cluster was started with (--cluster-token / KVEMU_CLUSTER_TOKEN){where}")


def wants_raw_sessions(request: web.Request, token: str | None) -> bool:
    """``?sessions=raw`` shows session ids as sent; it needs a configured token, presented."""
    if request.query.get("sessions", "hashed") != "raw":
        return False
    if not token:
        raise web.HTTPForbidden(reason="sessions=raw needs a cluster token (start with --cluster-token)")
    if not bearer_ok(request, token):
        raise unauthorized(missing_token_reason(request, "sessions=raw"))
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
