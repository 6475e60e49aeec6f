"""Validated numbers: bounds open and closed, non-numbers, non-finite values, and messages that
name the parameter."""
import math

import numpy as np
import pytest

from edp_tf import DPConfig, checks


@pytest.mark.parametrize("value, kwargs, want", [
    (0.5, dict(low=0.0, high=1.0), 0.5),
    (0, dict(low=0.0), 0.0),  # closed lower bound: its value is allowed
    (1, dict(high=1.0), 1.0),  # closed upper bound
    ("2.5", {}, 2.5),  # a string of a number (flags arrive as strings)
    (np.float32(0.25), dict(low=0.0, low_open=True), 0.25),
])
def test_number_accepts_values_within_bounds(value, kwargs, want):
    assert checks.number("p", value, **kwargs) == want


@pytest.mark.parametrize("value, kwargs", [
    (0.0, dict(low=0.0, low_open=True)),
    (1.0, dict(high=1.0, high_open=True)),
    (-0.1, dict(low=0.0)),
    (1.1, dict(high=1.0)),
    (math.nan, {}),
    (math.inf, {}),
    (-math.inf, dict(high=1.0)),  # a finite upper bound does not make -inf acceptable
    (math.inf, dict(low=0.0)),
])
def test_number_refuses_values_outside_bounds_and_non_finite_ones(value, kwargs):
    with pytest.raises(ValueError, match=r"^delta must be in .* and finite, got"):
        checks.number("delta", value, **kwargs)


@pytest.mark.parametrize("value", [True, None, "abc", [1.0]])
def test_number_refuses_non_numbers(value):
    with pytest.raises(ValueError, match="^noise_multiplier must be a number"):
        checks.number("noise_multiplier", value)


@pytest.mark.parametrize("value, minimum, want", [(0, 0, 0), (3, 1, 3), (np.int64(5), 1, 5)])
def test_count_accepts_integers_at_or_above_the_minimum(value, minimum, want):
    got = checks.count("steps", value, minimum)
    assert got == want and type(got) is int


@pytest.mark.parametrize("value, minimum", [(-1, 0), (0, 1), (True, 0), (2.0, 0), ("3", 0),
                                            (None, 0)])
def test_count_refuses_other_values_naming_the_parameter(value, minimum):
    with pytest.raises(ValueError, match=rf"^epochs must be an integer >= {minimum}, got"):
        checks.count("epochs", value, minimum)


def test_a_bad_value_names_its_field_in_the_error_not_only_the_message():
    """A command line maps the field to its flag from the error (no parsing of the text)."""
    with pytest.raises(checks.FieldError) as error:
        checks.count("DPConfig.augment_copies", 0, 1)
    assert error.value.field == "augment_copies"
    with pytest.raises(checks.FieldError) as error:
        DPConfig(seed=1.5)
    assert error.value.field == "seed"
