"""Keras callbacks that keep `privacy.json` (the run's privacy ledger) and stop at a budget.

Why a ledger on disk, rewritten after every epoch: a privacy review needs the epsilon of what was
actually run (steps counted, not planned), and a run resumed from a checkpoint must continue the
same account. Epsilon is recomputed from the recorded epochs (edp_tf.accounting), so the file is
self-contained: `python -m edp_nlu.privacy --run_dir=...` re-derives it.

Resuming is conservative: epochs already in the ledger are never dropped (re-running epoch t
after restoring an older checkpoint is charged again, since it queried the data again), and a gap
of epochs is refused. An epoch is charged from its first step that can read the data: before each
step call (after tracing: edp_tf/step_guard.py) the ledger makes sure `in_progress.steps` on disk
covers every step allowed to start, writing it (fsynced) a few steps ahead. A process killed at
any moment is charged that count on resume: never fewer steps than ran, at most the flush
interval more (docs/privacy.md, "Interrupted runs").
"""
from __future__ import annotations

import atexit
import json
import math
import os
import tempfile
import time
import weakref
from typing import Any, Iterable, Optional

import keras
from absl import logging

from edp_tf import accounting, checks, step_count
from edp_tf.accounting import EpochRecord
from edp_tf.sampling import PoissonSampler

FILENAME = "privacy.json"
SAMPLINGS = ("poisson", "shuffle")
# fields that must agree between a ledger on disk and the run that continues it
MECHANISM_FIELDS = ("delta", "sampling", "sampling_rate", "dataset_size", "batch_size", "replicas",
                    "microbatch_size", "noise_mode", "l2_norm_clip", "sensitivity", "scaling",
                    "privacy_unit", "user_estimator", "selection_noise_multiplier", "bands")
FIELD_DEFAULTS = {"privacy_unit": "example",  # ledgers written before the fields existed
                  "user_estimator": "fixed", "selection_noise_multiplier": None, "bands": 1}
SHUFFLE_SENTENCE = (
    "Batches were fixed-size shuffled batches, not Poisson samples: epsilon assumes Poisson "
    "sampling at rate q = batch_size / dataset_size, which shuffling does not provide (adding "
    "one example shifts every later batch, so many micro-batches change and the sensitivity "
    "bound does not hold; the number of steps depends on n). The run is not private.")
UNVERIFIED_POISSON_SENTENCE = (
    "The ledger was not given the PoissonSampler that produced the batches "
    "(PrivacyLedger.for_sampler), and fit trained on {source}: epsilon assumes Poisson sampling "
    "that it cannot verify, so the run is not reported as private.")
VALIDATION_SENTENCE = (
    "fit evaluated validation_data after every epoch without noise (the val_* logs, History, "
    "and callbacks that read them, such as EarlyStopping or ModelCheckpoint): epsilon covers the "
    "training examples, assuming no validation example is one of them; the validation examples "
    "themselves are not protected.")
PUBLIC_SIZE_SENTENCE = (
    "The dataset size n is treated as public (as in the usual DP-SGD accounting): the sampling "
    "rate q, the normaliser of every update (the expected batch q n), the number of steps and "
    "the default delta = 0.1/n follow from it, and adding or removing one record would change "
    "them. Release n, or fix these from a declared public size, only if it may be known.")
PUBLIC_USERS_SENTENCE = (
    "User level: the number of users and their total weight W are treated as public: the "
    "sampling rate, the normaliser q W and the steps follow from them.")
SAMPLING_SEED_SENTENCE = (
    "The Poisson sampling seed was fixed: the batches are predictable, so the amplification by "
    "sampling that epsilon relies on does not hold.")
OUTSIDE_FIT_SENTENCE = (
    "The private step ran outside an accounted fit (train_step or the train function called "
    "directly, a custom loop, a callback stepping on its own, or a fit without this ledger): "
    "steps_outside_fit counts those updates, which the step itself counted. Their batches were "
    "not the sampler's and they were not charged, so epsilon does not bound what they moved "
    "into the weights. The run is not private.")
WEIGHTS_MOVED_SENTENCE = (
    "The wrapped model's weights changed outside the private step (its own fit or optimizer, "
    "gradients applied by hand, a callback's assign or set_weights, a layer's statistics "
    "updated by the forward pass): weights_moved_outside_the_step counts the moves the "
    "weights' seal found (edp_tf/weight_seal.py). Epsilon does not bound what they moved "
    "into the weights. The run is not private.")
NOISE_CHANGED_SENTENCE = (
    "The step's noise multiplier differed from the schedule within an epoch (dp_noise_"
    "multiplier assigned during fit): the epoch was charged at the schedule's value, which "
    "its steps did not all use. The run is not private.")


class BudgetExhaustedError(RuntimeError):
    """Training would exceed the privacy budget before its first step."""


