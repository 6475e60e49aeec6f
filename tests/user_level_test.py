"""User-level DP (DP-FedSGD): the sampler's batches, the sensitivity of one user, the estimator's
denominator, the per-replica noise, and the ledger's record, on 2 logical CPU replicas."""
import json
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_nlu import privacy
from edp_tf import DPConfig, Mechanism, PrivateModel, UserPoissonSampler, ledger, microbatch

N = 2
K = 3  # rows per user's micro-batch (the cap)
# 12 users with 1..9 rows each (skewed), 60 rows
USER_ROWS = [9, 8, 7, 6, 5, 5, 4, 4, 4, 3, 3, 2]
USER_OF_ROW = [u for u, count in enumerate(USER_ROWS) for _ in range(count)]


@pytest.fixture(scope="module")
def strategy():
    return edp_tf.make_strategy(N)


def data(rows=len(USER_OF_ROW), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")
    return x, y


def mse(y_true, y_pred):
    return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)


def test_each_micro_batch_is_one_users_rows_and_users_are_poisson_sampled():
    x, _ = data()
    ids = np.arange(len(USER_OF_ROW), dtype="float32")[:, None]  # row ids travel as x
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 0.3, K, replicas=N)
    assert sampler.dataset_size == 12 and sampler.max_batch_size % (N * K) == 0
    seen = np.zeros(12)
    steps = 400
    for bx, _, mask in sampler.dataset(ids, ids, steps=steps):
        bx, mask = bx.numpy()[:, 0], mask.numpy()
        users_here = []
        for slot in range(sampler.slots):
            rows = bx[slot * K:(slot + 1) * K][mask[slot * K:(slot + 1) * K] > 0].astype(int)
            if not len(rows):
                continue
            owners = {USER_OF_ROW[r] for r in rows}
            assert len(owners) == 1  # one user per micro-batch
            (user,) = owners
            assert len(rows) == min(K, USER_ROWS[user]) and len(set(rows)) == len(rows)
            users_here.append(user)
        assert len(users_here) == len(set(users_here))  # a user at most once per step
        seen[users_here] += 1
    # each user is taken with probability q = 0.3 per step: 400 steps give a binomial count
    # with std sqrt(400 * 0.3 * 0.7) = 9.2; 5 std (46) bounds all 12 with probability > 1 - 1e-5
    assert np.all(np.abs(seen - 0.3 * steps) < 46)


def clipped_sum(model, x, y, C):
    """The clipped sum of a batch as a function of its row weights, traced once for all of the
    weights a test passes (a trace costs about a second, a call milliseconds)."""
    fn = tf.function(lambda w: microbatch.clipped_gradient_sum(
        model, mse, model.trainable_variables, x, y, w, K, None, [1.0, 1.0], C), autograph=False)
    return lambda w: [g.numpy() for g in fn(tf.constant(w))[0].clipped_sum]


