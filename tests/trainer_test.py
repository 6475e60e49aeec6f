"""End-to-end tests of the trainer (`edp_nlu.pipeline.training.train`, `python -m edp_nlu.train`)
at tiny sizes.

Each training run costs tens of CPU-seconds (tracing the step, the export), so runs are shared
between tests through module-scoped fixtures: CLC sgd/dpsgd (1 replica) and BERT sgd (2) run once
each, BERT edp (2 replicas) runs as an interrupted-then-resumed run with a target epsilon (it also
serves the smoke checks), and CLC edp runs through the command line (1 replica) with canaries.
Multi-replica noise and clipping are the library tests' business; here it is the wiring.
"""
import dataclasses
import glob
import math
import os
import re
import subprocess
import sys

import dp_accounting
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.configs.base import base_config
from edp_nlu.data import encoding
from edp_nlu.pipeline import builders, recipes, run_files, training
from edp_nlu.pipeline.callbacks import PublicProgress
from edp_nlu.pipeline.run_spec import RunSpec
from edp_nlu.privacy import statement_from_ledger
from edp_nlu.scoring import predictions
from edp_tf import Mechanism, accounting, padding
from tests.tiny_runs import (
    BATCH,
    SIZE,
    corpus,
    read,
    strategy,
    tiny_config,
    train_command,
    write_joint_dir,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_EPSILON = 4.0
PRIVACY_FIELDS = {"epsilon", "epsilon_rdp", "epsilon_pld", "delta", "sampling", "sampling_rate",
                  "dataset_size", "batch_size", "replicas", "microbatch_size", "noise_mode",
                  "l2_norm_clip", "sensitivity", "epochs", "extra_events", "not_covered",
                  "private", "schedule", "in_progress"}
DEV_METRICS = ("ser", "intent_accuracy", "slot_f1")


def utterance_texts(config, min_tokens=4):
    """Every utterance of the run's corpus (canaries and controls too) as it would be printed."""
    splits = corpus(config)
    every = (splits.train + splits.dev + splits.test + splits.canaries + splits.canary_controls)
    return {" ".join(u.tokens) for u in every if len(u.tokens) >= min_tokens}


# --------------------------------------------------------------------------- shared runs
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """name -> (config, run_dir, summary) of a completed run, trained once per module."""
    configs = {
        "clc-sgd": lambda: tiny_config("clc", "sgd", replicas=1, diagnostics=True),
        # no diagnostics, and the default per-example method (ghost), as the default command
        "clc-dpsgd": lambda: tiny_config("clc", "dpsgd", replicas=1, per_example_method="ghost"),
        "bert-sgd": lambda: tiny_config("bert", "sgd", replicas=2, diagnostics=True),
    }
    cache = {}

    def get(name):
        if name not in cache:
            config = configs[name]()
            run_dir = str(tmp_path_factory.mktemp(name) / "run")
            summary = training.train(config, run_dir,
                                     strategy=strategy(int(config.replicas)))
            cache[name] = (config, run_dir, summary)
        return cache[name]
    return get


class Interrupted(Exception):
    """Stands for a kill between epochs."""


class InterruptAfterEpoch(keras.callbacks.Callback):
    """Raises at the end of `epoch`, after the run's own callbacks wrote ledger and checkpoint."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.weights, self.iterations = epoch, None, None

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.weights = self.model.wrapped_model.get_weights()
            self.iterations = int(self.model.optimizer.iterations.numpy())
            raise Interrupted(f"interrupted after epoch {epoch}")


class WeightsAtStart(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = self.model.wrapped_model.get_weights()
        self.iterations = int(self.model.optimizer.iterations.numpy())


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """BERT eDP-SGD calibrated to TARGET_EPSILON over 3 epochs, killed after 2, then resumed.
    One replica (its micro-batch is the batch): tracing, most of the run, doubles with each
    replica, and the trainer's 2-replica runs are the user-level and BERT SGD ones."""
    # diagnostics on: the artifact test sees every file a private run with them writes
    config = tiny_config("bert", "edp", replicas=1, epochs=3, target_epsilon=TARGET_EPSILON,
                         diagnostics=True)
    run_dir = str(tmp_path_factory.mktemp("bert-edp") / "run")
    interrupt = InterruptAfterEpoch(1)
    with pytest.raises(Interrupted):
        training.train(config, run_dir, strategy=strategy(1), callbacks=[interrupt])
    ledger_before = read(run_dir, "privacy.json")
    start = WeightsAtStart()
    resumed = run_files.load_run_config(run_dir)
    resumed.bert.cut_padding = False  # an execution setting, which a resume may change
    summary = training.train(resumed, run_dir, resume=True, strategy=strategy(1),
                             callbacks=[start])
    return dict(config=config, run_dir=run_dir, summary=summary, interrupt=interrupt,
                start=start, ledger_before=ledger_before)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """`python -m edp_nlu.train` (default config, GloVe, with eDP-SGD) with planted canaries."""
    run_dir = str(tmp_path_factory.mktemp("cli") / "run")
    # 4 words, as tiny_config: the CLC step is unrolled over max_words, so tracing shrinks
    overrides = dict(synthetic_size=SIZE, synthetic_canaries=2, synthetic_canary_repeats=3,
                     batch_size=BATCH, max_words=4)
    clc = dict(vocabulary_size=2000, lstm_units=8, num_lstm_layers=1, char_embedding_dim=8,
               char_filters=8)
    argv = ([sys.executable, "-m", "edp_nlu.train", f"--run_dir={run_dir}", "--replicas=1",
             "--mechanism=edp",  # the default job is per-example: eDP is tested here
             "--verbose",  # all of the output, TensorFlow's too, is checked for utterances
             "--epochs=1"] + [f"--config.{k}={v}" for k, v in overrides.items()]
            + [f"--config.clc.{k}={v}" for k, v in clc.items()])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")  # all of TensorFlow's chatter is checked too
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    config = base_config()
    config.update(dict(overrides, replicas=1, epochs=1))
    config.clc.update(clc)
    return dict(proc=proc, run_dir=run_dir, config=config)


# --------------------------------------------------------------------------- run directory checks
def check_run_dir(run_dir, config, epochs, private):
    """The files every finished run must leave behind; returns (metrics, privacy or None)."""
    saved = read(run_dir, "config.json")
    n = len(corpus(config).train)
    assert saved["dataset_size"] == n
    assert saved["delta"] == pytest.approx(0.1 / n)
    assert saved["config"]["mechanism"] == config.mechanism
    assert saved["config"]["model"] == config.model

    metrics = read(run_dir, "metrics.json")
    diagnostics = bool(config.diagnostics)
    assert [e["epoch"] for e in metrics["epochs"]] == list(range(epochs))
    for e in metrics["epochs"]:
        assert e["seconds"] > 0
        assert e["dev"]["ser"] >= 0
        assert 0 <= e["dev"]["intent_accuracy"] <= 1 and 0 <= e["dev"]["slot_f1"] <= 1
        if not diagnostics:  # unnoised training statistics stay out of a shareable run
            assert "train" not in e
            continue
        assert math.isfinite(e["train"]["loss"]) and e["train"]["loss"] > 0
        if private:
            assert e["train"]["noise_multiplier"] > 0
    test = metrics["test"]
    assert set(DEV_METRICS) <= set(test)
    # both decodings of the same model are scored; "test" is the configured one's
    assert set(metrics["test_by_decoding"]) == {"bio", "viterbi"}
    assert metrics["test_by_decoding"]["bio"]["ill_formed_utterances"] == 0
    assert metrics["decoding"] == config.decoding
    assert test == metrics["test_by_decoding"][config.decoding]
    assert test["utterances"] == len(corpus(config).test)
    assert (("membership_inference" in metrics and "train_encoding" in metrics)
            == diagnostics)

    events = glob.glob(os.path.join(run_dir, "tensorboard", "**", "events.out.tfevents.*"),
                       recursive=True)
    assert bool(events) == diagnostics, "TensorBoard logs training statistics"
    assert tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints")) is not None
    assert os.path.isfile(os.path.join(run_dir, "saved_model", "saved_model.pb"))

    privacy = None
    if private:
        privacy = read(run_dir, "privacy.json")
        assert PRIVACY_FIELDS <= set(privacy)
        assert [e["epoch"] for e in privacy["epochs"]] == list(range(epochs))
        assert 0 < privacy["epsilon"] < math.inf
        assert privacy["epsilon"] <= privacy["epsilon_rdp"] + 1e-9  # PLD is the tighter bound
        assert privacy["in_progress"] is None
        assert privacy["dataset_size"] == n and privacy["delta"] == pytest.approx(0.1 / n)
        assert privacy["replicas"] == config.replicas
        assert privacy["sampling"] == "poisson"
        assert privacy["sampling_rate"] == pytest.approx(BATCH / n)
        # seed -1: noise and sampling from OS entropy; a vocabulary from the training text is
        # exported with the model, outside the proof, so that run is not private
        public_vocabulary = (config.clc.word_vectors if config.model == "clc"
                             else config.bert.vocabulary != "train")
        assert privacy["private"] is bool(public_vocabulary)
        assert any("vocabulary" in s for s in privacy["not_covered"]) is not public_vocabulary
        assert privacy["artifacts"]["diagnostics_released"] == diagnostics
        # the synthetic corpus's labels come from its generator, not from the training split
        assert not any("label sets" in s for s in privacy["not_covered"])
        assert read(run_dir, "label_schema.json")["from_training_data"] is False
        steps = math.ceil(n / BATCH)
        assert all(e["steps"] == steps for e in privacy["epochs"])
    else:
        assert not os.path.exists(os.path.join(run_dir, "privacy.json"))

    # counts and metrics only: no utterance of the corpus in what a run writes about itself
    texts = utterance_texts(config)
    assert len(texts) > 100  # the check below is not vacuous
    for name in ("config.json", "metrics.json", "privacy.json", "state.json"):
        path = os.path.join(run_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                content = f.read()
            assert not [t for t in texts if t in content], f"utterance text in {name}"
    return metrics, privacy


def check_summary(summary, run_dir, epochs, metrics, privacy):
    assert summary["run_dir"] == run_dir and summary["epochs"] == epochs
    assert summary["test"]["ser"] == pytest.approx(metrics["test"]["ser"])
    line = training.summary_line(summary)
    assert "SER" in line and run_dir in line
    if privacy is None:
        assert summary["epsilon"] == math.inf and "not private" in line
    else:
        assert summary["epsilon"] == privacy["epsilon"]
        assert summary["private"] is privacy["private"]
        assert f"epsilon {privacy['epsilon']:.3g}" in line
        assert ("NOT private" in line) is not privacy["private"]


# --------------------------------------------------------------------------- 1. smoke tests
@pytest.mark.parametrize("name", ["clc-sgd", "clc-dpsgd", "bert-sgd"])
def test_finished_run_directory(finished_run, name):
    config, run_dir, summary = finished_run(name)
    private = config.mechanism != "sgd"
    metrics, privacy = check_run_dir(run_dir, config, epochs=1, private=private)
    check_summary(summary, run_dir, 1, metrics, privacy)
    if config.mechanism == "dpsgd":
        assert privacy["microbatch_size"] == 1 and privacy["sensitivity"] == 1
        # GloVe's public vocabulary: nothing of the training text is exported
        assert not any("vocabulary" in s for s in privacy["not_covered"])


def test_edp_bert_run_directory(resumed_run):
    r = resumed_run
    metrics, privacy = check_run_dir(r["run_dir"], r["config"], epochs=3, private=True)
    check_summary(r["summary"], r["run_dir"], 3, metrics, privacy)
    # one micro-batch per replica: several examples each, so S = 2C
    assert privacy["microbatch_size"] > 1 and privacy["sensitivity"] == 2
    assert privacy["noise_mode"] == "calibrated"
    assert any("vocabulary" in s for s in privacy["not_covered"])  # bert.vocabulary = "train"
    # its first fit cut BERT's padding: step times followed the data (not covered)
    assert padding.TIMING_SENTENCE in privacy["not_covered"]
    # the resume's setting is kept for later resumes
    assert read(r["run_dir"], "config.json")["config"]["bert"]["cut_padding"] is False


def _run_dir_entries(run_dir) -> list:
    """The run directory's entries as the artifact list names them: files, and folders with
    a trailing slash; metrics.json also by each of its top-level fields."""
    entries = [name + ("/" if os.path.isdir(os.path.join(run_dir, name)) else "")
               for name in sorted(os.listdir(run_dir))]
    metrics = os.path.join(run_dir, "metrics.json")
    fields = sorted(read(run_dir, "metrics.json")) if os.path.exists(metrics) else []
    return entries + [f"metrics.json: {field}" for field in fields]


def _named_in(entry, artifacts) -> bool:
    listed = artifacts["covered"] + artifacts["not_covered"]
    if entry.startswith("metrics.json: "):  # a field: named in a metrics.json sentence
        field = entry.split(": ", 1)[1].replace("test_by_decoding", "test").replace(
            "decoding", "test").replace("unseen_labels", "test")
        return any(a.startswith("metrics.json") and re.search(rf"\b{field}\b", a)
                   for a in listed)
    return any(a == entry or a.startswith(entry.rstrip("/") + ("/" if entry.endswith("/")
                                                                 else "")) for a in listed)


@pytest.mark.parametrize("which", ["cli", "application", "diagnostics"])
def test_every_file_a_private_run_writes_is_named_covered_or_not(which, cli_run, finished_run,
                                                                   resumed_run):
    """No artifact outside privacy.json's list: the command line's run, the application's
    (training.train) and a run with diagnostics, each file and each field of metrics.json."""
    run_dir = {"cli": lambda: cli_run["run_dir"],
               "application": lambda: finished_run("clc-dpsgd")[1],
               "diagnostics": lambda: resumed_run["run_dir"]}[which]()
    artifacts = read(run_dir, "privacy.json")["artifacts"]
    entries = _run_dir_entries(run_dir)
    assert "privacy.json" in entries and "checkpoints/" in entries  # not vacuous
    assert ("tensorboard/" in entries) is (which == "diagnostics")
    unnamed = [e for e in entries if not _named_in(e, artifacts)]
    assert unnamed == [], f"{which}: written but not in privacy.json's artifacts: {unnamed}"


# --------------------------------------------------------------------------- 2. resume
def test_interrupted_run_left_two_epochs(resumed_run):
    before = resumed_run["ledger_before"]
    assert [e["epoch"] for e in before["epochs"]] == [0, 1]
    assert before["in_progress"] is None  # killed between epochs: nothing half-charged


def test_resume_continues_the_ledger_once_per_epoch(resumed_run):
    r = resumed_run
    privacy = read(r["run_dir"], "privacy.json")
    assert [e["epoch"] for e in privacy["epochs"]] == [0, 1, 2]
    assert [f["initial_epoch"] for f in privacy["fits"]] == [0, 2]
    z0 = privacy["schedule"]["noise_multiplier"]
    assert all(e["noise_multiplier"] == z0 for e in privacy["epochs"])  # same z0 after resume
    assert r["summary"]["noise_multiplier"] == z0

    # epsilon of 3 full epochs, recomputed from the corpus size, batch and z0 alone
    n = len(corpus(r["config"]).train)
    q, delta, steps = BATCH / n, 0.1 / n, math.ceil(n / BATCH)
    planned = accounting.plan_schedule(z0, 3, steps)
    assert privacy["epsilon"] == pytest.approx(
        accounting.compute_epsilon(planned, q, delta), rel=1e-9)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z0)), 3 * steps))
    assert privacy["epsilon_rdp"] == pytest.approx(rdp.get_epsilon(delta), rel=1e-6)

    metrics = read(r["run_dir"], "metrics.json")
    assert [e["epoch"] for e in metrics["epochs"]] == [0, 1, 2]


