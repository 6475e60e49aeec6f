"""The run's Keras callbacks, in the order resuming needs."""
from __future__ import annotations

import logging
import os
import time

import keras
import tensorflow as tf

from trainers import evaluation
from trainers.rundir import METRICS_FILE, STATE_FILE, read_json, write_json

_log = logging.getLogger(__name__)


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
        dev = (evaluation.score(self.dev, *evaluation.predict(
            self.joint, self.preprocessor, self.dev_x, step=self.predict_step)) if self.dev else {})
        path = os.path.join(self.run_dir, METRICS_FILE)
        record = read_json(path, {"epochs": []})
        record["epochs"] = [e for e in record["epochs"] if e["epoch"] < epoch]
        entry = {"epoch": epoch, "seconds": round(seconds, 3), "dev": dev,
                 "decoding": self.joint.decoding}
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


def in_resume_order(privacy_ledger, epoch_end: EpochEnd, tensorboard_dir, extra=()) -> list:
    """[privacy ledger, EpochEnd, TensorBoard, extra]: at the end of an epoch the ledger charges
    it *before* EpochEnd saves its checkpoint and state, so an interruption can only make the
    ledger count an epoch whose weights were lost (an over-estimate of epsilon), never the
    reverse. The ledger also refuses an epoch over the budget before its first step.
    `privacy_ledger` None (plain SGD) and `tensorboard_dir` None are left out."""
    ordered = [privacy_ledger] if privacy_ledger is not None else []
    ordered.append(epoch_end)
    if tensorboard_dir is not None:  # the training loss and clipping statistics: diagnostics
        ordered.append(keras.callbacks.TensorBoard(tensorboard_dir, write_graph=False,
                                                   profile_batch=0))
    return ordered + list(extra)
