"""A trace line's fields, checked: the value of a name, of the types it takes, at least a minimum; a list of
64-bit unsigned block ids. A bad value names the file, the line and the field (``TraceFormatError``)."""

from __future__ import annotations

from shared.errors import TraceFormatError

_INT_ONLY = {int}
_U64 = 2**64


def field(path: str, lineno: int, obj: dict, name: str, types: tuple, *, required: bool = True, minimum=None):
    """``obj[name]``, of one of ``types`` (never a bool) and at least ``minimum``; None where it is optional and absent."""
    if name not in obj:
        if required:
            raise TraceFormatError(path, lineno, name, "missing")
        return None
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, types):
        raise TraceFormatError(path, lineno, name, f"expected {'/'.join(t.__name__ for t in types)}, got {value!r:.60}")
    if minimum is not None and value < minimum:
        raise TraceFormatError(path, lineno, name, f"must be >= {minimum}, got {value}")
    return value


def hash_list(path: str, lineno: int, obj: dict, name: str) -> list[int]:
    """``obj[name]``, a list of integers in [0, 2**64)."""
    ids = field(path, lineno, obj, name, (list,))
    # One C-speed pass for the common all-valid case; the slow loop only runs to name the culprit.
    if not ids or (set(map(type, ids)) == _INT_ONLY and min(ids) >= 0 and max(ids) < _U64):
        return ids
    for i, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int) or h < 0 or h >= _U64:
            raise TraceFormatError(path, lineno, f"{name}[{i}]", f"expected a 64-bit unsigned integer, got {h!r:.60}")
    return ids
