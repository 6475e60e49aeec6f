"""One training run: data -> model -> (private) fit -> metrics, ledger, checkpoints, export.

Resuming: after every epoch the ledger (privacy.json) is written *before* the checkpoint, so an
interruption can only make the ledger count an epoch whose weights were lost (an over-estimate of
epsilon), never the reverse.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Optional

import keras
import ml_collections
import numpy as np
import tensorflow as tf

import edp_tf
from edp_tf import accounting, attacks, sampling
from edp_tf import ledger as ledger_lib
from edp_tf.mechanism import Mechanism
from trainers import data as data_lib
from trainers import metrics as metrics_lib
from trainers import optimizers, pipeline, recipes
from trainers import schema as schema_lib

_log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
METRICS_FILE = "metrics.json"


def default_run_dir(config) -> str:
    return os.path.join("runs", f"{config.name}-{config.mechanism}-{time.strftime('%Y%m%d-%H%M%S')}")


def load_run_config(run_dir: str) -> ml_collections.ConfigDict:
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"--resume: no {CONFIG_FILE} in run directory {run_dir}")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f)["config"])


def write_json(path: str, payload) -> None:
    """Atomic: a reader (or a crash) never sees half a file."""
    ledger_lib.write_json_atomically(path, payload, sort_keys=True)


def read_json(path: str, default=None):
    if not os.path.isfile(path):
        return default
    with open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------- evaluation
def padded_batches(batch_size: int, *arrays: dict):
    """Yields (real rows, [batch dict per input]) with the last batch padded (by wrapping) to
    `batch_size`: one trace of an evaluation function serves every batch (tracing the unrolled
    CLC costs tens of seconds). Callers keep the first `real rows` outputs."""
    rows = pipeline.rows(arrays[0])
    for start in range(0, rows, batch_size):
        index = np.arange(start, start + batch_size) % rows
        yield (min(batch_size, rows - start),
               [{k: tf.constant(v[index]) for k, v in a.items()} for a in arrays])


def predict(model, preprocessor, x: dict, batch_size: int = 256, step=None):
    """(intent labels, tag label lists cut to each utterance's kept words) for encoded inputs.

    Pass the same `step` (a tf.function of model.predict_labels) across calls to trace it once.
    """
    step = step or tf.function(model.predict_labels, reduce_retracing=True)
    intents, tags = [], []
    intent_names = preprocessor.intent_vocabulary.labels
    tag_names = preprocessor.tag_vocabulary.labels
    for real, (batch,) in padded_batches(batch_size, x):
        out = step(batch)
        ids = out["tag_ids"].numpy()[:real]
        kept = out["tag_mask"].numpy()[:real].sum(axis=1)
        intents.extend(intent_names[i] for i in out["intent_ids"].numpy()[:real])
        tags.extend([tag_names[t] for t in row[:k]] for row, k in zip(ids, kept))
    return intents, tags


def per_example_losses(model, x: dict, y: dict, batch_size: int = 256, step=None) -> np.ndarray:
    """The joint loss of each utterance under the trained model (inference mode).

    Pass the same `step` (see `loss_step`) across calls to trace it once.
    """
    step = step or loss_step(model)
    out = [step(bx, by).numpy()[:real] for real, (bx, by) in padded_batches(batch_size, x, y)]
    return np.concatenate(out) if out else np.zeros([0], np.float32)


def loss_step(model):
    """The per-example joint loss in inference mode, as one tf.function."""
    return tf.function(lambda bx, by: model.per_example_loss(by, model(bx, training=False)))


def membership_attack(model, preprocessor, train_enc, test_utterances) -> dict:
    """Loss-threshold membership inference: as many training utterances as test ones."""
    test_enc = pipeline.encode(preprocessor, test_utterances, "test")
    n = min(pipeline.rows(train_enc.x), pipeline.rows(test_enc.x))
    index = np.random.default_rng(0).permutation(pipeline.rows(train_enc.x))[:n]
    step = loss_step(model)
    members = per_example_losses(model, pipeline.subset(train_enc.x, index),
                                 pipeline.subset(train_enc.y, index), step=step)
    others = per_example_losses(model, pipeline.subset(test_enc.x, np.arange(n)),
                                pipeline.subset(test_enc.y, np.arange(n)), step=step)
    summary = attacks.loss_threshold_attack(members, others)
    summary["roc"] = attacks.roc_points(-members, -others)
    return summary


def score(references, intents, tags) -> dict:
    """Metrics against the original references; words past the model's length count as 'O'."""
    full_tags = [list(t) + ["O"] * (len(r.tokens) - len(t)) for r, t in zip(references, tags)]
    return metrics_lib.evaluate_utterances(references, intents, full_tags)


def artifacts(diagnostics: bool, labels) -> dict:
    """Which run-directory files epsilon covers, and which are diagnostics of the private data."""
    covered = ["checkpoints/ (weights and optimizer state)", "saved_model/ (serving export)",
               "metrics.json: dev and test metrics (computed on data that is not training data)",
               "config.json", "state.json", "privacy.json", "label_schema.json"]
    not_covered = []
    if labels.from_training_data:
        covered.remove("label_schema.json")
        not_covered.append("label_schema.json, preprocessor.json and the label names in "
                           "saved_model/: the label sets come from the training split")
    if diagnostics:
        not_covered += [
            "metrics.json: epochs[].train (training loss, preclip_norm, clipped_fraction, "
            "nonfinite_microbatches), train_encoding, membership_inference (training losses)",
            "tensorboard/ (the same training statistics)"]
    return {"covered": covered, "not_covered": not_covered, "diagnostics_released": diagnostics}


class EpochEnd(keras.callbacks.Callback):
    """Dev metrics into metrics.json, then the checkpoint and state (after the ledger)."""

    def __init__(self, run_dir, model, preprocessor, dev, dev_x, checkpoint, state, private,
                 diagnostics: bool = False):
        super().__init__()
        self.diagnostics = diagnostics
        self.run_dir, self.joint, self.preprocessor = run_dir, model, preprocessor
        self.dev, self.dev_x = dev, dev_x
        self.checkpoint, self.state, self.private = checkpoint, state, private
        self._start = time.time()
        self.predict_step = tf.function(model.predict_labels, reduce_retracing=True)

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        seconds = time.time() - self._start
        dev = (score(self.dev, *predict(self.joint, self.preprocessor, self.dev_x,
                                        step=self.predict_step)) if self.dev else {})
        path = os.path.join(self.run_dir, METRICS_FILE)
        record = read_json(path, {"epochs": []})
        record["epochs"] = [e for e in record["epochs"] if e["epoch"] < epoch]
        entry = {"epoch": epoch, "seconds": round(seconds, 3), "dev": dev}
        if self.diagnostics:  # unnoised statistics of the training data: not covered by epsilon
            entry["train"] = {k: float(v) for k, v in logs.items()}
        record["epochs"].append(entry)
        write_json(path, record)
        self.checkpoint.save()
        self.state["epochs_done"] = epoch + 1
        if self.private is not None:
            self.state["layer_scales"] = list(self.private.layer_scales)
        write_json(os.path.join(self.run_dir, STATE_FILE), self.state)
        if dev:
            _log.info("epoch %d: dev SER %.4f intent acc %.4f slot F1 %.4f (%.1f s)",
                      epoch, dev["ser"], dev["intent_accuracy"], dev["slot_f1"], seconds)


# --------------------------------------------------------------------------- training
def _datasets(config, x, y, n, private_cfg_k, strategy, fixed_seed):
    """(dataset, steps_per_epoch, sampling_rate, expected batch, Poisson sampler or None)."""
    replicas = strategy.num_replicas_in_sync
    batch = int(config.batch_size)
    if batch > n:
        raise ValueError(f"--config.batch_size={batch} exceeds the {n} training examples")
    q = batch / n
    if config.mechanism != "sgd" and config.sampling == "poisson":
        sampler = sampling.PoissonSampler(
            dataset_size=n, sampling_rate=q, replicas=replicas, microbatch_size=private_cfg_k,
            seed=fixed_seed)
        ds = sampler.dataset(x, y).repeat()
        return ds, sampler.steps_per_epoch, q, sampler.expected_batch_size, sampler
    multiple = replicas * (private_cfg_k or 1)
    if batch % multiple:
        raise ValueError(
            f"--config.batch_size={batch} must be a multiple of replicas x microbatch_size = "
            f"{multiple} with fixed-size batches")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shuffle(n, seed=fixed_seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)
    return ds, n // batch, q, None, None


def _optimizer(config, steps_per_epoch: int):
    return optimizers.build_optimizer(
        config.optimizer, float(config.learning_rate), int(config.epochs) * steps_per_epoch,
        config.lr_schedule, float(config.warmup_fraction), float(config.weight_decay))


def train(config, run_dir: str, resume: bool = False, strategy=None, callbacks=(),
          splits: Optional[data_lib.Splits] = None, after_training=None,
          export: bool = True) -> dict:
    """Runs (or resumes) the run described by `config` in `run_dir`; returns the summary.

    `callbacks` are extra Keras callbacks (appended after the run's own). `splits` replaces the
    corpus of `config.data_dir` (e.g. a subset, for shadow models); `after_training(model,
    preprocessor)` runs on the trained model and its result is the summary's "after_training";
    `export=False` skips the SavedModel.
    """
    extra_callbacks = list(callbacks)
    pipeline.check_config(config)
    started = time.time()
    os.makedirs(run_dir, exist_ok=True)
    config_path = os.path.join(run_dir, CONFIG_FILE)
    state = read_json(os.path.join(run_dir, STATE_FILE), {}) if resume else {}
    if resume and not state:
        raise ValueError(f"--resume: {run_dir} has no {STATE_FILE}: nothing to resume")
    if not resume and os.path.exists(config_path):
        raise ValueError(f"{run_dir} already holds a run: pass --resume or another --run_dir")
    strategy = strategy or edp_tf.make_strategy(int(config.replicas))
    if strategy.num_replicas_in_sync != config.replicas:
        raise ValueError(f"strategy has {strategy.num_replicas_in_sync} replicas, config "
                         f"asks for {config.replicas}")
    fixed_seed = int(config.seed) if config.seed >= 0 else None
    if fixed_seed is not None:
        keras.utils.set_random_seed(fixed_seed)

    splits = splits or pipeline.load_splits(config)
    if not resume:  # auto fields (0) take the data's size into account; config.json keeps them
        config = recipes.resolve(config, len(splits.train))
    labels = pipeline.label_schema(config, splits)
    vocab = data_lib.LabelVocab(labels.tags, (data_lib.UNKNOWN_INTENT, *labels.intents))
    unseen = {name: vocab.conform(getattr(splits, name), name)[1].to_dict()
              for name in ("dev", "test")}
    preprocessor, vectors = pipeline.build_preprocessor(config, splits.train, labels)
    train_enc = pipeline.encode(preprocessor, splits.train, "train")
    dev_x = preprocessor.encode([u.tokens for u in splits.dev])[0] if splits.dev else None
    test_x = preprocessor.encode([u.tokens for u in splits.test])[0] if splits.test else None
    n = len(splits.train)
    delta = config.delta or accounting.default_delta(n)
    k = pipeline.microbatch_size(config)
    private = config.mechanism != "sgd"

    ds, steps, q, expected_batch, sampler = _datasets(
        config, train_enc.x, train_enc.y, n, k, strategy, fixed_seed)
    dp = edp_tf.DPConfig(
        l2_norm_clip=config.l2_norm_clip, noise_multiplier=float(config.noise_multiplier),
        microbatch_size=k, noise_mode=config.noise_mode, decay=config.decay,
        decay_rate=config.decay_rate, scaling=config.scaling, seed=fixed_seed,
        expected_batch_size=expected_batch,
        physical_batch_size=int(config.physical_batch_size) or None) if private else None
    if private and config.target_epsilon > 0:
        rows = sampler.max_batch_size if sampler is not None else int(config.batch_size)
        planned = Mechanism.from_config(dp, strategy.num_replicas_in_sync, rows)
        z0 = state.get("noise_multiplier") or planned.calibrated(
            config.target_epsilon, delta, q, int(config.epochs), steps,
            extra_events=([accounting.ExtraEvent("private_layer_scales",
                                                 dp.scaling_noise_multiplier)]
                          if config.scaling == "private" else ())).noise_multiplier
        dp = dp.replace(noise_multiplier=z0)
        _log.info("calibrated z0 = %.4f for epsilon %.3g at delta %.3g", z0, config.target_epsilon,
                  delta)
    with strategy.scope():
        model = pipeline.build_model(config, preprocessor, vectors)
        optimizer = _optimizer(config, steps)
        if private:
            trainer = edp_tf.PrivateModel(model, dp)
            trainer.compile(optimizer=optimizer, loss=model.per_example_loss)
        else:
            trainer = model
            trainer.compile(optimizer=optimizer)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        manager = tf.train.CheckpointManager(checkpoint, os.path.join(run_dir, "checkpoints"), 2)
        if resume:
            optimizer.build(model.trainable_variables)
            if manager.latest_checkpoint is None:
                raise ValueError(f"--resume: no checkpoint in {run_dir}/checkpoints")
            checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
            if private and state.get("layer_scales"):
                trainer.restore_layer_scales(state["layer_scales"])

    z0 = dp.noise_multiplier if private else float(config.noise_multiplier)
    state.update({"noise_multiplier": z0, "steps_per_epoch": steps})
    if not resume:
        write_json(config_path, {"config": config.to_dict(), "dataset_size": n,
                                 "data_source": splits.source, "delta": delta})
        write_json(os.path.join(run_dir, "preprocessor.json"), preprocessor.get_config())
        write_json(os.path.join(run_dir, "label_schema.json"),
                   dict(labels.to_dict(), source=labels.source,
                        from_training_data=labels.from_training_data))
    callbacks = []
    if private:
        from edp_tf import ledger

        for sentence in pipeline.vocabulary_not_covered(preprocessor):
            trainer.note_not_covered(sentence)
        for sentence in schema_lib.not_covered(labels):
            trainer.note_not_covered(sentence)
        budget = config.target_epsilon if config.target_epsilon > 0 else None
        privacy_ledger = (ledger.PrivacyLedger.for_sampler(run_dir, sampler, delta, budget)
                          if sampler else
                          ledger.PrivacyLedger(run_dir, dataset_size=n, delta=delta,
                                               sampling=config.sampling, sampling_rate=q,
                                               target_epsilon=budget))
        privacy_ledger.artifacts = artifacts(bool(config.diagnostics), labels)
        callbacks.append(privacy_ledger)
    diagnostics = bool(config.diagnostics)
    epoch_end = EpochEnd(run_dir, model, preprocessor, splits.dev, dev_x, manager, state,
                         trainer if private else None, diagnostics)
    callbacks.append(epoch_end)
    if diagnostics:  # TensorBoard logs the training loss and clipping statistics
        callbacks.append(keras.callbacks.TensorBoard(
            os.path.join(run_dir, "tensorboard"), write_graph=False, profile_batch=0))
    callbacks += extra_callbacks
    initial_epoch = int(state.get("epochs_done", 0))
    if initial_epoch < config.epochs:
        try:
            trainer.fit(ds, epochs=int(config.epochs), initial_epoch=initial_epoch,
                        steps_per_epoch=steps, callbacks=callbacks, verbose="auto")
        except edp_tf.BudgetExhaustedError as error:  # a resumed run whose budget is spent
            _log.warning("no further epoch fits the budget: %s", error)

    # the dev predictions' trace serves the test split too (same batch shapes)
    test = (score(splits.test, *predict(model, preprocessor, test_x, step=epoch_end.predict_step))
            if splits.test else {})
    record = read_json(os.path.join(run_dir, METRICS_FILE), {"epochs": []})
    attack = (membership_attack(model, preprocessor, train_enc, splits.test)
              if splits.test and diagnostics else {})
    record.update({"test": test, "unseen_labels": unseen})
    if diagnostics:
        record.update({"train_encoding": train_enc.report, "membership_inference": attack})
    if attack:
        _log.info("membership inference (loss threshold, %d vs %d): AUC %.3f, TPR %.3f at 1%% FPR",
                  attack["members"], attack["nonmembers"], attack["auc"],
                  attack["tpr_at_1pct_fpr"])
    write_json(os.path.join(run_dir, METRICS_FILE), record)
    if export:
        from models.export import export_serving_model

        export_serving_model(model, preprocessor, os.path.join(run_dir, "saved_model"))
    privacy = read_json(os.path.join(run_dir, "privacy.json"), {})
    extra = {"after_training": after_training(model, preprocessor)} if after_training else {}
    return extra | {
        "run_dir": run_dir, "mechanism": config.mechanism, "model": config.model,
        "epochs": len(record["epochs"]), "seconds": round(time.time() - started, 1),
        "test": test, "membership_inference": attack,
        "epsilon": privacy.get("epsilon", math.inf if not private else None),
        "delta": delta, "private": bool(privacy.get("private", False)),
        "noise_multiplier": z0 if private else 0.0,
    }


def summary_line(summary: dict) -> str:
    test = summary["test"]
    eps = summary["epsilon"]
    privacy = ("not private (sgd)" if summary["mechanism"] == "sgd" else
               f"epsilon {eps:.3g} at delta {summary['delta']:.2g}"
               + ("" if summary["private"] else " (NOT private: see privacy.json)"))
    quality = (f"test SER {test['ser']:.4f}, intent acc {test['intent_accuracy']:.4f}, "
               f"slot F1 {test['slot_f1']:.4f}" if test else "no test split")
    attack = summary.get("membership_inference") or {}
    if attack:
        privacy += f"; membership-inference AUC {attack['auc']:.3f}"
    return (f"{summary['model']} / {summary['mechanism']}: {quality}; {privacy}; "
            f"{summary['epochs']} epochs in {summary['seconds']:.0f} s -> {summary['run_dir']}")
