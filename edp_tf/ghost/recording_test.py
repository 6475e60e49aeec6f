"""Recording: the hooks keep the forward pass and are removed; a weight read outside its layer
falls back to exact gradients."""

import keras
import numpy as np
import tensorflow as tf

from edp_tf import ghost, microbatch
from edp_tf.testing import data_for, loop_gradients, mixed_model, mse, variable_names


class KernelPenalty(keras.layers.Layer):
    """Reads another layer's kernel in its own call: that kernel is used outside its layer."""

    def __init__(self, dense, **kwargs):
        super().__init__(**kwargs)
        self.dense = dense

    def call(self, h):
        return h + 0.1 * tf.reduce_sum(tf.square(self.dense.kernel))


def test_weight_read_outside_its_layer_falls_back_and_stays_exact():
    keras.utils.set_random_seed(7)
    inp = keras.Input((4, 3))
    dense = keras.layers.Dense(5, name="tied")
    h = KernelPenalty(dense)(dense(inp))
    model = keras.Model(inp, keras.layers.Dense(2, name="head")(keras.layers.Flatten()(h)))
    x, y = data_for(model)
    w = np.ones(len(x), "float32")
    variables = model.trainable_variables
    captured = {}

    @tf.function(autograph=False)
    def run():
        p = microbatch.ghost_pass(model, mse, variables, x, y, tf.constant(w), 1, 1.0)
        captured["reasons"] = {variables[i].path: r for i, r in p.plan.reasons.items()}
        return microbatch.per_variable_squared_norms(model, mse, variables, x, y, w, 1, 1.0)

    (squares, ghost_indices) = run()
    assert "outside its layer" in captured["reasons"]["tied/kernel"]
    assert variable_names(model, ghost_indices) == ["head/kernel"]
    want = np.array([[float(np.sum(g ** 2)) for g in grads]
                     for grads in loop_gradients(model, mse, x, y, w, 1, 1.0)])
    np.testing.assert_allclose(squares.numpy(), want, rtol=1e-4, atol=1e-9)


def test_hooks_keep_the_forward_pass_and_are_removed():
    keras.utils.set_random_seed(9)
    model = mixed_model()
    x, _ = data_for(model)
    x = x % 13

    @tf.function(autograph=False)
    def hooked():
        with ghost.capture(model, model.trainable_variables) as cap:
            out = model(x, training=False)
        return out, len(cap.weights)

    out, recorded = hooked()
    assert int(recorded) == 8  # emb, qkv, 4 LSTM matrices, dense, head
    np.testing.assert_allclose(out.numpy(), model(x, training=False).numpy(), rtol=1e-5, atol=1e-6)
    assert all("call" not in layer.__dict__ for layer in model._flatten_layers())
