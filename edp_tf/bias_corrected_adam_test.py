"""BiasCorrectedAdam: its update against a NumPy transcription of DP-AdamBC, Adam at z = 0, the
noise std PrivateModel attaches against the noise its step really adds (4 logical CPU devices,
conftest.py), checkpoints, and its errors."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import DPConfig, PrivateModel
from edp_tf.bias_corrected_adam import BiasCorrectedAdam
from edp_tf.testing import mse, small_model, small_regression, wide_model, zero_loss

# A Dense(4 -> 5000) layer: its bias's 5,000 noise entries give a sample std with relative
# standard error 1/sqrt(2 x 5000) = 1.0% (the kernel's 20,000: 0.5%), so 5% is 5 standard errors
# for one std and 4.5 for the ratio of the two; a missing sqrt(N) would be off by 2x (N = 4).
WIDTH, STD_RTOL = 5000, 0.05


def reference(w, grads, zs, unit_std, lr, floor, b1=0.9, b2=0.999, eps=1e-7):
    """Tang et al. 2023, Algorithm 2, with phi from the b2-average of z_t^2 (NumPy)."""
    m = v = np.zeros_like(w)
    s = 0.0
    for t, (g, z) in enumerate(zip(grads, zs), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        s = b2 * s + (1 - b2) * z * z
        phi = unit_std ** 2 * s / (1 - b2 ** t)
        v_hat = v / (1 - b2 ** t)
        w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(np.maximum(v_hat - phi, floor * phi)) + eps)
    return w


def run_optimizer(optimizer, w0, grads, zs, unit_std):
    var = keras.Variable(w0)
    z = tf.Variable(0.0)
    optimizer.attach_noise([var], [unit_std], z)
    for g, zt in zip(grads, zs):
        z.assign(zt)
        optimizer.apply_gradients([(tf.constant(g), var)])
    return var.numpy()


def run_adam(w0, grads, lr):
    """Keras' own Adam over the same gradients (the baseline)."""
    adam, var = keras.optimizers.Adam(lr), keras.Variable(w0)
    for g in grads:
        adam.apply_gradients([(tf.constant(g), var)])
    return var.numpy()


