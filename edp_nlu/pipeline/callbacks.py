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
    charged, none twice), and `RunCheckpoints` checkpoints the weights after them, so a resume
    trains the rest of that epoch. The handlers are the process's own only while `fit` runs."""

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


class RunCheckpoints(keras.callbacks.Callback):
    """The run's checkpoints, each committed by state.json after the ledger has charged its
    steps (`in_resume_order`): at each epoch's end, and inside an epoch every
    `checkpoint_seconds` (0: none) and where a signal cut the epoch short (`GracefulStop`),
    each at a step count that is a multiple of `step_multiple` (BandMF's b: the rest of the
    epoch is then whole cycles of the groups, charged exactly by the accountant; 0: none inside
    an epoch), so that a resume repeats at most the steps since the last one. Workers of a
    multi-worker run write their checkpoints together (reading a variable may be a collective),
    so they take them every `every_steps` steps instead, and none where a signal stops them
    (`on_signal`), each worker at its own step."""

    def __init__(self, run_dir, checkpoint, state, private,
                 graceful: "GracefulStop | None" = None, phases: "timing.Phases | None" = None,
                 checkpoint_seconds: float = 0.0, step_multiple: int = 1, every_steps: int = 0,
                 on_signal: bool = True):
        super().__init__()
        self.phases = phases or timing.Phases()
        self.graceful = graceful
        self.run_dir = run_dir
        self.checkpoint, self.state, self.private = checkpoint, state, private
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.step_multiple = int(step_multiple)
        self.every_steps, self.on_signal = int(every_steps), bool(on_signal)
        self.continued: tuple = (None, 0)  # (epoch, steps done before this fit) of a resume
        self._saved = time.time()
        self._epoch, self._offset = 0, 0

    def on_train_begin(self, logs=None):
        self._saved = time.time()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._offset = self.continued[1] if self.continued[0] == epoch else 0

    def on_train_batch_end(self, batch, logs=None):
        steps = int(batch) + 1
        if steps >= (self.params or {}).get("steps", 0):  # the epoch's end commits the last
            return
        done = self._offset + steps
        timed = (self.checkpoint_seconds > 0
                 and time.time() - self._saved >= self.checkpoint_seconds)
        if timed or (self.every_steps and done % self.every_steps == 0):
            self._save_inside(self._epoch, done)

    def on_epoch_end(self, epoch, logs=None):
        if _cut_short(self.graceful):
            # its steps are charged; the resumed run trains the rest of the epoch again
            if self.on_signal:
                self._save_inside(epoch, self._offset + self.graceful.steps_done)
            return
        self._commit(epoch + 1, 0)

    def _save_inside(self, epoch: int, steps_done: int) -> None:
        """A checkpoint `steps_done` steps into `epoch` (none at a step that is not a multiple
        of `step_multiple`, or with `step_multiple` 0: the resume then starts from the previous
        one)."""
        if steps_done > 0 and self.step_multiple and steps_done % self.step_multiple == 0:
            self._commit(epoch, steps_done)

    def _commit(self, epochs_done: int, steps_done: int) -> None:
        with self.phases.phase("checkpoints"):
            checkpoints.write(
                self.checkpoint, self.run_dir, self.state, epochs_done,
                list(self.private.layer_scales) if self.private is not None else None,
                lambda state: write_json(os.path.join(self.run_dir, STATE_FILE), state),
                steps_done)
        self._saved = time.time()


class DevEvaluation(keras.callbacks.Callback):
    """At each whole epoch's end, after its checkpoint (`in_resume_order`: a kill during the
    evaluation loses no step, and the resume evaluates what is missing, `record_dev`), the dev
    metrics of the weights the epoch ended with, into metrics.json."""

    def __init__(self, run_dir, model, preprocessor, dev, dev_x, diagnostics: bool = False,
                 graceful: "GracefulStop | None" = None, phases: "timing.Phases | None" = None):
        super().__init__()
        self.phases = phases or timing.Phases()
        self.graceful = graceful
        self.diagnostics = diagnostics
        self.run_dir, self.joint, self.preprocessor = run_dir, model, preprocessor
        self.dev, self.dev_x = dev, dev_x
        self._start = time.time()
        self.predict_step = predictions.decoding_step(model)  # the test metrics' trace too

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        if not _cut_short(self.graceful):  # a cut epoch trains again on resume
            self.record_dev(epoch, time.time() - self._start, logs)

    def record_dev(self, epoch: int, seconds: "float | None", logs=None) -> None:
        """Epoch `epoch`'s dev metrics (of the weights it ended with) into metrics.json."""
        with self.phases.phase("dev evaluation"):
            dev = (predictions.score(self.dev, *predictions.predict_by_decoding(
                self.joint, self.preprocessor, self.dev_x, step=self.predict_step,
                decodings=(self.joint.decoding,))[self.joint.decoding])
                if self.dev else {})
        path = os.path.join(self.run_dir, METRICS_FILE)
        record = read_json(path, {"epochs": []})
        record["epochs"] = [e for e in record["epochs"] if e["epoch"] < epoch]
        entry = {"epoch": epoch, "seconds": None if seconds is None else round(seconds, 3),
                 "dev": dev, "decoding": self.joint.decoding}
        if self.diagnostics and logs:  # unnoised statistics of the training data: not covered
            entry["train"] = {k: float(v) for k, v in logs.items()}
        record["epochs"].append(entry)
        write_json(path, record)
        if dev:
            _log.info("epoch %d: dev SER %.4f intent acc %.4f slot F1 %.4f (%s)", epoch,
                      dev["ser"], dev["intent_accuracy"], dev["slot_f1"],
                      "restored" if seconds is None else f"{seconds:.1f} s")

    def missing_dev_record(self, epochs_done: int) -> bool:
        """Whether the last whole epoch's metrics were lost (a kill after its checkpoint)."""
        recorded = {e["epoch"] for e in
                    read_json(os.path.join(self.run_dir, METRICS_FILE), {"epochs": []})["epochs"]}
        return epochs_done > 0 and epochs_done - 1 not in recorded


def _cut_short(graceful: "GracefulStop | None") -> bool:
    return graceful is not None and graceful.epoch_cut_short()


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


def in_resume_order(privacy_ledger, run_checkpoints: RunCheckpoints,
                    dev_evaluation: DevEvaluation, tensorboard_dir, extra=(),
                    diagnostics: bool = False) -> list:
    """[graceful stop, privacy ledger, checkpoints, dev evaluation, TensorBoard, extra, progress
    bar]: at the end of an epoch the ledger charges it *before* its checkpoint and state are
    saved, so an interruption can only make the ledger count an epoch whose weights were lost
    (an over-estimate of epsilon), never the reverse; the dev evaluation comes after the
    checkpoint, so a kill during it loses no step. The ledger also refuses an epoch over the
    budget before its first step. `privacy_ledger` None (plain SGD) and `tensorboard_dir` None
    are left out. A private run without `diagnostics` gets the public progress bar, last so
    that it shows the epsilon of the epoch that just ended."""
    graceful = run_checkpoints.graceful
    ordered = [graceful] if graceful is not None else []
    ordered += [privacy_ledger] if privacy_ledger is not None else []
    ordered += [run_checkpoints, dev_evaluation]
    if tensorboard_dir is not None:  # the training loss and clipping statistics: diagnostics
        ordered.append(keras.callbacks.TensorBoard(tensorboard_dir, write_graph=False,
                                                   profile_batch=0))
    ordered += list(extra)
    if privacy_ledger is not None and not diagnostics:
        ordered.append(PublicProgress(privacy_ledger))
    return ordered
