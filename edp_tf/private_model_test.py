"""PrivateModel's step on 2 logical CPU replicas (edp_tf/conftest.py): ordinary training when
nothing is clipped or noised, non-finite micro-batches, the decay, chunks, and its errors."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer

from edp_tf import DPConfig, PrivateModel, microbatch, per_example_loss
from edp_tf.testing import mse, per_example_update, small_model, small_regression


@pytest.fixture(scope="module")
def ordinary_training():
    """Initial and final weights of plain Keras training on small_regression: every private
    variant below starts from the same weights and must end at the same ones."""
    x, y = small_regression()
    reference = small_model()
    init = reference.get_weights()
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return init, reference.get_weights()


@pytest.mark.parametrize("microbatch_size, physical", [(None, None), (1, None), (2, None),
                                                      (None, 2), (2, 2)])
def test_no_noise_huge_clip_equals_ordinary_training(strategy, ordinary_training,
                                                     microbatch_size, physical):
    """physical: replica batches processed in chunks of that many examples (same update)."""
    x, y = small_regression()
    init, trained = ordinary_training

    with strategy.scope():
        inner = small_model()
        inner.set_weights(init)
        private = PrivateModel(
            inner, DPConfig(l2_norm_clip=1e9, noise_multiplier=0.0,
                            microbatch_size=microbatch_size, physical_batch_size=physical),
            training_statistics=True)
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.MeanSquaredError())
    history = private.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(inner.get_weights(), trained):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert history.history["clipped_fraction"] == [0.0, 0.0]


def test_the_symbolic_build_opens_no_distributed_iterator(strategy, monkeypatch):
    """Keras builds from one element of a distributed iterator that the epoch iterator's
    `reset()` then destroys while the replicas' prefetch may still run (a SIGSEGV now and then
    under load); PrivateModel builds from the dataset itself, so the iterator of the first
    epoch is the only one opened before the first step. Keras' way opens two."""
    opened, before_first_step = [], []
    get_iterator = keras_tf_trainer.TFEpochIterator._get_iterator
    monkeypatch.setattr(keras_tf_trainer.TFEpochIterator, "_get_iterator",
                        lambda self: opened.append(1) or get_iterator(self))

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            before_first_step.append(len(opened))

    x, y = small_regression()
    with strategy.scope():
        private = PrivateModel(small_model(), DPConfig(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                       microbatch_size=1))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.MeanSquaredError())
    private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[FirstStep()])
    assert before_first_step[0] == 1


@pytest.mark.parametrize("microbatch_size", [1, 2])
def test_clipping_statistics_ignore_padding_rows(strategy, microbatch_size):
    """Poisson sampling pads batches with rows of weight 0, whose zero gradients are never above
    C: the clipped fraction and mean pre-clip norm must be those of the real micro-batches, the
    same as for a batch of only those rows (before, half-padded batches read 0.5 clipped)."""
    x, y = small_regression(seed=7)
    x, y = x[:16], y[:16]
    w = np.array([1.0 if i % 4 < 2 else 0.0 for i in range(16)], np.float32)  # 2 real per replica
    init = small_model().get_weights()

    def statistics(xs, ys, ws, batch):
        with strategy.scope():
            inner = small_model()
            inner.set_weights(init)
            private = PrivateModel(inner, DPConfig(l2_norm_clip=1e-6, noise_multiplier=0.0,
                                                   microbatch_size=microbatch_size),
                                   training_statistics=True)
            private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
        h = private.fit(xs, ys, sample_weight=ws, batch_size=batch, epochs=1, shuffle=False,
                        verbose=0).history
        return h["clipped_fraction"][0], h["preclip_norm"][0]

    padded = statistics(x, y, w, 16)
    real = w > 0
    alone = statistics(x[real], y[real], w[real], 8)
    assert padded[0] == 1.0 and alone[0] == 1.0  # every real micro-batch is above C = 1e-6
    assert padded[1] > 0
    np.testing.assert_allclose(padded[1], alone[1], rtol=1e-5)


