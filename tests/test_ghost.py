"""Ghost norms (edp_tf/ghost/) against the per-example gradients they replace.

The reference is a plain loop: one GradientTape per micro-batch, no vectorisation, no hooks.
Every test also checks that the weights meant to use ghost norms did (a silent fallback would
make the comparison pass without testing anything).
"""
import math
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import ghost, microbatch
from tests.reference import loop_clipped_sum, loop_gradients, mse


def squared_norms_by_ghost(model, loss_fn, x, y, w, k, k_e):
    variables = model.trainable_variables
    fn = tf.function(lambda: microbatch.per_variable_squared_norms(
        model, loss_fn, variables, x, y, tf.constant(w), k, k_e))
    squares, ghost_indices = fn()
    return squares.numpy(), ghost_indices


def names(model, indices):
    """Variable paths without keras' uniquifying suffixes (forward_lstm_3 -> forward_lstm)."""
    variables = model.trainable_variables
    return sorted(re.sub(r"_\d+(?=/)", "", variables[i].path) for i in indices)


# ------------------------------------------------------------------------ models, one per rule
def seq_input(shape, dtype="float32"):
    return keras.Input(shape, dtype=dtype)


def dense_model(din, dout):
    inp = seq_input((6, din))
    h = keras.layers.Flatten()(keras.layers.Dense(dout, activation="tanh", name="covered")(inp))
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), ["covered/kernel", "head/kernel"]


def einsum_model(equation, output_shape, bias_axes, input_shape):
    inp = seq_input(input_shape)
    h = keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, activation="relu",
                                 name="covered")(inp)
    h = keras.layers.Flatten()(h)
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), ["covered/kernel", "head/kernel"]


def embedding_model(reversible=False):
    inp = seq_input((7,), "int32")
    layer = (keras.layers.ReversibleEmbedding(11, 5, name="covered") if reversible
             else keras.layers.Embedding(11, 5, name="covered"))
    h = keras.layers.Flatten()(layer(inp))
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), ["covered/embeddings",
                                                                      "head/kernel"]


def lstm_model():
    inp = seq_input((5,), "int32")
    h = keras.layers.Embedding(9, 4, mask_zero=True, name="emb")(inp)
    h = keras.layers.Bidirectional(keras.layers.LSTM(3, unroll=True), name="bi")(h)
    model = keras.Model(inp, keras.layers.Dense(2, name="head")(h))
    covered = ["emb/embeddings", "head/kernel"] + [
        f"bi/{d}_lstm/lstm_cell/{v}" for d in ("forward", "backward")
        for v in ("kernel", "recurrent_kernel")]
    return model, covered


def data_for(model, n=8, seed=0):
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


RULE_MODELS = {
    "dense_gram": lambda: dense_model(24, 24),  # P (Din + Dout) < Din Dout: Gram matrices
    "dense_direct": lambda: dense_model(3, 2),  # tiny weight: per-micro-batch gradient is cheaper
    "einsum_qkv": lambda: einsum_model("abc,cde->abde", (6, 2, 3), "de", (6, 4)),
    "einsum_attention_output": lambda: einsum_model("abcd,cde->abe", (6, 5), "e", (6, 2, 3)),
    "einsum_ellipsis_transposed_kernel": lambda: einsum_model("...b,cb->...c", 4, None, (6, 3)),
    "embedding": lambda: embedding_model(),
    "reversible_embedding": lambda: embedding_model(reversible=True),
    "lstm_unrolled": lstm_model,
}


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name", list(RULE_MODELS))
def test_fast_norms_match_per_example_gradients(name, k):
    keras.utils.set_random_seed(3)
    model, covered = RULE_MODELS[name]()
    x, y = data_for(model)
    w = np.ones(len(x), "float32")
    squares, ghost_indices = squared_norms_by_ghost(model, mse, x, y, w, k, float(k))
    assert names(model, ghost_indices) == sorted(covered)
    want = np.array([[float(np.sum(g ** 2)) for g in grads]
                     for grads in loop_gradients(model, mse, x, y, w, k, float(k))])
    assert squares.shape == want.shape
    # float32 sums of a few hundred terms: relative error ~1e-6; 1e-4 leaves margin.
    np.testing.assert_allclose(squares, want, rtol=1e-4, atol=1e-9)


def test_gram_and_direct_branches_are_the_ones_tested():
    assert ghost.norms.use_gram(6, 24, 24) and not ghost.norms.use_gram(6, 3, 2)
    assert ghost.norms.use_gram(None, 3, 2)


# ------------------------------------------------------------------------ the full fast path
def mixed_model():
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


