"""Dense and EinsumDense ghost rules: per-example norms equal the plain loop's, on both the Gram
and the direct branch, and the einsum plans the rule accepts or refuses."""
import keras
import pytest

from edp_tf import ghost
from edp_tf.testing import assert_fast_norms_exact


def dense_model(din, dout):
    inp = keras.Input((6, din))
    h = keras.layers.Flatten()(keras.layers.Dense(dout, activation="tanh", name="covered")(inp))
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), ["covered/kernel", "head/kernel"]


def einsum_model(equation, output_shape, bias_axes, input_shape):
    inp = keras.Input(input_shape)
    h = keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, activation="relu",
                                 name="covered")(inp)
    h = keras.layers.Flatten()(h)
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), ["covered/kernel", "head/kernel"]


MODELS = {
    "dense_gram": lambda: dense_model(24, 24),  # P (Din + Dout) < Din Dout: Gram matrices
    "dense_direct": lambda: dense_model(3, 2),  # tiny weight: per-micro-batch gradient is cheaper
    "einsum_qkv": lambda: einsum_model("abc,cde->abde", (6, 2, 3), "de", (6, 4)),
    "einsum_attention_output": lambda: einsum_model("abcd,cde->abe", (6, 5), "e", (6, 2, 3)),
    "einsum_ellipsis_transposed_kernel": lambda: einsum_model("...b,cb->...c", 4, None, (6, 3)),
}


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_fast_norms_match_per_example_gradients(name, k):
    keras.utils.set_random_seed(3)
    assert_fast_norms_exact(*MODELS[name](), k)


def test_einsum_plans():
    assert ghost.dense.einsum_plan("abc,cde->abde", 3) == ("abc", "cde", "abde")
    inp, ker, out = ghost.dense.einsum_plan("...b,bc->...c", 4)
    assert len(inp) == 4 and inp[-1] == "b" and out[:-1] == inp[:-1] and ker == "bc"
    assert ghost.dense.einsum_plan("ab,ab->ab", 2) is None  # a letter in all three operands
    assert ghost.dense.einsum_plan("abc,cd->ad", 3) is None  # b summed away without the kernel