def test_nonfinite_microbatch_contributes_zero_and_is_counted(strategy):
    x, y = small_regression(seed=5)
    x, y = x[:16].copy(), y[:16]
    x[3, 0] = np.nan
    C, lr = 1e9, 0.1
    reference = small_model()
    init = reference.get_weights()
    with strategy.scope():
        inner = small_model()
        inner.set_weights(init)
        private = PrivateModel(inner, DPConfig(l2_norm_clip=C, noise_multiplier=0.0,
                                               microbatch_size=1), training_statistics=True)
        private.compile(optimizer=keras.optimizers.SGD(lr), loss=mse)
    history = private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert history.history["nonfinite_microbatches"] == [1.0]
    weights = inner.get_weights()
    assert all(np.all(np.isfinite(w)) for w in weights)
    keep = np.arange(16) != 3
    # the NaN example adds zero but the normaliser stays the batch size (16)
    want = per_example_update(reference, x[keep], y[keep], (1.0,) * 4, C, lr * 15 / 16)
    for got, w in zip(weights, want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)


def test_edp_nonfinite_replica_batch_is_dropped(strategy):
    x, y = small_regression(seed=6)
    x, y = x[:16].copy(), y[:16]
    x[0, 0] = np.inf  # replica 0's whole micro-batch becomes non-finite
    with strategy.scope():
        inner = small_model()
        private = PrivateModel(inner, DPConfig(noise_multiplier=0.5), training_statistics=True)
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    history = private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert history.history["nonfinite_microbatches"] == [1.0]
    assert all(np.all(np.isfinite(w)) for w in inner.get_weights())


def test_decay_reaches_the_step(strategy):
    x, y = small_regression()
    with strategy.scope():
        private = PrivateModel(small_model(), DPConfig(noise_multiplier=2.0, decay="exponential",
                                                       decay_rate=0.3))
        private.compile(optimizer=keras.optimizers.SGD(0.01), loss=mse)
    history = private.fit(x, y, batch_size=16, epochs=3, verbose=0)
    want = [2.0 * math.exp(-0.3 * t) for t in range(3)]
    np.testing.assert_allclose(history.history["noise_multiplier"], want, rtol=1e-6)
    # a resumed run continues the schedule at its absolute epoch
    history = private.fit(x, y, batch_size=16, initial_epoch=3, epochs=4, verbose=0)
    np.testing.assert_allclose(history.history["noise_multiplier"], [2.0 * math.exp(-0.9)],
                               rtol=1e-6)


def test_indivisible_batch_is_a_clear_error(strategy):
    x, y = small_regression()
    with strategy.scope():
        private = PrivateModel(small_model(), DPConfig(microbatch_size=3))
        private.compile(optimizer="sgd", loss=mse)
    with pytest.raises(ValueError, match="divisible by replicas x microbatch_size"):
        private.fit(x, y, batch_size=16, verbose=0)
    with strategy.scope():
        private = PrivateModel(small_model(), DPConfig())
        private.compile(optimizer="sgd", loss=mse)
    with pytest.raises(ValueError, match="divisible"):  # odd: indivisible by any replicas
        private.fit(x, y, batch_size=9, verbose=0)


def test_compile_errors():
    private = PrivateModel(small_model(), DPConfig())
    with pytest.raises(ValueError, match="loss"):
        private.compile(optimizer="sgd")
    with pytest.raises(ValueError, match="clipnorm"):
        private.compile(optimizer=keras.optimizers.SGD(clipnorm=1.0), loss=mse)
    with pytest.raises(ValueError, match="DPConfig"):
        PrivateModel(small_model(), {"l2_norm_clip": 1.0})


def test_wrapped_model_is_free_of_privacy_machinery(strategy):
    with strategy.scope():
        inner = small_model()
        private = PrivateModel(inner, DPConfig())
    assert private.wrapped_model is inner
    assert len(inner.weights) == 4


def test_physical_batch_size_processes_chunks(strategy, monkeypatch):
    """The chunked path really runs: each replica traces the gradients of one chunk of 2 rows
    (the loop body), once."""
    rows = []
    original = microbatch.unchunked_gradients

    def counted(model, loss_fn, variables, x, *args):
        rows.append(int(tf.nest.flatten(x)[0].shape[0]))
        return original(model, loss_fn, variables, x, *args)

    monkeypatch.setattr(microbatch, "unchunked_gradients", counted)
    x, y = small_regression()
    with strategy.scope():
        private = PrivateModel(small_model(), DPConfig(noise_multiplier=0.0, microbatch_size=1,
                                                       physical_batch_size=2))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert 16 // strategy.num_replicas_in_sync > 2  # more rows than a chunk on each replica
    assert rows == [2] * strategy.num_replicas_in_sync


