"""`python -m edp_nlu.privacy`: the planned statement per noise mode, the command itself, and the
statement re-derived from a real run's privacy.json (with a tampered copy flagged)."""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from absl import app, flags

import edp_tf
from edp_nlu import privacy
from edp_nlu.cli_test import NATIVE_NOISE  # the markers of TensorFlow's native start-up lines
from edp_tf import accounting as acc
from edp_tf import ledger, report
from edp_tf.partition_selection import GaussianThresholding


def run_command(capsys, *args: str) -> str:
    """`python -m edp_nlu.privacy *args` in this process (its flags on their own FlagValues:
    another module of the test process defines some of the same names); its stdout. The
    command as a process is test_privacy_command_runs'."""
    values = flags.FlagValues()
    privacy.define_flags(values)
    values(["edp-privacy", *args])
    capsys.readouterr()
    privacy.main([], values)
    return capsys.readouterr().out


def test_planned_statement_shows_both_modes_per_epoch():
    text = privacy.plan_statement(3000, 64, 3, 1.0, noise_mode="both", replicas=4)
    records = acc.plan_schedule(1.0, 3, 47, noise_mode="paper", replicas=4, sensitivity=2)
    paper_pld = acc.epsilon_per_epoch(records, 64 / 3000, 0.1 / 3000)  # default delta 0.1/n
    rows = [line for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 3 and "sensitivity S = 2 C" in text
    assert rows[-1].split()[-1] == f"{paper_pld[-1]:.4g}"
    assert "Guarantee (calibrated)" in text and "Guarantee (paper)" in text
    assert "at delta = 1/n" in text and "at delta = 1e-06" in text
    assert "Private: yes" in text
    shuffled = privacy.plan_statement(3000, 64, 1, 1.0, sampling="shuffle")
    assert "assumes Poisson sampling" in shuffled and "sensitivity S = 2 C" in shuffled
    assert "Private: NO" in shuffled
    with pytest.raises(ValueError, match="batch_size"):
        privacy.plan_statement(100, 200, 1, 1.0)


def test_planned_statement_with_sparse_embedding_noise_charges_the_joint_multiplier():
    text = privacy.plan_statement(3000, 64, 2, 1.0, microbatch_size=1,
                                  selection_noise_multiplier=2.0)
    joint = (1.0 + 2.0 ** -2) ** -0.5
    want = acc.compute_epsilon(acc.plan_schedule(joint, 2, 47), 64 / 3000, 0.1 / 3000)
    dense = acc.compute_epsilon(acc.plan_schedule(1.0, 2, 47), 64 / 3000, 0.1 / 3000)
    assert f"epsilon = {want:.4g} (PLD" in text and want > dense
    assert "DP-AdaFEST" in text


def test_privacy_command_runs_and_is_quiet():
    """The command as a user runs it, TensorFlow's native log level unset: the statement, and
    none of TensorFlow's start-up chatter (edp_nlu/cli.py quiets it; --verbose shows it, which
    is edp_nlu/cli_test.py's)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run(
        [sys.executable, "-m", "edp_nlu.privacy", "--dataset_size=3000", "--batch_size=64",
         "--epochs=2", "--replicas=4", "--noise_multiplier=1.0", "--microbatch_size=1"],
        capture_output=True, text=True, timeout=120, env=env,
        cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sensitivity S = 1 C" in out.stdout and "Cumulative epsilon per epoch" in out.stdout
    want = acc.compute_epsilon(acc.plan_schedule(1.0, 2, 47), 64 / 3000, 0.1 / 3000)  # 0.1/n
    assert f"epsilon = {want:.4g} (PLD" in out.stdout
    assert not [n for n in NATIVE_NOISE if n in out.stdout + out.stderr]


def test_statement_rederives_a_runs_epsilon_and_flags_tampering(tmp_path, capsys):
    """A real run's privacy.json (tiny model, 2 replicas, Poisson sampling, decay): the command
    recomputes its epsilon from the recorded fields alone and agrees; a halved epsilon is
    flagged."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")
    strategy = edp_tf.make_strategy(2)
    sampler = edp_tf.PoissonSampler(64, 0.25, replicas=2)
    with strategy.scope():
        model = edp_tf.PrivateModel(
            keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
            edp_tf.DPConfig(l2_norm_clip=1.0, noise_multiplier=2.0, decay="linear",
                            decay_rate=0.5, expected_batch_size=sampler.expected_batch_size))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    led = ledger.PrivacyLedger.for_sampler(str(tmp_path), sampler, 1 / 64)
    model.fit(sampler.dataset(x, y), epochs=2, verbose=0, callbacks=[led])
    content = ledger.read_ledger(str(tmp_path))
    text = privacy.statement_from_ledger(content)
    assert f"epsilon = {content['epsilon']:.4g} (PLD" in text and "WARNING" not in text
    assert "at delta = 1/n" in text and "at delta = 1e-06" in text
    assert "Private: yes" in text and len([ln for ln in text.splitlines()
                                           if ln.strip()[:1].isdigit()]) == 2
    tampered = dict(content, epsilon=content["epsilon"] / 2)
    assert "WARNING" in privacy.statement_from_ledger(tampered)
    # the reviewer's page: the same statement, written beside the command's output
    page = tmp_path / "report.html"
    out = run_command(capsys, f"--run_dir={tmp_path}", f"--report={page}")
    assert f"wrote {page}" in out
    html = page.read_text()
    assert f"({content['epsilon']:.3g}, {content['delta']:.3g})-differentially private" in html
    assert "<h2>Each artifact</h2>" in html and "--mechanism=default" in html


