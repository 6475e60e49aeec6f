"""PrivacyLedger (and its budget) around a tiny PrivateModel on 2 logical CPU replicas."""
import json
import math
import os

import keras
import numpy as np
import pytest

import edp_tf
from edp_tf import DPConfig, PrivateModel, accounting, batch_source, ledger, sampling

N = 2  # replicas (2 of the 4 logical CPUs: half the tracing cost of 4)
N_EX, Q = 64, 0.25  # expected batch 16, 4 steps per epoch
DELTA = 1 / N_EX
FIELDS = {"epsilon", "epsilon_rdp", "epsilon_pld", "delta", "sampling", "sampling_rate",
          "dataset_size", "batch_size", "replicas", "microbatch_size", "noise_mode",
          "l2_norm_clip", "sensitivity", "epochs", "extra_events", "not_covered", "private"}


@pytest.fixture(scope="module")
def strategy():
    return edp_tf.make_strategy(N)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_EX, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32")).astype("float32")
    return x, y


def mse(y_true, y_pred):
    return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)


def make_model(strategy, **cfg):
    cfg = DPConfig(**{"l2_norm_clip": 1.0, "noise_multiplier": 2.0, "decay": "linear",
                      "decay_rate": 0.5, **cfg})
    with strategy.scope():
        model = PrivateModel(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]), cfg)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=mse)
    return model


def poisson_fit(strategy, data, run_dir, epochs, initial_epoch=0, extra_callbacks=(),
                flush_steps=8, **cfg):
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=N)
    model = make_model(strategy, expected_batch_size=sampler.expected_batch_size, **cfg)
    led = ledger.PrivacyLedger.for_sampler(run_dir, sampler, DELTA, flush_steps=flush_steps)
    model.fit(sampler.dataset(*data), epochs=epochs, initial_epoch=initial_epoch, verbose=0,
              callbacks=[led, *extra_callbacks])
    return model, led, sampler


def load(run_dir):
    with open(os.path.join(run_dir, "privacy.json")) as f:
        return json.load(f)


def expected_epsilon(content):
    records = [accounting.EpochRecord.from_dict(e) for e in content["epochs"]]
    return accounting.compute_epsilon(records, content["sampling_rate"], content["delta"],
                                      content["extra_events"])


def test_ledger_records_every_epoch_with_the_issue_fields(strategy, data, tmp_path):
    model, led, sampler = poisson_fit(strategy, data, tmp_path, epochs=2)
    content = load(tmp_path)
    assert FIELDS <= set(content)
    assert [f for f in os.listdir(tmp_path) if f != "privacy.json"] == []  # no tmp file left
    facts = model.privacy_facts()
    assert content["sampling"] == "poisson" and content["sampling_rate"] == Q
    assert content["batch_size"] == sampler.expected_batch_size == 16
    assert content["replicas"] == N and content["sensitivity"] == 2 == facts["sensitivity"]
    assert content["microbatch_size"] == facts["microbatch_size"] == sampler.max_batch_size // N
    assert content["noise_mode"] == "calibrated" and content["l2_norm_clip"] == 1.0
    assert content["private"] is True and content["not_covered"] == []
    assert content["assumes"] == [ledger.PUBLIC_SIZE_SENTENCE]  # n is public, and says so
    assert content["in_progress"] is None
    for t, e in enumerate(content["epochs"]):
        assert set(e) == {"epoch", "steps", "noise_multiplier", "effective_noise_multiplier"}
        assert (e["epoch"], e["steps"]) == (t, sampler.steps_per_epoch)
        assert e["noise_multiplier"] == pytest.approx(2.0 / (1 + 0.5 * t))
        assert e["effective_noise_multiplier"] == e["noise_multiplier"]
    assert content["epsilon"] == content["epsilon_pld"] == pytest.approx(expected_epsilon(content))
    assert 0 < content["epsilon_pld"] <= content["epsilon_rdp"] < math.inf
    # the same run at delta = 1/n and 1e-6, recomputed from the records
    others = content["epsilon_at_other_deltas"]
    assert set(others) == {"1/n", "1e-06"}
    for entry in others.values():
        assert entry["epsilon"] == pytest.approx(expected_epsilon(dict(content,
                                                                       delta=entry["delta"])))
    assert others["1/n"]["delta"] == pytest.approx(1 / content["dataset_size"])


