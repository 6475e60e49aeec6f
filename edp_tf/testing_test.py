"""The reference computations checked against closed forms: everything else is tested against
them, so they must be right on their own."""
import math

import keras
import numpy as np

from edp_tf import testing


def linear_problem(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(6, 3)).astype("float32")
    y = rng.normal(size=(6, 2)).astype("float32")
    return model, x, y


def test_loop_gradients_match_the_closed_form_of_a_linear_model():
    """mse = mean over 2 outputs of (p - y)^2, so dL/dp = p - y; micro-batch j's gradient is
    sum_i w_i x_i^T (p_i - y_i) / k_e for W and sum_i w_i (p_i - y_i) / k_e for b."""
    model, x, y = linear_problem()
    w = np.array([1, 1, 0, 1, 1, 1], "float32")  # row 2 is padding
    kernel, bias = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    residual = (x @ kernel + bias - y) * w[:, None]
    grads = testing.loop_gradients(model, testing.mse, x, y, w, 2, 2.0)
    assert len(grads) == 3
    for j, (g_kernel, g_bias) in enumerate(grads):
        rows = slice(2 * j, 2 * j + 2)
        np.testing.assert_allclose(g_kernel, x[rows].T @ residual[rows] / 2.0, rtol=1e-5)
        np.testing.assert_allclose(g_bias, residual[rows].sum(0) / 2.0, rtol=1e-5, atol=1e-7)


def test_loop_clipped_sum_clips_in_the_scaled_space_and_skips_non_finite():
    grads = [[np.array([3.0]), np.array([8.0])],  # scaled by (1, 2): (3, 4), norm 5
             [np.array([0.3]), np.array([0.8])],  # scaled norm 0.5: below C, kept whole
             [np.array([np.nan]), np.array([1.0])]]
    total, norms, finite = testing.loop_clipped_sum(grads, (1.0, 2.0), 1.0)
    np.testing.assert_allclose(norms[:2], [5.0, 0.5])
    assert list(finite) == [True, True, False] and math.isnan(norms[2])
    np.testing.assert_allclose(total[0], [3.0 / 5 + 0.3])
    np.testing.assert_allclose(total[1], [4.0 / 5 + 0.4])  # the sum stays in the scaled space


def test_per_example_update_is_sgd_on_clipped_unscaled_gradients():
    """With C above every norm and alpha = 1 it is one plain SGD step on the mean loss."""
    model, x, y = linear_problem(seed=1)
    w = np.ones(len(x), "float32")
    per_example = testing.loop_gradients(model, testing.mse, x, y, w, 1, 1.0)
    mean = [sum(g[i] for g in per_example) / len(x) for i in range(2)]
    want = [v - 0.1 * g for v, g in zip(model.get_weights(), mean)]
    got = testing.per_example_update(model, x, y, (1.0, 1.0), 1e9, 0.1)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # A tiny C clips every example to norm C: the step's length is at most lr * C.
    clipped = testing.per_example_update(model, x, y, (1.0, 1.0), 1e-3, 0.1)
    step = math.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in zip(clipped, model.get_weights())))
    assert 0 < step <= 0.1 * 1e-3 * (1 + 1e-5)
