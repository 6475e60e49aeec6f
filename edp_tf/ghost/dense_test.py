"""Dense and EinsumDense ghost rules: per-example norms equal the plain loop's, on both the Gram
and the direct branch and with LoRA factors, and the einsum plans the rule accepts or refuses."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import ghost, microbatch
from edp_tf.ghost import capture
from edp_tf.testing import assert_fast_norms_exact, mse

_KERNELS = ["covered/kernel", "head/kernel"]  # the variables the models' rules cover

def dense_model(din, dout):
    inp = keras.Input((6, din))
    h = keras.layers.Flatten()(keras.layers.Dense(dout, activation="tanh", name="covered")(inp))
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), list(_KERNELS)


def einsum_model(equation, output_shape, bias_axes, input_shape):
    inp = keras.Input(input_shape)
    h = keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, activation="relu",
                                 name="covered")(inp)
    h = keras.layers.Flatten()(h)
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), list(_KERNELS)


def with_lora(build, rank=2):
    """`build`'s model with LoRA on its covered layer; B random (Keras starts it at 0, where A's
    gradient would be 0 and the test would prove nothing)."""
    def lora_build():
        model, _ = build()
        layer = model.get_layer("covered")
        layer.enable_lora(rank, lora_alpha=3)
        b = layer.lora_kernel_b
        b.assign(np.random.default_rng(1).normal(size=b.shape).astype("float32"))
        return model, ["covered/lora_kernel_a", "covered/lora_kernel_b", "head/kernel"]
    return lora_build


class _MatrixLoRA(keras.layers.EinsumDense):
    """A [contracted axes, r], B [r, output axes]: edp_nlu/models/bert/finetuning.py's layout,
    rebuilt here (edp_tf's tests import nothing from edp_nlu/models/)."""

    @property
    def kernel(self):
        if not self.lora_enabled:
            return super().kernel
        s = self.lora_alpha / self.lora_rank
        return self._kernel + s * keras.ops.tensordot(self.lora_kernel_a, self.lora_kernel_b, 1)


def with_matrix_lora(build, contracted: int, rank=2):
    def lora_build():
        model, _ = build()
        layer = model.get_layer("covered")
        layer.__class__ = _MatrixLoRA
        shape = tuple(layer._kernel.shape)
        layer._tracker.unlock()
        layer.lora_kernel_a = layer.add_weight(name="lora_kernel_a",
                                               shape=shape[:contracted] + (rank,))
        layer.lora_kernel_b = layer.add_weight(name="lora_kernel_b",
                                               shape=(rank,) + shape[contracted:])
        layer._kernel.trainable = False
        layer._tracker.lock()
        layer.lora_enabled, layer.lora_rank, layer.lora_alpha = True, rank, 3
        rng = np.random.default_rng(1)
        for v in (layer.lora_kernel_a, layer.lora_kernel_b):
            v.assign(rng.normal(size=v.shape).astype("float32"))
        return model, ["covered/lora_kernel_a", "covered/lora_kernel_b", "head/kernel"]
    return lora_build


MODELS = {
    "dense_gram": lambda: dense_model(24, 24),  # P (Din + Dout) < Din Dout: Gram matrices
    "dense_direct": lambda: dense_model(3, 2),  # tiny weight: per-micro-batch gradient is cheaper
    "einsum_qkv": lambda: einsum_model("abc,cde->abde", (6, 2, 3), "de", (6, 4)),
    "einsum_attention_output": lambda: einsum_model("abcd,cde->abe", (6, 5), "e", (6, 2, 3)),
    "einsum_ellipsis_transposed_kernel": lambda: einsum_model("...b,cb->...c", 4, None, (6, 3)),
    "dense_lora": with_lora(lambda: dense_model(5, 4)),
    "einsum_qkv_lora": with_lora(lambda: einsum_model("abc,cde->abde", (6, 2, 3), "de", (6, 4))),
    "einsum_attention_output_lora": with_lora(
        lambda: einsum_model("abcd,cde->abe", (6, 5), "e", (6, 2, 3))),
    # B over both output axes (heads, per-head size): A [Din, r], B [r, heads, dout]
    "einsum_qkv_matrix_lora": with_matrix_lora(
        lambda: einsum_model("abc,cde->abde", (6, 2, 3), "de", (6, 4)), contracted=1),
    "einsum_attention_output_matrix_lora": with_matrix_lora(
        lambda: einsum_model("abcd,cde->abe", (6, 5), "e", (6, 2, 3)), contracted=2),
}


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_fast_norms_match_per_example_gradients(name, k):
    keras.utils.set_random_seed(3)
    assert_fast_norms_exact(*MODELS[name](), k)


def test_lora_rule_keeps_the_forward_pass():
    """The rule's z + s (a A) B equals Keras' own LoRA forward (merged kernel) for each case."""
    for name in ("dense_lora", "einsum_qkv_lora", "einsum_attention_output_lora",
                 "einsum_qkv_matrix_lora", "einsum_attention_output_matrix_lora"):
        keras.utils.set_random_seed(4)
        model, _ = MODELS[name]()
        x = np.random.default_rng(0).normal(size=(3,) + tuple(model.inputs[0].shape[1:]))
        x = x.astype("float32")

        @tf.function(autograph=False)
        def hooked():
            with capture(model, model.trainable_variables):
                return model(x)

        np.testing.assert_allclose(hooked().numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_lora_on_a_summed_kernel_axis_falls_back_with_a_reason():
    """"ac,dc->ad": the last kernel axis (c) is contracted, which the rule does not cover.
    (Per-example inputs of rank 2: a rank-3 one would make keras' own einsum the BatchMatMul
    that edp_tf/onednn_guard.py refuses under oneDNN.)"""
    keras.utils.set_random_seed(2)
    inp = keras.Input((3,))
    layer = keras.layers.EinsumDense("ac,dc->ad", 4, name="covered")
    model = keras.Model(inp, keras.layers.Dense(2, name="head")(layer(inp)))
    layer.enable_lora(2)
    x, y = np.ones((4, 3), "float32"), np.ones((4, 2), "float32")
    variables = model.trainable_variables
    reasons = {}

    @tf.function(autograph=False)
    def run():
        p = microbatch.ghost_pass(model, mse, variables, x, y, tf.ones([4]), 1, 1.0)
        reasons.update({variables[i].path: r for i, r in p.plan.reasons.items()})
        return 0

    run()
    assert "factor B holds a summed kernel axis" in reasons["covered/lora_kernel_a"]


def test_einsum_plans():
    assert ghost.dense.einsum_plan("abc,cde->abde", 3) == ("abc", "cde", "abde")
    inp, ker, out = ghost.dense.einsum_plan("...b,bc->...c", 4)
    assert len(inp) == 4 and inp[-1] == "b" and out[:-1] == inp[:-1] and ker == "bc"
    assert ghost.dense.einsum_plan("ab,ab->ab", 2) is None  # a letter in all three operands
    assert ghost.dense.einsum_plan("abc,cd->ad", 3) is None  # b summed away without the kernel
