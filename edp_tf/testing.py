"""The definition of the clipped sum, computed the slow way: one GradientTape per micro-batch,
no vectorisation, no hooks. Every per-example method is tested against it; so can a user's own
ghost rule (`ghost.register`) be, with `assert_fast_norms_exact`.
"""
import math
import re

import keras
import numpy as np
import tensorflow as tf

from edp_tf import microbatch
from edp_tf.ghost import bounds


def mse(y_true, y_pred):
    return tf.reduce_mean(tf.reshape(tf.square(y_true - y_pred), [tf.shape(y_pred)[0], -1]), 1)


def zero_loss(y_true, y_pred):
    """A loss with zero gradient: the update of one SGD(1) step is then exactly the noise."""
    return 0.0 * tf.reduce_sum(y_pred, axis=-1)


def wide_model(width=1250):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(width)])


def loop_gradients(model, loss_fn, x, y, w, k, k_e):
    """[m][K] micro-batch gradients, one tape per micro-batch."""
    variables = model.trainable_variables

    @tf.function(autograph=False)
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


def squared_norms_by_ghost(model, loss_fn, x, y, w, k, k_e):
    """([m, K] per-micro-batch squared norms from the fast path, indices of the ghost-ruled
    variables): what the clip sees."""
    variables = model.trainable_variables
    fn = tf.function(lambda: microbatch.per_variable_squared_norms(
        model, loss_fn, variables, x, y, tf.constant(w), k, k_e), autograph=False)
    squares, ghost_indices = fn()
    return squares.numpy(), ghost_indices


def variable_names(model, indices):
    """Variable paths without keras' uniquifying suffixes (forward_lstm_3 -> forward_lstm)."""
    variables = model.trainable_variables
    return sorted(re.sub(r"_\d+(?=/)", "", variables[i].path) for i in indices)


def data_for(model, n=8, seed=0):
    """A random batch for `model`'s one input (ids below 9 with repeats and padding, or floats)
    and 2 regression targets per example."""
    rng = np.random.default_rng(seed)
    spec = model.inputs[0]
    shape = (n,) + tuple(spec.shape[1:])
    if spec.dtype.startswith("int"):
        x = rng.integers(0, 9, size=shape).astype("int32")
        x[:, 2] = x[:, 0]  # repeated ids within an example
        x[1, 3:] = 0  # padding (masked in the LSTM model)
    else:
        x = rng.normal(size=shape).astype("float32")
    y = rng.normal(size=(n, 2)).astype("float32")
    return x, y


def assert_fast_norms_exact(model, covered, k, loss_fn=mse):
    """The fast path's per-micro-batch squared norms and clipped sum equal the loop's, and
    exactly the variables named in `covered` (paths without keras' suffixes) used a ghost rule.
    One loop and one traced ghost pass give both (each trace costs seconds)."""
    x, y = data_for(model)
    w = np.ones(len(x), "float32")
    variables = model.trainable_variables
    alpha = (1.0,) * len(variables)
    reference = loop_gradients(model, loss_fn, x, y, w, k, float(k))
    want = np.array([[float(np.sum(g ** 2)) for g in grads] for grads in reference])
    # The clipped sum the step uses (each rule's weighted sum, in its variable's shape), with
    # C at the median norm so that about half the micro-batches are clipped.
    C = float(np.median(loop_clipped_sum(reference, alpha, 1e9)[1]))
    expected, _, _ = loop_clipped_sum(reference, alpha, C)
    plans = []

    @tf.function(autograph=False)
    def fast():
        g = microbatch.gradients(model, loss_fn, variables, x, y, tf.constant(w),
                                 microbatch.ClipPlan(k, float(k), alpha, C))
        plans.append(g.pass_.plan)
        return tf.stack(g.variable_squared_norms(), axis=1), g.clip(C).clipped_sum

    squares, result = fast()
    assert variable_names(model, [weight.index for weight in plans[0].ghost]) == sorted(covered)
    assert squares.shape == want.shape
    # float32 sums of a few hundred terms: relative error ~1e-6; 1e-4 leaves margin.
    np.testing.assert_allclose(squares.numpy(), want, rtol=1e-4, atol=1e-9)
    for v, got, want_sum in zip(variables, result, expected):
        # a ghost norm is raised by its rounding bound, up to bounds.MAX_MARGIN above the exact
        # one, so a micro-batch near C is clipped by up to that much more than the loop clips it
        # (4.8e-4 seen on an AVX2 machine for the LoRA head's kernel)
        np.testing.assert_allclose(got.numpy(), want_sum, rtol=bounds.MAX_MARGIN, atol=1e-6,
                                   err_msg=v.path)


def small_regression(seed=0, batch=16):
    """Three batches of a noiseless linear regression, 5 features to 3 targets."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch * 3, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 3))).astype("float32")
    return x, y


def small_model():
    """Two Dense layers (4 variables) for `small_regression`."""
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(7, activation="tanh"), keras.layers.Dense(3)]
    )


def per_example_update(model, x, y, alpha, C, lr):
    """The weights after one SGD(lr) step of per-example clipping, computed the slow way:
    per-example gradients, scaled by 1/alpha, clipped to C, unscaled, averaged."""
    total = [np.zeros(v.shape, np.float64) for v in model.trainable_variables]
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(mse(y[i : i + 1], model(x[i : i + 1])))
        grads = tape.gradient(loss, model.trainable_variables)
        scaled = [g.numpy() / a for g, a in zip(grads, alpha)]
        norm = math.sqrt(sum(float(np.sum(s**2)) for s in scaled))
        factor = min(1.0, C / norm)
        for t, s, a in zip(total, scaled, alpha):
            t += a * s * factor
    return [w - lr * t / len(x) for w, t in zip(model.get_weights(), total)]


def mixed_model():
    """One layer of each ghost-ruled family (Embedding, EinsumDense, LSTM, Dense) and one
    without a rule (LayerNormalization)."""
    ids = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(13, 8, name="emb")(ids)
    h = keras.layers.EinsumDense("abc,cde->abde", (6, 2, 4), bias_axes="de", name="qkv")(h)
    h = keras.layers.Reshape((6, 8))(h)
    h = keras.layers.LayerNormalization(name="ln")(h)
    h = keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True, unroll=True),
                                   name="bi")(h)
    h = keras.layers.Dense(5, activation="tanh", name="dense")(h)
    out = keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(ids, out)