def test_removing_one_user_moves_the_clipped_sum_by_their_clipped_mean_gradient():
    """Brute force: a batch of one micro-batch per user; removing a user (their slot becomes
    padding) changes the clipped sum by exactly that user's clipped mean-loss gradient, whose
    norm is <= C: S = 1 (in units of C) for a user, however many rows they have."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    x, y = data(4 * K, seed=2)
    x = x * 5.0  # large gradients: every user is clipped
    w = np.array([1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1], "float32")  # users of 3, 2, 1, 3 rows
    C = 0.5
    summed = clipped_sum(model, x, y, C)
    full = summed(w)
    for user in range(4):
        without = w.copy()
        without[user * K:(user + 1) * K] = 0.0
        diff = [a - b for a, b in zip(full, summed(without))]
        rows = [i for i in range(user * K, (user + 1) * K) if w[i]]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(mse(y[rows], model(x[rows])))
        grads = tape.gradient(loss, model.trainable_variables)
        norm = math.sqrt(sum(float(tf.reduce_sum(g * g)) for g in grads))
        want = [g.numpy() * min(1.0, C / norm) for g in grads]
        for got, expected in zip(diff, want):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
        assert math.sqrt(sum(float(np.sum(d * d)) for d in diff)) <= C * (1 + 1e-5)


def test_user_mechanism_denominator_sensitivity_and_noise():
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 0.25, K, replicas=N)
    m = Mechanism(N, sampler.max_batch_size, K, l2_norm_clip=0.7, noise_multiplier=1.5,
                  expected_batch_size=sampler.expected_batch_size, privacy_unit="user")
    assert m.sensitivity == 1  # not 2, although a micro-batch holds up to 3 examples
    assert m.expected_microbatches == pytest.approx(0.25 * 12)  # q W: the fixed denominator
    assert m.expected_examples_per_microbatch is None  # a user's mean loss
    assert m.per_replica_noise_std(1.5) == pytest.approx(1.5 * 0.7 / math.sqrt(N))
    with pytest.raises(ValueError, match="privacy_unit"):
        Mechanism(N, 12, None, expected_batch_size=3.0, privacy_unit="user")
    with pytest.raises(ValueError, match="privacy_unit"):
        DPConfig(microbatch_size=K, privacy_unit="user")  # no expected_batch_size


def fit(strategy, tmp_path, sampler, **cfg):
    config = DPConfig(**{"l2_norm_clip": 1.0, "noise_multiplier": 1.0, "microbatch_size": K,
                         "expected_batch_size": sampler.expected_batch_size, **cfg})
    with strategy.scope():
        model = PrivateModel(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]), config)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=mse)
    led = ledger.PrivacyLedger.for_sampler(tmp_path, sampler, 1e-3)
    model.fit(sampler.dataset(*data()), epochs=1, verbose=0, callbacks=[led])
    with open(os.path.join(tmp_path, "privacy.json")) as f:
        return json.load(f)


def test_ledger_records_the_user_level_mechanism(strategy, tmp_path):
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 0.25, K, replicas=N)
    led = fit(strategy, tmp_path, sampler, privacy_unit="user")
    assert led["privacy_unit"] == "user" and led["private"] is True
    assert led["dataset_size"] == 12 and led["sampling_rate"] == 0.25  # users, q over users
    assert led["sensitivity"] == 1 and led["microbatch_size"] == K
    # the epsilon is the Poisson-subsampled Gaussian over 12 users, recomputed independently
    records = [edp_tf.accounting.EpochRecord.from_dict(e) for e in led["epochs"]]
    assert led["epsilon"] == pytest.approx(
        edp_tf.accounting.compute_epsilon(records, 0.25, 1e-3), rel=1e-9)


def test_mismatched_unit_or_cap_is_refused(strategy, tmp_path):
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 0.25, K, replicas=N)
    with pytest.raises(ValueError, match="privacy_unit"):  # example-level step, user batches
        fit(strategy, tmp_path / "a", sampler)
    with pytest.raises(ValueError, match="exactly one user"):  # two users per micro-batch
        other = UserPoissonSampler.for_users(USER_OF_ROW, 0.25, 2 * K, replicas=N)
        fit(strategy, tmp_path / "b", other, privacy_unit="user")


def test_more_users_than_slots_raises_instead_of_truncating():
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 1.0, K, replicas=N,
                                           max_batch_size=N * K)  # 2 slots, 12 users taken
    x, y = data()
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than 2 users"):
        next(iter(sampler.dataset(x, y, steps=1)))


# ----------------------------------------------------------- the clipped-denominator estimator
def one_user_step(strategy, users, present, width, estimator, z, C, loss):
    """One step over `users` micro-batches of K rows (the first `present` hold a user, the rest
    padding) with D = 4 expected users; returns the update of SGD(1)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(users * K, 3)).astype("float32")
    y = rng.normal(size=(users * K, width)).astype("float32")
    w = np.zeros(users * K, "float32")
    w[:present * K] = 1.0
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(width)])
        model = PrivateModel(inner, DPConfig(
            l2_norm_clip=C, noise_multiplier=z, microbatch_size=K, privacy_unit="user",
            expected_batch_size=4.0, user_estimator=estimator))
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss)
    before = [v.numpy().copy() for v in inner.trainable_variables]
    model.fit(tf.data.Dataset.from_tensors((x, y, w)), epochs=1, verbose=0)
    return [v.numpy() - b for v, b in zip(inner.trainable_variables, before)], (x, y, w), inner


def zero_loss(y_true, y_pred):
    return 0.0 * keras.ops.sum(y_pred, axis=-1)


@pytest.mark.parametrize("present", [2, 8])  # fewer and more users than the expected 4
def test_clipped_estimator_noise_on_the_average_is_z_2C_over_D(strategy, present):
    """Zero loss: the update is the noise alone. Whatever the denominator max(4, users), the
    average carries std z S C / D with S = 2 (D = 4). 1,250 x 4 kernel entries: the sample std
    has relative error 1% (1/sqrt(2 x 5000)); 5% is 5 of them, while dividing the noise by 8
    users instead of 4 would be off by 2x."""
    update, _, _ = one_user_step(strategy, 8, present, 1250, "clipped", 1.3, 0.7, zero_loss)
    assert float(np.std(update[0])) == pytest.approx(1.3 * 2 * 0.7 / 4, rel=0.05)
    fixed, _, _ = one_user_step(strategy, 8, present, 1250, "fixed", 1.3, 0.7, zero_loss)
    assert float(np.std(fixed[0])) == pytest.approx(1.3 * 1 * 0.7 / 4, rel=0.05)