def noisy_gradients(steps=40, size=200, unit_std=0.3, seed=0):
    """Half the weights with a signal of 0.5, half with none, plus N(0, (unit_std z)^2) noise; z
    drops from 2 to 1 halfway (a decay), so phi must follow the average of z_t^2."""
    rng = np.random.default_rng(seed)
    signal = np.where(np.arange(size) < size // 2, 0.5, 0.0).astype(np.float32)
    zs = [2.0] * (steps // 2) + [1.0] * (steps - steps // 2)
    grads = [(signal + rng.normal(0, unit_std * z, size)).astype(np.float32) for z in zs]
    return grads, zs


@pytest.mark.parametrize("floor", [0.05, 1.0])
def test_matches_the_reference_algorithm(floor):
    grads, zs = noisy_gradients()
    w0 = np.linspace(-1, 1, 200).astype(np.float32)
    got = run_optimizer(BiasCorrectedAdam(0.01, floor=floor), w0, grads, zs, 0.3)
    want = reference(w0.astype(np.float64), grads, zs, 0.3, 0.01, floor)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # and it is not Adam: the correction moves the weights differently
    adam = run_adam(w0, grads, 0.01)
    assert np.max(np.abs(adam - got)) > 1e-3


def test_is_adam_without_noise():
    """z = 0: phi = 0, so the update is Adam's (epsilon aside: Keras adds it to sqrt(v), not to
    sqrt(v^); 1e-7 against gradients of ~0.5 is far below the tolerance). atol 2e-5: the two
    compute in float32 in different orders, and 20 steps of lr 0.01 move weights by up to 0.2."""
    grads, _ = noisy_gradients(steps=20)
    w0 = np.zeros(200, np.float32)
    got = run_optimizer(BiasCorrectedAdam(0.01), w0, grads, [0.0] * 20, 0.3)
    adam = run_adam(w0, grads, 0.01)
    np.testing.assert_allclose(got, adam, rtol=1e-4, atol=2e-5)


def test_signal_weights_step_like_adam_and_noise_weights_are_bounded():
    """Why the correction: DP-Adam divides every weight by ~sqrt(phi), so a weight with signal
    0.5 under noise std 3 moves about as slowly as SGD would; the corrected moment sees ~0.5^2
    and lets it move ~sqrt(phi) / 0.5 times further. Weights with no signal move at most
    1 / sqrt(floor) times DP-Adam's step. 400 steps: v^ - phi has relative error ~sqrt(2 / 400)
    of phi (7%, i.e. 0.63 against a signal^2 of 0.25: estimated, not exact), so the checks are
    factors, not digits."""
    rng = np.random.default_rng(1)
    steps, size, std = 400, 2000, 3.0
    signal = np.where(np.arange(size) < size // 2, 0.5, 0.0)
    grads = [(signal + rng.normal(0, std, size)).astype(np.float32) for _ in range(steps)]
    w0 = np.zeros(size, np.float32)
    corrected = run_optimizer(BiasCorrectedAdam(1e-3, floor=0.05), w0, grads, [1.0] * steps, std)
    plain = run_adam(w0, grads, 1e-3)
    half = size // 2
    drift_bc, drift_adam = -np.mean(corrected[:half]), -np.mean(plain[:half])
    assert drift_adam > 0 and drift_bc > 2.0 * drift_adam
    spread_bc, spread_adam = np.std(corrected[half:]), np.std(plain[half:])
    assert spread_bc <= spread_adam / np.sqrt(0.05) * 1.1


@pytest.mark.parametrize("cfg_kwargs, scales", [
    (dict(noise_mode="calibrated"), None),
    (dict(noise_mode="paper"), None),
    (dict(microbatch_size=1), None),
    (dict(microbatch_size=2, expected_batch_size=24.0), None),
    (dict(microbatch_size=1), (0.6, 1.28)),
])
def test_attached_std_is_the_noise_the_step_adds(strategy, cfg_kwargs, scales):
    """With a zero-gradient loss one SGD(1) step's update is the noise alone: its measured std
    per variable must be the std the step tells BiasCorrectedAdam (x z), for every noise mode,
    micro-batch size, expected batch and per-variable scale alpha (STD_RTOL: see above)."""
    z, C, batch = 1.3, 0.7, 32
    cfg = DPConfig(l2_norm_clip=C, noise_multiplier=z, **cfg_kwargs)
    update, _ = _one_step(strategy, cfg, batch, scales, lambda: keras.optimizers.SGD(1.0))
    _, private = _one_step(strategy, cfg, batch, scales, lambda: BiasCorrectedAdam(1e-3))
    attached_model = private.wrapped_model
    sizes = [int(np.prod(v.shape)) for v in attached_model.trainable_variables]
    parts = np.split(update, np.cumsum(sizes)[:-1])
    assert len(parts) == 2
    for variable, part in zip(attached_model.trainable_variables, parts):
        attached = private.optimizer.unit_noise_std(variable) * z
        assert attached == pytest.approx(np.std(part), rel=STD_RTOL)
    if scales:  # the two variables' noise differs by alpha's ratio, and the step says so
        assert np.std(parts[0]) / np.std(parts[1]) == pytest.approx(0.6 / 1.28, rel=STD_RTOL)


def _one_step(strategy, cfg, batch, scales, make_optimizer):
    """(change of the weights, PrivateModel) after one step with a zero-gradient loss."""
    with strategy.scope():
        model = wide_model(WIDTH)
        private = PrivateModel(model, cfg)
        private.compile(optimizer=make_optimizer(), loss=zero_loss)
    if scales:
        private.restore_layer_scales(scales)
    x = np.random.default_rng(0).normal(size=(batch, 4)).astype("float32")
    before = np.concatenate([w.ravel() for w in model.get_weights()])
    private.fit(x, np.zeros((batch, WIDTH), "float32"), batch_size=batch, epochs=1, verbose=0,
                shuffle=False)
    return np.concatenate([w.ravel() for w in model.get_weights()]) - before, private


def test_trains_under_private_model_and_checkpoints(strategy, tmp_path):
    x, y = small_regression(seed=3, batch=64)
    with strategy.scope():
        inner = small_model()
        private = PrivateModel(inner, DPConfig(l2_norm_clip=1.0, noise_multiplier=0.5,
                                               microbatch_size=1))
        optimizer = BiasCorrectedAdam(0.01)
        private.compile(optimizer=optimizer, loss=mse)
    before = private.evaluate(x, y, verbose=0, batch_size=16)
    private.fit(x, y, batch_size=16, epochs=8, verbose=0)
    after = private.evaluate(x, y, verbose=0, batch_size=16)
    assert after < 0.8 * before
    checkpoint = tf.train.Checkpoint(optimizer=optimizer)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    saved = [v.numpy().copy() for v in optimizer._mean_squared_multipliers]
    # t steps at z = 0.5: s = (1 - b2^t) z^2, updated once per step (on every replica's copy)
    steps = int(optimizer.iterations.numpy())
    assert steps == 8 * len(x) // 16
    np.testing.assert_allclose(saved, 0.25 * (1 - 0.999 ** steps), rtol=1e-4)
    for v in optimizer._mean_squared_multipliers:
        v.assign(tf.zeros_like(v))
    checkpoint.restore(path)
    for v, want in zip(optimizer._mean_squared_multipliers, saved):
        np.testing.assert_allclose(v.numpy(), want)


def test_serialises_with_its_floor():
    opt = BiasCorrectedAdam(2e-3, floor=0.2)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(again, BiasCorrectedAdam)
    assert (again.floor, float(again.learning_rate)) == (0.2, pytest.approx(2e-3))


def test_errors():
    with pytest.raises(ValueError, match="floor"):
        BiasCorrectedAdam(floor=0.0)
    with pytest.raises(ValueError, match="amsgrad"):
        BiasCorrectedAdam(amsgrad=True)
    var = keras.Variable(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="attach_noise"):
        BiasCorrectedAdam().apply_gradients([(tf.ones(3), var)])
    with pytest.raises(ValueError, match="2 stds"):
        BiasCorrectedAdam().attach_noise([var], [1.0, 2.0], tf.Variable(1.0))
    other = keras.Variable(np.zeros(3, np.float32))
    optimizer = BiasCorrectedAdam()
    optimizer.attach_noise([var], [1.0], tf.Variable(1.0))
    with pytest.raises(ValueError, match="no noise std"):
        optimizer.apply_gradients([(tf.ones(3), other)])


def test_sparse_embeddings_are_refused(strategy):
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(50, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    x = np.random.default_rng(0).integers(0, 50, (16, 3)).astype("int32")
    with strategy.scope():
        private = PrivateModel(model, DPConfig(microbatch_size=1, sparse_embeddings=True))
        private.compile(optimizer=BiasCorrectedAdam(), loss=mse)
    with pytest.raises(ValueError, match="sparse_embeddings"):
        private.fit(x, np.zeros((16, 1), "float32"), batch_size=16, epochs=1, verbose=0)
