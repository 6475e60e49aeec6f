"""Noise filters: the recursion against NumPy, a constant update passing, the identity settings
against the plain optimizer, the variance of filtered i.i.d. noise against the filter's gain, and
under PrivateModel on 2 logical CPU replicas (edp_tf/conftest.py) that they see exactly the released
update and leave the ledger as it is; checkpoints, serialisation and errors."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import DPConfig, PrivateModel, ledger, sampling
from edp_tf.bias_corrected_adam import BiasCorrectedAdam
from edp_tf.filtering import KalmanFilter, LowPassFilter, impulse_response, noise_variance_gain
from edp_tf.testing import wide_model, zero_loss

SECOND_ORDER = dict(b=(0.1, 0.2, 0.1), a=(-0.9, 0.3))  # a stable 2nd-order low-pass


def reference_filter(updates, b, a):
    """m_t / c_t by direct convolution with the impulse response (NumPy, float64)."""
    h = impulse_response(b, a, len(updates))
    out = []
    for t in range(1, len(updates) + 1):
        weights = h[:t][::-1]  # h_{t-1} for the first update ... h_0 for the newest
        out.append(np.tensordot(weights, np.asarray(updates[:t]), axes=1) / weights.sum())
    return out


def kalman_coefficients(kappa):
    return (kappa,), (kappa - 1.0,)


def run(optimizer, w0, updates):
    """The variable after each step, and the optimizer (one variable, eager)."""
    var = keras.Variable(np.asarray(w0, np.float32))
    after = []
    for g in updates:
        optimizer.apply_gradients([(tf.constant(g, tf.float32), var)])
        after.append(var.numpy().copy())
    return var, after


def iterates(optimizer, var, before):
    """x_t: the variable for a low-pass filter, the filter's iterate for Kalman (the variable
    holds the extrapolated point)."""
    return optimizer.iterate(var) if isinstance(optimizer, KalmanFilter) else before


@pytest.mark.parametrize("make, coefficients", [
    (lambda: LowPassFilter(keras.optimizers.SGD(1.0)), ((0.25, 0.25), (-0.5,))),
    (lambda: LowPassFilter(keras.optimizers.SGD(1.0), **SECOND_ORDER),
     (SECOND_ORDER["b"], SECOND_ORDER["a"])),
    (lambda: KalmanFilter(keras.optimizers.SGD(1.0), kappa=0.4), kalman_coefficients(0.4)),
])
def test_steps_with_the_filtered_updates(make, coefficients):
    """SGD(1) behind the filter steps by exactly -m_t / c_t of the updates so far; a wrong
    coefficient, shift or normaliser moves every step after the first."""
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=50) for _ in range(12)]
    optimizer = make()
    var = keras.Variable(np.zeros(50, np.float32))
    x_prev, steps = np.zeros(50), []
    for g in updates:
        optimizer.apply_gradients([(tf.constant(g, tf.float32), var)])
        x = iterates(optimizer, var, var.numpy())
        steps.append(x_prev - x)
        x_prev = x
    want = reference_filter(updates, *coefficients)
    np.testing.assert_allclose(steps, want, rtol=1e-4, atol=1e-5)


def test_kalman_evaluates_at_the_extrapolated_point_and_finalises_to_the_iterate():
    """A constant update u: x_t = x_0 - t u exactly (the normaliser makes the first step whole),
    and the model holds y_t = x_t + gamma (x_t - x_{t-1}) = x_t - gamma u, until finalize."""
    kappa, steps, u = 0.7, 6, np.linspace(-1, 1, 20)
    optimizer = KalmanFilter(keras.optimizers.SGD(1.0), kappa=kappa)
    var, _ = run(optimizer, np.zeros(20), [u] * steps)
    gamma = (1 - kappa) / kappa
    np.testing.assert_allclose(optimizer.iterate(var), -steps * u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var.numpy(), -steps * u - gamma * u, rtol=1e-5, atol=1e-6)
    optimizer.finalize_variable_values([var])
    np.testing.assert_allclose(var.numpy(), -steps * u, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda inner: LowPassFilter(inner),
    lambda inner: LowPassFilter(inner, **SECOND_ORDER),
    lambda inner: KalmanFilter(inner),
])
def test_a_constant_update_passes_unchanged(make):
    """The filter of a constant update is that update at every step (its DC gain is 1 and the
    normaliser unbiases the start): SGD(0.1) steps by exactly -0.1 g each time."""
    g = np.linspace(-2, 3, 30)
    optimizer = make(keras.optimizers.SGD(0.1))
    var = keras.Variable(np.zeros(30, np.float32))
    for t in range(1, 26):
        optimizer.apply_gradients([(tf.constant(g, tf.float32), var)])
        np.testing.assert_allclose(iterates(optimizer, var, var.numpy()), -0.1 * t * g,
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda inner: LowPassFilter(inner, b=(1.0,), a=()),
    lambda inner: KalmanFilter(inner, kappa=1.0),
])
@pytest.mark.parametrize("inner", [lambda: keras.optimizers.Adam(0.01),
                                   lambda: keras.optimizers.SGD(0.1, momentum=0.9)])
def test_identity_coefficients_are_the_plain_optimizer(make, inner):
    rng = np.random.default_rng(1)
    updates = [rng.normal(size=40) for _ in range(10)]
    w0 = rng.normal(size=40)
    _, plain = run(inner(), w0, updates)
    _, filtered = run(make(inner()), w0, updates)
    np.testing.assert_allclose(filtered, plain, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make", [
    lambda: LowPassFilter(keras.optimizers.SGD(1.0)),
    lambda: LowPassFilter(keras.optimizers.SGD(1.0), **SECOND_ORDER),
    lambda: KalmanFilter(keras.optimizers.SGD(1.0)),
    lambda: KalmanFilter(keras.optimizers.SGD(1.0), kappa=0.2),
])
def test_variance_of_filtered_noise_is_the_filters_gain(make):
    """i.i.d. N(0, 1) updates on 20,000 weights: the sample variance of step T's filtered update
    estimates Var = gain(T) with relative standard error sqrt(2 / 20000) = 1%, so 5% is 5
    standard errors; the gains here are 0.18-0.54 of the unfiltered variance, so a filter that
    did not filter, or mis-normalised, is off by far more."""
    size, steps = 20000, 30
    rng = np.random.default_rng(2)
    optimizer = make()
    var = keras.Variable(np.zeros(size, np.float32))
    x_prev = None
    for _ in range(steps):
        x_prev = iterates(optimizer, var, var.numpy())
        optimizer.apply_gradients([(tf.constant(rng.normal(size=size), tf.float32), var)])
    step = x_prev - iterates(optimizer, var, var.numpy())
    gain = optimizer.noise_variance_gain(steps)
    assert gain < 0.6
    assert np.var(step) == pytest.approx(gain, rel=0.05)


def test_theoretical_gains():
    """The long-run gain of a first-order EMA with weight k is k / (2 - k); the default low-pass
    keeps 1/4 (h = 0.25, then 0.375 x 0.5^j: sum of squares 0.25, sum 1)."""
    assert noise_variance_gain((0.3,), (-0.7,), 2000) == pytest.approx(0.3 / 1.7)
    assert LowPassFilter("sgd").noise_variance_gain(2000) == pytest.approx(0.25)
    assert LowPassFilter("sgd").noise_variance_gain(1) == pytest.approx(1.0)  # one update: as is


N_EX, Q, WIDTH = 64, 0.25, 50


FILTERS = {"lowpass": (lambda inner: LowPassFilter(inner, **SECOND_ORDER),
                       (SECOND_ORDER["b"], SECOND_ORDER["a"])),
           "kalman": (lambda inner: KalmanFilter(inner, kappa=0.5), kalman_coefficients(0.5))}


def test_under_private_model_sees_the_release_and_keeps_the_ledger(strategy, tmp_path):
    """Several replicas, a zero-gradient loss: every released update is the summed noise alone, the
    same sequence for a fixed noise seed. A filtered run must step by the filter of the plain
    run's updates: a filter fed one replica's share, or the un-noised sum (zero), or applied
    before the all-reduce, would not. The ledger is the plain run's, field by field."""
    runs = {name: _private_run(strategy, tmp_path / name, make)
            for name, (make, _) in [("plain", (lambda inner: inner, None)), *FILTERS.items()]}
    released = -runs["plain"][0]
    assert len(released) >= 3
    assert np.std(released) > 0.01  # the release carries the noise
    for name, (_, coefficients) in FILTERS.items():
        np.testing.assert_allclose(-runs[name][0], reference_filter(list(released), *coefficients),
                                   rtol=1e-4, atol=1e-5, err_msg=name)
        for field in ledger.MECHANISM_FIELDS + ("epsilon", "epsilon_rdp", "epochs", "private"):
            assert runs[name][1][field] == runs["plain"][1][field], (name, field)


