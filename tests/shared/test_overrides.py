from dataclasses import dataclass

import pytest

from shared.errors import InputError
from shared.overrides import apply_overrides, parse_pairs


@dataclass(frozen=True)
class Params:
    rate: float = 1.0
    turns: int = 3
    name: str = "x"
    on: bool = False
    cap: int | None = None


def test_parse_pairs():
    assert parse_pairs(["a=1", " b = x "]) == {"a": "1", "b": "x"}
    with pytest.raises(InputError):
        parse_pairs(["novalue"])


def test_apply_coerces_types():
    p = apply_overrides(Params(), {"rate": "2.5", "turns": "1e3", "name": "y", "on": "yes", "cap": "7"})
    assert p == Params(rate=2.5, turns=1000, name="y", on=True, cap=7)
    assert apply_overrides(Params(cap=3), {"cap": "none"}).cap is None


def test_unknown_and_bad_values_name_the_field():
    with pytest.raises(InputError) as err:
        apply_overrides(Params(), {"speed": "1"})
    assert err.value.field == "speed" and "rate" in str(err.value)
    with pytest.raises(InputError) as err:
        apply_overrides(Params(), {"turns": "2.5"})
    assert err.value.field == "turns"
    with pytest.raises(InputError) as err:
        apply_overrides(Params(), {"on": "maybe"})
    assert err.value.field == "on"
