"""The guarantee bound to the step: every update the private step applies is counted in its own
graph, and no Keras path (train_on_batch, the train function, train_step, a callback's own
steps, a second wrapper, training before the wrapper, a layer unfrozen between fits) ends in a
statement that says private with those updates uncharged."""
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import ledger, report

N_EX, BATCH, EPOCHS, TARGET = 120, 30, 2, 4.0  # 4 steps an epoch


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_EX, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def _model(strategy=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])


def _wrap(model, run_dir=None, strategy=None):
    private = edp_tf.make_private(model, target_epsilon=TARGET, epochs=EPOCHS, batch_size=BATCH,
                                  run_dir=run_dir, strategy=strategy)
    private.compile(keras.optimizers.SGD(0.1),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return private


def _one_batch(x, y):
    """A batch the caller chose (not a Poisson sample), with the mask the step reads."""
    return tf.data.Dataset.from_tensors((x[:BATCH], y[:BATCH], np.ones(BATCH, "float32")))


def test_the_step_counts_each_update_once_on_every_replica_count():
    x, y = _data()
    for replicas in (1, 2):
        strategy = edp_tf.make_strategy(replicas)
        private = _wrap(_model(strategy), strategy=strategy)
        private.fit(x, y, epochs=1, verbose=0)
        # one update per step, not one per replica: the ledger's truth is the step's count
        assert private.step_count.value == private.sampler.steps_per_epoch
        statement = private.privacy_statement()
        assert statement["private"] is True and "steps_outside_fit" not in statement


def test_train_on_batch_is_refused_before_it_moves_a_weight():
    x, y = _data()
    model = _model()
    private = _wrap(model)
    private.fit(x, y, epochs=1, verbose=0)
    before = model.get_weights()
    with pytest.raises(ValueError, match="train_on_batch is refused"):
        private.train_on_batch(x[:BATCH], y[:BATCH])
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert private.privacy_statement()["private"] is True


def test_steps_outside_fit_void_every_statement(tmp_path):
    x, y = _data()
    model = _model()
    private = _wrap(model, str(tmp_path))
    private.fit(x, y, epochs=1, verbose=0)
    charged = private.privacy_statement()["epsilon"]
    for _ in range(3):  # the train function, called directly on a batch of the caller's
        private.train_function(iter(_one_batch(x, y)))
    private.train_step((tf.constant(x[:BATCH]), tf.constant(y[:BATCH]),
                        tf.ones([BATCH])))  # and the step itself, eagerly
    statement = private.privacy_statement()
    assert statement["steps_outside_fit"] == 4
    assert statement["private"] is False
    assert ledger.OUTSIDE_FIT_SENTENCE in statement["not_covered"]
    assert statement["epsilon"] == pytest.approx(charged)  # what fit charged, nothing hidden
    with open(tmp_path / "privacy.json") as f:  # the file a reviewer reads says so too
        on_disk = json.load(f)
    assert on_disk["private"] is False and on_disk["steps_outside_fit"] == 4
    assert "NOT reported as private" in report.sections(on_disk)[0][1][0]
    private.fit(x, y, epochs=1, verbose=0)  # a later fit keeps the run void
    assert private.privacy_statement()["private"] is False


def test_a_callback_stepping_inside_an_epoch_is_outside_the_charge():
    x, y = _data()
    private = _wrap(_model())
    batch = (tf.constant(x[:BATCH]), tf.constant(y[:BATCH]), tf.ones([BATCH]))

    class StepsOnItsOwn(keras.callbacks.Callback):
        def on_train_batch_end(self, index, logs=None):
            if index == 1:
                self.model.train_step(batch)

    private.fit(x, y, epochs=1, verbose=0, callbacks=[StepsOnItsOwn()])
    statement = private.privacy_statement()
    assert statement["epochs"][0]["steps"] == private.sampler.steps_per_epoch
    assert statement["steps_outside_fit"] == 1 and statement["private"] is False


def test_plain_training_of_the_wrapped_model_after_its_private_fit_voids_the_run():
    """Keras' own fit on the model the wrapper trains (its own optimizer) moves the weights
    without the private step; the optimizers' counts give it away."""
    x, y = _data()
    model = _model()
    private = _wrap(model)
    private.fit(x, y, epochs=1, verbose=0)
    assert private.privacy_statement()["private"] is True
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # 4 plain updates
    statement = private.privacy_statement()
    assert statement["private"] is False and statement["steps_outside_fit"] == 4


def test_a_model_is_trained_by_one_wrapper_only():
    x, y = _data()
    model = _model()
    _wrap(model).fit(x, y, epochs=1, verbose=0)
    second = _wrap(model)
    with pytest.raises(ValueError, match="private step.s. of another PrivateModel"):
        second.fit(x, y, epochs=1, verbose=0)
    assert second.step_count.value == 0  # refused before its first step
    untrained = _model()
    _wrap(untrained)  # a wrapper that never stepped leaves no mark
    _wrap(untrained).fit(x, y, epochs=1, verbose=0)


def test_a_model_trained_before_its_wrapper_is_refused():
    x, y = _data()
    model = _model()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # plain training, then private
    private = _wrap(model)
    with pytest.raises(ValueError, match="trained before this wrapper: its optimizer applied 4"):
        private.fit(x, y, epochs=1, verbose=0)
    assert private.step_count.value == 0


def test_a_normalization_unfrozen_between_fits_is_refused_before_it_learns():
    x, y = _data()
    with tf.distribute.get_strategy().scope():
        norm = keras.layers.BatchNormalization(center=False, scale=False)
        norm.trainable = False  # inference mode: its statistics stay put
        model = keras.Sequential([keras.Input((4,)), norm, keras.layers.Dense(2)])
    private = _wrap(model)
    private.fit(x, y, epochs=1, verbose=0)
    moving_mean = norm.moving_mean.numpy().copy()
    norm.trainable = True  # its moving statistics would now follow each private batch
    with pytest.raises(ValueError, match="update non-trainable state"):
        private.fit(x, y, epochs=1, verbose=0)
    np.testing.assert_array_equal(norm.moving_mean.numpy(), moving_mean)