@pytest.mark.parametrize("present, denominator", [(2, 4.0), (6, 6.0)])
def test_clipped_estimator_divides_by_max_of_expected_and_drawn_users(strategy, present,
                                                                      denominator):
    """z = 0, C large: the update is minus the sum of the users' mean-loss gradients over
    max(D, users drawn), D = 4 (users spread over both replicas)."""
    update, (x, y, w), inner = one_user_step(strategy, 8, present, 2, "clipped", 0.0, 1e6, mse)
    keras.utils.set_random_seed(0)
    reference = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    total = [np.zeros(v.shape) for v in reference.trainable_variables]
    for u in range(present):
        rows = slice(u * K, (u + 1) * K)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(mse(y[rows], reference(x[rows])))
        for t, g in zip(total, tape.gradient(loss, reference.trainable_variables)):
            t += g.numpy()
    for got, t in zip(update, total):
        np.testing.assert_allclose(got, -t / denominator, rtol=1e-4, atol=1e-6)


def test_clipped_estimator_is_recorded_and_checked(strategy, tmp_path):
    m = Mechanism(N, 12, K, expected_batch_size=3.0, privacy_unit="user",
                  user_estimator="clipped")
    assert m.sensitivity == 2 and m.to_dict()["user_estimator"] == "clipped"
    with pytest.raises(ValueError, match="needs privacy_unit='user'"):
        DPConfig(microbatch_size=K, user_estimator="clipped")
    with pytest.raises(ValueError, match="user_estimator"):
        DPConfig(microbatch_size=K, privacy_unit="user", expected_batch_size=3.0,
                 user_estimator="median")
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 0.25, K, replicas=N)
    led = fit(strategy, tmp_path, sampler, privacy_unit="user", user_estimator="clipped")
    assert led["user_estimator"] == "clipped" and led["sensitivity"] == 2

    assert "clipped-denominator estimator" in privacy.statement_from_ledger(led)


# ------------------------------------------------------------------- per-user weights
def test_weighted_users_scale_their_clipped_update_and_the_denominator():
    """w_k = min(n_k / w_hat, 1) with w_hat = 6: users of 9..2 rows weigh 1..1/3. The sampler's
    masks carry w_k, the expected batch is q sum w_k, and in the clipped sum each user moves it
    by w_k x their clipped mean-loss gradient (norm <= w_k C <= C) for every method."""
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 0.3, K, replicas=N, weight_cap=6)
    weights = [min(c / 6, 1.0) for c in USER_ROWS]
    assert sampler.user_weights == pytest.approx(weights)
    assert sampler.expected_batch_size == pytest.approx(0.3 * sum(weights))
    ids = np.arange(len(USER_OF_ROW), dtype="float32")[:, None]
    for bx, _, mask in sampler.dataset(ids, ids, steps=20):
        for row, m in zip(bx.numpy()[:, 0], mask.numpy()):
            if m > 0:
                assert m == pytest.approx(weights[USER_OF_ROW[int(row)]])
    with pytest.raises(ValueError, match="weight_cap"):
        UserPoissonSampler.for_users(USER_OF_ROW, 0.3, K, weight_cap=0)

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    x, y = data(4 * K, seed=2)
    x = x * 5.0  # every user clipped
    user_w = [1.0, 0.5, 0.25, 0.75]
    w = np.array([1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1], "float32")
    weighted = w * np.repeat(user_w, K).astype("float32")
    C = 0.5
    want = [np.zeros(v.shape) for v in model.trainable_variables]
    for user in range(4):
        rows = [i for i in range(user * K, (user + 1) * K) if w[i]]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(mse(y[rows], model(x[rows])))
        grads = tape.gradient(loss, model.trainable_variables)
        norm = math.sqrt(sum(float(tf.reduce_sum(g * g)) for g in grads))
        for t, g in zip(want, grads):
            t += user_w[user] * g.numpy() * min(1.0, C / norm)
    for method in ("ghost", "vectorized", "loop"):
        fn = tf.function(lambda: microbatch.clipped_gradient_sum(
            model, mse, model.trainable_variables, x, y, weighted, K, None, [1.0, 1.0], C,
            method=method), autograph=False)
        for got, expected in zip(fn()[0].clipped_sum, want):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-6,
                                       err_msg=method)


def test_weighted_sampler_needs_the_weighted_denominator(strategy, tmp_path):
    sampler = UserPoissonSampler.for_users(USER_OF_ROW, 0.25, K, replicas=N, weight_cap=6)
    led = fit(strategy, tmp_path / "ok", sampler, privacy_unit="user")
    assert led["batch_size"] == pytest.approx(sampler.expected_batch_size) and led["private"]
    with pytest.raises(ValueError, match="total weight"):
        fit(strategy, tmp_path / "bad", sampler, privacy_unit="user",
            expected_batch_size=0.25 * 12)  # q x users, not q W