def test_resume_continues_the_ledger_without_loss_or_double_count(strategy, data, tmp_path):
    poisson_fit(strategy, data, tmp_path, epochs=2)
    first = load(tmp_path)
    # a new process would rebuild the model and the ledger, and resume from the epoch-2 checkpoint
    poisson_fit(strategy, data, tmp_path, epochs=4, initial_epoch=2)
    resumed = load(tmp_path)
    assert [e["epoch"] for e in resumed["epochs"]] == [0, 1, 2, 3]
    assert resumed["epochs"][:2] == first["epochs"]
    assert [e["noise_multiplier"] for e in resumed["epochs"]] == pytest.approx(
        [2.0 / (1 + 0.5 * t) for t in range(4)])
    assert resumed["epsilon"] == pytest.approx(expected_epsilon(resumed))
    assert resumed["epsilon"] > first["epsilon"]
    assert [f["initial_epoch"] for f in resumed["fits"]] == [0, 2]

    with pytest.raises(ValueError, match="missing"):  # a gap would lose epochs 4..5
        poisson_fit(strategy, data, tmp_path, epochs=7, initial_epoch=6)
    with pytest.raises(ValueError, match="l2_norm_clip"):  # another mechanism
        poisson_fit(strategy, data, tmp_path, epochs=5, initial_epoch=4, l2_norm_clip=0.5)
    assert load(tmp_path)["epochs"] == resumed["epochs"]  # refusals leave the ledger alone


class CrashAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("simulated crash")


def test_interrupted_epoch_is_charged_the_steps_that_can_have_run(strategy, data, tmp_path):
    with pytest.raises(RuntimeError, match="simulated crash"):  # a crash no handler saw
        poisson_fit(strategy, data, tmp_path, epochs=3, extra_callbacks=[CrashAt(1, 1)],
                    flush_steps=1)
    crashed = load(tmp_path)
    assert [e["epoch"] for e in crashed["epochs"]] == [0]
    # 2 steps of 4 ran; with a bound one step ahead, the disk covers exactly those
    assert crashed["in_progress"]["epoch"] == 1 and crashed["in_progress"]["steps"] == 2
    assert crashed["in_progress"]["planned_steps"] == 4
    poisson_fit(strategy, data, tmp_path, epochs=2, initial_epoch=1)
    resumed = load(tmp_path)
    # epoch 1 ran twice: 2 steps before the crash, then 4
    assert [(e["epoch"], e["steps"]) for e in resumed["epochs"]] == [(0, 4), (1, 2), (1, 4)]
    assert resumed["in_progress"] is None
    assert resumed["epsilon"] == pytest.approx(expected_epsilon(resumed))


def test_budget_stop_stops_before_the_epoch_that_would_exceed(strategy, data, tmp_path):
    # target strictly between the planned epsilon after 2 and after 3 epochs
    plan = accounting.plan_schedule(2.0, 4, 4, "linear", 0.5, "calibrated", N, 2)
    eps = accounting.epsilon_per_epoch(plan, Q, DELTA)
    target = (eps[1] + eps[2]) / 2
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=N)
    model = make_model(strategy, expected_batch_size=sampler.expected_batch_size)
    stop = led = ledger.PrivacyLedger.for_sampler(tmp_path, sampler, DELTA, target_epsilon=target)
    history = model.fit(sampler.dataset(*data), epochs=4, verbose=0, callbacks=[led])
    content = load(tmp_path)
    assert len(history.epoch) == 2 and stop.stopped_after_epoch == 1
    assert [e["epoch"] for e in content["epochs"]] == [0, 1]
    assert content["epsilon"] <= target < eps[2]
    # Keras prints epochs from 1: two epochs ran, the third would exceed the target
    assert stop.reason.startswith("stopping after epoch 2:")
    assert "epoch 3 would bring it to" in stop.reason
    # resuming over budget refuses before any step, and leaves the ledger as it was
    model2 = make_model(strategy, expected_batch_size=sampler.expected_batch_size)
    led2 = ledger.PrivacyLedger.for_sampler(tmp_path, sampler, DELTA, target_epsilon=target)
    with pytest.raises(ledger.BudgetExhaustedError, match="epoch 3 would bring"):
        model2.fit(sampler.dataset(*data), epochs=4, initial_epoch=2, verbose=0,
                   callbacks=[led2])
    after = load(tmp_path)
    assert after["epochs"] == content["epochs"] and after["in_progress"] is None


def test_shuffled_batches_fixed_seed_and_private_scaling_are_reported(strategy, data, tmp_path):
    model = make_model(strategy, seed=7, scaling="private", scaling_noise_multiplier=3.0)
    led = ledger.PrivacyLedger(tmp_path, N_EX, DELTA, sampling="shuffle")
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[led])
    content = load(tmp_path)
    assert content["sampling"] == "shuffle" and content["sampling_rate"] == 16 / N_EX
    assert content["batch_size"] == 16 and content["epochs"][0]["steps"] == 4
    assert ledger.SHUFFLE_SENTENCE in content["not_covered"]
    assert any("seed" in s for s in content["not_covered"])
    assert content["private"] is False  # fixed batches (and a fixed noise seed) void it
    (extra,) = content["extra_events"]
    assert extra["name"] == "private_layer_scales" and extra["noise_multiplier"] == 3.0
    without = accounting.compute_epsilon(
        [accounting.EpochRecord.from_dict(e) for e in content["epochs"]], 16 / N_EX, DELTA)
    assert content["epsilon"] == pytest.approx(expected_epsilon(content))
    assert content["epsilon"] > without  # the alpha query is charged


