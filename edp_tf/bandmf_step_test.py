"""BandMF in the private step: the correlated noise on 1 and 2 replicas, its state kept out of
checkpoints, and the run's sampler, plan and ledger (conftest.py: 4 logical CPU devices)."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_tf import (
    DPConfig,
    Mechanism,
    PrivacyLedger,
    PrivacyPlan,
    PrivateModel,
    accounting,
    bandmf,
    make_strategy,
    sampling,
)
from edp_tf.testing import wide_model, zero_loss

BATCH, WIDTH = 8, 1250


class _Weights(keras.callbacks.Callback):
    def __init__(self, model):
        super().__init__()
        self.inner, self.seen = model, [np.concatenate(
            [w.ravel() for w in model.get_weights()])]

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(np.concatenate([w.ravel() for w in self.inner.get_weights()]))


def noise_sequence(strategy, config, steps):
    """The summed noise y_t of `steps` steps of a zero-gradient model (SGD(1): the update is
    -y_t / D)."""
    with strategy.scope():
        inner = wide_model(WIDTH)
        private = PrivateModel(inner, config)
        private.compile(optimizer=keras.optimizers.SGD(1.0), loss=zero_loss)
    x = np.ones((BATCH * steps, 4), "float32")
    y = np.zeros((BATCH * steps, WIDTH), "float32")
    weights = _Weights(inner)
    private.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                callbacks=[weights])
    seen = np.array(weights.seen)
    return -(seen[1:] - seen[:-1]) * private.mechanism.expected_microbatches, private


@pytest.mark.parametrize("replicas", [1, 2])
def test_noise_follows_the_banded_recurrence_with_fresh_draws(strategy, replicas):
    """C y must give back z: every step's z_t of std z S C and uncorrelated with z_{t-1}.
    Noise without the history (y_t = z_t / c_0) or with one draw per replica would fail:
    6,250 entries per step give the std to a relative standard error of 0.9%, so 5% is over
    5 of them, while y_t = z_t / c_0 alone makes the reconstructed z_t off by the
    c_k y_{t-k} terms (std about 0.5 of z's), and 2 independent draws raise the std 41%."""
    bands, steps, z, clip = 3, 6, 1.3, 0.7
    used = strategy if replicas == 2 else make_strategy(1)
    config = DPConfig(l2_norm_clip=clip, noise_multiplier=z, microbatch_size=1,
                      expected_batch_size=float(BATCH), bandmf_bands=bands)
    y, private = noise_sequence(used, config, steps)
    c = private.mechanism.strategy_coefficients
    assert c == bandmf.default_coefficients(bands)  # no plan: the unoptimised strategy
    # z_t = sum_k c_k y_{t-k}: the C x (noise) the analysis releases
    recovered = np.array([sum(c[k] * y[t - k] for k in range(bands) if t - k >= 0)
                          for t in range(steps)])
    sigma = z * 1 * clip  # S = 1 for per-example micro-batches
    for t in range(steps):
        assert float(np.std(recovered[t])) == pytest.approx(sigma, rel=0.05), t
    for t in range(1, steps):
        corr = np.corrcoef(recovered[t], recovered[t - 1])[0, 1]
        assert abs(corr) < 5 / math.sqrt(recovered[t].size), (t, corr)
    # the released noise itself is correlated, with the marginal std the strategy predicts
    marginal = bandmf.marginal_noise_std(c, steps) * sigma
    np.testing.assert_allclose(np.std(y, axis=1), marginal, rtol=0.05)
    assert np.corrcoef(y[1], y[0])[0, 1] < -0.3  # c_1 > 0: y_1 leans against y_0


def test_noise_history_stays_out_of_checkpoints_and_the_model(tmp_path):
    config = DPConfig(noise_multiplier=1.0, microbatch_size=1, expected_batch_size=8.0,
                      bandmf_bands=2)
    _, private = noise_sequence(make_strategy(1), config, 2)
    history = private.noise_stage.history
    assert len(history) == 2 and float(np.abs(history[0].numpy()).max()) > 0
    path = tf.train.Checkpoint(model=private, optimizer=private.optimizer).write(
        str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert names and not any("bandmf" in n or "history" in n for n in names), names
    held = {id(v) for v in private.wrapped_model.weights + private.weights}
    assert not any(id(h) in held for h in history)


def test_bandmf_is_refused_where_its_proof_does_not_reach():
    with pytest.raises(ValueError, match="decay='none'"):
        DPConfig(microbatch_size=1, expected_batch_size=8.0, bandmf_bands=2,
                 decay="linear", decay_rate=0.5)
    with pytest.raises(ValueError, match="expected_batch_size"):
        Mechanism.from_config(DPConfig(microbatch_size=1, bandmf_bands=2), 1, 8)
    with pytest.raises(ValueError, match="bandmf_bands must be an integer >= 1"):
        DPConfig(bandmf_bands=0)
    with pytest.raises(ValueError, match="L2 norm <= 1"):
        Mechanism(1, 8, 1, expected_batch_size=8.0, bands=2, strategy=(0.9, 0.9))


def _tiny():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def _loss(y_true, y_pred):
    return keras.ops.sum(keras.ops.square(y_pred - y_true), axis=-1)


def test_plan_sampler_and_ledger_charge_the_amplified_event(tmp_path):
    n, q, bands, epochs = 96, 1 / 24, 2, 2
    sampler = sampling.BandMFSampler(n, q, bands=bands)  # OS entropy: a private run
    steps = sampler.steps_per_epoch  # 2 x ceil(1 / (2 q)) = 24
    config = DPConfig(l2_norm_clip=1.0, microbatch_size=1,
                      expected_batch_size=sampler.expected_batch_size, bandmf_bands=bands)
    mechanism = Mechanism.from_config(config, 1, sampler.max_batch_size)
    plan = PrivacyPlan(mechanism, n, q, 1e-3, epochs, steps).calibrated(8.0)
    assert plan.mechanism.strategy == bandmf.optimal_coefficients(epochs * steps, bands)
    config = config.replace(noise_multiplier=plan.mechanism.noise_multiplier)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")
    with make_strategy(1).scope():
        private = PrivateModel(_tiny(), config, plan=plan)
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=_loss)
    led = PrivacyLedger.for_sampler(tmp_path, sampler, 1e-3)
    # a plain Poisson sample, or a BandMF sampler of other bands, is another sampling
    for other in (sampling.PoissonSampler(n, q, seed=3),
                  sampling.BandMFSampler(n, q, bands=4, seed=3)):
        with pytest.raises(ValueError, match="another sampler"):
            private.fit(other.dataset(x, y), epochs=1, verbose=0, callbacks=[led])
    private.fit(sampler.dataset(x, y), epochs=epochs, verbose=0, callbacks=[led])
    ledger = led.ledger
    assert ledger["bands"] == bands and ledger["private"] is True
    assert ledger["bandmf_coefficients"] == list(plan.mechanism.strategy)
    records = led.records
    assert [r.bands for r in records] == [bands] * epochs
    assert ledger["epsilon"] == pytest.approx(accounting.compute_epsilon(records, q, 1e-3))
    assert ledger["epsilon"] == pytest.approx(plan.epsilon(), rel=1e-9) and ledger["epsilon"] <= 8
    # the same steps as DP-SGD would have cost more at this z (T at q vs T / b at b q is
    # the trade: here it is charged as the amplified event, not as T steps at q)
    dpsgd = tuple(accounting.EpochRecord(r.epoch, r.steps, r.noise_multiplier,
                                         r.effective_noise_multiplier) for r in records)
    assert accounting.compute_epsilon(dpsgd, q, 1e-3) != pytest.approx(ledger["epsilon"])


def test_a_bandmf_step_refuses_a_plain_poisson_ledger(tmp_path):
    n, q = 96, 1 / 24
    plain = sampling.PoissonSampler(n, q, seed=3)
    config = DPConfig(noise_multiplier=1.0, microbatch_size=1,
                      expected_batch_size=plain.expected_batch_size, bandmf_bands=2)
    x, y = np.ones((n, 3), "float32"), np.ones((n, 2), "float32")
    with make_strategy(1).scope():
        private = PrivateModel(_tiny(), config)
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=_loss)
    led = PrivacyLedger.for_sampler(tmp_path, plain, 1e-3)
    with pytest.raises(ValueError, match="PoissonSampler's batches are not the step's unit: "
                                         "bands 1 in the sampler vs 2 in the step"):
        private.fit(plain.dataset(x, y), epochs=1, verbose=0, callbacks=[led])
    with pytest.raises(ValueError, match="steps_per_epoch=3 must be a multiple"):
        private.fit(plain.dataset(x, y, repeat=True), steps_per_epoch=3, verbose=0)


def test_make_private_runs_bandmf_through_its_own_sampler():
    private = edp_tf.make_private(_tiny(), target_epsilon=8.0, epochs=2, batch_size=8,
                                  bandmf_bands=4)
    private.compile(optimizer=keras.optimizers.SGD(0.1), loss=_loss)
    x = np.random.default_rng(0).normal(size=(96, 3)).astype("float32")
    private.fit(x, np.zeros((96, 2), "float32"), verbose=0)
    assert isinstance(private.batch_source.sampler, sampling.BandMFSampler)
    assert private.batch_source.sampler.bands == 4
    assert private.mechanism.strategy == bandmf.optimal_coefficients(2 * 12, 4)
    assert [r.bands for r in private._ledger.records] == [4, 4]
    assert 7.0 < private.epsilon <= 8.0
