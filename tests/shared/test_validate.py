import math

import pytest

from shared.errors import InputError
from shared.validate import check_int, check_number, check_positive, check_positive_int, check_probability


@pytest.mark.parametrize("value", [True, 1.0, "3", None, [1]])
def test_int_refuses_non_integers_and_bool(value):
    with pytest.raises(InputError) as e:
        check_int("n", value)
    assert str(e.value).startswith("n: must be an integer")


def test_int_bounds_are_inclusive_and_named():
    assert check_int("n", 3, 3, 5) == 3 and check_int("n", 5, 3, 5) == 5
    with pytest.raises(InputError, match=r"n: must be an integer >= 3 and <= 5, got 6"):
        check_int("n", 6, 3, 5)
    with pytest.raises(InputError, match=r"count: must be an integer >= 1, got 0"):
        check_positive_int("count", 0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, False, "0.5", None])
def test_number_refuses_nan_inf_bool_and_strings(value):
    with pytest.raises(InputError) as e:
        check_number("x", value)
    assert str(e.value).startswith("x: must be a")


def test_number_bounds_and_shorthands():
    assert check_number("x", 2, 0, 2) == 2.0
    assert check_number("x", math.inf, minimum=0, finite=False) == math.inf
    with pytest.raises(InputError, match=r"rate: must be a number > 0, got 0"):
        check_positive("rate", 0)
    with pytest.raises(InputError, match=r"p: must be a number >= 0 and <= 1, got 1.5"):
        check_probability("p", 1.5)
    assert check_probability("p", 1) == 1.0


def test_user_errors_cross_process_boundaries_intact():
    import pickle

    from replica.core.cache.pool import PoolCapacityError
    from shared.errors import TraceFormatError, UnknownNameError

    for err in (InputError("f", "bad"), TraceFormatError("t.jsonl", 3, "hash_ids", "bad"),
                UnknownNameError("policy", "mru", ["lru"]), PoolCapacityError(10, 5)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__
