"""The definition of the clipped sum, computed the slow way: one GradientTape per micro-batch,
no vectorisation, no hooks. Tests compare every per-example method against it."""
import math

import numpy as np
import tensorflow as tf


def mse(y_true, y_pred):
    return tf.reduce_mean(tf.reshape(tf.square(y_true - y_pred), [tf.shape(y_pred)[0], -1]), 1)


def loop_gradients(model, loss_fn, x, y, w, k, k_e):
    """[m][K] micro-batch gradients, one tape per micro-batch."""
    variables = model.trainable_variables

    @tf.function
    def one(xj, yj, wj):
        with tf.GradientTape() as tape:
            per_example = tf.cast(loss_fn(yj, model(xj, training=True)), tf.float32)
            loss = tf.reduce_sum(per_example * wj) / k_e
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]

    n = len(w)
    take = lambda t, j: tf.nest.map_structure(lambda a: a[j : j + k], t)  # noqa: E731
    return [[g.numpy().astype(np.float64) for g in one(take(x, j), take(y, j), w[j : j + k])]
            for j in range(0, n, k)]


def loop_clipped_sum(grads, alpha, C):
    """sum_j clip_C(g_j / alpha) (scaled space), norms, finite flags: the definition."""
    total = [np.zeros_like(g) for g in grads[0]]
    norms, finite = [], []
    for g in grads:
        norm = math.sqrt(sum(float(np.sum((t / a) ** 2)) for t, a in zip(g, alpha)))
        norms.append(norm)
        finite.append(math.isfinite(norm))
        if not math.isfinite(norm):
            continue
        for s, t, a in zip(total, g, alpha):
            s += (t / a) * min(1.0, C / max(norm, 1e-30))
    return total, np.array(norms), np.array(finite)
