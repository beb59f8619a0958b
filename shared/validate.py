"""The one family of input checks: each raises an ``InputError`` that names the field.

``bool`` is never a number here (a stray ``true`` must not pass as 1), NaN and infinities
are refused unless asked for, and the message says what was expected and what came.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from shared.errors import InputError


def _bounds(minimum: float | None, maximum: float | None, above: float | None) -> str:
    parts = []
    if above is not None:
        parts.append(f"> {above:g}")
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    return " and ".join(parts)


def check_int(field: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer within ``[minimum, maximum]`` (either bound optional)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InputError(field, f"must be an integer{_suffix(minimum, maximum, None)}, got {value!r:.60}")
    number = int(value)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise InputError(field, f"must be an integer {_bounds(minimum, maximum, None)}, got {value!r}")
    return number


def check_number(field: str, value: Any, minimum: float | None = None, maximum: float | None = None, *,
                 above: float | None = None, finite: bool = True) -> float:
    """A real number within the bounds (``above``: strictly greater); finite unless ``finite=False``."""
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        raise InputError(field, f"must be a number{_suffix(minimum, maximum, above)}, got {value!r:.60}")
    number = float(value)
    if finite and math.isinf(number):
        raise InputError(field, f"must be a finite number, got {value!r}")
    if ((minimum is not None and number < minimum) or (maximum is not None and number > maximum)
            or (above is not None and not number > above)):
        raise InputError(field, f"must be a number {_bounds(minimum, maximum, above)}, got {value!r}")
    return number


def check_positive_int(field: str, value: Any) -> int:
    return check_int(field, value, minimum=1)


def check_positive(field: str, value: Any) -> float:
    return check_number(field, value, above=0)


def check_probability(field: str, value: Any) -> float:
    return check_number(field, value, 0, 1)


def _suffix(minimum: float | None, maximum: float | None, above: float | None) -> str:
    bounds = _bounds(minimum, maximum, above)
    return f" {bounds}" if bounds else ""
