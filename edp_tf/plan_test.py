"""PrivacyPlan: the schedule and calibration it states are the ones the accountant and the step
use, and PrivateModel refuses to run a step the plan was not made for."""
import dataclasses

import keras
import pytest

from edp_tf import DPConfig, Mechanism, PrivacyLedger, PrivacyPlan, PrivateModel, accounting, plan
from edp_tf.partition_selection import GaussianThresholding
from edp_tf.testing import mse, small_model, small_regression


def _plan(**changes):
    mechanism = Mechanism.from_config(DPConfig(noise_multiplier=1.0, microbatch_size=1,
                                               decay="linear", decay_rate=0.5), 1, 16)
    return PrivacyPlan(mechanism, dataset_size=48, sampling_rate=1 / 3, delta=1e-3, epochs=3,
                       steps_per_epoch=3, **changes)


def test_the_plan_states_the_accountants_schedule_and_epsilon():
    p = _plan()
    records = p.schedule()
    assert [(r.epoch, r.steps) for r in records] == [(0, 3), (1, 3), (2, 3)]
    assert [r.noise_multiplier for r in records] == [1.0, 1 / 1.5, 1 / 2.0]
    assert p.schedule(first_epoch=1) == records[1:]
    assert p.epsilon() == accounting.compute_epsilon(records, 1 / 3, 1e-3)


def test_calibration_meets_the_target_with_the_extra_query_charged():
    extra = accounting.ExtraEvent("private_layer_scales", 5.0)
    calibrated = _plan(extra_events=(extra,)).calibrated(4.0)
    assert 3.9 < calibrated.epsilon() <= 4.0
    assert calibrated.mechanism == plan.calibrate(_plan().mechanism, 4.0, 1e-3, 1 / 3, 3, 3,
                                                  (extra,))
    without = _plan().calibrated(4.0)  # the extra query costs noise
    assert without.mechanism.noise_multiplier < calibrated.mechanism.noise_multiplier


@pytest.mark.parametrize("field, value", [("dataset_size", 0), ("sampling_rate", 1.5),
                                          ("delta", 1.0), ("epochs", 0),
                                          ("steps_per_epoch", 0), ("mechanism", "z=1")])
def test_a_bad_plan_names_the_field(field, value):
    with pytest.raises(ValueError, match=field if field != "delta" else "delta"):
        dataclasses.replace(_plan(), **{field: value})


def test_private_model_runs_the_plans_mechanism_and_reports_its_sentences():
    x, y = small_regression()
    config = DPConfig(noise_multiplier=1.0, microbatch_size=1)
    made = PrivacyPlan(Mechanism.from_config(config, 1, 16), 48, 1 / 3, 1e-3, 1, 3,
                       not_covered=("a public corpus was used",))
    private = PrivateModel(small_model(), config, plan=made)
    private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    private.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert private.mechanism is made.mechanism
    assert private.privacy_facts()["not_covered"] == ["a public corpus was used"]
    other = PrivateModel(small_model(), config, plan=made)  # batches of 8: another step
    other.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    with pytest.raises(ValueError, match="global_batch_size 16 planned vs 8 here"):
        other.fit(x, y, batch_size=8, epochs=1, verbose=0)


def test_a_release_before_training_is_calibrated_for_and_charged_once(tmp_path):
    """A query answered before the first step (DP label selection) is in the plan's releases:
    calibration counts it with its delta, the model reports it, and the ledger charges it once
    however many fits run."""
    release = GaussianThresholding.for_delta(5.0, 4, 1e-4).extra_event("label_selection")
    calibrated = _plan(releases=(release,)).calibrated(4.0)
    assert 3.9 < calibrated.epsilon() <= 4.0
    assert calibrated.epsilon() == accounting.compute_epsilon(
        calibrated.schedule(), 1 / 3, 1e-3, (release,))
    without = _plan().calibrated(4.0)
    assert calibrated.mechanism.noise_multiplier > without.mechanism.noise_multiplier
    with pytest.raises(ValueError, match="not above the delta"):
        _plan(releases=(dataclasses.replace(release, delta=1e-3),))

    x, y = small_regression()
    config = DPConfig(noise_multiplier=1.0, microbatch_size=1)
    made = PrivacyPlan(Mechanism.from_config(config, 1, 16), 48, 1 / 3, 1e-3, 2, 3,
                       releases=(release,))
    private = PrivateModel(small_model(), config, plan=made)
    private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    ledger = PrivacyLedger(str(tmp_path), dataset_size=48, delta=1e-3, sampling="shuffle")
    private.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[ledger])
    private.fit(x, y, batch_size=16, epochs=2, initial_epoch=1, verbose=0, callbacks=[ledger])
    led = ledger.ledger
    assert [e["name"] for e in led["extra_events"]] == ["label_selection"]
    assert accounting.ExtraEvent.from_dict(led["extra_events"][0]) == release
    records = [accounting.EpochRecord.from_dict(e) for e in led["epochs"]]
    assert led["epsilon"] == accounting.compute_epsilon(records, 1 / 3, 1e-3, (release,))


def test_a_ledger_for_another_run_than_the_plan_is_refused_before_the_first_step(tmp_path):
    """The plan's epsilon (and a target's calibration) assumed its n, q and delta: a ledger
    charging another n or delta would report a run the plan did not calibrate for."""
    x, y = small_regression()
    config = DPConfig(noise_multiplier=1.0, microbatch_size=1)
    made = PrivacyPlan(Mechanism.from_config(config, 1, 16), 48, 1 / 3, 1e-3, 1, 3)
    private = PrivateModel(small_model(), config, plan=made)
    private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    before = [v.numpy().copy() for v in private.trainable_variables]
    ledger = PrivacyLedger(str(tmp_path), dataset_size=96, delta=1e-4, sampling="shuffle")
    with pytest.raises(ValueError, match=r"dataset_size 48 planned vs 96 here, delta 0\.001 "
                                         r"planned vs 0\.0001 here"):
        private.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[ledger])
    for v, b in zip(private.trainable_variables, before):  # no step ran
        assert (v.numpy() == b).all()
    assert not (tmp_path / "privacy.json").exists()