def test_resume_restores_weights_and_optimizer(resumed_run):
    interrupt, start = resumed_run["interrupt"], resumed_run["start"]
    steps = read(resumed_run["run_dir"], "privacy.json")["epochs"][0]["steps"]
    assert interrupt.iterations == 2 * steps
    assert start.iterations == 2 * steps  # Adam's step count came back with the checkpoint
    # without the restore these would be a fresh initialisation (OS entropy), not the saved ones
    assert len(start.weights) == len(interrupt.weights)
    for restored, saved in zip(start.weights, interrupt.weights):
        np.testing.assert_array_equal(restored, saved)


# --------------------------------------------------------------------------- 4. target epsilon
def test_target_epsilon_calibration_spends_close_to_the_budget(resumed_run):
    privacy = read(resumed_run["run_dir"], "privacy.json")
    assert privacy["epsilon"] <= TARGET_EPSILON
    # all 3 planned epochs ran, so the calibration should have left little on the table: the PLD
    # bisection stops within 0.1 % in z0, and epsilon moves by a few % per 1 % of z0 here
    assert privacy["epsilon"] >= 0.97 * TARGET_EPSILON
    z0 = privacy["schedule"]["noise_multiplier"]
    n, steps = privacy["dataset_size"], privacy["epochs"][0]["steps"]
    less_noise = accounting.plan_schedule(0.99 * z0, 3, steps)
    assert accounting.compute_epsilon(less_noise, BATCH / n, 0.1 / n) > TARGET_EPSILON


