"""Only the private step moves the weights: every other path that changes them (the wrapped
model's own fit, the wrapper's optimizer applying raw gradients, a callback's update between
steps, a layer's statistics, a noise multiplier assigned mid-epoch) ends in a statement that
says not private, and the Keras habits that only bring back what the step left (an average
written back when fit ends, EarlyStopping's best weights, an epoch's checkpoint reloaded) keep
it private."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import weight_seal

N_EX, BATCH, EPOCHS, TARGET = 120, 30, 2, 4.0  # 4 steps an epoch
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_EX, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def _model(*layers, strategy=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        return keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(2)])


def _wrap(model, optimizer=None, strategy=None, **compile_kwargs):
    private = edp_tf.make_private(model, target_epsilon=TARGET, epochs=EPOCHS, batch_size=BATCH,
                                  strategy=strategy)
    private.compile(optimizer or keras.optimizers.SGD(0.1), LOSS, **compile_kwargs)
    return private


def _raw_update(model, x, y, optimizer):
    """One unclipped, noiseless gradient step on the private data."""
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x))
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _not_private(private) -> dict:
    statement = private.privacy_statement()
    assert statement["private"] is False
    return statement


def test_the_fingerprint_sees_one_changed_element_and_is_the_same_under_xla_and_on_the_host():
    a = tf.Variable(np.linspace(-1, 1, 1000).astype("float32"))
    b = tf.Variable(np.arange(6, dtype="int64"))
    eager = int(weight_seal.fingerprint([a, b]))
    compiled = int(tf.function(weight_seal.fingerprint, jit_compile=True, autograph=False)([a, b]))
    assert compiled == eager  # the step's value and the host's agree bit for bit
    assert weight_seal.host_fingerprint([a, b]) == eager
    a[517].assign(a[517] + 1e-7)  # the smallest step float32 can take there
    assert int(weight_seal.fingerprint([a, b])) != eager
    assert weight_seal.host_fingerprint([a, b]) == int(weight_seal.fingerprint([a, b]))


def test_the_host_reads_every_kind_of_variable_as_the_step_does():
    rng = np.random.default_rng(1)
    big = rng.normal(size=5000) * 1e30  # bit patterns whose int64 sum wraps past 2**63
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = tf.Variable(rng.normal(size=(3, 4)).astype("float32"))
    variables = [tf.Variable(big.astype("float64")), tf.Variable(big.astype("float16")),
                 tf.Variable(tf.constant(rng.normal(size=7), tf.bfloat16)),
                 tf.Variable(rng.integers(-9, 9, 5).astype("int32")), tf.Variable([True, False]),
                 tf.Variable(-3.5), keras.Variable(np.ones((2, 2), "float32")), mirrored]
    for i in range(len(variables)):
        assert weight_seal.host_fingerprint(variables[i:i + 1]) == int(
            weight_seal.fingerprint(variables[i:i + 1])), variables[i].dtype
    assert weight_seal.host_fingerprint(variables) == int(weight_seal.fingerprint(variables))


@pytest.mark.parametrize("path", ["inner_fit_own_optimizer", "inner_fit_recompiled",
                                  "raw_gradients_after_fit"])
def test_a_move_after_fit_voids_the_statement(path):
    x, y = _data()
    model = _model()
    private = _wrap(model)
    private.fit(x, y, epochs=1, verbose=0)
    assert private.privacy_statement()["private"] is True
    if path == "inner_fit_own_optimizer":  # the wrapper's optimizer, stepped by Keras' fit
        model.compile(private.optimizer, LOSS)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    elif path == "inner_fit_recompiled":  # a fresh optimizer, recompiled away afterwards
        model.compile(keras.optimizers.SGD(0.1), LOSS)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        model.compile(keras.optimizers.SGD(0.1), LOSS)
    else:
        _raw_update(model, x, y, private.optimizer)
    assert _not_private(private)["weights_moved_outside_the_step"] >= 1


@pytest.mark.parametrize("replicas,where", [(1, "weights"), (2, "weights"), (2, "momentum")])
def test_a_callback_updating_between_steps_is_counted_by_the_step(replicas, where):
    x, y = _data()
    strategy = edp_tf.make_strategy(replicas)
    model = _model(strategy=strategy)

    class StepsOnItsOwn(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:  # a statistic of the private batch, assigned by hand: to the
                # weights, or to the momentum the next step applies (the weights untouched)
                held = (model.trainable_variables if where == "weights"
                        else private.optimizer.momentums)
                for variable in held:
                    variable.assign_add(tf.fill(variable.shape, float(x[:BATCH].mean())))

    private = _wrap(model, keras.optimizers.SGD(0.1, momentum=0.9), strategy=strategy)
    private.fit(x, y, epochs=1, verbose=0, callbacks=[StepsOnItsOwn()])
    # the next step found the weights moved (the epoch's close would have sealed them over)
    assert _not_private(private)["weights_moved_outside_the_step"] >= 1


def test_statistics_a_layer_learns_in_the_forward_pass_void_the_statement():
    x, y = _data()
    norm = keras.layers.BatchNormalization(center=False, scale=False)
    norm.trainable = False  # frozen when fit checks the model: refused otherwise
    model = _model(norm)

    class Unfreeze(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                norm.trainable = True  # its moving mean now follows the private batches

    private = _wrap(model, run_eagerly=True)
    before = norm.moving_mean.numpy().copy()
    private.fit(x, y, epochs=2, verbose=0, callbacks=[Unfreeze()])
    assert not np.allclose(before, norm.moving_mean.numpy())  # the hole this test closes
    assert _not_private(private)["weights_moved_outside_the_step"] >= 1


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_noise_multiplier_assigned_mid_epoch_voids_the_statement_even_if_the_mean_holds(
        interrupted):
    x, y = _data()

    class ZeroThenDouble(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            z = float(self.model.mechanism.noise_multiplier_at(0))
            # the epoch's mean is still z: only the step's own range sees step 0 unnoised
            self.model.dp_noise_multiplier.assign({0: 0.0, 1: 2 * z}.get(batch, z))

        def on_train_batch_end(self, batch, logs=None):
            if interrupted and batch == 3:  # the epoch's close never runs: its handler charges
                raise KeyboardInterrupt

    private = _wrap(_model())
    with pytest.raises(KeyboardInterrupt if interrupted else RuntimeError):
        private.fit(x, y, epochs=1, verbose=0, callbacks=[ZeroThenDouble()])
    statement = _not_private(private)
    assert any("noise multiplier differed" in s for s in statement["not_covered"])


def test_a_raw_update_hidden_in_the_average_voids_the_statement():
    x, y = _data()
    model = _model()
    private = _wrap(model, keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5))
    private.fit(x, y, epochs=1, verbose=0)
    weights = model.get_weights()
    _raw_update(model, x, y, private.optimizer)  # moves the weights and their average
    model.set_weights(weights)  # the weights put back: the average still holds the update
    private.optimizer.finalize_variable_values(model.trainable_variables)
    assert _not_private(private)["weights_moved_outside_the_step"] >= 1


def test_an_average_written_back_when_fit_ends_stays_private():
    x, y = _data()
    model = _model(keras.layers.Dense(3), keras.layers.Dropout(0.5))  # Dropout: seed state
    private = _wrap(model, keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5))
    last = {}

    class Last(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            last["weights"] = [w.numpy().copy() for w in model.trainable_variables]

    private.fit(x, y, epochs=2, verbose=0, callbacks=[Last()])
    averages = private.optimizer._model_variables_moving_average
    # the weights are the average (finalize_variable_values wrote it back), not the last step's
    assert all(np.allclose(w, a.numpy()) for w, a in zip(last["weights"], averages))
    assert private.privacy_statement()["private"] is True


def test_the_average_swapped_in_and_out_by_keras_stays_private():
    x, y = _data()
    private = _wrap(_model(), keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5))
    # Keras' swap adds and subtracts: swapped back, the weights differ in their last bits
    swap = keras.callbacks.SwapEMAWeights(swap_on_epoch=True)
    private.fit(x, y, epochs=2, verbose=0, callbacks=[swap], validation_data=(x[:10], y[:10]))
    assert private.privacy_statement()["private"] is True


def test_a_checkpoint_saved_inside_an_epoch_and_reloaded_stays_private(tmp_path):
    x, y = _data()
    model = _model()
    private = _wrap(model)
    saved = str(tmp_path / "step.weights.h5")
    checkpoint = keras.callbacks.ModelCheckpoint(saved, save_weights_only=True, save_freq=3)
    private.fit(x, y, epochs=1, verbose=0, callbacks=[checkpoint])
    last = model.get_weights()
    private.load_weights(saved)  # the weights after step 3 of 4
    assert not all(np.array_equal(a, b) for a, b in zip(model.get_weights(), last))
    assert private.privacy_statement()["private"] is True


def test_best_weights_restored_and_an_epoch_checkpoint_reloaded_stay_private(tmp_path):
    x, y = _data()
    model = _model()
    private = _wrap(model)
    best = keras.callbacks.EarlyStopping(monitor="epsilon", mode="min", patience=5,
                                         restore_best_weights=True)  # epoch 1's: the lowest
    saved = str(tmp_path / "epoch{epoch}.weights.h5")
    checkpoint = keras.callbacks.ModelCheckpoint(saved, save_weights_only=True)
    seen = []

    class Weights(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(model.get_weights())

    private.fit(x, y, epochs=2, verbose=0, callbacks=[Weights(), best, checkpoint])
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), seen[0]))
    assert private.privacy_statement()["private"] is True
    private.load_weights(saved.format(epoch=2))
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), seen[1]))
    assert private.privacy_statement()["private"] is True
