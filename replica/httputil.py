"""Replica-only HTTP plumbing: the admin bearer-token check."""

from __future__ import annotations

import hmac

from aiohttp import web

from replica.runtime import SETTINGS


def require_admin(request: web.Request) -> None:
    token = request.app[SETTINGS].admin_token
    given = request.headers.get("Authorization", "")
    if not token:
        raise web.HTTPForbidden(reason="admin endpoints are disabled: start the replica with an admin token")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise web.HTTPUnauthorized(reason="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


