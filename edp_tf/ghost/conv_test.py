"""Conv1D and Conv2D ghost rules: per-example norms and the clipped sum equal the plain loop's,
for each padding, stride and dilation the rule covers; what it does not cover keeps exact
per-example gradients."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import microbatch
from edp_tf.testing import assert_fast_norms_exact, mse


def conv2d_model(**conv):
    inp = keras.Input((7, 6, 2))
    h = keras.layers.Conv2D(3, 3, activation="relu", name="covered", **conv)(inp)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h))


def conv1d_model(**conv):
    inp = keras.Input((9, 4))
    h = keras.layers.Conv1D(3, 3, activation="tanh", name="covered", **conv)(inp)
    h = keras.layers.GlobalMaxPooling1D()(h)
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h))


@pytest.mark.parametrize("build, conv, k", [
    (conv2d_model, {}, 1),
    (conv2d_model, {}, 2),  # micro-batches of 2: the rows of two examples in one norm
    (conv2d_model, {"padding": "same", "strides": 2}, 1),
    (conv2d_model, {"dilation_rate": 2}, 1),
    (conv1d_model, {"padding": "same"}, 1),
    (conv1d_model, {"strides": 2, "use_bias": False}, 2),
], ids=["2d", "2d_k2", "2d_same_stride2", "2d_dilated", "1d_same", "1d_stride2_nobias_k2"])
def test_conv_norms_and_clipped_sum_are_exact(build, conv, k):
    keras.utils.set_random_seed(4)
    assert_fast_norms_exact(build(**conv), ["covered/kernel", "head/kernel"], k)


def test_a_causal_conv1d_keeps_exact_per_example_gradients():
    keras.utils.set_random_seed(4)
    assert_fast_norms_exact(conv1d_model(padding="causal"), ["head/kernel"], 1)


def test_a_conv_over_inputs_of_unknown_length_keeps_exact_per_example_gradients():
    """The rule slices patches at sizes it must know: an input of unknown length falls back to
    the layer's own call (exact per-example gradients), saying why."""
    keras.utils.set_random_seed(4)
    inp = keras.Input((None, 4))
    h = keras.layers.Conv1D(3, 3, name="covered")(inp)
    model = keras.Model(inp, keras.layers.Dense(2, name="head")(
        keras.layers.GlobalMaxPooling1D()(h)))
    variables = model.trainable_variables
    x, y = np.ones((4, 9, 4), "float32"), np.ones((4, 2), "float32")
    reasons = {}

    @tf.function(input_signature=[tf.TensorSpec([None, None, 4])], autograph=False)
    def run(x):
        p = microbatch.ghost_pass(model, mse, variables, x, y, tf.ones([4]), 1, 1.0)
        reasons.update({variables[i].path: r for i, r in p.plan.reasons.items()})
        return 0

    run(x)
    assert reasons["covered/kernel"] == "a convolution over inputs of unknown size"
