"""Gaussian thresholding partition selection: its statistics, the contribution bound, and the
delta it spends."""
import collections
import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from edp_tf import accounting
from edp_tf import partition_selection as ps

# Binomial tolerance of the statistical tests: 5 standard deviations, so that a correct
# implementation fails with probability below 6e-7 per check (the draws are seeded as well, so
# a pass is reproducible).
SIGMAS = 5.0


def binomial_tolerance(p: float, trials: int) -> float:
    return SIGMAS * math.sqrt(p * (1 - p) / trials)


def test_threshold_for_delta_spends_at_most_the_delta():
    for sigma, m, delta in [(5.0, 4, 7.6e-7), (1.0, 1, 1e-5), (10.0, 16, 1e-9), (0.5, 3, 0.3)]:
        tau = ps.threshold_for_delta(sigma, m, delta)
        spent = ps.threshold_delta(sigma, tau, m)
        assert spent <= delta and spent == pytest.approx(delta, rel=1e-9)
        # the smallest such tau: a little lower spends more
        assert ps.threshold_delta(sigma, tau - 1e-6 * sigma, m) > delta
    # the formula: -m ln(1 - Q((tau - 1) / sigma)), just above m Q of the literature
    p = stats.norm.sf((26.0 - 1.0) / 5.0)
    assert ps.threshold_delta(5.0, 26.0, 4) == pytest.approx(-4 * math.log1p(-p), rel=1e-12)
    assert 4 * p <= ps.threshold_delta(5.0, 26.0, 4) <= 4 * p * (1 + p)
    # more noise or more partitions per unit need a higher threshold for the same delta
    assert ps.threshold_for_delta(6.0, 4, 1e-6) > ps.threshold_for_delta(5.0, 4, 1e-6)
    assert ps.threshold_for_delta(5.0, 8, 1e-6) > ps.threshold_for_delta(5.0, 4, 1e-6)


def test_mechanism_parameters_and_its_extra_event():
    mech = ps.GaussianThresholding.for_delta(5.0, 4, 1e-6)
    assert mech.sensitivity == 2.0 and mech.effective_noise_multiplier == 2.5
    assert mech.delta <= 1e-6
    event = mech.extra_event("label_selection")
    assert event == accounting.ExtraEvent("label_selection", 5.0, None, 1, 2.0, mech.delta)
    assert event.effective_noise_multiplier == 2.5
    assert accounting.ExtraEvent.from_dict(event.to_dict()) == event
    with pytest.raises(ValueError, match="raise the threshold"):
        ps.GaussianThresholding(1.0, -100.0, 2)  # every partition of one unit is released
    for bad in [dict(noise_stddev=0.0), dict(max_partitions=0), dict(threshold=math.nan)]:
        kw = dict(noise_stddev=1.0, threshold=5.0, max_partitions=1) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            ps.GaussianThresholding(**kw)


def test_a_partition_far_above_the_threshold_is_released():
    mech = ps.GaussianThresholding.for_delta(5.0, 4, 1e-6)  # tau ~ 26
    assert mech.release_probability(100) == 1.0  # 1 - 1e-50 in floats
    units = [["common"]] * 100 + [["other"]] * 100
    for seed in range(50):
        assert ps.select_partitions(units, mech, seed) == {"common", "other"}


def test_a_partition_of_one_unit_is_released_with_probability_q_tau_minus_one():
    """Each of `trials` units brings its own partition (count 1): the released fraction is a
    binomial proportion around P[1 + N(0, sigma^2) > tau] = Q((tau - 1) / sigma)."""
    sigma, tau, trials = 1.0, 1.5, 40_000
    mech = ps.GaussianThresholding(sigma, tau, 1)
    p = stats.norm.sf((tau - 1.0) / sigma)  # 0.3085
    assert mech.release_probability(1) == pytest.approx(p, rel=1e-12)
    released = ps.select_partitions([[i] for i in range(trials)], mech, seed=7)
    assert abs(len(released) / trials - p) < binomial_tolerance(p, trials)  # 0.0115
    # and at a count of 3, P[3 + N > tau] = Q((tau - 3) / sigma)
    p3 = stats.norm.sf((tau - 3.0) / sigma)
    released = ps.select_partitions([[i] for i in range(trials)] * 3, mech, seed=8)
    assert abs(len(released) / trials - p3) < binomial_tolerance(p3, trials)