def _private_run(strategy, run_dir, wrap):
    """(the steps x_t - x_{t-1} of one epoch, the ledger) of a zero-loss PrivateModel run."""
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=strategy.num_replicas_in_sync, seed=3)
    with strategy.scope():
        model = wide_model(WIDTH)
        model.set_weights([np.zeros((4, WIDTH), np.float32), np.zeros(WIDTH, np.float32)])
        private = PrivateModel(model, DPConfig(l2_norm_clip=1.0, noise_multiplier=1.5,
                                               expected_batch_size=sampler.expected_batch_size,
                                               seed=11))
        optimizer = wrap(keras.optimizers.SGD(1.0))
        private.compile(optimizer=optimizer, loss=zero_loss)
    positions, held = [np.zeros(5 * WIDTH)], [np.zeros(5 * WIDTH)]

    def track_step(*_, **__):
        variables = model.trainable_variables
        positions.append(np.concatenate([iterates(optimizer, v, v.numpy()).ravel()
                                         for v in variables]))
        copies = [[c.numpy().ravel() for c in strategy.experimental_local_results(v.value)]
                  for v in variables]
        assert all(len(c) == strategy.num_replicas_in_sync for c in copies)
        for replica in range(1, strategy.num_replicas_in_sync):  # the copies stay identical
            for c in copies:
                np.testing.assert_array_equal(c[replica], c[0])
        held.append(np.concatenate([c[0] for c in copies]))

    track = keras.callbacks.LambdaCallback(on_train_batch_end=track_step)
    led = ledger.PrivacyLedger.for_sampler(str(run_dir), sampler, 1 / N_EX)
    x = np.random.default_rng(0).normal(size=(N_EX, 4)).astype("float32")
    private.fit(sampler.dataset(x, np.zeros((N_EX, WIDTH), "float32")), epochs=1, verbose=0,
                callbacks=[led, track])
    assert len(positions) - 1 == sampler.steps_per_epoch
    # Kalman: between steps the model holds y_t = x_t + gamma (x_t - x_{t-1}) on every replica
    gamma = getattr(optimizer, "gamma", 0.0)
    x = np.asarray(positions)
    np.testing.assert_allclose(held[1:], x[1:] + gamma * np.diff(x, axis=0), rtol=1e-5,
                               atol=1e-6)
    return np.diff(np.asarray(positions), axis=0), ledger.read_ledger(str(run_dir))


