"""Validated numbers: a wrong value fails with a message naming the parameter, before any
privacy budget is spent."""
from __future__ import annotations

import math


class FieldError(ValueError):
    """A bad value of one named parameter. `field` is its name, so that a command line can name
    the flag that set it from a table (edp_nlu/pipeline/builders.py named_as_flags) instead of
    reading it back out of the message."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _field(name: str) -> str:
    """"DPConfig.augment_copies" -> "augment_copies"."""
    return name.rsplit(".", 1)[-1]


def number(name: str, value, low: float = -math.inf, low_open: bool = False,
           high: float = math.inf, high_open: bool = False) -> float:
    """`value` as a finite float within the given bounds, else ValueError naming `name`."""
    if isinstance(value, bool):
        raise FieldError(_field(name), f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise FieldError(_field(name), f"{name} must be a number, got {value!r}") from None
    too_low = v <= low if low_open else v < low
    too_high = v >= high if high_open else v > high
    if not math.isfinite(v) or too_low or too_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise FieldError(_field(name),
                         f"{name} must be in {lo}{low}, {high}{hi} and finite, got {value!r}")
    return v


def count(name: str, value, minimum: int = 0) -> int:
    """`value` as an int >= `minimum`, else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) and not (
            hasattr(value, "__index__")):
        raise FieldError(_field(name), f"{name} must be an integer >= {minimum}, got {value!r}")
    v = int(value)
    if v < minimum:
        raise FieldError(_field(name), f"{name} must be an integer >= {minimum}, got {value!r}")
    return v


def instance(what: str, value, kind, wanted: str):
    """`value` when it is a `kind`, else ValueError: "{what} must be {wanted}, got <type>"."""
    if not isinstance(value, kind):
        raise ValueError(f"{what} must be {wanted}, got {type(value).__name__}")
    return value
