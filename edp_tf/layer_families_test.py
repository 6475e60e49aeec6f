"""Per-example clipping is exact for the Keras layers users reach for (a layer no method can
vectorise is clipped one micro-batch at a time, automatically).

Each model's clipped sum (every per-example method it is allowed with) is compared with the
definition computed by a plain loop of one GradientTape per micro-batch (edp_tf/testing.py).
"""
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import DPConfig, PrivateModel, make_strategy, microbatch, per_example_loss
from edp_tf.testing import loop_clipped_sum, loop_gradients, mse


def _ids_input():
    return keras.Input((6,), dtype="int32")


def recurrent(layer_cls, unroll):
    def build():
        inp = _ids_input()
        h = keras.layers.Embedding(10, 4, mask_zero=True)(inp)
        h = layer_cls(3, unroll=unroll)(h)
        return keras.Model(inp, keras.layers.Dense(2)(h))
    return build


def conv1d():
    inp = _ids_input()
    h = keras.layers.Embedding(10, 4)(inp)
    h = keras.layers.Conv1D(3, 2, activation="relu")(h)
    return keras.Model(inp, keras.layers.Dense(2)(keras.layers.GlobalMaxPooling1D()(h)))


def layer_norm():
    inp = _ids_input()
    h = keras.layers.LayerNormalization()(keras.layers.Embedding(10, 4)(inp))
    return keras.Model(inp, keras.layers.Dense(2)(keras.layers.Flatten()(h)))


def attention():
    inp = _ids_input()
    h = keras.layers.Embedding(10, 4)(inp)
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)(h, h)
    return keras.Model(inp, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(h)))


def shared_dense():
    """One Dense applied twice: its kernel's per-example gradient is the sum of two uses."""
    inp = _ids_input()
    h = keras.layers.Embedding(10, 4)(inp)
    shared = keras.layers.Dense(4, activation="tanh")
    h = shared(shared(h))
    return keras.Model(inp, keras.layers.Dense(2)(keras.layers.Flatten()(h)))


def tied_embedding():
    """The token table reused as the output projection (BERT-style weight tying)."""
    inp = _ids_input()
    table = keras.layers.ReversibleEmbedding(10, 4)
    logits = table(table(inp), reverse=True)  # [b, 6, 10]
    h = keras.layers.GlobalAveragePooling1D()(logits)
    return keras.Model(inp, keras.layers.Dense(2)(h))


MODELS = {
    "gru_not_unrolled": recurrent(keras.layers.GRU, False),
    "lstm_not_unrolled": recurrent(keras.layers.LSTM, False),
    "simple_rnn_unrolled": recurrent(keras.layers.SimpleRNN, True),
    "gru_unrolled": recurrent(keras.layers.GRU, True),
    "conv1d": conv1d,
    "layer_norm": layer_norm,
    "attention": attention,
    "shared_dense": shared_dense,
    "tied_embedding": tied_embedding,
}
NOT_VECTORISABLE = {"gru_not_unrolled", "lstm_not_unrolled"}


def _data(n=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 10, size=(n, 6)).astype("int32")
    x[1, 3:] = 0  # padding: masked where the model masks
    x[:, 2] = x[:, 0]  # a repeated id
    y = rng.normal(size=(n, 2)).astype("float32")
    return x, y


def _cases():
    for name in MODELS:
        for method in ("ghost", "vectorized", "loop"):
            if name in NOT_VECTORISABLE and method != "loop":
                continue
            yield name, method


_REFERENCE = {}  # model name: loop_gradients' micro-batch gradients of its seeded model


