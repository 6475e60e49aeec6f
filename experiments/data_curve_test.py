"""The data curve's arithmetic (experiments/data_curve.py): error counts and the 1.2x crossing."""
import math

import pytest

from experiments import data_curve


def test_errors_recompose_the_ser():
    test = {"intent_errors": 38, "slot_deletions": 120, "slot_insertions": 170,
            "slot_substitutions": 208, "utterances": 700, "reference_slots": 1790,
            "ser": 0.21526104417670683}  # results/snips clc_dpsgd_eps8_both_directions
    e, d = data_curve.errors(test)
    assert (e, d) == (536, 2490) and e / d == pytest.approx(test["ser"], rel=1e-12)


def test_crossing_recovers_a_power_law_and_says_when_it_extrapolates():
    ns = [3_000, 6_000, 12_000]
    ratios = [1 + 4.0 * (n / 1000) ** -0.5 for n in ns]  # ratio - 1 = 4 n_k^-0.5
    fit = data_curve.crossing(ns, ratios, target=1.2)
    assert fit["b"] == pytest.approx(-0.5, rel=1e-9)
    assert fit["n"] == pytest.approx(1000 * (4.0 / 0.2) ** 2, rel=1e-9)  # 400k
    assert fit["extrapolated"]
    inside = data_curve.crossing([1_000, 1_000_000], [1 + 4.0, 1 + 4.0 * 1000 ** -0.5])
    assert not inside["extrapolated"] and 1_000 < inside["n"] < 1_000_000


def test_no_crossing_from_one_point_or_a_rising_ratio():
    assert data_curve.crossing([1_000, 1_000], [2.0, 2.5]) is None  # one n
    assert data_curve.crossing([1_000, 2_000], [2.0, 3.0]) is None  # rises with n
    assert data_curve.crossing([1_000, 2_000], [2.0, math.inf]) is None  # plain SER 0


def test_ratio_interval_widens_with_fewer_errors():
    few = data_curve.ratio_interval(10, 5, 2.0)
    many = data_curve.ratio_interval(1000, 500, 2.0)
    assert few[0] < many[0] < 2.0 < many[1] < few[1]
    assert all(math.isnan(x) for x in data_curve.ratio_interval(10, 0, math.inf))
