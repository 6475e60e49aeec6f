"""The replica-local private step on 4 logical CPU devices (configured in conftest.py)."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import DPConfig, PrivateModel

N = 4  # replicas


@pytest.fixture(scope="module")
def strategy():
    s = edp_tf.make_strategy(N)
    assert s.num_replicas_in_sync == N
    return s


def zero_loss(y_true, y_pred):
    """A loss with zero gradient: the update of one SGD(1) step is then exactly the noise."""
    return 0.0 * tf.reduce_sum(y_pred, axis=-1)


def mse(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)


def wide_model(width=1250):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(width)])


def one_step_update(strategy, cfg, batch, width=1250, model=None):
    with strategy.scope():
        inner = model or wide_model(width)
        private = PrivateModel(inner, cfg)
        private.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=zero_loss)
    x = np.random.default_rng(0).normal(size=(batch, 4)).astype("float32")
    y = np.zeros((batch, width), "float32")
    before = np.concatenate([w.ravel() for w in inner.get_weights()])
    private.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    after = np.concatenate([w.ravel() for w in inner.get_weights()])
    return after - before, private


# 5 * 1250 = 6250 weights: the sample std has relative standard error 1/sqrt(2 * 6250) = 0.9%, so a
# 5% tolerance is > 5 standard errors, while identical noise on the 4 replicas would be off by
# sqrt(4) = 2x (and correlated noise by a large fraction of that).
STD_RTOL = 0.05


@pytest.mark.parametrize(
    "name, cfg_kwargs, batch, expected",
    [
        # calibrated eDP: one micro-batch of 8 per replica, S = 2C; summed noise z S C, D = N.
        ("calibrated_edp", dict(noise_mode="calibrated"), 32, lambda z, C: z * 2 * C / N),
        # paper: each replica adds y/N, y ~ N(0, (Cz)^2), to its mean update; final = mean of N.
        ("paper", dict(noise_mode="paper"), 32, lambda z, C: z * C * math.sqrt(N) / N**2),
        # per-example DP-SGD: S = C, D = B = 32.
        ("per_example", dict(microbatch_size=1), 32, lambda z, C: z * C / 32),
        # micro-batches of 2: S = 2C, D = 16 micro-batches.
        ("microbatch_2", dict(microbatch_size=2), 32, lambda z, C: z * 2 * C / 16),
    ],
)
def test_update_std_matches_formula(strategy, name, cfg_kwargs, batch, expected):
    z, C = 1.3, 0.7
    cfg = DPConfig(l2_norm_clip=C, noise_multiplier=z, **cfg_kwargs)
    update, private = one_step_update(strategy, cfg, batch)
    want = expected(z, C)
    got = float(np.std(update))
    print(f"{name}: update std {got:.6g}, formula {want:.6g}, ratio {got / want:.4f}")
    assert got == pytest.approx(want, rel=STD_RTOL)
    # mean ~ 0 within 5 standard errors of the mean
    assert abs(float(np.mean(update))) < 5 * want / math.sqrt(update.size)


def test_noise_differs_across_steps_and_is_seeded_only_on_request(strategy):
    cfg = DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0)
    a, _ = one_step_update(strategy, cfg, 32)
    b, _ = one_step_update(strategy, cfg, 32)
    # independent draws: |corr| < 5 / sqrt(n) with overwhelming probability
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)
    seeded = cfg.replace(seed=1234)
    c, private = one_step_update(strategy, seeded, 32)
    d, _ = one_step_update(strategy, seeded, 32)
    np.testing.assert_allclose(c, d, rtol=1e-6, atol=1e-7)
    facts = private.privacy_facts()
    assert facts["seed_fixed"] is True
    assert any("not private" in s for s in facts["not_covered"])


def test_noise_differs_between_consecutive_steps_of_one_fit(strategy):
    """Two steps of one fit: the second update's noise must not repeat the first's."""
    width = 1250
    with strategy.scope():
        inner = wide_model(width)
        private = PrivateModel(inner, DPConfig(noise_multiplier=1.0))
        private.compile(optimizer=keras.optimizers.SGD(1.0), loss=zero_loss)
    x = np.ones((64, 4), "float32")
    y = np.zeros((64, width), "float32")
    w0 = inner.get_weights()[0].copy()
    private.fit(x[:32], y[:32], batch_size=32, verbose=0)
    w1 = inner.get_weights()[0].copy()
    private.fit(x[:32], y[:32], batch_size=32, verbose=0)
    w2 = inner.get_weights()[0].copy()
    u1, u2 = (w1 - w0).ravel(), (w2 - w1).ravel()
    assert abs(np.corrcoef(u1, u2)[0, 1]) < 5 / math.sqrt(u1.size)


def small_regression(seed=0, batch=16):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch * 3, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 3))).astype("float32")
    return x, y


def small_model():
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(7, activation="tanh"), keras.layers.Dense(3)]
    )


@pytest.mark.parametrize("microbatch_size, physical", [(None, None), (1, None), (2, None),
                                                      (None, 2), (2, 2)])
def test_no_noise_huge_clip_equals_ordinary_training(strategy, microbatch_size, physical):
    """physical: replica batches processed in chunks of that many examples (same update)."""
    x, y = small_regression()
    reference = small_model()
    init = reference.get_weights()
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

    with strategy.scope():
        inner = small_model()
        inner.set_weights(init)
        private = PrivateModel(
            inner, DPConfig(l2_norm_clip=1e9, noise_multiplier=0.0,
                            microbatch_size=microbatch_size, physical_batch_size=physical))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.MeanSquaredError())
    history = private.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(inner.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert history.history["clipped_fraction"] == [0.0, 0.0]


def per_example_reference(model, x, y, alpha, C, lr):
    """Plain loop: per-example gradients, scaled, clipped to C, unscaled, averaged."""
    total = [np.zeros(v.shape, np.float64) for v in model.trainable_variables]
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(mse(y[i : i + 1], model(x[i : i + 1])))
        grads = tape.gradient(loss, model.trainable_variables)
        scaled = [g.numpy() / a for g, a in zip(grads, alpha)]
        norm = math.sqrt(sum(float(np.sum(s**2)) for s in scaled))
        factor = min(1.0, C / norm)
        for t, s, a in zip(total, scaled, alpha):
            t += a * s * factor
    return [w - lr * t / len(x) for w, t in zip(model.get_weights(), total)]


@pytest.mark.parametrize("microbatch_size, physical", [(1, None), (2, None), (1, 2), (2, 2)])
def test_clipping_and_layer_scales_match_plain_loop(strategy, microbatch_size, physical):
    """Per-example (and per-micro-batch) clipping in the alpha-scaled space, with z = 0; also
    with the replica batches processed in chunks of `physical` examples."""
    x, y = small_regression(seed=3)
    x, y = x[:16], y[:16]
    alpha_raw = (2.0, 0.5, 1.0, 3.0)  # kernel, bias, kernel, bias
    C, lr = 0.05, 0.3  # small C: every contribution is clipped
    reference = small_model()
    init = reference.get_weights()
    with strategy.scope():
        inner = small_model()
        inner.set_weights(init)
        cfg = DPConfig(l2_norm_clip=C, noise_multiplier=0.0, microbatch_size=microbatch_size,
                       scaling="public", layer_scales=alpha_raw, physical_batch_size=physical)
        private = PrivateModel(inner, cfg)
        private.compile(optimizer=keras.optimizers.SGD(lr), loss=mse)
    history = private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    alpha = private.layer_scales
    assert sum(a * a for a in alpha) == pytest.approx(len(alpha))  # normalised: sum a^2 = K
    assert np.allclose(np.array(alpha) / np.array(alpha_raw), alpha[0] / alpha_raw[0])
    assert history.history["clipped_fraction"] == [1.0]

    if microbatch_size == 1:
        want = per_example_reference(reference, x, y, alpha, C, lr)
    else:  # micro-batches of 2 consecutive examples: clip each pair's mean gradient
        total = [np.zeros(v.shape, np.float64) for v in reference.trainable_variables]
        for j in range(0, 16, 2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(mse(y[j : j + 2], reference(x[j : j + 2])))
            scaled = [g.numpy() / a for g, a in
                      zip(tape.gradient(loss, reference.trainable_variables), alpha)]
            norm = math.sqrt(sum(float(np.sum(s**2)) for s in scaled))
            for t, s, a in zip(total, scaled, alpha):
                t += a * s * min(1.0, C / norm)
        want = [w - lr * t / 8 for w, t in zip(reference.get_weights(), total)]
    for got, w in zip(inner.get_weights(), want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)


def test_stacked_clip_bounds_every_contribution():
    rng = np.random.default_rng(1)
    stacked = [tf.constant(rng.normal(size=(6, 3, 2)) * 10, tf.float32),
               tf.constant(rng.normal(size=(6, 4)), tf.float32)]
    C = 1.5
    from edp_tf import microbatch

    result = microbatch.StackedGradients(stacked, None, None, [1.0, 1.0]).clip(C)
    norms = np.sqrt(sum(np.sum(s.numpy().reshape(6, -1) ** 2, 1) for s in stacked))
    np.testing.assert_allclose(result.norms.numpy(), norms, rtol=1e-5)
    factors = np.minimum(1.0, C / norms)
    for got, s in zip(result.clipped_sum, stacked):
        np.testing.assert_allclose(got.numpy(), np.tensordot(factors, s.numpy(), 1), rtol=1e-5)
    clipped_norms = norms * factors
    assert np.all(clipped_norms <= C * (1 + 1e-6))


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
                                               microbatch_size=1))
        private.compile(optimizer=keras.optimizers.SGD(lr), loss=mse)
    history = private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert history.history["nonfinite_microbatches"] == [1.0]
    weights = inner.get_weights()
    assert all(np.all(np.isfinite(w)) for w in weights)
    keep = np.arange(16) != 3
    # the NaN example adds zero but the normaliser stays the batch size (16)
    want = per_example_reference(reference, x[keep], y[keep], (1.0,) * 4, C, lr * 15 / 16)
    for got, w in zip(weights, want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)


def test_edp_nonfinite_replica_batch_is_dropped(strategy):
    x, y = small_regression(seed=6)
    x, y = x[:16].copy(), y[:16]
    x[0, 0] = np.inf  # replica 0's whole micro-batch becomes non-finite
    with strategy.scope():
        inner = small_model()
        private = PrivateModel(inner, DPConfig(noise_multiplier=0.5))
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
    with pytest.raises(ValueError, match="divisible"):
        private.fit(x, y, batch_size=10, verbose=0)


def test_compile_errors():
    private = PrivateModel(small_model(), DPConfig())
    with pytest.raises(ValueError, match="loss"):
        private.compile(optimizer="sgd")
    with pytest.raises(ValueError, match="clipnorm"):
        private.compile(optimizer=keras.optimizers.SGD(clipnorm=1.0), loss=mse)
    with pytest.raises(ValueError, match="DPConfig"):
        PrivateModel(small_model(), {"l2_norm_clip": 1.0})


def test_scalings_and_what_they_report(strategy):
    x, y = small_regression()
    facts = {}
    for scaling in ("first_batch", "private", "public"):
        with strategy.scope():
            private = PrivateModel(small_model(), DPConfig(scaling=scaling, noise_multiplier=0.5))
            private.compile(optimizer=keras.optimizers.SGD(0.01), loss=mse)
        if scaling == "public":
            with pytest.raises(ValueError, match="public"):
                private.fit(x, y, batch_size=16, verbose=0)
            pub_x, pub_y = small_regression(seed=9)
            private.set_public_layer_scales(pub_x, pub_y)
        private.fit(x, y, batch_size=16, verbose=0)
        alpha = np.array(private.layer_scales)
        assert alpha.shape == (4,) and np.all(alpha > 0)
        assert np.sum(alpha**2) == pytest.approx(4.0)
        facts[scaling] = private.privacy_facts()
    assert any("first private batch" in s for s in facts["first_batch"]["not_covered"])
    assert facts["public"]["not_covered"] == [] and facts["public"]["extra_events"] == []
    (event,) = facts["private"]["extra_events"]
    assert event["name"] == "private_layer_scales" and event["noise_multiplier"] == 5.0
    assert facts["private"]["not_covered"] == []


def test_first_batch_scales_follow_gradient_norms(strategy):
    """alpha_k is proportional to ||g_k|| of the first batch's mean gradient (the paper's rule)."""
    x, y = small_regression(seed=2)
    reference = small_model()
    init = reference.get_weights()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(mse(y[:16], reference(x[:16])))
    norms = np.array([np.linalg.norm(g) for g in
                      tape.gradient(loss, reference.trainable_variables)])
    with strategy.scope():
        inner = small_model()
        inner.set_weights(init)
        private = PrivateModel(inner, DPConfig(scaling="first_batch", noise_multiplier=0.0))
        private.compile(optimizer=keras.optimizers.SGD(0.0), loss=mse)
    private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    want = edp_tf.scaling.normalize(norms)
    np.testing.assert_allclose(private.layer_scales, want, rtol=1e-4)


def test_wrapped_model_is_free_of_privacy_machinery(strategy):
    with strategy.scope():
        inner = small_model()
        private = PrivateModel(inner, DPConfig())
    assert private.wrapped_model is inner
    assert len(inner.weights) == 4


def test_make_strategy_errors():
    with pytest.raises(ValueError, match="replicas"):
        edp_tf.make_strategy(0)
    with pytest.raises(RuntimeError, match="logical CPU devices"):
        edp_tf.make_strategy(64)  # TF is initialised with 4 logical devices by now


def test_physical_batch_size_processes_chunks(strategy, monkeypatch):
    """The chunked path really runs: one unchunked_gradients per chunk and replica when traced."""
    from edp_tf import microbatch

    calls = []
    original = microbatch.unchunked_gradients
    monkeypatch.setattr(microbatch, "unchunked_gradients",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    x, y = small_regression()
    with strategy.scope():
        private = PrivateModel(small_model(), DPConfig(noise_multiplier=0.0, microbatch_size=1,
                                                       physical_batch_size=2))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    private.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    per_replica = 16 // strategy.num_replicas_in_sync
    assert len(calls) == strategy.num_replicas_in_sync * per_replica // 2


def test_noise_owners_balance_the_draws():
    from edp_tf import noise

    assert noise.noise_owners([10, 1000, 5, 990], 2) == (1, 0, 0, 1)
    assert noise.noise_owners([7, 3], 1) == (0, 0)
    assert sorted(noise.noise_owners([4] * 8, 4)) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_each_variable_gets_the_whole_summed_noise(strategy):
    """One owner replica draws each variable's noise with std sqrt(N) x the per-replica std: the
    kernel and the bias (different owners) must each show the formula's std. 1,250 bias entries:
    relative standard error 2%, so 10% is 5 of them; a missing sqrt(N) would be off by 2x."""
    z, C = 1.3, 0.7
    update, private = one_step_update(strategy, DPConfig(l2_norm_clip=C, noise_multiplier=z), 32)
    kernel, bias = update[: 4 * 1250], update[4 * 1250:]
    assert len(set(private._noise_owners)) == 2
    want = z * 2 * C / N
    assert float(np.std(kernel)) == pytest.approx(want, rel=0.05)
    assert float(np.std(bias)) == pytest.approx(want, rel=0.10)
