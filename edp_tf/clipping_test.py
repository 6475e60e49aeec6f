"""Clipping: every micro-batch's contribution is bounded by C in the scaled space, and the
step's clipped, unscaled update matches a plain per-example loop."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import DPConfig, PrivateModel, microbatch
from edp_tf.testing import mse, per_example_update, small_model, small_regression


@pytest.mark.parametrize("microbatch_size, physical", [(1, None), (2, None), (1, 2), (2, 2)])
def test_clipping_and_layer_scales_match_plain_loop(strategy, microbatch_size, physical):
    """Per-example (and per-micro-batch) clipping in the alpha-scaled space, with z = 0; also
    with the replica batches processed in chunks of `physical` examples."""
    x, y = small_regression(seed=3)
    x, y = x[:16], y[:16]
    alpha_raw = (2.0, 0.5, 1.0, 3.0)  # kernel, bias, kernel, bias
    C, lr = 0.05, 0.3  # small C: every contribution is clipped
    reference = small_model()
    init = reference.get_weights()
    with strategy.scope():
        inner = small_model()
        inner.set_weights(init)
        cfg = DPConfig(l2_norm_clip=C, noise_multiplier=0.0, microbatch_size=microbatch_size,
                       scaling="public", layer_scales=alpha_raw, physical_batch_size=physical)
        private = PrivateModel(inner, cfg, training_statistics=True)
        private.compile(optimizer=keras.optimizers.SGD(lr), loss=mse)
    history = private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    alpha = private.layer_scales
    assert sum(a * a for a in alpha) == pytest.approx(len(alpha))  # normalised: sum a^2 = K
    assert np.allclose(np.array(alpha) / np.array(alpha_raw), alpha[0] / alpha_raw[0])
    assert history.history["clipped_fraction"] == [1.0]

    if microbatch_size == 1:
        want = per_example_update(reference, x, y, alpha, C, lr)
    else:  # micro-batches of 2 consecutive examples: clip each pair's mean gradient
        total = [np.zeros(v.shape, np.float64) for v in reference.trainable_variables]
        for j in range(0, 16, 2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(mse(y[j : j + 2], reference(x[j : j + 2])))
            scaled = [g.numpy() / a for g, a in
                      zip(tape.gradient(loss, reference.trainable_variables), alpha)]
            norm = math.sqrt(sum(float(np.sum(s**2)) for s in scaled))
            for t, s, a in zip(total, scaled, alpha):
                t += a * s * min(1.0, C / norm)
        want = [w - lr * t / 8 for w, t in zip(reference.get_weights(), total)]
    for got, w in zip(inner.get_weights(), want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)


def test_stacked_clip_bounds_every_contribution():
    rng = np.random.default_rng(1)
    stacked = [tf.constant(rng.normal(size=(6, 3, 2)) * 10, tf.float32),
               tf.constant(rng.normal(size=(6, 4)), tf.float32)]
    C = 1.5

    result = microbatch.StackedGradients(stacked, None, None, [1.0, 1.0]).clip(C)
    norms = np.sqrt(sum(np.sum(s.numpy().reshape(6, -1) ** 2, 1) for s in stacked))
    np.testing.assert_allclose(result.norms.numpy(), norms, rtol=1e-5)
    factors = np.minimum(1.0, C / norms)
    for got, s in zip(result.clipped_sum, stacked):
        np.testing.assert_allclose(got.numpy(), np.tensordot(factors, s.numpy(), 1), rtol=1e-5)
    clipped_norms = norms * factors
    assert np.all(clipped_norms <= C * (1 + 1e-6))