# --------------------------------------------------------------------------- 3. errors
def test_existing_run_dir_needs_resume(finished_run):
    config, run_dir, _ = finished_run("clc-sgd")
    before = os.path.getmtime(os.path.join(run_dir, "config.json"))
    with pytest.raises(ValueError, match="already holds a run.*--resume"):
        training.train(config, run_dir, strategy=strategy(1))
    assert os.path.getmtime(os.path.join(run_dir, "config.json")) == before


def test_resume_of_an_empty_run_dir_is_refused(tmp_path):
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    with pytest.raises(ValueError, match="config.json"):
        run_files.load_run_config(empty)
    with pytest.raises(ValueError, match="nothing to resume"):
        training.train(tiny_config(replicas=1), empty, resume=True, strategy=strategy(1))


@pytest.mark.parametrize("field, value", [
    ("mechanism", "foo"), ("model", "gpt"), ("sampling", "random"), ("replicas", 0),
    ("batch_size", -1), ("epochs", -1), ("learning_rate", -1.0), ("delta", 1.5),
    ("target_epsilon", -1.0), ("microbatch_size", -1), ("steps", -1), ("sampling_rate", 1.5),
    ("slot_loss", "max"), ("lr_schedule", "step"), ("warmup_fraction", 1.0),
    ("weight_decay", -0.1), ("ema_fraction", 1.0), ("local_epochs", 1), ("local_batch_size", -1),
    ("local_learning_rate", 0.0), ("user_estimator", "clipped"), ("user_weight_cap", 4.0),
    ("head_dropout", 1.0), ("head_dropout", -0.1), ("private_head_dropout", 1.0),
    ("private_ema_fraction", 1.0),
])
def test_invalid_config_value_names_the_field(tmp_path, field, value):
    config = tiny_config(**{"replicas": 1, field: value})
    with pytest.raises(ValueError, match=rf"--config\.{field}="):
        training.train(config, str(tmp_path / "run"), strategy=strategy(1))
    assert not os.path.exists(tmp_path / "run" / "config.json")


