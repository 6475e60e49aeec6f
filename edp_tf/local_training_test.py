"""DP-FedAvg's local training: the pseudo-gradient against a plain loop of local SGD, one
full-batch local step against FedSGD, the step with a server optimizer, and the config checks."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import DPConfig, PrivateModel
from edp_tf.local_training import LocalTraining, pseudo_gradient
from edp_tf.testing import mse

K = 3  # rows per user


def model_and_user(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(2)])
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(K, 4)).astype("float32")
    y = rng.normal(size=(K, 2)).astype("float32")
    return model, x, y


def plain_local_sgd(model, x, y, w, epochs, batch, lr):
    """theta - theta_local by assigning a clone's weights step by step (eager, no stateless
    call)."""
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    for _ in range(epochs):
        for start in range(0, len(x), batch):
            xb, yb, wb = x[start:start + batch], y[start:start + batch], w[start:start + batch]
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(mse(yb, clone(xb, training=True)) * wb) / max(wb.sum(), 1.0)
            variables = clone.trainable_variables
            for v, g in zip(variables, tape.gradient(loss, variables)):
                v.assign_sub(lr * g)
    return [a - b for a, b in zip(model.get_weights(), clone.get_weights())]


@pytest.mark.parametrize("epochs, batch, mask", [(1, K, [1, 1, 1]), (2, 2, [1, 1, 1]),
                                                 (3, 1, [1, 0, 1]), (2, 2, [1, 1, 0])])
def test_pseudo_gradient_matches_a_plain_loop_of_local_sgd(epochs, batch, mask):
    """(2, 2, [1, 1, 0]): the second local batch is padding only and must change nothing."""
    model, x, y = model_and_user()
    w = np.array(mask, "float32")
    local = LocalTraining(epochs, batch, 0.3)
    delta, loss, _ = tf.function(lambda: pseudo_gradient(
        model, mse, model.trainable_variables, x, y, w, local), autograph=False)()
    want = plain_local_sgd(model, x, y, w, epochs, batch, 0.3)
    for got, expected in zip(delta, want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)
    full = float(np.sum(mse(y, model(x)).numpy() * w) / w.sum())
    assert float(loss[0]) == pytest.approx(full, rel=1e-5)  # the loss under the global weights


def test_one_full_batch_local_step_is_eta_times_the_fedsgd_gradient():
    model, x, y = model_and_user(seed=1)
    w = np.array([1, 1, 0], "float32")
    delta, _, _ = tf.function(lambda: pseudo_gradient(
        model, mse, model.trainable_variables, x, y, w, LocalTraining(1, K, 0.5)),
        autograph=False)()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(mse(y, model(x, training=True)) * w) / 2.0
    for d, g in zip(delta, tape.gradient(loss, model.trainable_variables)):
        np.testing.assert_allclose(d.numpy(), 0.5 * g.numpy(), rtol=1e-5, atol=1e-7)


def fit_users(strategy, users_x, users_y, users_w, lr, **cfg):
    """One step over a fixed batch of users (k rows each), z = 0, C large."""
    model, _, _ = model_and_user(seed=2)
    init = model.get_weights()
    with strategy.scope():
        inner = keras.models.clone_model(model)
        inner.set_weights(init)
        private = PrivateModel(inner, DPConfig(
            l2_norm_clip=1e6, noise_multiplier=0.0, microbatch_size=K, privacy_unit="user",
            expected_batch_size=4.0, **cfg))
        private.compile(optimizer=keras.optimizers.SGD(lr), loss=mse)
    data = tf.data.Dataset.from_tensors((users_x, users_y, users_w))
    private.fit(data, epochs=1, verbose=0)
    return inner.get_weights()


def test_fedavg_with_one_full_batch_step_equals_fedsgd(strategy):
    """Local SGD(eta) once over each user's rows, server SGD(1/eta): the FedSGD step (4 users
    over the replicas, one of them with a padding row)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(4 * K, 4)).astype("float32")
    y = rng.normal(size=(4 * K, 2)).astype("float32")
    w = np.ones(4 * K, "float32")
    w[K - 1] = 0.0
    fedsgd = fit_users(strategy, x, y, w, 1.0)
    fedavg = fit_users(strategy, x, y, w, 1 / 0.25, local_epochs=1, local_learning_rate=0.25)
    for a, b in zip(fedavg, fedsgd):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    several = fit_users(strategy, x, y, w, 1.0, local_epochs=3, local_batch_size=1,
                        local_learning_rate=0.25)
    assert not np.allclose(several[0], fedsgd[0])  # more local steps: another update


def test_local_training_is_user_level_only_and_checked():
    with pytest.raises(ValueError, match="needs privacy_unit='user'"):
        DPConfig(local_epochs=1, microbatch_size=2)
    user = dict(privacy_unit="user", microbatch_size=2, expected_batch_size=5.0)
    with pytest.raises(ValueError, match="local_epochs must be an integer >= 0"):
        DPConfig(local_epochs=-1, **user)
    with pytest.raises(ValueError, match="local_batch_size"):
        DPConfig(local_epochs=1, local_batch_size=0, **user)
    with pytest.raises(ValueError, match="local_learning_rate"):
        DPConfig(local_epochs=1, local_learning_rate=0.0, **user)
    assert DPConfig(local_epochs=2, **user).local_epochs == 2
    mechanism = edp_tf.Mechanism.from_config(DPConfig(local_epochs=2, **user), 2, 20)
    assert mechanism.sensitivity == 1  # a clipped user update, as in DP-FedSGD


@pytest.mark.parametrize("weight", [2.0, -1.0])
@pytest.mark.parametrize("as_dataset", [False, True])
def test_a_user_weight_outside_0_1_is_refused(strategy, weight, as_dataset):
    """A user's weight scales the clipped update: above 1 it would move the sum past C. Arrays
    are checked before the step; a dataset's later batches in the step itself."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8 * K, 4)).astype("float32")
    y = rng.normal(size=(8 * K, 2)).astype("float32")
    w = np.ones(8 * K, "float32")
    if as_dataset:
        w[4 * K:] = weight  # the second batch: the first one passes the eager check
    else:
        w[1] = weight
    model, _, _ = model_and_user(seed=2)
    with strategy.scope():
        private = PrivateModel(keras.models.clone_model(model), DPConfig(
            l2_norm_clip=1.0, noise_multiplier=0.0, microbatch_size=K, privacy_unit="user",
            expected_batch_size=4.0))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="must be in \\[0, 1\\]"):
        if as_dataset:
            private.fit(tf.data.Dataset.from_tensor_slices((x, y, w)).batch(4 * K), epochs=1,
                        verbose=0)
        else:
            private.fit(x, y, sample_weight=w, batch_size=4 * K, epochs=1, verbose=0)
