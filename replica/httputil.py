"""Replica-only HTTP plumbing: the admin bearer-token check."""

from __future__ import annotations

from aiohttp import web

from replica.runtime import SETTINGS
from shared.auth import bearer_ok, unauthorized


def require_admin(request: web.Request) -> None:
    """Admin endpoints: refused without a configured admin token, else they need it presented."""
    token = request.app[SETTINGS].admin_token
    if not token:
        raise web.HTTPForbidden(reason="admin endpoints are disabled: start the replica with an admin token")
    if not bearer_ok(request, token):
        raise unauthorized("missing or wrong bearer token")