@pytest.mark.parametrize("field, value, named", [
    ("noise_mode", "foo", "noise_mode"), ("decay", "cubic", "decay"),
    ("l2_norm_clip", 0.0, "l2_norm_clip"), ("noise_multiplier", -1.0, "noise_multiplier"),
    ("scaling", "bogus", "scaling"), ("optimizer", "rmsprop", "optimizer"),
    ("synthetic_size", 3, "size"),
])
def test_values_checked_later_still_name_the_field(tmp_path, field, value, named):
    """Caught by the library (DPConfig, the corpus), after the data is loaded: still no run left."""
    config = tiny_config(**{"replicas": 1, field: value})
    with pytest.raises(ValueError, match=named):
        training.train(config, str(tmp_path / "run"), strategy=strategy(1))
    assert not os.path.exists(tmp_path / "run" / "config.json")


@pytest.mark.parametrize("field, value", [
    ("vocabulary", "klingon"), ("finetune", "some"), ("private_finetune", "some"),
    ("dropout", 1.0), ("private_dropout", 1.5), ("lora_layout", "diagonal"),
    ("lora_targets", "mlp"), ("frozen_layers", -1),
])
def test_invalid_nested_config_value_names_the_field(tmp_path, field, value):
    config = tiny_config("bert", replicas=1)
    config.bert[field] = value
    with pytest.raises(ValueError, match=rf"--config\.bert\.{field}="):
        training.train(config, str(tmp_path / "run"), strategy=strategy(1))


@pytest.mark.parametrize("overrides, message", [
    (dict(batch_size=10_000), r"--config\.batch_size=10000 exceeds"),
    (dict(sampling="shuffle", batch_size=31, replicas=2), r"--config\.batch_size=31 must be a "
                                                          "multiple"),
])
def test_batch_size_the_data_cannot_serve(tmp_path, overrides, message):
    config = tiny_config(**{"replicas": 1, **overrides})
    with pytest.raises(ValueError, match=message):
        training.train(config, str(tmp_path / "run"),
                       strategy=strategy(int(config.replicas)))
    # nothing that would block a corrected rerun in the same directory, not even an empty one
    assert not os.path.exists(tmp_path / "run")


