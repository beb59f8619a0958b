"""What a replica's answer can mean to the router, whichever path sent the request (views, pd)."""

from __future__ import annotations


class ReplicaFailed(Exception):
    """The replica did not answer (connection error, timeout, 5xx before any byte)."""


class ReplicaBusy(Exception):
    """The replica answered 503 with Retry-After (its queue or connection cap is full): overload,
    not failure. Try another, keep its index entries, and leave it alone for a while."""


def check_status(status: int, headers) -> None:
    """Raise what a replica's status means for routing: busy (503 + Retry-After) or failed (5xx)."""
    if status == 503 and "Retry-After" in headers:
        raise ReplicaBusy()
    if status >= 500:
        raise ReplicaFailed(f"replica answered {status}")