def test_statement_of_a_run_with_private_label_selection(tmp_path):
    """A ledger charging the DP label selection: the statement names its sensitivity and the
    delta it spends, recomputes epsilon at the reduced delta, gives inf at a reported delta the
    threshold exhausts, and says where the label sets come from."""
    selection = GaussianThresholding.for_delta(5.0, 4, 2e-6).extra_event("label_selection")
    records = acc.plan_schedule(1.2, 2, 10)
    content = {
        "delta": 2e-5, "sampling_rate": 0.1, "dataset_size": 5000, "noise_mode": "calibrated",
        "replicas": 1, "microbatch_size": 1, "sensitivity": 1, "l2_norm_clip": 1.0,
        "sampling": "poisson", "batch_size": 500, "private": True,
        "epochs": [r.to_dict() for r in records], "extra_events": [selection.to_dict()],
        "not_covered": [], "artifacts": {"label_sets": "The label sets (2 intents) were "
                                         "selected with differential privacy."},
        "epsilon": acc.compute_epsilon(records, 0.1, 2e-5, [selection])}
    text = privacy.statement_from_ledger(content)
    assert "WARNING" not in text and "Private: yes" in text
    assert "label_selection (Gaussian, z = 5 on sensitivity 2, no sampling" in text
    assert "delta 2e-06 spent from the run's delta" in text
    assert "epsilon inf at delta = 1e-06" in text
    assert "Label sets: The label sets (2 intents) were selected" in text


def test_sampling_table_rows_meet_the_target_and_report_their_noise():
    """Each row's z reaches the target epsilon (recomputed here from its own schedule, within
    calibrate_noise's 1e-3 relative tolerance on z, which moves epsilon by well under 1%), and its
    noise columns follow from z, q, n and the step count; more passes at one q need more noise."""
    n, target = 1000, 4.0
    rows = privacy.sampling_table(n, target, sampling_rates=(0.1,), passes=(2, 4))
    assert [(r.passes, r.sampling_rate, r.steps) for r in rows] == [(2, 0.1, 20), (4, 0.1, 40)]
    for r in rows:
        eps = acc.compute_epsilon(acc.plan_schedule(r.noise_multiplier, 1, r.steps),
                                  r.sampling_rate, 0.1 / n)
        assert 0.99 * target < eps <= target
        assert r.step_noise == pytest.approx(r.noise_multiplier / (r.sampling_rate * n))
        assert r.run_noise == pytest.approx(r.step_noise / r.steps ** 0.5)
    assert rows[1].noise_multiplier > rows[0].noise_multiplier
    text = privacy.sampling_table_text(rows, n, target, 0.1 / n)
    assert len([line for line in text.splitlines() if line.strip()[:1].isdigit()]) == 2
    assert "run noise spans" in text
    for bad in ({"passes": (0,)}, {"sampling_rates": (1.5,)}):
        with pytest.raises(ValueError):
            privacy.sampling_table(n, target, **bad)
    with pytest.raises(ValueError, match="dataset_size"):
        privacy.sampling_table(0, target)


def test_sampling_table_command(capsys):
    base = ("--dataset_size=1000", "--sampling_table", "--sampling_rates=0.1", "--passes=2")
    out = run_command(capsys, *base, "--target_epsilon=4")
    row = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(row) == 1 and row[0][:4] == ["2", "0.1", "100", "20"]
    eps = acc.compute_epsilon(acc.plan_schedule(float(row[0][4]), 1, 20), 0.1, 0.1 / 1000)
    # z is printed to 4 digits (<= 0.05% off), which moves epsilon by well under 0.25%
    assert 3.9 < eps < 4.01
    assert "run noise spans 1.00x" in out
    with pytest.raises(app.UsageError, match="--target_epsilon"):
        run_command(capsys, *base)


def test_one_headline_charges_the_open_epoch_everywhere(tmp_path, capsys):
    x = np.random.default_rng(0).normal(size=(120, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    private = edp_tf.make_private(
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), target_epsilon=4.0,
        epochs=2, batch_size=30, run_dir=str(tmp_path))
    private.compile(keras.optimizers.SGD(0.1),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    private.fit(x, y, epochs=1, verbose=0)
    path = tmp_path / "privacy.json"
    with open(path) as f:
        led = json.load(f)
    closed = led["epsilon"]
    # a kill inside epoch 1 after a checkpoint of its first 3 steps: the durable bound says 3
    record = acc.EpochRecord.from_dict(led["epochs"][0])
    led["in_progress"] = acc.EpochRecord(1, 3, record.noise_multiplier,
                                         record.effective_noise_multiplier).to_dict()
    path.write_text(json.dumps(led))
    top = ledger.headline(ledger.read_ledger(str(tmp_path)))
    expected = acc.compute_epsilon((record, acc.EpochRecord.from_dict(led["in_progress"])),
                                   led["sampling_rate"], led["delta"])
    assert top["epsilon"] == pytest.approx(expected) and top["epsilon"] > closed
    assert top["steps"] == private.sampler.steps_per_epoch + 3
    # edp-privacy's statement, the report and a settled ledger give that same figure
    text = run_command(capsys, f"--run_dir={tmp_path}")
    assert f"Guarantee: epsilon = {top['epsilon']:.4g} " in text
    assert f"{top['steps']} steps" in text
    verdict = report.sections(ledger.read_ledger(str(tmp_path)))[0][1][0]
    assert f"({top['epsilon']:.3g}," in verdict
    settled = ledger.settle_interrupted(str(tmp_path))
    assert settled["epsilon"] == pytest.approx(top["epsilon"])