@pytest.mark.parametrize("k", [1, 2])
def test_clipped_sum_matches_plain_loop_with_scales_and_a_nonfinite_example(k):
    keras.utils.set_random_seed(5)
    model = mixed_model()
    variables = model.trainable_variables
    x, y = data_for(model)
    x = x % 13
    y[5, 0] = np.nan  # example 5 (micro-batch 5 // k) has a NaN loss
    w = np.ones(len(x), "float32")
    w[6] = 0.0  # a padded row (Poisson sampling) contributes nothing
    k_e = float(k)
    rng = np.random.default_rng(0)
    alpha = tuple(float(a) for a in rng.uniform(0.5, 2.0, len(variables)))
    reference = loop_gradients(model, mse, x, y, w, k, k_e)
    finite_norms = [n for n in loop_clipped_sum(reference, alpha, 1e9)[1] if math.isfinite(n)]
    C = float(np.median(finite_norms))  # about half the micro-batches are clipped
    want, want_norms, want_finite = loop_clipped_sum(reference, alpha, C)

    fn = tf.function(lambda: microbatch.clipped_gradient_sum(
        model, mse, variables, x, y, tf.constant(w), k, k_e, alpha, C))
    result, losses, _ = fn()
    np.testing.assert_array_equal(result.finite.numpy(), want_finite)
    assert not want_finite[5 // k] and want_finite.sum() == len(want_finite) - 1
    np.testing.assert_allclose(result.norms.numpy()[want_finite], want_norms[want_finite],
                               rtol=1e-4)
    for v, got, expected in zip(variables, result.clipped_sum, want):
        got = got.numpy()
        assert np.all(np.isfinite(got)), v.path
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-6, err_msg=v.path)
    plan_squares, ghost_indices = squared_norms_by_ghost(model, mse, x, np.nan_to_num(y), w, k, k_e)
    assert names(model, ghost_indices) == sorted(
        ["emb/embeddings", "qkv/kernel", "dense/kernel", "head/kernel"]
        + [f"bi/{d}_lstm/lstm_cell/{v}" for d in ("forward", "backward")
           for v in ("kernel", "recurrent_kernel")])


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

    @tf.function
    def run():
        p = microbatch.ghost_pass(model, mse, variables, x, y, tf.constant(w), 1, 1.0)
        captured["reasons"] = {variables[i].path: r for i, r in p.plan.reasons.items()}
        return microbatch.per_variable_squared_norms(model, mse, variables, x, y, w, 1, 1.0)

    (squares, ghost_indices) = run()
    assert "outside its layer" in captured["reasons"]["tied/kernel"]
    assert names(model, ghost_indices) == ["head/kernel"]
    want = np.array([[float(np.sum(g ** 2)) for g in grads]
                     for grads in loop_gradients(model, mse, x, y, w, 1, 1.0)])
    np.testing.assert_allclose(squares.numpy(), want, rtol=1e-4, atol=1e-9)


def test_hooks_keep_the_forward_pass_and_are_removed():
    keras.utils.set_random_seed(9)
    model = mixed_model()
    x, _ = data_for(model)
    x = x % 13

    @tf.function
    def hooked():
        with ghost.capture(model, model.trainable_variables) as cap:
            out = model(x, training=False)
        return out, len(cap.weights)

    out, recorded = hooked()
    assert int(recorded) == 8  # emb, qkv, 4 LSTM matrices, dense, head
    np.testing.assert_allclose(out.numpy(), model(x, training=False).numpy(), rtol=1e-5, atol=1e-6)
    assert all("call" not in layer.__dict__ for layer in model._flatten_layers())


def test_einsum_plans():
    assert ghost.dense.einsum_plan("abc,cde->abde", 3) == ("abc", "cde", "abde")
    inp, ker, out = ghost.dense.einsum_plan("...b,bc->...c", 4)
    assert len(inp) == 4 and inp[-1] == "b" and out[:-1] == inp[:-1] and ker == "bc"
    assert ghost.dense.einsum_plan("ab,ab->ab", 2) is None  # a letter in all three operands
    assert ghost.dense.einsum_plan("abc,cd->ad", 3) is None  # b summed away without the kernel


def test_per_example_method_names_are_checked():
    from edp_tf import DPConfig

    with pytest.raises(ValueError, match="per_example_method"):
        DPConfig(microbatch_size=1, per_example_method="jacobian")
    with pytest.raises(ValueError, match="per-example method"):
        microbatch.clipped_gradient_sum(None, None, [], {}, {}, None, 1, 1.0, [], 1.0, "jacobian")


def test_single_clip_zeroes_a_nonfinite_gradient_exactly():
    def clip(grads):
        return microbatch.SingleGradient(grads, None, None, [1.0] * len(grads)).clip(1.0)

    result = clip([tf.constant([1.0, np.nan]), tf.constant([[2.0]])])
    assert not bool(result.finite[0])
    assert all(np.all(g.numpy() == 0.0) for g in result.clipped_sum)
    result = clip([tf.constant([3.0, 4.0])])
    np.testing.assert_allclose(result.clipped_sum[0].numpy(), [0.6, 0.8], rtol=1e-6)


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