def write_json_atomically(path: str, content: dict, sort_keys: bool = False,
                          durable: bool = False) -> None:
    """Readers see the old or the new file, never a partial one (tmp file + os.replace); the
    one atomic writer of the project (the trainers' run files use it too). `durable` also
    fsyncs the directory, so that the rename itself survives a power loss (the ledger's step
    bound must never go back to an older value)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            # inf is written as Infinity (Python's json reads it)
            json.dump(content, f, indent=2, sort_keys=sort_keys)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename is None:  # name the file (a full disk)
            raise OSError(error.errno, error.strerror, path) from error
        raise


def read_ledger(run_dir_or_path: str) -> dict:
    """The ledger of a run directory (or a privacy.json path), with a clear error if unreadable."""
    path = run_dir_or_path
    if os.path.isdir(path):
        path = os.path.join(path, FILENAME)
    try:
        with open(path) as f:
            ledger = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no privacy ledger at {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): refusing to guess its epsilon; restore "
                         "it from a backup, or start a new run directory") from None
    if not isinstance(ledger, dict) or "epochs" not in ledger:
        raise ValueError(f"{path} is not a privacy ledger (no 'epochs' field)")
    return ledger


def charged(ledger: dict) -> tuple:
    """(EpochRecords, ExtraEvents) a resume of `ledger` (read_ledger's dict) starts from: its
    epochs, an interrupted epoch's charge (`in_progress.steps`) and its extra events."""
    records = [EpochRecord.from_dict(e) for e in ledger["epochs"]]
    interrupted = ledger.get("in_progress")
    if interrupted and interrupted.get("steps"):
        records.append(EpochRecord.from_dict(interrupted))
    return tuple(records), accounting.as_extra_events(ledger.get("extra_events", []))


def headline(ledger: dict, delta: Optional[float] = None) -> dict:
    """The one statement every output gives (privacy.json, `statement()`, the report,
    edp-privacy, edp-evaluate's labels): epsilon over every step a released file can hold,
    whether the run is private, and the steps counted.

    Why the open or interrupted epoch is in it: a checkpoint committed inside that epoch (the
    trainers', or a user callback's save) holds its steps the moment it is on disk, so the
    epoch's durable bound (`in_progress.steps`, never fewer than ran) is charged in the
    headline, not in a footnote, and a later resume charges exactly that."""
    records, extras = charged(ledger)
    delta = ledger["delta"] if delta is None else accounting.check_delta(delta)
    est = accounting.compute_epsilons(records, ledger["sampling_rate"], delta, extras)
    interrupted = ledger.get("in_progress") or {}
    return {"epsilon": est.epsilon, "epsilon_rdp": est.epsilon_rdp,
            "epsilon_pld": est.epsilon_pld, "delta": delta,
            "private": bool(ledger.get("private")) and math.isfinite(est.epsilon),
            "steps": sum(r.steps for r in records), "epochs": len(records),
            "in_progress_steps": int(interrupted.get("steps") or 0)}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def library_artifacts(facts: dict) -> dict:
    """What a run of the library alone releases, when no application said more: the ledger's
    own file, the weights it trained, and what fit's logs (History, progress bar, callbacks)
    show; the trainers list their run directory instead (`PrivacyLedger.artifacts`)."""
    not_covered = []
    if facts.get("training_statistics"):
        not_covered.append("fit's logs (History, progress bar, callbacks): loss, metrics and "
                           "clipping statistics of the training batches, without noise")
    if facts.get("validation_data"):
        not_covered.append("fit's logs (History, progress bar, callbacks): val_* of "
                           "validation_data, without noise (assumed not training data)")
    return {"covered": [f"the ledger ({FILENAME} when run_dir is given)",
                        "the wrapped model's weights and the optimizer's state, "
                        "however the caller saves or exports them",
                        "fit's logs: noise_multiplier (a function of the schedule)"],
            "not_covered": not_covered}


def _merge_sentences(*lists: Iterable[str]) -> list:
    out: list = []
    for sentences in lists:
        out.extend(s for s in sentences if s not in out)
    return out


class PrivacyLedger(keras.callbacks.Callback):
    """Keeps `run_dir/privacy.json` for a `PrivateModel.fit`, one entry per epoch actually run.

    Args:
      run_dir: where privacy.json lives (a resumed run passes the same directory); None keeps
        the ledger in memory (`ledger`), continued by later fits with the same callback.
      dataset_size: n, the number of training examples (users, for user-level privacy).
      delta: the delta of the reported (epsilon, delta).
      sampling: "poisson" (edp_tf.sampling; the step must be given DPConfig(expected_batch_size))
        or "shuffle" (fixed-size batches: not private, the epsilon shown assumes Poisson).
      sampling_rate: q. Default: expected_batch_size / n (poisson) or batch / n (shuffle).
      sampling_seed_fixed: the Poisson sampler was given a seed (the batches are predictable).
      sampler: the PoissonSampler whose batches the model trains on (`for_sampler` passes it).
        Without it a "poisson" ledger cannot verify the sampling and reports the run as not
        private.
      target_epsilon: a budget. After each epoch the ledger predicts the next one's epsilon
        (z_{t+1}, this epoch's steps) and sets `stop_training` if it would exceed the budget;
        since Keras runs at least one step after that, an epoch that *starts* over budget (the
        first of a fit, or a resumed one) is refused with BudgetExhaustedError before its first
        step. `budget_accountant` ("pld" or "rdp") makes the prediction.
      flush_steps: the most steps the durable bound runs ahead of the steps started, so the
        most a kill can over-charge (SIGKILL, power loss: `in_progress.steps` is charged).
      flush_seconds: the bound is rewritten (fsynced, about 10 ms) about this often: it runs
        ahead by the steps that take this long, between 1 and `flush_steps`.
      budget_reserve: the fraction of target_epsilon the plan held back (its noise calibrated
        for the rest), stated in privacy.json; the budget itself stays target_epsilon.
    """

    def __init__(self, run_dir: str, dataset_size: int, delta: float, sampling: str = "poisson",
                 sampling_rate: Optional[float] = None, sampling_seed_fixed: bool = False,
                 sampler=None, target_epsilon: Optional[float] = None,
                 budget_accountant: str = "pld", flush_steps: int = 8,
                 flush_seconds: float = 1.0, budget_reserve: float = 0.0):
        super().__init__()
        if isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1:
            raise ValueError(f"dataset_size must be an integer >= 1, got {dataset_size!r}")
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        # None: the ledger lives in memory only (edp_tf.make_private without a run_dir)
        self.run_dir = None if run_dir is None else str(run_dir)
        self.path = None if run_dir is None else os.path.join(self.run_dir, FILENAME)
        self.dataset_size = dataset_size
        self.delta = accounting.check_delta(delta)
        self.sampling = sampling
        self.sampling_rate = (None if sampling_rate is None
                              else accounting.check_sampling_rate(sampling_rate))
        self.sampling_seed_fixed = bool(sampling_seed_fixed)
        self.sampler = sampler
        # optional: {"covered": [...], "not_covered": [...]} files of the run directory, written
        # into privacy.json so that a reviewer sees what epsilon covers; "release_covered": False
        # (an exported artifact holds data of the training split) makes the run not private
        self.artifacts: Optional[dict] = None
        if sampler is not None:
            if not isinstance(sampler, PoissonSampler) or sampling != "poisson":
                raise ValueError("sampler must be an edp_tf.sampling.PoissonSampler, with "
                                 "sampling='poisson'")
            if sampler.dataset_size != dataset_size or (
                    sampling_rate is not None and sampling_rate != sampler.sampling_rate):
                raise ValueError("dataset_size and sampling_rate must be the sampler's")
        self._ledger: Optional[dict] = None
        self._fit_params: Any = None  # Keras' per-fit params dict: identifies the current fit
        self._continued = False
        self._open_epoch: Optional[int] = None
        self._steps = 0
        self._charged_extra: dict = {}  # id(model) -> extra events already charged for it
        # the budget: stop before an epoch that would take epsilon above target_epsilon
        self.target_epsilon = (None if target_epsilon is None
                               else checks.number("target_epsilon", target_epsilon, 0.0, True))
        self.budget_accountant = accounting._check_accountant(budget_accountant)
        # the fraction of the budget the plan held back for redoing steps a late kill lost
        self.budget_reserve = checks.number("budget_reserve", budget_reserve, 0.0, False, 0.5,
                                            True)
        self.stopped_after_epoch: Optional[int] = None
        self.reason: Optional[str] = None
        self._cleared: Any = None  # (epoch, records) whose prediction passed
        self.flush_steps = checks.count("flush_steps", flush_steps, 1)
        self.flush_seconds = checks.number("flush_seconds", flush_seconds, 0.0)
        self._started = 0  # steps of the open epoch allowed to start (the hook's count)
        self._bound = 0  # in_progress.steps on disk: what a kill of the open epoch is charged
        self._hooked = False  # the model called the hook in this epoch (edp_tf/step_guard.py)
        self._last_call: Optional[float] = None  # time of the previous step call
        self._last_steps = 1  # steps that call could run
        self._step_seconds: Optional[float] = None  # a step's time, for the flush interval
        self._epoch_count: Optional[int] = None  # the step's own count when the epoch opened
        self._inner_iterations_seen: Optional[int] = None  # the wrapped model's optimizer

    @classmethod
    def for_sampler(cls, run_dir: str, sampler, delta: float,
                    target_epsilon: Optional[float] = None, **kwargs) -> "PrivacyLedger":
        """A ledger for batches of an `edp_tf.sampling.PoissonSampler` (`kwargs`: the
        constructor's budget_accountant, flush_steps, flush_seconds)."""
        return cls(run_dir, sampler.dataset_size, delta, "poisson", sampler.sampling_rate,
                   sampler.seed_fixed, sampler=sampler, target_epsilon=target_epsilon, **kwargs)

    # ------------------------------------------------------------------ state
    @property
    def records(self) -> tuple:
        """The EpochRecords charged so far (the current, unfinished epoch excluded)."""
        if self._ledger is None:
            return ()
        return tuple(EpochRecord.from_dict(e) for e in self._ledger["epochs"])

    @property
    def ledger(self) -> dict:
        if self._ledger is None:
            raise RuntimeError("the ledger is known once fit() has started")
        return self._ledger

    def record_for(self, epoch: int, steps: int) -> EpochRecord:
        """The record `steps` steps of `epoch` will have under the model's schedule."""
        if self._ledger is None:
            raise RuntimeError("the ledger is known once fit() has started")
        mechanism = self.model.mechanism  # begin_fit checked it against the ledger's fields
        z_t = mechanism.noise_multiplier_at(epoch)
        return EpochRecord(epoch, steps, z_t, mechanism.effective_noise_multiplier(z_t),
                           mechanism.bands)

    def epsilon_with(self, extra_records: Iterable[EpochRecord] = (),
                     accountant: str = "pld") -> float:
        """Epsilon of the ledger plus `extra_records` (a prediction, for the budget)."""
        led = self.ledger
        return accounting.compute_epsilon(self.records + tuple(extra_records),
                                          led["sampling_rate"], led["delta"],
                                          led["extra_events"], accountant)

    def check_batch_source(self, source) -> None:
        """Refuses, before the first step, batches this ledger's sampler did not draw.

        A ledger made for a sampler (`for_sampler`) states a Poisson epsilon; batches cut by
        Keras from arrays, or a tf.data pipeline the library did not sample, are another
        sampling for which that number bounds nothing (edp_tf.batch_source).
        `PrivateModel.fit` calls this with what it was given; `begin_fit` again.
        """
        if self.sampling != "poisson" or self.sampler is None:
            return
        if source is None or source.kind != "sampler":
            what = source.description if source is not None else "batches of unknown origin"
            raise ValueError(
                f"PrivacyLedger for a {type(self.sampler).__name__}: fit was given {what}, "
                "and the ledger's epsilon holds only for the sampler's Poisson batches. Train on "
                "fit(sampler.dataset(x, y), ...) (repeat=True for an infinite stream; "
                "edp_tf.batch_source.map_rows to parse its batches row by row), or keep "
                "these batches with PrivacyLedger(..., sampling='shuffle'), which reports the "
                "run as not private.")
        if source.sampler != self.sampler:
            theirs = source.sampler
            raise ValueError(
                f"fit's batches come from another sampler ({type(theirs).__name__}, n="
                f"{theirs.dataset_size}, q={theirs.sampling_rate}) than the ledger's "
                f"({type(self.sampler).__name__}, n={self.sampler.dataset_size}, "
                f"q={self.sampler.sampling_rate}): pass the ledger the sampler whose dataset "
                "fit trains on")

    # ------------------------------------------------------------------ callbacks
    def on_train_begin(self, logs=None):
        self.begin_fit()
        add = getattr(self.model, "add_before_steps", None)
        if add is not None:
            add(self.before_steps)

    def on_train_end(self, logs=None):
        remove = getattr(self.model, "remove_before_steps", None)
        if remove is not None:
            remove(self.before_steps)
        self.reconcile()  # the last epoch's saves (a ModelCheckpoint's) into privacy.json

    def on_epoch_begin(self, epoch, logs=None):
        self.begin_epoch(epoch)
        if self.target_epsilon is not None:
            self._refuse_if_over_budget(epoch)

    def on_train_batch_end(self, batch, logs=None):
        # with steps_per_execution = k Keras reports once per k steps, with the last step's index
        self._steps = max(self._steps, int(batch) + 1)

    def on_epoch_end(self, epoch, logs=None):
        self.close_epoch(epoch, logs)
        if logs is not None and self._ledger is not None:
            # epsilon so far, a function of the ledger only (public): the callbacks after this
            # one see it (History, the progress bar, CSVLogger, TensorBoard)
            logs["epsilon"] = float(self._ledger["epsilon"])
        if self.target_epsilon is not None:
            self._stop_if_next_exceeds(epoch)

    # ------------------------------------------------------------------ the work
    def begin_fit(self) -> None:
        """Reads the mechanism from the model, loads or starts the ledger (once per fit)."""
        if self._ledger is not None and self._fit_params is self.params:
            return
        facts = self._facts()
        source = getattr(self.model, "batch_source", None)
        self.check_batch_source(source)  # fit checked it before anything ran; this is the root
        self._adopt_sampler_of(source)
        self._check_plan(facts.get("plan"))
        mechanism = self._mechanism(facts)
        previous = (read_ledger(self.path) if self.path is not None and os.path.exists(self.path)
                    else self._ledger if self.path is None else None)
        if previous is not None:
            led = previous
            diff = [k for k in MECHANISM_FIELDS
                    if not _same(led.get(k, FIELD_DEFAULTS.get(k)), mechanism[k])]
            if diff:
                raise ValueError(
                    f"{self.path or 'the ledger'} was written for another mechanism: "
                    + ", ".join(f"{k} {led.get(k, FIELD_DEFAULTS.get(k))!r} there vs "
                                f"{mechanism[k]!r} now" for k in diff)
                    + ". Continue it with the same mechanism, or use a new run_dir.")
        else:
            led = dict(mechanism, epochs=[], extra_events=[], not_covered=[], private=True,
                       in_progress=None, fits=[])
        self._refuse_training_it_does_not_hold(led)
        charged = self._charged_extra.setdefault(id(self.model), [])
        new_extra = [e for e in facts.get("extra_events", []) if e not in charged]
        accounting.as_extra_events(new_extra)  # validates them before anything is written
        charged.extend(new_extra)
        led["extra_events"] = list(led["extra_events"]) + [dict(e) for e in new_extra]
        not_covered = list(facts.get("not_covered", []))
        unverified = self.sampling == "poisson" and self.sampler is None
        if self.sampling == "shuffle":
            not_covered.append(SHUFFLE_SENTENCE)
        if unverified:
            not_covered.append(UNVERIFIED_POISSON_SENTENCE.format(
                source=source.description if source is not None else "batches of unknown origin"))
        if self.sampling_seed_fixed:
            not_covered.append(SAMPLING_SEED_SENTENCE)
        led["not_covered"] = _merge_sentences(led["not_covered"], not_covered)
        # what the epsilon statement takes as given, beside what it does not cover
        led["assumes"] = _merge_sentences(
            [PUBLIC_SIZE_SENTENCE]
            + ([PUBLIC_USERS_SENTENCE] if facts.get("privacy_unit") == "user" else []),
            led.get("assumes", []),
            [VALIDATION_SENTENCE] if facts.get("validation_data") else [])
        # informational: where this fit's batches came from (a sampler, and any row-wise parse)
        led["batch_source"] = source.to_dict() if source is not None else None
        void = (facts.get("seed_fixed") or self.sampling_seed_fixed
                or facts.get("scaling") == "first_batch" or self.sampling == "shuffle"
                or unverified or (self.artifacts or {}).get("release_covered") is False)
        led["private"] = bool(led.get("private", True)) and not void
        led["artifacts"] = (dict(self.artifacts) if self.artifacts is not None
                            else library_artifacts(facts))
        led["global_batch_size"] = facts["global_batch_size"]
        led["schedule"] = self._schedule()
        if self.target_epsilon is not None:  # the budget, for the report's chart
            led["target_epsilon"] = self.target_epsilon
        if self.budget_reserve and self.target_epsilon is not None:
            led["budget_reserve"] = {
                "fraction": self.budget_reserve,
                "planned_epsilon": self.target_epsilon * (1.0 - self.budget_reserve),
                "why": "the noise was calibrated for the planned epsilon; the rest of "
                       "target_epsilon is for redoing steps an interruption lost"}
        self._ledger, self._fit_params = led, self.params
        self._continued, self._open_epoch, self._steps = False, None, 0
        self._refresh_epsilon()
        _LIVE.add(self)
        listen = getattr(self.model, "add_after_save", None)
        if listen is not None:  # a file the model saves is listed when it is written
            listen(self.reconcile)
        self.reconcile()  # steps since the last fit, or before this ledger

    def continue_at(self, epoch: int) -> None:
        """First epoch of a fit: charges an interrupted epoch, refuses gaps (once per fit)."""
        self.begin_fit()
        if not self._continued:
            self._continued = True
            self._continue_from(epoch)
            self._write()  # an interrupted epoch's charge and this fit, before any step

    def begin_epoch(self, epoch: int) -> None:
        """Opens `epoch` in memory; nothing is charged until a step may read the data
        (`before_steps` writes the bound then)."""
        self.continue_at(epoch)
        if self._open_epoch == epoch:
            return
        self.reconcile()  # steps between the fit's epochs (a callback's own)
        self._open_epoch, self._steps = epoch, 0
        self._started = self._bound = 0
        self._hooked = False
        self._last_call = None
        count = self._step_count()
        self._epoch_count = None if count is None else count.value

    def before_steps(self, steps: int) -> None:
        """Called before a train-function call that may run `steps` steps, once it is traced
        (edp_tf/step_guard.py): if they could take the open epoch past the bound on disk, a
        new bound, a few steps ahead, is written and fsynced first. Every step that can read
        the data is then covered by `in_progress.steps` before it starts."""
        if self._open_epoch is None or self._ledger is None:
            return
        now = time.monotonic()
        if self._last_call is not None:
            self._step_seconds = (now - self._last_call) / max(1, self._last_steps)
        self._last_call, self._last_steps = now, steps
        self._hooked = True
        upcoming = self._started + steps
        if upcoming > self._bound:
            ahead = self.flush_steps
            if self._step_seconds is None:  # the epoch's first call: one step's bound
                ahead = 1
            elif self._step_seconds > 0:
                ahead = max(1, min(ahead, math.ceil(self.flush_seconds / self._step_seconds)))
            bound = self._started + max(steps, ahead)
            planned = self._planned_steps()
            self._bound = bound if planned is None else min(bound, max(planned, upcoming))
            self._mark_in_progress()
        self._started = upcoming

    def _mark_in_progress(self) -> None:
        record = self.record_for(self._open_epoch, self._bound).to_dict()
        record["planned_steps"] = self._planned_steps()
        self.ledger["in_progress"] = record
        self._write(durable=True)

    def cancel_epoch(self, epoch: int) -> None:
        """Withdraws an epoch that has not run a single step (the budget refused it)."""
        if self._open_epoch == epoch and self._started == 0 and self._steps == 0:
            self._open_epoch = None
            if self.ledger.get("in_progress") is not None:
                self.ledger["in_progress"] = None
                self._write()

    def close_interrupted(self) -> None:
        """Charges the epoch a fit left open when an exception ended it in this process: the
        steps allowed to start (the hook's count), or without the hook the steps counted plus
        the one that may have run past its last callback (never more than the epoch's planned
        steps). A crash of the process is charged on resume instead (`in_progress.steps`)."""
        if self._open_epoch is None:
            return
        if self._hooked:
            if self._started == 0:  # no step read the data
                self.cancel_epoch(self._open_epoch)
                return
            steps = max(self._started, self._steps)
        else:
            steps = self._steps + 1
        planned = self._planned_steps()
        steps = steps if planned is None else min(steps, planned)
        record = self.record_for(self._open_epoch, steps)
        if self._noise_not_charged(record) is not None:
            self._void(NOISE_CHANGED_SENTENCE)
        led = self.ledger
        led["epochs"] = list(led["epochs"]) + [record.to_dict()]
        led["in_progress"] = None
        self._open_epoch = None
        self._settle_epoch_count(record.steps)
        self._refresh_epsilon()
        self._write()
        logging.warning("privacy ledger: epoch %d was interrupted after %d step(s): charged %d",
                        record.epoch, self._steps, record.steps)

    def close_epoch(self, epoch: int, logs: Optional[dict] = None) -> None:
        """Charges the finished epoch and rewrites privacy.json (idempotent)."""
        if self._open_epoch != epoch:
            return
        record = self.record_for(epoch, self._capped_steps())
        logged = (logs or {}).get("noise_multiplier")
        wrong = self._noise_not_charged(record, () if logged is None else (float(logged),))
        if wrong is not None:
            self._void(NOISE_CHANGED_SENTENCE)  # before the exception: its handler charges
            raise RuntimeError(
                f"epoch {epoch}: the step used noise_multiplier={wrong!r} but the schedule "
                f"says {record.noise_multiplier!r}: refusing to write a wrong epsilon (the "
                "run is stated as not private)")
        led = self.ledger
        led["epochs"] = list(led["epochs"]) + [record.to_dict()]
        led["in_progress"] = None
        self._open_epoch = None
        self._settle_epoch_count(record.steps)
        self._declare_moved(self._weight_moves())
        self._refresh_epsilon()
        self._write()
        logging.info("privacy ledger: epoch %d (%d steps, z=%.4g, z_eff=%.4g): epsilon %.4g "
                     "(RDP %.4g) at delta %.3g", epoch, record.steps, record.noise_multiplier,
                     record.effective_noise_multiplier, led["epsilon"], led["epsilon_rdp"],
                     led["delta"])

    # ------------------------------------------------------------------ the step's own count
    def reconcile(self) -> None:
        """Compares the ledger with the step's own count (edp_tf/step_count.py) and states the
        steps no accounted epoch holds: they void the run (`steps_outside_fit`, not covered).
        Runs at every fit's and epoch's start, before a statement is read, and at exit; not
        while an epoch is open (its steps are being charged by the durable bound)."""
        count = self._step_count()
        if self._ledger is None or self._open_epoch is not None:
            return
        if self._list_saved_files():
            self._write()
        if count is not None:
            self._declare_outside(count.take_unaccounted() + self._updates_not_by_the_step())
        self._declare_moved(self._weight_moves())

    def statement(self) -> dict:
        """The ledger as a reviewer reads it, reconciled with the step's count first, with the
        headline's epsilon and `private` (an open epoch's durable bound charged)."""
        self.reconcile()
        led = dict(self.ledger)
        top = headline(led)
        return led | {k: top[k] for k in ("epsilon", "epsilon_rdp", "epsilon_pld", "private")}

    def _step_count(self):
        return getattr(self.model, "step_count", None) if self.model is not None else None

    def _refuse_training_it_does_not_hold(self, led: dict) -> None:
        """Before the first step: weights that another wrapper trained, or that an optimizer
        updated before this wrapper's first step, carry steps this ledger would not state."""
        model, count = self.model, self._step_count()
        if count is None:
            return
        wrapped = getattr(model, "wrapped_model", None)
        others = step_count.steps_by_other_wrappers(wrapped, count) if wrapped is not None else 0
        if others:
            raise ValueError(
                f"this model's weights hold {others} private step(s) of another PrivateModel "
                "(make_private or PrivateModel called twice on one model), which this ledger "
                "would not count: keep training with the first wrapper (its fits continue its "
                "ledger), or wrap a freshly built model")
        if count.value:
            return  # this wrapper has stepped: reconcile() accounts for its own count
        charged = sum(int(e["steps"]) for e in led["epochs"]) + int(
            (led.get("in_progress") or {}).get("steps") or 0)
        own = getattr(model, "optimizer", None)
        before = _iterations(own) - charged
        inner = getattr(wrapped, "optimizer", None)
        if inner is not None and inner is not own:
            before = max(before, 0) + _iterations(inner)
        if before > 0:
            raise ValueError(
                f"the model was trained before this wrapper: its optimizer applied {before} "
                "update(s) the ledger does not hold (model.fit before make_private?), and "
                "epsilon would not cover them. Wrap a freshly built model; if that training "
                "used public data only, copy its weights into a fresh model "
                "(fresh.set_weights(model.get_weights())) and wrap that")

    def _updates_not_by_the_step(self) -> int:
        """Updates the wrapped model's own optimizer applied since the last call (a plain
        `model.fit` on the model the wrapper trains): the private step never uses it. (The
        wrapper's optimizer is not compared with the step's count: Keras counts its iterations
        per replica.)"""
        model = self.model
        own = getattr(model, "optimizer", None)
        inner = getattr(getattr(model, "wrapped_model", None), "optimizer", None)
        now = _iterations(inner) if inner is not None and inner is not own else 0
        seen, self._inner_iterations_seen = self._inner_iterations_seen, now
        return 0 if seen is None else max(0, now - seen)

    def _settle_epoch_count(self, charged_steps: int) -> None:
        """At an epoch's close: updates the step applied beyond the steps charged (a
        callback's own steps inside the epoch) are outside; the rest are accounted."""
        count, start = self._step_count(), self._epoch_count
        self._epoch_count = None
        if count is None or start is None:
            return
        ran = count.value - start
        count.take_unaccounted()
        self._declare_outside(ran - charged_steps)

    def _noise_not_charged(self, record: EpochRecord, logged: tuple = ()) -> Optional[float]:
        """A z_t the open epoch's steps used (their lowest and highest, and what fit logged)
        other than the one `record` charges; None when they all match."""
        seen = getattr(self.model, "dp_noise_range", None) if self.model is not None else None
        used = (() if seen is None else tuple(float(z) for z in seen.numpy())) + logged
        return next((z for z in used if math.isfinite(z) and not math.isclose(
            z, record.noise_multiplier, rel_tol=1e-5, abs_tol=1e-7)), None)

    def _weight_moves(self) -> int:
        seal = getattr(self.model, "weight_seal", None) if self.model is not None else None
        return 0 if seal is None else seal.take()

    def _declare_moved(self, moves: int) -> None:
        if moves <= 0:
            return
        led = self.ledger
        led["weights_moved_outside_the_step"] = (
            int(led.get("weights_moved_outside_the_step", 0)) + int(moves))
        self._void(WEIGHTS_MOVED_SENTENCE)
        logging.warning("privacy ledger: the weights changed outside the private step: the "
                        "run is not private (privacy.json weights_moved_outside_the_step)")

    def _void(self, sentence: str) -> None:
        led = self.ledger
        led["not_covered"] = _merge_sentences(led["not_covered"], [sentence])
        led["private"] = False
        self._write(durable=True)

    def _declare_outside(self, steps: int) -> None:
        if steps <= 0:
            return
        led = self.ledger
        led["steps_outside_fit"] = int(led.get("steps_outside_fit", 0)) + int(steps)
        led["not_covered"] = _merge_sentences(led["not_covered"], [OUTSIDE_FIT_SENTENCE])
        led["private"] = False
        self._write(durable=True)
        logging.warning("privacy ledger: %d step(s) ran outside an accounted fit: the run is "
                        "not private (privacy.json steps_outside_fit)", steps)

    # ------------------------------------------------------------------ the budget
    def _refuse_if_over_budget(self, epoch: int) -> None:
        records = self.records
        steps = self._planned_steps() or (records[-1].steps if records else None)
        if self._cleared == (epoch, records, steps):
            return  # on_epoch_end of the previous epoch already predicted this one
        if steps is None:  # an infinite stream: the epoch would never end to be checked
            self.cancel_epoch(epoch)
            raise ValueError(
                f"privacy budget: epoch {epoch + 1}'s length is unknown (an infinite dataset, "
                "such as sampler.dataset(x, y, repeat=True)): give fit steps_per_epoch, so that "
                "the budget can be checked before each epoch")
        predicted = self._predict(epoch, steps)
        if predicted > self.target_epsilon:
            self.cancel_epoch(epoch)
            raise BudgetExhaustedError(  # epochs counted from 1, as Keras prints them
                f"epoch {epoch + 1} would bring epsilon from {self._now():.4g} to "
                f"{predicted:.4g} > target {self.target_epsilon:.4g}: not training it")

    def _stop_if_next_exceeds(self, epoch: int) -> None:
        records = self.records
        if not records:
            return
        steps = self._planned_steps() or records[-1].steps
        predicted = self._predict(epoch + 1, steps)
        if predicted <= self.target_epsilon:
            # this fit's epochs' length: a fit of another length checks its first epoch again
            self._cleared = (epoch + 1, records, steps)
            return
        self.model.stop_training = True
        self.stopped_after_epoch = epoch
        # epochs counted from 1, as Keras prints them; the planned end of a budgeted run, not a
        # fault, hence INFO
        self.reason = (f"stopping after epoch {epoch + 1}: epsilon is {self._now():.4g}; epoch "
                       f"{epoch + 2} would bring it to {predicted:.4g} > target "
                       f"{self.target_epsilon:.4g}")
        logging.info("privacy budget: %s", self.reason)

    def _predict(self, epoch: int, steps: int) -> float:
        return self.epsilon_with([self.record_for(epoch, steps)], self.budget_accountant)

    def _now(self) -> float:
        return self.epsilon_with((), self.budget_accountant)

    # ------------------------------------------------------------------ helpers
    def _write(self, durable: bool = False) -> None:
        self._list_saved_files()
        if self.path is not None:
            write_json_atomically(self.path, self._ledger, durable=durable)

    def _list_saved_files(self) -> bool:
        """The files the model saved (`save`, `save_weights`, `export`, so a ModelCheckpoint's
        too) among the covered artifacts: each holds weights of some step, and the headline
        counts every step up to now. Whether the list grew."""
        saved = getattr(self.model, "saved_files", ()) if self.model is not None else ()
        if not saved or self._ledger is None or self._ledger.get("artifacts") is None:
            return False
        artifacts = dict(self._ledger["artifacts"])
        before = list(artifacts.get("covered", []))
        artifacts["covered"] = _merge_sentences(before, [
            f"{path} (saved by the model: weights of a step the headline counts)"
            for path in saved])
        self._ledger["artifacts"] = artifacts
        return artifacts["covered"] != before

    def _facts(self) -> dict:
        model = self.model
        if not all(hasattr(model, a) for a in ("privacy_facts", "dp_config", "mechanism")):
            raise ValueError("PrivacyLedger needs an edp_tf.PrivateModel (privacy_facts, "
                             f"dp_config, mechanism), got {type(model).__name__}")
        return model.privacy_facts()

    def _adopt_sampler_of(self, source) -> None:
        """A Poisson ledger made without its sampler verifies the batches after all when fit
        trained on a sampler's dataset of the ledger's n and q."""
        if self.sampling != "poisson" or self.sampler is not None or source is None:
            return
        theirs = source.sampler
        if source.kind == "sampler" and theirs.dataset_size == self.dataset_size and (
                self.sampling_rate is None or _same(theirs.sampling_rate, self.sampling_rate)):
            self.sampler = theirs
            self.sampling_rate = theirs.sampling_rate
            self.sampling_seed_fixed = self.sampling_seed_fixed or theirs.seed_fixed

    def _check_plan(self, plan: Optional[dict]) -> None:
        """The model's PrivacyPlan must be for this ledger's n, q and delta: its epsilon, and the
        noise a target epsilon calibrated through it, would otherwise be for another run than
        the one this ledger charges (the ledger's epsilon stays true, the target would not)."""
        if not plan:
            return
        ours = {"dataset_size": self.dataset_size, "sampling_rate": self.sampling_rate,
                "delta": self.delta}
        diff = [k for k, v in ours.items() if v is not None and not _same(plan[k], v)]
        if diff:
            raise ValueError(
                "the model's PrivacyPlan was made for another run than this ledger charges: "
                + ", ".join(f"{k} {plan[k]!r} planned vs {ours[k]!r} here" for k in diff)
                + " (make the plan and the ledger from the same sampler and delta)")

    def _check_unit(self, mechanism) -> None:
        """The sampler's unit must be the step's (edp_tf/sampling_unit.py): a user-level step
        fed example-level batches (or micro-batches holding two users, or BandMF batches to an
        independent step) would claim S = C for a change that can be larger."""
        if self.sampler is not None:
            mechanism.sampling_unit.refuse_other(self.sampler.unit,
                                                 type(self.sampler).__name__)

    def _mechanism(self, facts: dict) -> dict:
        self._check_unit(self.model.mechanism)
        n, expected = self.dataset_size, self.model.mechanism.expected_batch_size
        batch = facts["global_batch_size"]
        if self.sampling == "poisson":
            if expected is None:
                raise ValueError(
                    "sampling='poisson' needs DPConfig(expected_batch_size=q*n) so that the step "
                    "normalises by the expected batch, not the padded one")
            q = self.sampling_rate or expected / n
            batch_size = expected
            # q n, or q W for weighted users (the sampler knows W)
            want = self.sampler.expected_batch_size if self.sampler is not None else q * n
            if not math.isclose(want, batch_size, rel_tol=1e-6):
                what = ("the users' total weight" if getattr(self.sampler, "user_weights", ())
                        else f"dataset_size={n}")
                raise ValueError(
                    f"sampling_rate={q} x {what} = {want} but "
                    f"DPConfig.expected_batch_size={batch_size}: they must agree")
        else:
            q, batch_size = batch / n, batch
            if self.sampling_rate is not None and not math.isclose(self.sampling_rate, q,
                                                                   rel_tol=1e-6):
                raise ValueError(f"sampling='shuffle' with batches of {batch} out of {n} has "
                                 f"q = {q}, not sampling_rate={self.sampling_rate}")
        return {
            "delta": self.delta, "sampling": self.sampling,
            "sampling_rate": accounting.check_sampling_rate(q), "dataset_size": n,
            "batch_size": batch_size, "replicas": facts["replicas"],
            "microbatch_size": facts["microbatch_size"], "noise_mode": facts["noise_mode"],
            "l2_norm_clip": facts["l2_norm_clip"], "sensitivity": facts["sensitivity"],
            "scaling": facts["scaling"], "privacy_unit": facts["privacy_unit"],
            "user_estimator": facts["user_estimator"],
            # sparse embedding noise: z_c of the row counts (joined into each epoch's z_eff)
            "selection_noise_multiplier": facts.get("selection_noise_multiplier"),
            "sparse_embeddings": facts.get("sparse_embeddings"),  # informational: C1, tau, tables
            "clipping": facts.get("clipping", "flat"),  # informational: same S flat or per layer
            # informational (epsilon does not depend on it): DP-FedAvg's local epochs per user
            "local_epochs": facts.get("local_epochs", 0),
            # informational: the first epochs trained only some variables (same mechanism)
            "frozen_until_epoch": facts.get("frozen_until_epoch", 0),
            # informational: rows (augmented copies) in each example's clip; S, q and epsilon
            # are those of the same run without copies
            "augment_copies": facts.get("augment_copies", 1),
            # BandMF: b (charged as ceil(steps / b) steps at b q) and its strategy
            # (informational: any coefficients of norm <= 1 have the same epsilon)
            "bands": facts.get("bands", 1),
            # informational: Opacus' secure mode (CSPRNG state, summed draws), same epsilon
            "secure_noise": facts.get("secure_noise", False),
        } | ({"bandmf_coefficients": facts["bandmf_coefficients"]}
             if facts.get("bandmf_coefficients") else {})

    def _schedule(self) -> dict:
        m = self.model.mechanism
        return {"noise_multiplier": m.noise_multiplier, "decay": m.decay,
                "decay_rate": m.decay_rate}

    def _planned_steps(self) -> Optional[int]:
        steps = (self.params or {}).get("steps")
        return None if steps is None else int(steps)

    def _capped_steps(self) -> int:
        planned = self._planned_steps()
        return self._steps if planned is None else min(self._steps, planned)

    def _continue_from(self, epoch: int) -> None:
        """Charges an interrupted epoch, refuses gaps, records where this fit starts."""
        led = self._ledger
        _charge_interrupted(led, self.path or "the ledger")
        done = [e["epoch"] for e in led["epochs"]]
        following = max(done) + 1 if done else 0
        if epoch > following:
            raise ValueError(
                f"{self.path or 'the ledger'} records epochs up to {following - 1} but fit "
                f"starts at epoch "
                f"{epoch}: epochs {following}..{epoch - 1} are missing from the ledger, so its "
                "epsilon would be too small. Resume with the run_dir whose ledger has them.")
        if epoch < following and done:
            logging.warning("privacy ledger: fit starts at epoch %d, which the ledger has "
                            "charged already (in whole or in part): the steps it runs now are "
                            "charged on top (they query the data again)", epoch)
        led["fits"] = list(led.get("fits", [])) + [
            {"initial_epoch": epoch, "epochs_recorded_before": len(led["epochs"])}]
        self._refresh_epsilon()

    def _refresh_epsilon(self) -> None:
        _refresh_epsilon(self._ledger)


def _iterations(optimizer) -> int:
    iterations = getattr(optimizer, "iterations", None)
    return 0 if iterations is None else int(iterations.numpy())


def _refresh_epsilon(led: dict) -> None:
    """The ledger's epsilon fields: the headline's (its charged epochs, an open epoch's
    durable bound and its extra events)."""
    top = headline(led)
    led["epsilon"], led["epsilon_rdp"], led["epsilon_pld"] = (
        top["epsilon"], top["epsilon_rdp"], top["epsilon_pld"])
    # beside the run's delta (default 0.1/n): the same run at delta = 1/n and 1e-6
    led["epsilon_at_other_deltas"] = accounting.epsilons_at_reported_deltas(
        charged(led)[0], led["sampling_rate"], led["dataset_size"], led["extra_events"])
    if math.isinf(top["epsilon"]):
        led["private"] = False


def settle_interrupted(run_dir: str) -> Optional[dict]:
    """Charges the epoch an interrupted fit left in `run_dir`'s privacy.json (`in_progress`,
    its steps: the most that can have run) into its epochs and epsilon, and rewrites it; returns
    the ledger (None without one). A resumed fit does this when it begins; a run resumed only to
    finish with what it has trained starts no fit, and its statement must still count them."""
    path = os.path.join(run_dir, FILENAME)
    if not os.path.exists(path):
        return None
    led = read_ledger(path)
    if _charge_interrupted(led, path):
        _refresh_epsilon(led)
        write_json_atomically(path, led, durable=True)
    return led


def _charge_interrupted(led: dict, where: str) -> bool:
    """Moves an interrupted epoch's charge (`in_progress`: the most steps that can have run)
    into the ledger's epochs; whether there was one."""
    interrupted = led.get("in_progress")
    if not interrupted:
        return False
    if interrupted.get("steps") is None:
        raise ValueError(
            f"{where}: epoch {interrupted['epoch']} was interrupted and its step count was "
            "unknown (a dataset of unknown length): its cost cannot be bounded")
    led["epochs"] = list(led["epochs"]) + [EpochRecord.from_dict(interrupted).to_dict()]
    led["in_progress"] = None
    logging.warning("privacy ledger: epoch %d was interrupted: charged %d step(s), the most "
                    "that can have run", interrupted["epoch"], interrupted["steps"])
    return True


# ledgers that have begun a fit: at exit each states the steps its model ran since (a custom
# loop after the last fit), so that privacy.json does not outlive them as private
_LIVE: "weakref.WeakSet[PrivacyLedger]" = weakref.WeakSet()


@atexit.register
def _reconcile_at_exit() -> None:
    for ledger in list(_LIVE):
        try:
            ledger.reconcile()
        except Exception as error:  # noqa: BLE001 (at exit: say it, never mask the exit)
            logging.error("privacy ledger: could not reconcile %s at exit: %s",
                          ledger.path or "the in-memory ledger", error)