def test_the_delta_bounds_what_one_unit_alone_can_release():
    """The privacy-relevant event: neighbouring datasets differ by one unit whose m partitions
    nobody else has; the chance any is released is at most the spent delta."""
    mech = ps.GaussianThresholding(1.0, 2.0, 3)  # loose on purpose: measurable
    per_partition = stats.norm.sf(1.0)
    any_released = 1 - (1 - per_partition) ** 3
    assert any_released <= mech.delta
    trials = 20_000
    rng_seeds = range(trials)
    hits = sum(bool(ps.select_partitions([["a", "b", "c"]], mech, s)) for s in rng_seeds)
    assert abs(hits / trials - any_released) < binomial_tolerance(any_released, trials)


def test_each_unit_counts_in_at_most_m_partitions_drawn_at_random():
    rng = np.random.default_rng(3)
    many = list("abcdefghij")
    units = [many, many + many, ["a", "a", "b"], ["z"]]  # duplicates count once
    counts = ps.count_partitions(units, 3, rng)
    assert sum(counts.values()) == 3 + 3 + 2 + 1
    assert counts["z"] == 1 and set(counts) <= set(many) | {"z"}
    assert all(c <= 3 for c in counts.values())
    # which 3 of the 10 are kept is uniform, not the first ones: each about 3/10 of the time
    trials = 4000
    kept = collections.Counter()
    for _ in range(trials):
        kept.update(ps.count_partitions([many], 3, rng))
    assert set(kept) == set(many)
    for label in many:
        assert abs(kept[label] / trials - 0.3) < binomial_tolerance(0.3, trials), label


def test_select_counts_each_unit_in_at_most_m_partitions():
    """Two units with the same ten labels, a threshold between 1 and 2 and almost no noise: only
    partitions both units kept are released: the overlap of two random 3-subsets of 10, a
    hypergeometric count of mean 0.9 and variance 3 * 0.3 * 0.7 * 7 / 9 = 0.49."""
    mech = ps.GaussianThresholding(1e-3, 1.5, 3)
    trials, released = 2000, 0
    for seed in range(trials):
        got = ps.select_partitions([list("abcdefghij")] * 2, mech, seed)
        assert len(got) <= 3 and got <= set("abcdefghij")
        released += len(got)
    assert abs(released / trials - 0.9) < SIGMAS * math.sqrt(0.49 / trials)


def test_the_default_draws_from_os_entropy():
    """Without a seed two selections of marginal partitions differ (same seed: the same)."""
    mech = ps.GaussianThresholding(1.0, 1.0, 1)  # each singleton released with probability 1/2
    units = [[i] for i in range(200)]
    assert ps.select_partitions(units, mech) != ps.select_partitions(units, mech)
    assert ps.select_partitions(units, mech, 5) == ps.select_partitions(units, mech, 5)


def test_composed_cost_is_the_gaussian_at_the_reduced_delta():
    """Charged with DP-SGD steps, the selection adds a Gaussian of z = sigma / sqrt(m) and spends
    its threshold delta: epsilon at delta is dp-accounting's composition at delta - delta_thr."""
    mech = ps.GaussianThresholding.for_delta(5.0, 4, 1e-6)
    records = accounting.plan_schedule(1.2, 3, 20)
    delta = 1e-5
    got = accounting.compute_epsilon(records, 0.05, delta, [mech.extra_event()], "rdp")
    by_hand = dp_accounting.rdp.RdpAccountant()
    by_hand.compose(dp_accounting.GaussianDpEvent(2.5))
    by_hand.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.2)), 60))
    assert got == pytest.approx(by_hand.get_epsilon(delta - mech.delta), rel=1e-9)