def _two_outputs(seed=0):
    """A shared trunk with a classification and a regression output, named."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(6, activation="tanh")(inputs)
    cls = keras.layers.Dense(3, name="cls")(h)
    reg = keras.layers.Dense(1, name="reg")(h)
    return keras.Model(inputs, {"cls": cls, "reg": reg})


def test_keras_compile_with_a_loss_per_output_trains_as_keras_does(strategy):
    """loss={name: ...} with loss_weights, the Keras way: with a huge clip and no noise the private
    step is Keras' own (its objective is the batch mean of the weighted per-example sum)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(48, 5)).astype("float32")
    y = {"cls": rng.integers(0, 3, size=(48,)), "reg": rng.normal(size=(48, 1)).astype("float32")}
    losses = {"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              "reg": keras.losses.MeanSquaredError()}
    weights = {"cls": 1.0, "reg": 0.25}
    reference = _two_outputs()
    init = reference.get_weights()
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses, loss_weights=weights)
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    with strategy.scope():
        inner = _two_outputs()
        inner.set_weights(init)
        private = PrivateModel(inner, DPConfig(l2_norm_clip=1e9, noise_multiplier=0.0,
                                               microbatch_size=1), training_statistics=True)
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses, loss_weights=weights,
                        metrics={"cls": ["accuracy"]})
    history = private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(inner.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert any("accuracy" in k for k in history.history)


def test_per_example_loss_of_several_outputs_is_their_weighted_sum():
    rng = np.random.default_rng(4)
    y_true = [rng.normal(size=(4, 2)).astype("float32"), rng.normal(size=(4, 1)).astype("float32")]
    y_pred = [rng.normal(size=(4, 2)).astype("float32"), rng.normal(size=(4, 1)).astype("float32")]
    as_list = per_example_loss.as_per_example_loss(["mse", "mae"], [2.0, 0.5])
    want = (2.0 * np.mean((y_true[0] - y_pred[0]) ** 2, axis=1)
            + 0.5 * np.mean(np.abs(y_true[1] - y_pred[1]), axis=1))
    np.testing.assert_allclose(as_list(y_true, y_pred).numpy(), want, rtol=1e-6)
    by_name = per_example_loss.as_per_example_loss({"b": "mae", "a": None}, {"b": 0.5},
                                             output_names=lambda: ["a", "b"])
    np.testing.assert_allclose(by_name(y_true, y_pred).numpy(),
                               0.5 * np.mean(np.abs(y_true[1] - y_pred[1]), axis=1), rtol=1e-6)
    with pytest.raises(ValueError, match="loss_weights name outputs without a loss"):
        per_example_loss.as_per_example_loss({"a": "mse"}, {"c": 1.0})


def test_fit_on_a_dataset_does_not_warn_about_shuffling(strategy):
    """A sampler's dataset is passed as is; Keras' default shuffle=True would warn that it is
    ignored, on every fit."""
    import warnings

    x, y = small_regression()
    with strategy.scope():
        private = PrivateModel(small_model(), DPConfig(noise_multiplier=0.0, microbatch_size=1))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        private.fit(dataset, epochs=1, verbose=0)
    assert not [w for w in caught if "shuffle" in str(w.message)]


def test_class_weight_is_refused_before_training(strategy):
    """Keras folds class_weight into the per-row loss weight, which per-example clipping then
    caps at C: the run would train as if unweighted. The refusal comes before any step."""
    x, y = small_regression()
    with strategy.scope():
        inner = small_model()
        private = PrivateModel(inner, DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0,
                                               microbatch_size=1))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    before = [w.copy() for w in inner.get_weights()]
    with pytest.raises(ValueError, match="class_weight"):
        private.fit(x, (y > 0).astype("int32"), class_weight={0: 1.0, 1: 5.0}, batch_size=16,
                    epochs=1, verbose=0)
    for got, want in zip(inner.get_weights(), before):
        np.testing.assert_array_equal(got, want)