@pytest.mark.parametrize("name, method", list(_cases()))
def test_clipped_sum_is_exact(name, method):
    keras.utils.set_random_seed(3)
    model = MODELS[name]()
    variables = model.trainable_variables
    x, y = _data()
    w = np.ones(len(x), "float32")
    w[5] = 0.0  # a padded row contributes nothing
    k = 2
    rng = np.random.default_rng(1)
    alpha = tuple(float(a) for a in rng.uniform(0.5, 2.0, len(variables)))
    # the methods of one model share its loop (the same seed builds the same weights)
    if name not in _REFERENCE:
        _REFERENCE[name] = loop_gradients(model, mse, x, y, w, k, float(k))
    reference = _REFERENCE[name]
    C = float(np.median(loop_clipped_sum(reference, alpha, 1e9)[1]))  # about half clipped
    want, want_norms, _ = loop_clipped_sum(reference, alpha, C)
    result, losses, y_pred = tf.function(lambda: microbatch.clipped_gradient_sum(
        model, mse, variables, x, y, tf.constant(w), k, float(k), alpha, C, method),
        autograph=False)()
    np.testing.assert_allclose(result.norms.numpy(), want_norms, rtol=1e-4)
    for v, got, expected in zip(variables, result.clipped_sum, want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=2e-4, atol=1e-6, err_msg=v.path)
    assert losses.shape == (len(x) // k,)
    assert tuple(tf.nest.flatten(y_pred)[0].shape) == (len(x), 2)


@pytest.mark.parametrize("name", sorted(NOT_VECTORISABLE))
def test_recurrent_layer_that_is_not_unrolled_falls_back_to_the_loop_exactly(name, caplog):
    """Keras' default GRU / LSTM (unroll=False) trains per example without a flag: the library
    clips those micro-batches one at a time, exactly as per_example_method='loop' does, and says
    so once."""
    strategy = make_strategy(1)
    x, y = _data()
    keras.utils.set_random_seed(5)
    init = MODELS[name]().get_weights()
    trained = {}
    for method in ("ghost", "loop"):
        with strategy.scope():
            model = MODELS[name]()
            model.set_weights(init)
            private = PrivateModel(model, DPConfig(microbatch_size=1, noise_multiplier=0.0,
                                                   l2_norm_clip=0.1, per_example_method=method))
            private.compile(optimizer=keras.optimizers.SGD(0.5), loss=mse)
        with caplog.at_level(logging.INFO, logger="edp_tf.step_method"):
            private.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        trained[method] = model.get_weights()
    assert [r for r in caplog.records if "cannot be vectorised" in r.getMessage()]
    assert any(not np.allclose(a, b) for a, b in zip(init, trained["ghost"]))
    for got, want in zip(trained["ghost"], trained["loop"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_loop_method_trains_a_recurrent_layer_that_is_not_unrolled(strategy):
    """On the shared strategy's 2 replicas."""
    x, y = _data(16)
    with strategy.scope():
        model = MODELS["gru_not_unrolled"]()
        private = PrivateModel(model, DPConfig(microbatch_size=1, noise_multiplier=0.0,
                                               per_example_method="loop"),
                               training_statistics=True)
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    before = [v.numpy().copy() for v in model.trainable_variables]
    history = private.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert any(not np.allclose(b, v.numpy()) for b, v in zip(before, model.trainable_variables))


@pytest.mark.parametrize("method", ["ghost", "loop"])
def test_a_loss_per_output_with_weights_and_sample_weights_is_clipped_exactly(method):
    """What `PrivateModel.compile(loss={...}, loss_weights={...})` derives, with sample weights
    and about half the examples clipped: the clipped sum is the definition's (edp_tf.testing's
    loop over the weighted sum of the outputs' losses)."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(6, activation="tanh")(inputs)
    model = keras.Model(inputs, {"cls": keras.layers.Dense(3, name="cls")(h),
                                 "reg": keras.layers.Dense(1, name="reg")(h)})
    rng = np.random.default_rng(2)
    x = rng.normal(size=(12, 5)).astype("float32")
    y = {"cls": rng.integers(0, 3, size=(12,)), "reg": rng.normal(size=(12, 1)).astype("float32")}
    w = rng.uniform(0.2, 1.0, size=12).astype("float32")
    w[3] = 0.0
    loss = per_example_loss.as_per_example_loss(
        {"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
        {"cls": 1.0, "reg": 0.25})
    variables = model.trainable_variables
    alpha = (1.0,) * len(variables)
    reference = loop_gradients(model, loss, x, y, w, 1, 1.0)
    C = float(np.median(loop_clipped_sum(reference, alpha, 1e9)[1]))
    want, want_norms, _ = loop_clipped_sum(reference, alpha, C)
    result, _, _ = tf.function(lambda: microbatch.clipped_gradient_sum(
        model, loss, variables, x, y, tf.constant(w), 1, 1.0, alpha, C, method), autograph=False)()
    np.testing.assert_allclose(result.norms.numpy(), want_norms, rtol=1e-4)
    assert 0 < int(np.sum(want_norms > C)) < len(x)  # the clip acts on some, not all
    for v, got, expected in zip(variables, result.clipped_sum, want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=2e-4, atol=1e-6, err_msg=v.path)
