"""Ghost norms: the Gram / direct choice, and a ghost norm never below the exact one where
float32 Gram terms cancel."""
import keras
import numpy as np
import tensorflow as tf

from edp_tf import ghost
from edp_tf.testing import squared_norms_by_ghost


def test_gram_and_direct_branches_are_the_ones_tested():
    assert ghost.norms.use_gram(6, 24, 24) and not ghost.norms.use_gram(6, 3, 2)
    assert ghost.norms.use_gram(None, 3, 2)


def test_ghost_norm_is_not_underestimated_when_positions_cancel():
    """Two positions with the same input and nearly opposite output gradients: the micro-batch
    gradient a^T (c1 + c2) is tiny while the Gram terms are large. A float32 <AA^T, dZdZ^T>
    comes out far from the truth here; the ghost norm must not be below it (the clip would then
    let an example contribute more than C)."""
    rng = np.random.default_rng(3)
    b, p, d = 8, 2, 64
    a = rng.normal(size=(b, 1, d)).astype(np.float32) * 30
    x = np.repeat(a, p, axis=1)
    c1 = rng.normal(size=(b, 1, d)).astype(np.float32)
    c2 = (-c1 + 1e-3 * rng.normal(size=(b, 1, d))).astype(np.float32)
    y = np.concatenate([c1, c2], axis=1)  # dL/dz = y exactly: the loss is linear in z
    model = keras.Sequential([keras.Input((p, d)), keras.layers.Dense(d, use_bias=False)])

    def linear(y_true, y_pred):
        return tf.reduce_sum(y_true * y_pred, axis=[1, 2])

    squares, ghost_indices = squared_norms_by_ghost(model, linear, tf.constant(x), tf.constant(y),
                                                    np.ones(b, np.float32), 1, 1.0)
    assert ghost_indices == [0]
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    exact = np.array([np.sum((x64[i].T @ y64[i]) ** 2) for i in range(b)])
    float32_gram = np.array([np.sum((x[i] @ x[i].T) * (y[i] @ y[i].T), dtype=np.float32)
                             for i in range(b)])
    assert np.max(np.abs(float32_gram - exact) / exact) > 0.01  # the case does cancel
    assert np.all(squares[:, 0] >= exact)
    np.testing.assert_allclose(squares[:, 0], exact, rtol=1e-5)