def test_state_is_checkpointed_with_the_optimizer(tmp_path):
    rng = np.random.default_rng(4)
    for optimizer in (LowPassFilter(keras.optimizers.Adam(0.01), **SECOND_ORDER),
                      KalmanFilter(keras.optimizers.Adam(0.01))):
        var, _ = run(optimizer, np.zeros(8), [rng.normal(size=8) for _ in range(3)])
        path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / optimizer.name))
        saved = [v.numpy().copy() for v in optimizer.variables]
        assert len(saved) > len(optimizer.inner_optimizer.variables)  # the filter's own state
        assert int(optimizer.iterations.numpy()) == 3
        for v in optimizer.variables:
            v.assign(tf.zeros_like(v))
        tf.train.Checkpoint(optimizer=optimizer).restore(path).assert_existing_objects_matched()
        for v, want in zip(optimizer.variables, saved):
            np.testing.assert_array_equal(v.numpy(), want)


def test_serialises_with_its_coefficients():
    for optimizer in (LowPassFilter(keras.optimizers.Adam(2e-3), **SECOND_ORDER),
                      KalmanFilter(keras.optimizers.SGD(0.1), kappa=0.3)):
        again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        assert type(again) is type(optimizer)
        assert type(again.inner_optimizer) is type(optimizer.inner_optimizer)
        assert float(again.learning_rate) == pytest.approx(float(optimizer.learning_rate))
        assert again.get_config() == optimizer.get_config()


def test_errors():
    with pytest.raises(ValueError, match="BiasCorrectedAdam"):
        LowPassFilter(BiasCorrectedAdam())
    with pytest.raises(ValueError, match="clipnorm"):
        KalmanFilter(keras.optimizers.Adam(clipnorm=1.0))
    with pytest.raises(ValueError, match="unstable"):
        LowPassFilter("sgd", b=(0.5,), a=(-1.2,))
    with pytest.raises(ValueError, match="b_0"):
        LowPassFilter("sgd", b=(0.0, 1.0), a=())
    with pytest.raises(ValueError, match="kappa"):
        KalmanFilter("sgd", kappa=0.0)
    with pytest.raises(ValueError, match="inner optimizer"):
        LowPassFilter("sgd", weight_decay=0.1)
    table = keras.Variable(np.zeros((5, 2), np.float32))
    sparse = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]), tf.constant([5, 2]))
    with pytest.raises(ValueError, match="dense"):
        LowPassFilter("sgd").apply_gradients([(sparse, table)])
