"""The run's Keras callbacks, in the order resuming needs."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

import keras

from edp_nlu.pipeline import checkpoints, timing
from edp_nlu.pipeline.run_files import METRICS_FILE, STATE_FILE, read_json, write_json
from edp_nlu.scoring import predictions

_log = logging.getLogger(__name__)


class StoppedBySignal(RuntimeError):
    """SIGTERM or SIGINT stopped training after a step; the run resumes with --resume."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


class GracefulStop(keras.callbacks.Callback):
    """SIGTERM (a preempted machine) or SIGINT (Ctrl-C) finishes the current step, then stops.

    Keras still closes the epoch: the ledger charges the steps that ran (every step that ran is
    charged, none twice), while `EpochEnd` keeps no checkpoint of a partial epoch, so a resume
    reruns that epoch from the last whole one. The handlers are the process's own only while
    `fit` runs."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        super().__init__()
        self.signum = None
        self.steps_done = 0
        self._previous = {}

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._stop) for s in self.SIGNALS}

    def on_train_end(self, logs=None):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.steps_done = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps_done = int(batch) + 1

    def _stop(self, signum, frame):
        self.signum = signum
        self.model.stop_training = True

    def epoch_cut_short(self) -> bool:
        return self.signum is not None and self.steps_done < (self.params or {}).get("steps", 0)


class EpochEnd(keras.callbacks.Callback):
    """Dev metrics into metrics.json, then the checkpoint, committed by state.json (after the
    ledger: `checkpoints`); an epoch that a signal cut short is not kept (`GracefulStop`)."""

    def __init__(self, run_dir, model, preprocessor, dev, dev_x, checkpoint, state, private,
                 diagnostics: bool = False, graceful: "GracefulStop | None" = None,
                 phases: "timing.Phases | None" = None):
        super().__init__()
        self.phases = phases or timing.Phases()
        self.graceful = graceful
        self.diagnostics = diagnostics
        self.run_dir, self.joint, self.preprocessor = run_dir, model, preprocessor
        self.dev, self.dev_x = dev, dev_x
        self.checkpoint, self.state, self.private = checkpoint, state, private
        self._start = time.time()
        self.predict_step = predictions.decoding_step(model)  # the test metrics' trace too

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        if self.graceful is not None and self.graceful.epoch_cut_short():
            return  # its steps are charged; the resumed run trains the epoch again
        logs = logs or {}
        seconds = time.time() - self._start
        with self.phases.phase("dev evaluation"):
            dev = (predictions.score(self.dev, *predictions.predict_by_decoding(
                self.joint, self.preprocessor, self.dev_x, step=self.predict_step,
                decodings=(self.joint.decoding,))[self.joint.decoding])
                if self.dev else {})
        path = os.path.join(self.run_dir, METRICS_FILE)
        record = read_json(path, {"epochs": []})
        record["epochs"] = [e for e in record["epochs"] if e["epoch"] < epoch]
        entry = {"epoch": epoch, "seconds": round(seconds, 3), "dev": dev,
                 "decoding": self.joint.decoding}
        if self.diagnostics:  # unnoised statistics of the training data: not covered by epsilon
            entry["train"] = {k: float(v) for k, v in logs.items()}
        record["epochs"].append(entry)
        write_json(path, record)
        with self.phases.phase("checkpoints"):
            checkpoints.write(
                self.checkpoint, self.run_dir, self.state, epoch + 1,
                list(self.private.layer_scales) if self.private is not None else None,
                lambda state: write_json(os.path.join(self.run_dir, STATE_FILE), state))
        if dev:
            _log.info("epoch %d: dev SER %.4f intent acc %.4f slot F1 %.4f (%.1f s)",
                      epoch, dev["ser"], dev["intent_accuracy"], dev["slot_f1"], seconds)


# --------------------------------------------------------------------------- training


class PublicProgress(keras.callbacks.ProgbarLogger):
    """Keras' progress bar showing only what is public: steps, time, the noise multiplier z_t
    and, after each epoch, the epsilon spent so far (the ledger's). The step's other logs
    (training loss, clipped fraction, pre-clip norm, non-finite micro-batches) are unnoised
    statistics of the private batches: a private run shows them only with diagnostics."""

    PUBLIC = ("noise_multiplier",)

    def __init__(self, privacy_ledger=None):
        super().__init__()
        self._ledger = privacy_ledger

    def _public(self, logs) -> dict:
        return {k: v for k, v in (logs or {}).items() if k in self.PUBLIC}

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, self._public(logs))

    def on_epoch_end(self, epoch, logs=None):
        public = self._public(logs)
        if self._ledger is not None and self._ledger.records:  # it ran first: this epoch's
            public["epsilon"] = self._ledger.ledger["epsilon"]
        super().on_epoch_end(epoch, public)


def in_resume_order(privacy_ledger, epoch_end: EpochEnd, tensorboard_dir, extra=(),
                    diagnostics: bool = False) -> list:
    """[privacy ledger, EpochEnd, TensorBoard, extra, progress bar]: at the end of an epoch the
    ledger charges it *before* EpochEnd saves its checkpoint and state, so an interruption can
    only make the ledger count an epoch whose weights were lost (an over-estimate of epsilon),
    never the reverse. The ledger also refuses an epoch over the budget before its first step.
    `privacy_ledger` None (plain SGD) and `tensorboard_dir` None are left out. A private run
    without `diagnostics` gets the public progress bar, last so that it shows the epsilon of
    the epoch that just ended."""
    ordered = [epoch_end.graceful] if epoch_end.graceful is not None else []
    ordered += [privacy_ledger] if privacy_ledger is not None else []
    ordered.append(epoch_end)
    if tensorboard_dir is not None:  # the training loss and clipping statistics: diagnostics
        ordered.append(keras.callbacks.TensorBoard(tensorboard_dir, write_graph=False,
                                                   profile_batch=0))
    ordered += list(extra)
    if privacy_ledger is not None and not diagnostics:
        ordered.append(PublicProgress(privacy_ledger))
    return ordered
