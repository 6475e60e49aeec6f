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


def test_ser_ratio_of_two_runs_without_an_error_is_one():
    assert data_curve.ser_ratio(0.2, 0.1) == pytest.approx(2.0)
    assert math.isinf(data_curve.ser_ratio(0.0005, 0.0))  # only plain is perfect
    assert data_curve.ser_ratio(0.0, 0.0) == 1.0  # neither errs: private is as good


def test_first_within_needs_every_pair_at_and_above_n():
    ns = [10_000, 30_000, 30_000, 100_000]
    assert data_curve.first_within(ns, [3.0, 1.1, 1.15, 1.0]) == 30_000
    assert data_curve.first_within(ns, [3.0, 1.1, 1.3, 1.0]) == 100_000  # one pair at 30k out
    # within at 10k but not at 30k: the answer is where it stays within
    assert data_curve.first_within(ns, [1.1, 3.0, 1.1, 1.0]) == 100_000
    assert data_curve.first_within(ns, [1.1, 1.1, 1.1, math.inf]) is None  # largest n out
