"""edp_tf/mechanism.py: the step's constants and the accountant's multiplier come from one value."""
import math

import pytest

from edp_tf import accounting, plan
from edp_tf.config import DPConfig
from edp_tf.mechanism import Mechanism, effective_noise_multiplier, sensitivity


@pytest.mark.parametrize("mode,replicas,k", [
    ("calibrated", 1, None), ("calibrated", 4, None), ("calibrated", 4, 1), ("calibrated", 2, 4),
    ("paper", 1, None), ("paper", 4, None)])  # paper mode: one micro-batch per replica
def test_per_replica_std_sums_to_the_accountants_multiplier(mode, replicas, k):
    """N independent per-replica draws sum to std sqrt(N) sigma_r, which the accountant divides
    by S C: the step's noise and the ledger's z_eff are the same number."""
    m = Mechanism(replicas, 64, k, l2_norm_clip=0.7, noise_multiplier=1.3, noise_mode=mode)
    summed = m.per_replica_noise_std(1.3) * math.sqrt(replicas)
    assert summed / (m.sensitivity * 0.7) == pytest.approx(m.effective_noise_multiplier(), 1e-12)
    want = 1.3 if mode == "calibrated" else 1.3 / (math.sqrt(replicas) * m.sensitivity)
    assert m.effective_noise_multiplier() == pytest.approx(want, rel=1e-12)


def test_geometry_of_fixed_and_poisson_batches():
    fixed = Mechanism(4, 64, 2)
    assert (fixed.per_replica_batch, fixed.examples_per_microbatch,
            fixed.microbatches_per_replica, fixed.sensitivity) == (16, 2, 8, 2)
    assert fixed.expected_examples_per_microbatch == 2.0
    assert fixed.expected_microbatches == 32.0  # N * m
    # Poisson: 80 padded rows, 40 expected: a micro-batch of 2 holds 1 real example on average
    poisson = Mechanism(4, 80, 2, expected_batch_size=40.0)
    assert poisson.expected_examples_per_microbatch == pytest.approx(1.0)
    assert poisson.expected_microbatches == pytest.approx(40.0)
    per_example = Mechanism(2, 80, 1, expected_batch_size=40.0)
    assert (per_example.sensitivity, per_example.expected_microbatches) == (1, 40.0)
    edp = Mechanism(2, 64)  # one micro-batch of 32 per replica
    assert (edp.examples_per_microbatch, edp.sensitivity, edp.expected_microbatches) == (32, 2, 2)
    assert Mechanism(4, 4).sensitivity == 1  # one row per replica is one example per micro-batch
    # augmented copies: 4 rows of one example per micro-batch, accounted as one example
    copies = Mechanism(2, 320, 1, expected_batch_size=40.0, augment_copies=4)
    assert (copies.sensitivity, copies.rows_per_microbatch, copies.microbatches_per_replica,
            copies.expected_examples_per_microbatch, copies.expected_microbatches) == (
        1, 4, 40, None, 40.0)
    assert copies.expected_microbatches == per_example.expected_microbatches
    assert copies.to_dict()["microbatch_size"] == 1


def test_from_config_and_schedule_agree_with_the_config():
    cfg = DPConfig(l2_norm_clip=0.5, noise_multiplier=2.0, microbatch_size=1, decay="linear",
                   decay_rate=0.5, expected_batch_size=30.0)
    m = Mechanism.from_config(cfg, 2, 64)
    assert (m.l2_norm_clip, m.noise_multiplier, m.decay, m.expected_batch) == (
        0.5, 2.0, "linear", 30.0)
    records = plan.schedule(m, 3, 7)
    assert [r.epoch for r in records] == [0, 1, 2] and all(r.steps == 7 for r in records)
    for r in records:
        assert r.noise_multiplier == cfg.noise_multiplier_at(r.epoch) == m.noise_multiplier_at(
            r.epoch)
        assert r.effective_noise_multiplier == m.effective_noise_multiplier(r.noise_multiplier)


def test_calibrated_mechanism_meets_the_target():
    m = plan.calibrate(Mechanism(2, 64, 1, noise_multiplier=0.0), 4.0, 1e-5, 0.01, 3, 100)
    eps = accounting.compute_epsilon(plan.schedule(m, 3, 100), 0.01, 1e-5)
    assert eps <= 4.0 and eps > 3.9  # bisection to a relative 1e-3 in z lands just under
    looser = accounting.compute_epsilon(
        plan.schedule(Mechanism(2, 64, 1, noise_multiplier=m.noise_multiplier * 0.99), 3, 100),
        0.01, 1e-5)
    assert looser > 4.0


def test_formulas_and_errors():
    assert sensitivity(1) == 1 and sensitivity(2) == sensitivity(64) == 2
    assert accounting.sensitivity_for is sensitivity  # one formula, re-exported
    assert effective_noise_multiplier(2.0, "paper", 4, 2) == pytest.approx(0.5)
    for bad, field in [(dict(replicas=0), "replicas"), (dict(global_batch_size=0),
                                                         "global_batch_size"),
                       (dict(microbatch_size=0), "microbatch_size"),
                       (dict(l2_norm_clip=0.0), "l2_norm_clip"),
                       (dict(noise_mode="loud"), "noise_mode"), (dict(decay="fast"), "decay"),
                       (dict(expected_batch_size=-1.0), "expected_batch_size")]:
        args = dict(replicas=2, global_batch_size=8) | bad
        with pytest.raises(ValueError, match=field):
            Mechanism(**args)


def test_to_dict_holds_the_ledgers_fields():
    d = Mechanism(2, 64, 4, l2_norm_clip=0.5, expected_batch_size=48.0).to_dict()
    assert d == {"replicas": 2, "global_batch_size": 64, "microbatch_size": 4,
                 "microbatches_per_replica": 8, "sensitivity": 2, "noise_mode": "calibrated",
                 "l2_norm_clip": 0.5, "expected_batch_size": 48.0, "privacy_unit": "example",
                 "user_estimator": "fixed", "selection_noise_multiplier": None,
                 "augment_copies": 1}


def test_sparse_embedding_noise_is_charged_at_the_joint_multiplier_not_drawn_at_it():
    plain = Mechanism(1, 64, 1, noise_multiplier=1.2, expected_batch_size=64.0)
    sparse = Mechanism(1, 64, 1, noise_multiplier=1.2, expected_batch_size=64.0,
                       selection_noise_multiplier=2.0)
    assert sparse.effective_noise_multiplier() == pytest.approx((1.2 ** -2 + 2.0 ** -2) ** -0.5)
    assert sparse.per_replica_noise_std(1.2) == plain.per_replica_noise_std(1.2)
    assert [r.effective_noise_multiplier for r in plan.schedule(sparse, 2, 5)] == pytest.approx(
        [sparse.effective_noise_multiplier()] * 2)
    with pytest.raises(ValueError, match="example-level only"):
        Mechanism(1, 8, 4, expected_batch_size=2.0, privacy_unit="user",
                  selection_noise_multiplier=2.0)
