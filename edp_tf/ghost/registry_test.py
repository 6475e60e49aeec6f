"""The public registry: a user's own layer gets ghost norms by registering a rule, and they are
the exact per-example norms (the reference: one GradientTape per example, no hooks)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import ghost, microbatch


class Projection(keras.layers.Layer):
    """A user layer: x @ W, with its own `call` (no built-in rule covers it)."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 3), initializer="glorot_uniform", name="w")

    def call(self, x):
        return tf.matmul(x, self.w)


def projection_rule(cap, layer, x):
    w = cap.weight(layer.w, "matmul")
    rows, z = ghost.flat_matmul(cap, tf.convert_to_tensor(x), cap.read(w, layer.w))
    cap.add(w, ghost.Use("matmul", rows, z, lambda dz: dz))
    return z


def mse(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)


def model_and_data():
    keras.utils.set_random_seed(3)
    inp = keras.Input((5,))
    out = keras.layers.Dense(2, name="head")(keras.ops.tanh(Projection(name="proj")(inp)))
    model = keras.Model(inp, out)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 5)), tf.float32)
    y = tf.constant(rng.normal(size=(8, 2)), tf.float32)
    return model, x, y


def ghost_squares(model, x, y):
    variables = model.trainable_variables
    fn = tf.function(lambda: microbatch.per_variable_squared_norms(
        model, mse, variables, x, y, tf.ones([8]), 1, 1.0), autograph=False)
    squares, ghost_indices = fn()
    return squares.numpy(), [variables[i].path for i in ghost_indices]


def exact_squares(model, x, y):
    rows = []
    for i in range(8):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(mse(y[i:i + 1], model(x[i:i + 1], training=True)))
        rows.append([float(tf.reduce_sum(tf.square(g)))
                     for g in tape.gradient(loss, model.trainable_variables)])
    return np.array(rows)


@pytest.fixture
def registered_projection():
    ghost.register(Projection, projection_rule)
    yield
    ghost.unregister(Projection)


def test_unregistered_layer_falls_back_to_exact_gradients():
    model, x, y = model_and_data()
    squares, ghosted = ghost_squares(model, x, y)
    assert not any("proj" in p for p in ghosted) and any("head" in p for p in ghosted)
    np.testing.assert_allclose(squares, exact_squares(model, x, y), rtol=1e-5, atol=1e-7)


def test_registered_rule_gives_exact_ghost_norms(registered_projection):
    assert Projection in ghost.registered()
    model, x, y = model_and_data()
    squares, ghosted = ghost_squares(model, x, y)
    assert any("proj" in p for p in ghosted)  # the rule was used, not the fallback
    np.testing.assert_allclose(squares, exact_squares(model, x, y), rtol=1e-5, atol=1e-7)


def test_a_subclass_with_its_own_call_and_a_declined_instance_keep_exact_gradients(
        registered_projection):
    class Doubled(Projection):
        def call(self, x):
            return 2.0 * super().call(x)

    assert ghost.rule_for(Doubled()) is None
    assert ghost.rule_for(Projection()) is projection_rule
    ghost.register(Projection, projection_rule, applies=lambda layer: layer.name == "other")
    assert ghost.rule_for(Projection(name="proj")) is None


def test_register_checks_its_arguments():
    with pytest.raises(ValueError, match="layer class"):
        ghost.register("Dense", projection_rule)
    with pytest.raises(ValueError, match="callable rule"):
        ghost.register(Projection, None)
