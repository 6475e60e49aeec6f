"""A model whose state would learn from the private batches outside the clip is refused before the
first step; a model without such state trains as before."""
import keras
import numpy as np
import pytest

from edp_tf import DPConfig, PrivateModel, model_state
from edp_tf.testing import mse, small_regression


def _model(middle=None):
    inputs = keras.Input((5,))
    h = keras.layers.Dense(6)(inputs)
    if middle is not None:
        h = middle(h)
    h = keras.layers.Dropout(0.1)(h)  # its seed state advances every call: not data
    return keras.Model(inputs, keras.layers.Dense(3)(h))


def _fit(model, **private_kwargs):
    x, y = small_regression()
    private = PrivateModel(model, DPConfig(noise_multiplier=1.0, microbatch_size=1),
                           training_statistics=True, **private_kwargs)
    private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    return private.fit(x, y, batch_size=16, epochs=1, verbose=0)


@pytest.mark.parametrize("microbatch_size", [None, 1])
def test_batch_normalization_is_refused_before_any_step(microbatch_size):
    bn = keras.layers.BatchNormalization(name="bn")
    model = _model(bn)
    x, y = small_regression()
    model(x[:2])
    before = [v.numpy().copy() for v in model.variables]
    private = PrivateModel(model, DPConfig(noise_multiplier=1.0, microbatch_size=microbatch_size))
    private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    with pytest.raises(ValueError, match=r"'bn' \(BatchNormalization\).*LayerNormalization"):
        private.fit(x, y, batch_size=16, epochs=1, verbose=0)
    for old, v in zip(before, model.variables):  # nothing trained, no statistic moved
        np.testing.assert_array_equal(old, v.numpy())


def test_a_custom_layer_with_running_statistics_is_refused():
    class RunningMean(keras.layers.Layer):
        def build(self, shape):
            self.mean = self.add_weight(shape=shape[1:], initializer="zeros", trainable=False)

        def call(self, x, training=False):
            if training:
                self.mean.assign(0.9 * self.mean + 0.1 * keras.ops.mean(x, axis=0))
            return x - self.mean

    with pytest.raises(ValueError, match="running_mean"):
        _fit(_model(RunningMean(name="running_mean")))


def test_frozen_batch_normalization_and_layer_normalization_train():
    bn = keras.layers.BatchNormalization(name="bn")
    bn.trainable = False  # Keras 3 runs a frozen BatchNormalization in inference mode
    assert np.isfinite(_fit(_model(bn)).history["loss"][0])
    assert np.isfinite(_fit(_model(keras.layers.LayerNormalization())).history["loss"][0])


def test_adapted_preprocessing_needs_a_public_declaration():
    x, _ = small_regression()
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(x)
    inputs = keras.Input((5,))
    model = keras.Model(inputs, keras.layers.Dense(3)(norm(inputs)))
    with pytest.raises(ValueError, match=r"'norm' \(Normalization\).*public_layers"):
        _fit(model)
    history = _fit(model, public_layers=["norm"])
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match=r"public_layers names no layer.*'nrom'"):
        _fit(model, public_layers=["nrom"])


def test_the_check_reads_no_values_and_changes_nothing():
    bn = keras.layers.BatchNormalization(name="bn")
    model = _model(bn)
    x = np.full((8, 5), np.nan, np.float32)  # shapes only: NaN would poison any real pass
    model(x[:1])
    before = [v.numpy().copy() for v in model.variables]
    assert model_state.state_assigned_in_training(model, x) == ["'bn' (BatchNormalization)"]
    for old, v in zip(before, model.variables):
        np.testing.assert_array_equal(old, v.numpy())


def test_a_recurrent_cell_with_running_statistics_is_refused_and_stays_unrolled():
    """The check traces unrolled recurrent layers as loops (cheaper): a cell that assigns state
    inside the loop is still found, and the layers are unrolled again afterwards."""
    class RunningCell(keras.layers.Layer):
        state_size = 4

        def build(self, shape):
            self.kernel = self.add_weight(shape=(shape[-1], 4))
            self.mean = self.add_weight(shape=(4,), initializer="zeros", trainable=False)

        def call(self, x, states, training=False):
            h = keras.ops.tanh(x @ self.kernel + states[0])
            if training:
                self.mean.assign(0.9 * self.mean + 0.1 * keras.ops.mean(h, axis=0))
            return h, [h]

    def model(cell):
        inputs = keras.Input((3, 5))
        rnn = keras.layers.RNN(cell, unroll=True, name="rnn")
        return keras.Model(inputs, keras.layers.Dense(2)(rnn(inputs))), rnn

    x = np.zeros((2, 3, 5), np.float32)
    running, rnn = model(RunningCell(name="running_cell"))
    assert model_state.state_assigned_in_training(running, x)
    assert rnn.unroll
    plain, rnn = model(keras.layers.SimpleRNNCell(4))
    assert model_state.state_assigned_in_training(plain, x) == []
    assert rnn.unroll


def test_declaring_a_layer_public_declares_the_layers_it_holds():
    """TextVectorization adapts a StringLookup of its own, named automatically: naming the outer
    layer covers it; a layer not named stays refused, under the name the user gave it (its
    inner, auto-named lookup is adapted by it and never named)."""
    tv = keras.layers.TextVectorization(output_sequence_length=4, name="tv")
    tv.adapt(["call my mother", "what is the weather"])
    other = keras.layers.TextVectorization(output_sequence_length=4, name="other")
    other.adapt(["refill the order"])
    inputs = keras.Input((), dtype="string")
    ids = keras.layers.Concatenate()([tv(inputs), other(inputs)])
    model = keras.Model(inputs, keras.layers.Embedding(20, 2)(ids))
    def held(layer):
        return {f"{inner.name!r} ({type(inner).__name__})"
                for inner in layer._flatten_layers(include_self=False)}

    assert held(tv) and held(other)  # the StringLookup each holds
    outer = {"'tv' (TextVectorization)", "'other' (TextVectorization)"}
    assert set(model_state.adaptable_layers(model)) == outer
    assert model_state.adaptable_layers(model, ["tv"]) == ["'other' (TextVectorization)"]
    assert model_state.adaptable_layers(model, ["tv", "other"]) == []
    with pytest.raises(ValueError, match=r"'other' \(TextVectorization\).*make_private\(\.\.\., "
                                         r"public_layers=\[\.\.\.\]\)"):
        model_state.refuse_state_outside_the_clip(model, keras.ops.convert_to_tensor(
            ["refill the order"]), ["tv"])