def test_strategy_and_config_must_agree_on_replicas(tmp_path):
    with pytest.raises(ValueError, match="replicas"):
        training.train(tiny_config(replicas=2), str(tmp_path / "run"),
                       strategy=strategy(1))


# --------------------------------------------------------------------------- 6. command line
def test_cli_prints_one_summary_line_and_exits_0(cli_run):
    proc = cli_run["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("clc / edp: ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    assert re.search(r"test SER \d\.\d{4}, .*; epsilon \d[\d.e+]* at delta ", lines[0]), lines[0]
    assert cli_run["run_dir"] in lines[0]
    metrics, privacy = check_run_dir(cli_run["run_dir"], cli_run["config"], epochs=1,
                                     private=True)
    # the default config calibrates to epsilon 8; GloVe's public vocabulary is not a leak
    assert privacy["epsilon"] <= 8.0
    assert not any("vocabulary" in s for s in privacy["not_covered"])
    assert padding.TIMING_SENTENCE not in privacy["not_covered"]  # CLC's step time is fixed
    assert f"test SER {metrics['test']['ser']:.4f}" in lines[0]
    # without diagnostics the progress bar shows public quantities only: no unnoised loss or
    # clipping statistics of the private batches
    assert "epsilon: " in proc.stdout, proc.stdout[-3000:]
    assert not re.search(r"\bloss: |clipped_fraction|preclip_norm|nonfinite",
                         proc.stdout + proc.stderr)
    # where the wall time went, after the summary: every phase of the run is named
    (timing,) = [line for line in proc.stdout.splitlines() if line.startswith("time: ")]
    for phase in ("start-up", "data", "build", "tracing", "steps", "test metrics", "export"):
        assert f" {phase} " in timing, timing


def test_resuming_a_finished_run_says_so_without_training(cli_run, capsys):
    """In this process (tiny_runs.train_command): the command trains nothing here."""
    proc = cli_run["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = train_command(capsys, f"--run_dir={cli_run['run_dir']}", "--resume")
    assert "is finished (1 epochs): nothing to resume" in again
    summary = [line for line in proc.stdout.splitlines() if line.startswith("clc / edp: ")][0]
    assert summary.split(" epochs in ")[0] in again  # the same numbers, from its files


def test_resume_refuses_a_command_that_asks_for_another_run(cli_run, capsys):
    """The refusal is a user error: as a process, one `error:` line and exit 2 (cli.run, as
    edp_nlu/cli_test.py's resume of a directory that is not a run)."""
    with pytest.raises(ValueError) as refused:
        train_command(capsys, f"--run_dir={cli_run['run_dir']}", "--resume", "--epochs=2",
                      "--target_epsilon=3", "--config.l2_norm_clip=0.5")
    line = str(refused.value)
    assert "\n" not in line
    # more epochs would extend the run; a new target and clip are another run
    assert "target_epsilon=8.0 (asked: 3.0)" in line and "l2_norm_clip=1.0 (asked: 0.5)" in line
    assert "epochs=" not in line and "new --run_dir" in line


def test_resume_compares_a_config_file_as_it_ran():
    """A private run resumed with its config file given again (as `experiments.experiment` does):
    config.json records what ran, a private_ field in place of its plain field, so the file is
    compared with its private_ fields in their places (edp_nlu/train.py); compared raw, it was
    refused (bert.finetune 'lora' vs 'no_embeddings')."""
    file = tiny_config("bert", "dpsgd", replicas=1)
    file.bert.update(finetune="no_embeddings", private_finetune="lora", dropout=0.1,
                     private_dropout=0.0)
    ran = recipes.resolve(file, 192).to_dict()
    assert run_files.resume_differences(ran, {}, recipes.with_private_fields(file, True)) == []
    assert ("bert.finetune", "lora", "no_embeddings") in run_files.resume_differences(ran, {}, file)
    file.bert.private_dropout = 0.2  # another run
    assert run_files.resume_differences(ran, {}, recipes.with_private_fields(file, True)) == [
        ("bert.dropout", 0.0, 0.2), ("bert.private_dropout", 0.0, 0.2)]


def test_resume_differences_ignore_auto_values_and_extensions():
    saved = {"epochs": 4, "batch_size": 256, "bert": {"dropout": 0.1}, "target_epsilon": 8.0}
    given_file = {"epochs": 4, "batch_size": 0, "bert": {"dropout": 0.1}, "target_epsilon": 8.0}
    assert run_files.resume_differences(saved, {"epochs": 6}, given_file) == []
    # fewer epochs finish the run with what is trained; a higher budget is the way out of a
    # spent one (the ledger keeps every step), a lower one is another run
    assert run_files.resume_differences(saved, {"epochs": 2, "bert.dropout": 0.3,
                                                "target_epsilon": 9.0}) == [
        ("bert.dropout", 0.1, 0.3)]
    assert run_files.resume_differences(saved, {"target_epsilon": 3.0}) == [
        ("target_epsilon", 8.0, 3.0)]


def test_a_damaged_run_file_is_named_with_the_way_out(tmp_path):
    (tmp_path / "config.json").write_text('{"config": {"epochs": 3')
    with pytest.raises(ValueError, match=r"config.json is damaged .*new --run_dir"):
        run_files.load_run_config(str(tmp_path))


def test_public_progress_shows_no_statistic_of_the_private_batches(capsys):
    bar = PublicProgress()
    bar.set_params({"verbose": 2, "epochs": 1, "steps": 2})
    bar.on_train_begin()
    bar.on_epoch_begin(0)
    private_logs = {"loss": 1.234, "clipped_fraction": 0.5, "preclip_norm": 3.0,
                    "nonfinite_microbatches": 0.0, "noise_multiplier": 1.1}
    for step in range(2):
        bar.on_train_batch_end(step, dict(private_logs))
    bar.on_epoch_end(0, dict(private_logs))
    shown = capsys.readouterr().out
    assert "noise_multiplier: 1.1" in shown
    assert not [k for k in private_logs if k != "noise_multiplier" and k in shown], shown


def test_cli_output_holds_no_utterance_text(cli_run):
    proc = cli_run["proc"]
    output = proc.stdout + proc.stderr
    splits = corpus(cli_run["config"])
    assert len(splits.canaries) == 2
    # the canaries' secrets ("dddd ddd ddd" phone numbers, "door code is dddddd") are unique to
    # them; as phrases, a chance match with numbers in TensorFlow's logs is out of reach
    for canary in splits.canaries:
        digits = [t for t in canary.tokens if t.isdigit()]
        secret = " ".join(digits) if len(digits) > 1 else f"code is {digits[0]}"
        assert secret not in output, canary
        assert " ".join(canary.tokens) not in output
    texts = utterance_texts(cli_run["config"])
    assert len(texts) > 100  # not vacuous
    leaked = [t for t in texts if t in output]
    assert not leaked, f"{len(leaked)} utterances printed"


def long_training_utterances(config):
    """How many training utterances the run truncates to its max_words (the checks below need
    some, or they would hold vacuously)."""
    return sum(len(u.tokens) > config.max_words for u in corpus(config).train)


def test_cli_logs_no_training_count_without_diagnostics(cli_run):
    """A private run without --config.diagnostics logs no count of its training split: how many
    training utterances were truncated is an unnoised statistic of the data epsilon protects
    (the whole output is checked, --verbose and TensorFlow's logs included)."""
    proc = cli_run["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert long_training_utterances(cli_run["config"]) > 0
    output = proc.stdout + proc.stderr
    assert "utterances truncated" not in output, [
        line for line in output.splitlines() if "truncated" in line]


@pytest.mark.parametrize("diagnostics", [False, True])
def test_training_counts_reach_the_log_only_with_diagnostics(caplog, diagnostics):
    """The data phase of a private user-level run (what `train` runs first, without training):
    the training split's truncations and the dev/test rows of training users left out are
    logged with --config.diagnostics only."""
    import logging

    config = tiny_config(privacy_unit="user", examples_per_user=4, batch_size=8,
                         diagnostics=diagnostics)
    splits = corpus(config)
    a_training_user = splits.train[0].user
    dev = (dataclasses.replace(splits.dev[0], user=a_training_user),) + tuple(splits.dev[1:])
    splits = dataclasses.replace(splits, dev=dev)  # one dev row of a training user
    truncated = long_training_utterances(config)
    assert truncated > 0
    with caplog.at_level(logging.INFO):
        data = training._load_data(RunSpec.parse(config), splits, resume=False, run_dir=None,
                                   strategy=strategy(1), fixed_seed=None)
    assert len(data.splits.dev) == len(splits.dev) - 1  # the row is left out either way
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert (f"train: {truncated} utterances truncated" in logged) is diagnostics, logged
    assert ("user level: 1 dev/test utterances of training users left out" in logged) is (
        diagnostics), logged
    if not diagnostics:
        assert "truncated" not in logged and "left out" not in logged, logged


# --------------------------------------------------------------------------- user-level privacy
def edp_tf_mechanism(dp):
    return Mechanism.from_config(dp, 2, 8 * dp.microbatch_size)


def test_user_level_run_accounts_users(tmp_path):
    """privacy_unit=user: Poisson sampling over the synthetic corpus's users, one micro-batch per
    user, the ledger's n and q over users, S = 1; data without user ids is refused by name."""
    config = tiny_config(privacy_unit="user", examples_per_user=4, batch_size=8,
                         target_epsilon=TARGET_EPSILON)
    users = {u.user for u in corpus(config).train}
    summary = training.train(config, str(tmp_path / "users"), strategy=strategy(2), export=False)
    led = read(summary["run_dir"], "privacy.json")
    assert led["privacy_unit"] == "user" and led["private"] is True
    assert led["dataset_size"] == len(users) and led["sampling_rate"] == pytest.approx(
        8 / len(users))
    assert led["sensitivity"] == 1 and led["microbatch_size"] == 4
    assert led["epsilon"] <= TARGET_EPSILON
    # the test split lost the training users' utterances: its metrics depend on who trains
    assert any(a.startswith("metrics.json: test metrics (user level")
               for a in led["artifacts"]["not_covered"])
    assert not any(a.startswith("metrics.json: test") for a in led["artifacts"]["covered"])

    statement = statement_from_ledger(led)
    assert "add/remove-one-user (all of that user's data)" in statement
    assert f"n = {len(users)} users" in statement
    splits = corpus(config)
    # DP-FedAvg is the same accounting per user (its step: edp_tf/local_training_test.py); the
    # trainer's part is to hand the knobs to DPConfig and the statement to name it
    fedavg = tiny_config(privacy_unit="user", examples_per_user=4, local_epochs=2,
                         local_batch_size=2, local_learning_rate=0.5)
    privacy = RunSpec.parse(fedavg).privacy
    dp = builders.dp_config(privacy, builders.microbatch_size(privacy), 2.0, None)
    assert (dp.local_epochs, dp.local_batch_size, dp.local_learning_rate) == (2, 2, 0.5)
    assert edp_tf_mechanism(dp).sensitivity == 1
    assert "after 2 local epoch(s) (DP-FedAvg)" in statement_from_ledger(
        dict(led, local_epochs=2))
    anonymous = dataclasses.replace(splits, train=tuple(
        dataclasses.replace(u, user=None) for u in splits.train))
    with pytest.raises(ValueError, match="privacy_unit=user needs user ids"):
        training.train(config, str(tmp_path / "anonymous"), strategy=strategy(2), splits=anonymous,
                       export=False)


def test_sparse_embedding_run_charges_the_joint_multiplier(tmp_path):
    """--config.sparse_embeddings: BERT's trainable tables (token, segment) get DP-AdaFEST;
    the ledger records z_c and every epoch is charged at (z^-2 + z_c^-2)^-1/2; z0 is calibrated
    with the selection included, so the target still holds."""
    config = tiny_config("bert", "dpsgd", replicas=1, epochs=2, target_epsilon=TARGET_EPSILON,
                         sparse_embeddings=True, selection_noise_multiplier=3.0,
                         per_example_method="ghost")  # the loop has no sparse path
    config.bert.finetune = "all"
    summary = training.train(config, str(tmp_path / "sparse"), strategy=strategy(1), export=False)
    led = read(summary["run_dir"], "privacy.json")
    assert led["selection_noise_multiplier"] == 3.0
    # the tiny BERT's vocabulary is the training text's: exported, so the run is not private
    assert led["private"] is False and led["artifacts"]["release_covered"] is False
    assert any("token_embedding" in t for t in led["sparse_embeddings"]["tables"])
    for e in led["epochs"]:
        assert e["effective_noise_multiplier"] == pytest.approx(
            (e["noise_multiplier"] ** -2 + 3.0 ** -2) ** -0.5)
    assert TARGET_EPSILON * 0.95 < led["epsilon"] <= TARGET_EPSILON

    assert "DP-AdaFEST" in statement_from_ledger(led)


# --------------------------------------------------------------------------- weight averaging
class _RawWeights(keras.callbacks.Callback):
    """The last epoch's raw weights and the optimizer's averages, before fit writes the latter."""

    def on_epoch_end(self, epoch, logs=None):
        wrapped = getattr(self.model, "wrapped_model", self.model)
        self.raw = [v.numpy().copy() for v in wrapped.trainable_variables]
        self.average = [v.numpy().copy()
                        for v in self.model.optimizer._model_variables_moving_average]


@pytest.mark.parametrize("mechanism", ["dpsgd", "sgd"])
def test_ema_fraction_leaves_the_averaged_weights_in_the_model(tmp_path, mechanism, monkeypatch):
    """ema_fraction > 0: what the run evaluates and exports is the moving average of the weights
    (matched variable by variable), not the last step's weights; the momentum follows the steps.
    The private run also clips in automatic chunks (of 8 rows here, recipes.CHUNK),
    recorded in config.json and kept on resume.

    The runs train on given splits without export, as tools.lira trains shadow models on subsets:
    `splits` replaces the corpus, the hook sees the trained model (and its return value is the
    summary's), and export=False leaves no SavedModel."""
    config = tiny_config("clc", mechanism, replicas=1, epochs=2, ema_fraction=0.5,
                         noise_multiplier=1.0)
    words = config.max_words  # the budgets count row-words: 8 rows of this many words
    monkeypatch.setitem(recipes.UNCHUNKED, "clc", 8 * words)
    monkeypatch.setitem(recipes.CHUNK, "clc", 8 * words)
    full = corpus(config)
    half = dataclasses.replace(full, train=full.train[: len(full.train) // 2])
    raw, seen = _RawWeights(), {}

    def hook(model, preprocessor):
        seen["final"] = [v.numpy() for v in model.trainable_variables]
        enc = encoding.encode(preprocessor, half.train[:7], "hook")
        seen["losses"] = predictions.per_example_losses(model, enc.x, enc.y)
        return "hooked"

    run_dir = str(tmp_path / "run")
    first = training.train(config, run_dir, strategy=strategy(1), callbacks=[raw], splits=half,
                           after_training=hook, export=False)
    assert first["after_training"] == "hooked"
    assert seen["losses"].shape == (7,) and np.all(np.isfinite(seen["losses"]))
    assert read(run_dir, "config.json")["dataset_size"] == len(half.train)
    assert not os.path.exists(os.path.join(run_dir, "saved_model"))
    assert len(seen["final"]) == len(raw.average) == len(raw.raw)
    for final, average in zip(seen["final"], raw.average):
        np.testing.assert_array_equal(final, average)
    assert any(not np.allclose(f, r) for f, r in zip(seen["final"], raw.raw))
    # 96 training utterances at batch 32: 6 steps, time constant 0.5 x 6 = 3 steps
    assert len(half.train) == 96
    assert float(raw.model.optimizer.ema_momentum) == pytest.approx(1 - 1 / 3)
    # a finished run resumed (fit has nothing left to run) is scored on the averages too
    again = training.train(config, run_dir, resume=True, strategy=strategy(1), splits=half,
                           after_training=hook, export=False)
    assert again["test"] == first["test"]
    assert read(run_dir, "config.json")["config"]["physical_batch_size"] == (
        8 if mechanism == "dpsgd" else 0)
    for final, average in zip(seen["final"], raw.average):
        np.testing.assert_array_equal(final, average)


@pytest.mark.parametrize("model", ["clc", "bert"])
def test_head_dropout_reaches_the_heads(model):
    """The heads' dropout is the config's (private runs: private_head_dropout when set); before
    the field existed it was a fixed 0.1 that "no dropout" recipes silently kept."""
    for mechanism, expected in (("dpsgd", 0.0), ("sgd", 0.3)):
        config = tiny_config(model, mechanism, replicas=1, head_dropout=0.3,
                             private_head_dropout=0.0)
        spec = RunSpec.parse(config).resolved(192)
        splits = builders.load_splits(spec.data)
        preprocessor, vectors = builders.build_preprocessor(
            spec.model, splits.train, builders.label_schema(spec.data, splits))
        built = builders.build_model(spec.model, preprocessor, vectors)
        assert built.intent_dropout.rate == built.tag_dropout.rate == expected
        assert built.dropout_rate == expected  # what get_config saves for the export


# --------------------------------------------------------------------------- probing first
class _EncoderAndHeads(keras.callbacks.Callback):
    """The encoder's and the heads' trainable weights at the start and after each epoch."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _record(self):
        task = self.model.wrapped_model
        heads = [v for v in task.trainable_variables
                 if all(v is not e for e in task.encoder.trainable_variables)]
        self.seen.append(([v.numpy().copy() for v in task.encoder.trainable_variables],
                          [v.numpy().copy() for v in heads]))

    def on_train_begin(self, logs=None):
        self._record()

    def on_epoch_end(self, epoch, logs=None):
        self._record()


def test_probe_epochs_train_the_heads_alone_then_the_encoder(tmp_path):
    """BERT with LoRA (ghost norms): during the probing epoch the encoder's trainable weights
    (LoRA factors, biases, layer norms) stay bit-identical, the heads move; in the next epoch the
    encoder moves too. The ledger is that of any 2 epochs. One replica: frozen variables under
    mirrored noise on 2 replicas are edp_tf/private_model_freeze_test.py's.

    The run reads a joint-format directory without schema, its labels taken as they are
    (label_selection="training" instead of the private selection), and its vocabulary is the
    training text's (bert.vocabulary="train"): the labels and the vocabulary come from the
    training split and are exported with the model, so the ledger says epsilon does not cover
    them, the export is listed as not covered and the run is not private (one run for both
    checks: a tiny run's cost is mostly tracing)."""
    config = tiny_config("bert", "dpsgd", replicas=1, epochs=2, probe_epochs=1,
                         noise_multiplier=1.0, label_selection="training")
    config.bert.private_finetune = "lora"
    assert config.bert.vocabulary == "train"
    config.data_dir = write_joint_dir(tmp_path / "joint", corpus(config))
    run_dir = str(tmp_path / "run")
    seen = _EncoderAndHeads()
    # the ledger lists what a run writes whether or not this one exports (run_files.artifacts)
    summary = training.train(config, run_dir, strategy=strategy(1), callbacks=[seen],
                             export=False)
    (encoder0, heads0), (encoder1, heads1), (encoder2, _) = seen.seen
    assert len(encoder0) > 0
    for before, after in zip(encoder0, encoder1):
        np.testing.assert_array_equal(before, after)
    assert any(not np.allclose(b, a) for b, a in zip(heads0, heads1))
    assert any(not np.allclose(b, a) for b, a in zip(encoder1, encoder2))
    ledger = read(run_dir, "privacy.json")
    assert summary["private"] is False and len(ledger["epochs"]) == 2
    assert ledger["frozen_until_epoch"] == 1  # recorded; epsilon is that of any 2 epochs

    assert any("label sets were derived from the training split" in s
               for s in ledger["not_covered"])
    assert read(run_dir, "label_schema.json")["from_training_data"] is True
    assert any("label_schema.json" in a for a in ledger["artifacts"]["not_covered"])
    assert any(s.startswith("saved_model/") and "the label sets and the vocabulary" in s
               for s in ledger["artifacts"]["not_covered"])
    assert not [a for a in ledger["artifacts"]["covered"] if a.startswith("saved_model/")]
    assert ledger["private"] is False


@pytest.mark.parametrize("overrides, message", [
    (dict(mechanism="sgd", probe_epochs=1), r"--config\.probe_epochs=1 is invalid.*private"),
    (dict(mechanism="dpsgd", probe_epochs=2, epochs=2), r"--config\.probe_epochs=2 is invalid"
                                                        r".*fewer than the run's 2 epochs"),
    (dict(mechanism="dpsgd", probe_epochs=-1), r"--config\.probe_epochs=-1 is invalid"),
    (dict(mechanism="dpsgd", probe_epochs=1, sparse_embeddings=True, per_example_method="ghost"),
     r"--config\.probe_epochs=1 is invalid: probe_epochs cannot be combined with "
     r"sparse_embeddings"),
])
def test_probe_epochs_that_cannot_run_name_the_field(tmp_path, overrides, message):
    config = tiny_config(**{"replicas": 1, **overrides})
    with pytest.raises(ValueError, match=message):
        training.train(config, str(tmp_path / "run"), strategy=strategy(1))
