"""``--set name=value`` overrides applied to a frozen dataclass, with type checks."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable

from shared.errors import InputError

_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def parse_pairs(pairs: Iterable[str] | None) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; a pair without ``=`` is an error."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise InputError("--set", f"expected name=value, got {pair!r}")
        out[name.strip()] = value.strip()
    return out


def _coerce(name: str, raw: str, typ: typing.Any):
    origin = typing.get_origin(typ)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if raw.lower() in ("none", "null", ""):
            return None
        typ = args[0]
    try:
        if typ is bool:
            if raw.lower() not in _BOOL_WORDS:
                raise ValueError(raw)
            return _BOOL_WORDS[raw.lower()]
        if typ is int:
            try:
                return int(raw)
            except ValueError:
                as_float = float(raw)  # accept "1e6" and "2000.0"
                if not as_float.is_integer():
                    raise
                return int(as_float)
        if typ is float:
            return float(raw)
        if typ is str:
            return raw
        if origin in (tuple, list) or typ in (tuple, list):
            inner = (typing.get_args(typ) or (float,))[0]
            return tuple(_coerce(name, part, inner) for part in raw.split(",") if part)
    except ValueError:
        raise InputError(name, f"expected {getattr(typ, '__name__', typ)}, got {raw!r}") from None
    return raw


def apply_overrides(obj, overrides: dict[str, str]):
    """A copy of dataclass ``obj`` with string overrides coerced to each field's type.

    Unknown names are rejected with the list of valid ones; the dataclass's own
    ``__post_init__`` validation then runs on the result.
    """
    fields = {f.name: f for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    changes = {}
    for name, raw in overrides.items():
        if name not in fields:
            raise InputError(name, f"unknown parameter; valid: {', '.join(sorted(fields))}")
        changes[name] = _coerce(name, raw, hints[name])
    return dataclasses.replace(obj, **changes)


def coerce(value: str) -> int | float | str:
    """A ``NAME=VALUE`` value as given on a command line: an int, else a float, else the text."""
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value
