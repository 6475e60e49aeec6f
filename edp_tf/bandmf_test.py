"""BandMF strategy coefficients: the error they are optimised for, checked against dense
matrices, and the optimum against DP-SGD and unoptimised bands."""
import numpy as np
import pytest
from scipy import linalg

from edp_tf import bandmf


def dense_strategy(coefficients, steps):
    column = np.zeros(steps)
    column[:len(coefficients)] = coefficients
    return linalg.toeplitz(column, np.zeros(steps))


def dense_prefix_error(coefficients, steps):
    """||c||^2 ||A C^{-1}||_F^2 / T, A the prefix-sum matrix: the definition, by matrices."""
    c = dense_strategy(coefficients, steps)
    b = np.tril(np.ones((steps, steps))) @ np.linalg.inv(c)
    sensitivity2 = np.max(np.sum(c ** 2, axis=0))
    return sensitivity2 * np.sum(b ** 2) / steps


@pytest.mark.parametrize("coefficients", [(1.0,), (0.8, 0.6), (0.7, 0.5, 0.4, 0.3)])
def test_prefix_error_and_inverse_match_dense_matrices(coefficients):
    steps = 37
    assert bandmf.prefix_sum_error(coefficients, steps) == pytest.approx(
        dense_prefix_error(coefficients, steps), rel=1e-10)
    inverse = np.linalg.inv(dense_strategy(coefficients, steps))[:, 0]
    np.testing.assert_allclose(bandmf.inverse_coefficients(coefficients, steps), inverse,
                               rtol=1e-10, atol=1e-12)


def test_one_band_is_dp_sgd():
    steps = 300
    assert bandmf.optimal_coefficients(steps, 1) == (1.0,)
    assert bandmf.prefix_sum_error((1.0,), steps) == pytest.approx((steps + 1) / 2)
    np.testing.assert_array_equal(bandmf.marginal_noise_std((1.0,), 5), np.ones(5))


@pytest.mark.parametrize("steps, bands", [(60, 4), (300, 8), (1000, 32)])
def test_optimised_band_beats_dp_sgd_and_unoptimised_bands(steps, bands):
    c = bandmf.optimal_coefficients(steps, bands)
    assert len(c) == bands and c[0] > 0
    assert np.linalg.norm(c) == pytest.approx(1.0, abs=1e-12)
    error = bandmf.prefix_sum_error(c, steps)
    assert error < bandmf.prefix_sum_error((1.0,), steps)  # DP-SGD
    # the starting point and a flat band, both valid strategies of the same b
    assert error < bandmf.prefix_sum_error(bandmf.default_coefficients(bands), steps)
    assert error < bandmf.prefix_sum_error(np.full(bands, bands ** -0.5), steps)
    # a local optimum: nudging any coefficient (then renormalising) does not help
    for k in range(bands):
        nudged = np.array(c)
        nudged[k] *= 1.02
        assert bandmf.prefix_sum_error(nudged / np.linalg.norm(nudged), steps) >= error * (
            1 - 1e-6)


def test_every_column_of_the_strategy_has_norm_at_most_one():
    steps, bands = 50, 6
    c = dense_strategy(bandmf.optimal_coefficients(steps, bands), steps)
    norms = np.linalg.norm(c, axis=0)
    assert norms.max() == pytest.approx(1.0, abs=1e-12)  # full columns: exactly 1
    # participations b apart touch disjoint rows: their columns are orthogonal
    assert np.count_nonzero(np.abs(c[:, 0] * c[:, bands]) > 0) == 0


def test_check_coefficients_refuses_what_would_raise_the_sensitivity():
    assert bandmf.check_coefficients([0.6, 0.8], 2) == (0.6, 0.8)
    with pytest.raises(ValueError, match="L2 norm <= 1"):
        bandmf.check_coefficients([0.8, 0.8], 2)
    with pytest.raises(ValueError, match="c_0 > 0"):
        bandmf.check_coefficients([0.0, 0.5], 2)
    with pytest.raises(ValueError, match="needs 3"):
        bandmf.check_coefficients([1.0], 3)
    with pytest.raises(ValueError, match="at least as many steps"):
        bandmf.optimal_coefficients(3, 4)
