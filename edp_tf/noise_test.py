"""Noise of the private step: its std per mode, independence across replicas and steps, one
owner replica per variable (2 logical CPU replicas, edp_tf/conftest.py)."""
import math

import keras
import numpy as np
import pytest

from edp_tf import DPConfig, PrivateModel, noise
from edp_tf.testing import wide_model, zero_loss

N = 2  # replicas: edp_tf/conftest.py's strategy


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
# 5% tolerance is > 5 standard errors, while identical noise on the replicas would be off by
# sqrt(N) (41% on 2; correlated noise by a large fraction of that).
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
        # secure mode: the sum of 4 draws / 2 has the same std, independent across replicas
        ("secure_per_example", dict(microbatch_size=1, secure_noise=True), 32,
         lambda z, C: z * C / 32),
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


def test_noise_owners_balance_the_draws():
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
    assert len(set(private.noise_stage.owners)) == 2
    want = z * 2 * C / N
    assert float(np.std(kernel)) == pytest.approx(want, rel=0.05)
    assert float(np.std(bias)) == pytest.approx(want, rel=0.10)


def test_secure_noise_takes_its_whole_state_from_the_os_csprng(monkeypatch):
    drawn = iter([11, 22, 33])
    monkeypatch.setattr(noise.secrets, "randbits", lambda bits: next(drawn))
    assert list(noise.SecureNormal().generator.state.numpy()) == [11, 22, 33]
    monkeypatch.undo()
    a, b = noise.SecureNormal(), noise.SecureNormal()
    assert not np.array_equal(a.generator.state.numpy(), b.generator.state.numpy())
    with pytest.raises(ValueError, match="secure_noise"):
        DPConfig(secure_noise=True, seed=3)
    # 4 x 10^5 samples: the sample variance's standard error is sqrt(2 / n) = 0.22%, and the
    # fourth moment's (3 for a Gaussian) is about 1.5%: 5% and 10% are > 6 standard errors
    sample = a.normal([400_000]).numpy()
    assert np.var(sample) == pytest.approx(1.0, rel=0.05)
    assert np.mean(sample ** 4) == pytest.approx(3.0, rel=0.10)
