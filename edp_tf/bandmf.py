"""Banded matrix factorization (BandMF): the strategy of correlated noise across steps.

The step releases x_t + y_t, x_t the clipped sum, y = C^{-1} z with fresh z_t ~ N(0, s^2):
the post-processing of C x + z, a Gaussian mechanism on C x. C is lower-triangular Toeplitz
with b bands (c_0 .. c_{b-1}), so the noise follows the recurrence

    y_t = (z_t - sum_{k=1}^{b-1} c_k y_{t-k}) / c_0,

and only the last b - 1 noise vectors are kept. With ||c||_2 = 1 every column of C has norm
<= 1, and an example that takes part at most once every b steps (the b fixed groups of
`edp_tf.sampling.BandMFSampler`) touches disjoint rows of C x with each participation: the
run is then exactly as private as DP-SGD with ceil(T / b) steps at the group's sampling rate
b q (Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization", Theorem 4),
whatever the coefficients are. Their choice is utility only: `optimal_coefficients`
minimises the expected total squared error of the T prefix sums (what SGD's iterates
accumulate), as jax-privacy's `optimize_banded_toeplitz` does with its mean reduction.

Plain numpy and scipy: the optimisation runs once, before the first step.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
from scipy import optimize, signal

from edp_tf import checks

# ||c||_2 may exceed 1 by this much through float rounding; more would raise the sensitivity
NORM_TOLERANCE = 1e-9


def check_coefficients(coefficients: Sequence[float], bands: int) -> tuple:
    """`coefficients` as a tuple of b floats with c_0 > 0 and ||c||_2 <= 1 (the sensitivity
    bound every column of C must keep), else ValueError naming what is wrong."""
    c = tuple(float(v) for v in coefficients)
    if len(c) != bands:
        raise ValueError(f"BandMF needs {bands} strategy coefficients (one per band), "
                         f"got {len(c)}")
    if not all(math.isfinite(v) for v in c) or c[0] <= 0:
        raise ValueError(f"BandMF strategy coefficients must be finite with c_0 > 0, got {c}")
    norm = math.sqrt(math.fsum(v * v for v in c))
    if norm > 1.0 + NORM_TOLERANCE:
        raise ValueError(f"BandMF strategy coefficients must have L2 norm <= 1 (the column "
                         f"norm of C, i.e. the sensitivity), got {norm!r}")
    return c


def default_coefficients(bands: int) -> tuple:
    """Fichtenberger et al.'s square root of the prefix-sum matrix, truncated to b bands and
    normalised to norm 1: no run length needed (the optimisation's starting point)."""
    b = checks.count("bands", bands, 1)
    k = np.arange(b, dtype=np.float64)
    ratios = np.ones(b)
    ratios[1:] = (2 * k[1:] - 1) / (2 * k[1:])
    c = np.cumprod(ratios)
    return tuple(float(v) for v in c / np.linalg.norm(c))


def inverse_coefficients(coefficients: Sequence[float], steps: int) -> np.ndarray:
    """The first `steps` Toeplitz coefficients of C^{-1}: the impulse response of the noise
    recurrence (y = C^{-1} z)."""
    impulse = np.zeros(checks.count("steps", steps, 1))
    impulse[0] = 1.0
    return signal.lfilter([1.0], np.asarray(coefficients, np.float64), impulse)


def prefix_sum_error(coefficients: Sequence[float], steps: int) -> float:
    """Expected squared error of the T prefix sums of the released steps, summed over the
    prefixes and divided by T (the mean per-prefix error), at unit noise per unit of
    sensitivity: ||c||^2 x mean_t sum_{j <= t} B_j^2 with B = A C^{-1}'s coefficients (A the
    prefix-sum matrix). DP-SGD (c = [1]) gives (T + 1) / 2."""
    c = np.asarray(coefficients, np.float64)
    b_coef = np.cumsum(inverse_coefficients(c, steps))
    weights = (steps - np.arange(steps)) / steps  # B_j^2 is in the prefixes j .. T-1
    return float(np.dot(c, c) * np.dot(weights, b_coef ** 2))


def _loss_and_gradient(steps_down: np.ndarray, steps: int) -> tuple:
    """prefix_sum_error of c = the reverse cumulative sum of `steps_down` (d_k >= 0, so c is
    non-negative and non-increasing) and its gradient in d."""
    c = np.cumsum(steps_down[::-1])[::-1]
    norm2 = float(np.dot(c, c))
    if norm2 <= 0.0:
        return math.inf, np.zeros_like(steps_down)
    b_coef = np.cumsum(inverse_coefficients(c, steps))
    weights = (steps - np.arange(steps)) / steps
    error = float(np.dot(weights, b_coef ** 2))
    # d inv_i / d c_k = -(inv * inv)_{i-k}: the series of 1 / c(x) differentiated in c_k
    inv2 = inverse_coefficients(np.convolve(c, c), steps)
    d_error_d_inv = np.cumsum((2.0 * weights * b_coef)[::-1])[::-1]
    grad_error = np.array([-np.dot(d_error_d_inv[k:], inv2[:steps - k])
                           for k in range(len(c))])
    grad_c = norm2 * grad_error + 2.0 * c * error
    return norm2 * error, np.cumsum(grad_c)  # c_k = sum_{j >= k} d_j: dL/dd_j = sum_{k<=j}


@functools.lru_cache(maxsize=64)
def optimal_coefficients(steps: int, bands: int) -> tuple:
    """The b-banded Toeplitz strategy with the least expected prefix-sum error over T steps
    (L-BFGS from `default_coefficients`), normalised to ||c||_2 = 1.

    The search keeps c non-negative and non-increasing: such a polynomial has no zero inside
    the unit disc (Enestrom-Kakeya), so the noise recurrence 1 / c(x) never grows
    exponentially, and the optimum over this set is the one jax-privacy's unconstrained
    search reports for prefix sums (positive, decreasing)."""
    steps, bands = checks.count("steps", steps, 1), checks.count("bands", bands, 1)
    if bands > steps:
        raise ValueError(f"BandMF with {bands} bands needs at least as many steps, got {steps}")
    if bands == 1:
        return (1.0,)
    start = np.asarray(default_coefficients(bands))
    d0 = start - np.append(start[1:], 0.0)
    result = optimize.minimize(_loss_and_gradient, d0, args=(steps,), jac=True,
                               method="L-BFGS-B", bounds=[(0.0, None)] * bands,
                               options={"maxiter": 1000})
    best = result.x if result.fun <= _loss_and_gradient(d0, steps)[0] else d0
    c = np.cumsum(best[::-1])[::-1]
    return check_coefficients(c / np.linalg.norm(c), bands)


def marginal_noise_std(coefficients: Sequence[float], steps: int) -> np.ndarray:
    """std of y_t per unit std of z, at each step t: sqrt(sum_{j <= t} (C^{-1})_j^2)."""
    return np.sqrt(np.cumsum(inverse_coefficients(coefficients, steps) ** 2))
