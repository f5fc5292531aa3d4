"""The shared argument checks (gpuengine/checks.py): what each accepts, and the one message shape of a refusal."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gpuengine import checks
from gpuengine.checks import ArgumentError


def test_argument_error_is_a_value_error_and_a_type_error():
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, TypeError)


@pytest.mark.parametrize("value", [1, 7, np.int8(3), np.uint64(9)])
def test_whole_accepts_integers_and_returns_an_int(value):
    assert checks.whole("n", value) == int(value) and type(checks.whole("n", value)) is int


@pytest.mark.parametrize("value, allowed", [(0, "a whole number >= 1"), (True, "a whole number >= 1"),
                                            (2.0, "a whole number >= 1"), ("2", "a whole number >= 1"),
                                            (None, "a whole number >= 1"), (np.float64(3), "a whole number >= 1")])
def test_whole_refuses_naming_the_argument_and_value(value, allowed):
    with pytest.raises(ArgumentError) as caught:
        checks.whole("epochs", value)
    assert str(caught.value) == f"epochs={value!r} is not accepted; use {allowed}"


def test_whole_with_a_range_and_another_error_class():
    class Mine(ValueError):
        pass
    with pytest.raises(Mine, match=r"^k=11 is not accepted; use a whole number in 0\.\.10$"):
        checks.whole("k", 11, 0, 10, error=Mine)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 0.0, -1e-3, "0.1", None, True])
def test_number_refuses_non_finite_non_positive_and_non_numbers(value):
    with pytest.raises(ArgumentError, match=r"^lr=.* is not accepted; use a finite number > 0\.0$"):
        checks.number("lr", value, above=0.0)


def test_number_accepts_numpy_and_python_numbers():
    assert checks.number("lr", np.float32(0.5), above=0.0) == 0.5
    assert checks.number("p", 0, at_least=0.0, below=1.0) == 0.0
    assert checks.number("x", math.inf, finite=False) == math.inf


def test_seed_is_a_whole_number_from_zero():
    assert checks.seed("seed", 0) == 0
    with pytest.raises(ArgumentError, match=r"^seed=-1 is not accepted; use a whole number >= 0$"):
        checks.seed("seed", -1)


@pytest.mark.parametrize("value, dims", [((-4,), None), ((), None), ([3, 0], None), ((28, 28), 3), (5, None),
                                         ((2.0,), None), ((True, 2), None)])
def test_shape_refuses_what_is_not_whole_numbers_from_one(value, dims):
    with pytest.raises(ArgumentError, match=r"is not accepted; use a tuple of (3 )?whole numbers >= 1"):
        checks.shape("shape", value, dims)


def test_shape_returns_a_tuple_of_ints():
    assert checks.shape("shape", [np.int64(28), 28, 1], 3) == (28, 28, 1)


def test_flag_choice_callable_and_methods():
    assert checks.flag("f", np.bool_(True)) is True
    with pytest.raises(ArgumentError, match=r"^f=1 is not accepted; use True or False$"):
        checks.flag("f", 1)
    assert checks.choice("a", None, (None, "relu")) is None
    with pytest.raises(ArgumentError, match=r"^a='RELU' is not accepted; use one of None, 'relu' \(fused\)$"):
        checks.choice("a", "RELU", (None, "relu"), "fused")
    assert checks.optional_callable("hook", None) is None
    with pytest.raises(ArgumentError, match=r"^hook=3 is not accepted; use a callable or None$"):
        checks.optional_callable("hook", 3)
    with pytest.raises(ArgumentError, match=r"^loss=<class 'object'> is not accepted; use a loss$"):
        checks.has_methods("loss", object, ("__init__",), "a loss")