def test_shuffled_batches_alone_are_not_private(strategy, data, tmp_path):
    model = make_model(strategy)
    led = ledger.PrivacyLedger(tmp_path, N_EX, DELTA, sampling="shuffle")
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[led])
    content = load(tmp_path)
    assert content["not_covered"] == [ledger.SHUFFLE_SENTENCE]
    assert content["private"] is False and math.isfinite(content["epsilon"])


def test_poisson_claim_without_the_sampler_is_not_private(strategy, data, tmp_path):
    """An ordinary .batch() dataset must not get a Poisson epsilon reported as private."""
    model = make_model(strategy, expected_batch_size=16.0)
    led = ledger.PrivacyLedger(tmp_path, N_EX, DELTA)  # "poisson", but no sampler to check
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[led])
    content = load(tmp_path)
    assert content["not_covered"] == [ledger.UNVERIFIED_POISSON_SENTENCE.format(
        source=batch_source.BatchSource("arrays").description)]
    assert content["private"] is False
    with pytest.raises(ValueError, match="PoissonSampler"):
        ledger.PrivacyLedger(tmp_path, N_EX, DELTA, sampler=object())


class WrongNoiseLog(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["noise_multiplier"] = 0.5


def test_poisson_needs_expected_batch_and_log_mismatch_is_refused(strategy, data, tmp_path):
    model = make_model(strategy)
    sampler = sampling.PoissonSampler(N_EX, Q, replicas=N)
    with pytest.raises(ValueError, match="expected_batch_size"):
        model.fit(sampler.dataset(*data), epochs=1, verbose=0,
                  callbacks=[ledger.PrivacyLedger(tmp_path / "a", N_EX, DELTA)])
    model = make_model(strategy)
    with pytest.raises(RuntimeError, match="refusing to write a wrong epsilon"):
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[
            WrongNoiseLog(), ledger.PrivacyLedger(tmp_path / "b", N_EX, DELTA, "shuffle")])


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(dataset_size=0, delta=0.01), "dataset_size"),
     (dict(dataset_size=10, delta=1.0), "delta"),
     (dict(dataset_size=10, delta=0.01, sampling="random"), "sampling"),
     (dict(dataset_size=10, delta=0.01, sampling_rate=0.0), "sampling_rate")],
)
def test_invalid_ledger_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        ledger.PrivacyLedger(tmp_path, **kwargs)


def test_read_ledger_refuses_broken_files(tmp_path):
    (tmp_path / "privacy.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ledger.read_ledger(str(tmp_path))
    with pytest.raises(ValueError, match="no privacy ledger"):
        ledger.read_ledger(str(tmp_path / "missing"))


def test_augmented_copies_keep_the_ledger_and_epsilon_of_one_copy(strategy, data, tmp_path):
    """K = 4 copies per example (the same example 4 times here: the ledger only sees the
    geometry) is charged exactly as K = 1: same q, steps, S and epsilon; only the padded batch
    grows. A sampler whose copies are not the step's is refused."""
    x, y = data
    copies = (np.repeat(x, 4, axis=0), np.repeat(y, 4, axis=0))
    contents = {}
    for k, sampler, arrays in (
            (1, sampling.PoissonSampler(N_EX, Q, replicas=N, microbatch_size=1), data),
            (4, sampling.AugmentedPoissonSampler(N_EX, Q, replicas=N, copies=4), copies)):
        model = make_model(strategy, microbatch_size=1, augment_copies=k,
                           expected_batch_size=sampler.expected_batch_size)
        led = ledger.PrivacyLedger.for_sampler(tmp_path / f"k{k}", sampler, DELTA)
        model.fit(sampler.dataset(*arrays), epochs=1, verbose=0, callbacks=[led])
        contents[k] = load(tmp_path / f"k{k}")
        assert model.mechanism.rows_per_microbatch == k
    one, four = contents[1], contents[4]
    assert four["augment_copies"] == 4 and one["augment_copies"] == 1
    assert four["global_batch_size"] == 4 * one["global_batch_size"]
    for field in ledger.MECHANISM_FIELDS + ("epsilon", "epsilon_rdp", "epochs", "private"):
        assert four[field] == one[field], field
    assert four["sensitivity"] == 1 and four["private"] is True
    for sampler, arrays in ((sampling.PoissonSampler(N_EX, Q, replicas=N, microbatch_size=1),
                             data),
                            (sampling.AugmentedPoissonSampler(N_EX, Q, replicas=N, copies=4),
                             copies)):
        model = make_model(strategy, microbatch_size=1, augment_copies=2,
                           expected_batch_size=sampler.expected_batch_size)
        led = ledger.PrivacyLedger.for_sampler(tmp_path / "mismatch", sampler, DELTA)
        with pytest.raises(ValueError, match=r"copies \d in the sampler vs 2 in the step"):
            model.fit(sampler.dataset(*arrays), epochs=1, verbose=0, callbacks=[led])
