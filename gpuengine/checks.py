"""Argument checks at the public API's entry points: each refusal names the argument, the value and what is accepted.

Every message has the shape the toggles' ConfigError already uses (config.py):
`units=2.5 is not accepted; use a whole number >= 1`. The checks run on host
values once, where an argument enters (a constructor, `train()`, a reader),
never inside a step. Conventions:

- a bool is not a number here: `Dense(True)` would otherwise be one unit;
- NumPy integers and floats are numbers like Python's; strings are not;
- a whole number must be an integer type: 2.0 and "2" are refused, as
  check_batch and the toggles refuse them;
- a number must be finite unless the caller asks otherwise: `lr=inf` trains
  to NaN as surely as `lr=nan` does.

The error is an `ArgumentError`, a ValueError and a TypeError at once, so a
caller catching either (a wrong type used to surface as a raw TypeError) still
catches it. Modules with an error class of their own (DataError for data and
files, NetworkError for graphs) pass it as `error`, so each raises one kind.
This module sits below everything, config included, and imports only NumPy.
"""
from __future__ import annotations

import math
from typing import NoReturn

import numpy as np


class ArgumentError(ValueError, TypeError):
    """An argument the API does not accept; the message names it, its value and what is accepted."""


def refuse(name: str, value, allowed: str, error: type[Exception] = ArgumentError) -> NoReturn:
    """Raise `error` with the one message shape: `name=value is not accepted; use allowed`."""
    raise error(f"{name}={value!r} is not accepted; use {allowed}")


def is_whole(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _range_text(kind: str, minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f"{kind} in {minimum}..{maximum}"
    if minimum is not None:
        return f"{kind} >= {minimum}"
    return kind if maximum is None else f"{kind} <= {maximum}"


def whole(name: str, value, minimum: int | None = 1, maximum: int | None = None,
          error: type[Exception] = ArgumentError) -> int:
    """`value` as an int, if it is an integer (not a bool) within [minimum, maximum]."""
    if (not is_whole(value) or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        refuse(name, value, _range_text("a whole number", minimum, maximum), error)
    return int(value)


def seed(name: str, value, error: type[Exception] = ArgumentError) -> int:
    """A random seed: a whole number >= 0 (what NumPy's generators take)."""
    return whole(name, value, 0, None, error)


def number(name: str, value, *, above: float | None = None, at_least: float | None = None,
           below: float | None = None, at_most: float | None = None, finite: bool = True,
           error: type[Exception] = ArgumentError) -> float:
    """`value` as a float, if it is a real number (not a bool), finite unless told, and within the bounds given."""
    bounds = [f"> {above}" if above is not None else "", f">= {at_least}" if at_least is not None else "",
              f"< {below}" if below is not None else "", f"<= {at_most}" if at_most is not None else ""]
    allowed = " and ".join(b for b in bounds if b)
    allowed = ("a finite number" if finite else "a number") + (f" {allowed}" if allowed else "")
    if not is_real(value):
        refuse(name, value, allowed, error)
    x = float(value)
    if (math.isnan(x) or (finite and math.isinf(x)) or (above is not None and not x > above)
            or (at_least is not None and not x >= at_least) or (below is not None and not x < below)
            or (at_most is not None and not x <= at_most)):
        refuse(name, value, allowed, error)
    return x


def flag(name: str, value, error: type[Exception] = ArgumentError) -> bool:
    """A switch: True or False (NumPy's bools too); 0, 1 and strings are refused."""
    if not isinstance(value, (bool, np.bool_)):
        refuse(name, value, "True or False", error)
    return bool(value)


def shape(name: str, value, dims: int | None = None, error: type[Exception] = ArgumentError) -> tuple[int, ...]:
    """A per-sample shape: a tuple (or list) of whole numbers >= 1, exactly `dims` of them if given."""
    count = "" if dims is None else f"{dims} "
    allowed = f"a tuple of {count}whole numbers >= 1" + (", e.g. (height, width, channels)" if dims == 3 else "")
    if (not isinstance(value, (tuple, list)) or (dims is not None and len(value) != dims)
            or (dims is None and not value) or not all(is_whole(v) and v >= 1 for v in value)):
        refuse(name, value, allowed, error)
    return tuple(int(v) for v in value)


def choice(name: str, value, choices, why: str = "", error: type[Exception] = ArgumentError):
    """One of `choices`, compared as given (no case folding: the API's names are exact); `why` says what they are."""
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        refuse(name, value, f"one of {', '.join(map(repr, choices))}" + (f" ({why})" if why else ""), error)
    return value


def optional_callable(name: str, value, error: type[Exception] = ArgumentError):
    """A hook: a callable, or None for none."""
    if value is not None and not callable(value):
        refuse(name, value, "a callable or None", error)
    return value


def has_methods(name: str, value, methods: tuple[str, ...], allowed: str, error: type[Exception] = ArgumentError):
    """An object (not a class) with every method in `methods` (a loss): `allowed` says what to pass instead."""
    if isinstance(value, type) or not all(callable(getattr(value, m, None)) for m in methods):
        refuse(name, value, allowed, error)
    return value
