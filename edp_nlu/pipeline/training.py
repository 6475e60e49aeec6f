"""One training run: data -> model -> (private) fit -> metrics, ledger, checkpoints, export.

`train` is the sequence; the pieces live in `builders` (data, model, dataset, optimizer, DPConfig),
`callbacks` (their resume order), `edp_nlu.scoring.predictions` (predictions, scores, the
membership attack) and `run_files` (the files). Resuming: the ledger charges an epoch before its
checkpoint is saved (callbacks.in_resume_order), so an interruption can only over-count epsilon.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import time
from typing import Optional

import keras
import tensorflow as tf

import edp_tf
from edp_nlu.data import encoding, loading
from edp_nlu.data import schema as schema_lib
from edp_nlu.models.export import export_serving_model
from edp_nlu.pipeline import (
    builders,
    checkpoints,
    label_selection,
    public_start,
    public_subspace,
    recipes,
    run_files,
    run_spec,
    timing,
    warm_start,
)
from edp_nlu.pipeline import callbacks as callbacks_lib
from edp_nlu.pipeline.run_files import CONFIG_FILE, METRICS_FILE, STATE_FILE, read_json, write_json
from edp_nlu.scoring import predictions
from edp_tf import accounting
from edp_tf import ledger as ledger_lib
from edp_tf.ledger import PrivacyLedger

_log = logging.getLogger(__name__)
BUDGET_EXIT = run_files.BUDGET_EXIT
_WARM_START_OUTSIDE = ("the starting weights came from a run that used this run's training data "
                       "outside its epsilon (privacy.json's not_covered names it)")


class BudgetSpentError(RuntimeError):
    """A resumed run whose charged epochs leave no budget for the epochs it was asked for."""


@dataclasses.dataclass
class _Data:
    """The corpus and its encodings, once per run."""

    spec: run_spec.RunSpec  # resolved (automatic fields filled) for a new run
    splits: loading.Splits
    units: int  # n: training examples, or users for user-level privacy
    users: Optional[list]  # the user of each training row (user-level privacy), else None
    delta: float  # the run's delta (config.delta, else 0.1 / n)
    labels: object  # edp_nlu.data.schema.LabelSchema; privately selected ones restrict `splits`
    unseen: dict
    preprocessor: object
    vectors: object
    train: encoding.Encoded
    dev_x: Optional[dict]
    test_x: Optional[dict]


def train(config, run_dir: str, resume: bool = False, strategy=None, callbacks=(),
          splits: Optional[loading.Splits] = None, after_training=None,
          export: bool = True) -> dict:
    """Runs (or resumes) the run described by `config` in `run_dir`; returns the summary.

    `callbacks` are extra Keras callbacks (appended after the run's own). `splits` replaces the
    corpus of `config.data_dir` (e.g. a subset, for shadow models); `after_training(model,
    preprocessor)` runs on the trained model and its result is the summary's "after_training";
    `export=False` skips the SavedModel.
    """
    started = time.time()
    phases = timing.Phases()
    spec = run_spec.RunSpec.parse(config)  # every field checked once, before anything is written
    state = _open_run_dir(run_dir, resume)
    strategy = _strategy(spec.run, strategy)
    init_from = _start_from(config, spec, run_dir, resume, strategy)
    fixed_seed = int(spec.run.seed) if spec.run.seed >= 0 else None
    if fixed_seed is not None:
        keras.utils.set_random_seed(fixed_seed)
    with phases.phase("data"):
        data = _load_data(spec, splits, resume, run_dir, strategy, fixed_seed)
    spec, n, delta = data.spec, data.units, data.delta
    restored = _restart_point(run_dir, state) if resume else None
    # read and checked once, on a new run: a resumed one restores its own checkpoint
    source = (warm_start.prepare(dataclasses.replace(spec.model, init_from=init_from),
                                 data.splits.train)
              if init_from and restored is None else None)
    if source is not None:  # kept in state.json: a resumed run states it without the source
        state["warm_start"] = source.facts()
    warm = state.get("warm_start")
    private = spec.privacy.private
    k = builders.microbatch_size(spec.privacy)
    with phases.phase("build"):
        ds, steps, q, expected_batch, sampler = builders.datasets(
            spec.data, spec.sampling, spec.privacy, data.train.x, data.train.y, n, k, strategy,
            fixed_seed, data.users)
        spec, dp, plan = (_private_step(spec, data, state, run_dir, resume, strategy,
                                        fixed_seed, (sampler, q, expected_batch, steps), k)
                          if private else (spec, None, None))
        model, trainer, checkpoint = _build(spec, data, dp, plan, steps, strategy, restored,
                                            source)
    z0 = dp.noise_multiplier if private else float(spec.privacy.knob("noise_multiplier"))
    state.update({"noise_multiplier": z0, "steps_per_epoch": steps})
    state.setdefault("first_noise_multiplier", z0)  # what a resume's limit on raising it is of
    if not resume:
        _write_run_files(run_dir, spec, data, n, delta, state)
    else:
        _keep_resumed_settings(run_dir, spec)
    ledger = _ledger(spec, data, run_dir, sampler, n, delta, q, warm) if private else None
    if ledger is not None:  # epsilon after each epoch, and the budget's prediction of the next
        phases.time_methods(ledger, ("on_train_begin", "on_epoch_begin", "on_epoch_end"),
                            "privacy accounting")
    run_checkpoints, evaluation = _checkpoints_and_evaluation(
        spec, run_dir, data, model, trainer if private else None, checkpoint, state, strategy,
        steps, phases)
    initial_epoch = int(state.get("epochs_done", 0))
    budget_refused = _train_epochs(spec, run_dir, resume, state, trainer, ds, steps, ledger,
                                   run_checkpoints, evaluation,
                                   (timing.StepTimes(phases), *callbacks))
    if private:  # a resume with no epoch left starts no fit: an interrupted charge is its own
        ledger_lib.settle_interrupted(run_dir)
    record, test, attack = _evaluate_and_export(run_dir, data, model, trainer,
                                                evaluation.predict_step, phases, export)
    done = int(state.get("epochs_done", initial_epoch))
    stopped = _budget_stop(done, spec.sampling.epochs, budget_refused, ledger)
    state["stopped"] = stopped
    state["finished"] = True  # after the export: a run killed before it is not finished
    write_json(os.path.join(run_dir, STATE_FILE), state)
    privacy = _statement(ledger, run_dir)
    extra = ({"after_training": after_training(model, data.preprocessor)}
             if after_training else {})
    return extra | {
        "run_dir": run_dir, "mechanism": spec.privacy.mechanism, "model": spec.model.model,
        "epochs": len(record["epochs"]), "seconds": round(time.time() - started, 1),
        "test": test, "decoding": model.decoding, "membership_inference": attack,
        "epsilon": privacy.get("epsilon", math.inf if not private else None),
        "delta": delta, "private": bool(privacy.get("private", False)),
        "noise_multiplier": z0 if private else 0.0, "timing": phases.breakdown(),
        "stopped": stopped,
    }


def _checkpoints_and_evaluation(spec: run_spec.RunSpec, run_dir: str, data: _Data, model,
                                private_model, checkpoint, state: dict, strategy, steps: int,
                                phases: timing.Phases) -> tuple:
    """(RunCheckpoints, DevEvaluation), sharing one GracefulStop: an epoch a signal cut short
    is checkpointed where it stopped and not evaluated."""
    graceful = callbacks_lib.GracefulStop()
    run_checkpoints = callbacks_lib.RunCheckpoints(
        run_dir, checkpoint, state, private_model, graceful, phases,
        *_inside_epoch_checkpoints(spec, strategy, private_model is not None, steps))
    evaluation = callbacks_lib.DevEvaluation(
        run_dir, model, data.preprocessor, data.splits.dev, data.dev_x,
        bool(spec.run.diagnostics), graceful, phases)
    return run_checkpoints, evaluation


def _evaluate_and_export(run_dir: str, data: _Data, model, trainer, predict_step,
                         phases: timing.Phases, export: bool) -> tuple:
    """(metrics record, test scores, attack) of the trained model, then its SavedModel."""
    # The averaged weights, also when fit had nothing left to run or stopped; not before the
    # first step (the averages would still be the zeros they start as).
    if trainer.optimizer.use_ema and int(trainer.optimizer.iterations.numpy()) > 0:
        trainer.optimizer.finalize_variable_values(model.trainable_variables)
    with phases.phase("test metrics"):
        record, test, attack = _final_metrics(run_dir, data, model, predict_step)
    if export:
        with phases.phase("export"):
            run_files.write_directory_atomically(
                os.path.join(run_dir, "saved_model"),
                lambda path: export_serving_model(model, data.preprocessor, path))
    return record, test, attack


def _private_step(spec: run_spec.RunSpec, data: _Data, state: dict, run_dir: str,
                  resume: bool, strategy, fixed_seed: Optional[int], batches: tuple,
                  k: Optional[int]) -> tuple:
    """(spec with its clipping chunks, DPConfig, PrivacyPlan) of a private run; `batches`:
    the sampler, q, the expected batch and the steps per epoch. A resumed run with a target
    epsilon is replanned for what its ledger has charged (`_replan`)."""
    sampler, q, expected_batch, steps = batches
    # chunked clipping bounds the step's memory (recipes.chunk_rows); config.json records it
    replica_rows = ((sampler.max_batch_size if sampler else int(spec.sampling.batch_size))
                    // strategy.num_replicas_in_sync)
    spec = spec.with_knobs(physical_batch_size=recipes.chunk_rows(
        spec.model, spec.privacy, (k or 1) * builders.augment_copies(spec.privacy),
        replica_rows))
    warm = state.get("warm_start")
    dp, plan = builders.private_run(
        spec.sampling, spec.privacy, k, expected_batch, fixed_seed,
        strategy.num_replicas_in_sync, sampler, q, data.units, data.delta, steps,
        state.get("noise_multiplier"), _not_covered(data, warm), _releases(data, run_dir, resume))
    if resume and spec.privacy.target_epsilon > 0:
        dp, plan = _replan(run_dir, spec, dp, plan, int(state.get("epochs_done", 0)),
                           int(state.get("steps_done", 0)), state)
    return spec, dp, plan


def _train_epochs(spec: run_spec.RunSpec, run_dir: str, resume: bool, state: dict, trainer,
                  ds, steps: int,
                  ledger, run_checkpoints, evaluation, extra_callbacks: tuple) -> bool:
    """Trains the epochs left (from the checkpoint restored, inside an epoch or at its end);
    returns whether the budget refused one. A signal's graceful stop raises StoppedBySignal
    with the way to continue."""
    initial_epoch = int(state.get("epochs_done", 0))
    # killed between an epoch's checkpoint and its dev metrics: the weights restored are that
    # epoch's (not so from a checkpoint inside the next epoch)
    if (resume and not state.get("steps_done")
            and evaluation.missing_dev_record(initial_epoch)):
        evaluation.record_dev(initial_epoch - 1, None)
    epochs, diagnostics = int(spec.sampling.epochs), bool(spec.run.diagnostics)
    if initial_epoch >= epochs:
        return False
    fit_callbacks = callbacks_lib.in_resume_order(
        ledger, run_checkpoints, evaluation,
        os.path.join(run_dir, "tensorboard") if diagnostics else None,
        extra_callbacks, diagnostics)
    budget_refused = _fit_remaining(trainer, ds, epochs, steps, initial_epoch,
                                    int(state.get("steps_done", 0)), fit_callbacks,
                                    run_checkpoints, ledger)
    graceful = run_checkpoints.graceful
    if graceful.signum is not None:
        done = int(state.get("epochs_done", initial_epoch))
        raise callbacks_lib.StoppedBySignal(graceful.signum, (
            f"stopped by {signal.Signals(graceful.signum).name}: {done} of {epochs} "
            f"epochs are checkpointed in {run_dir}"
            + (f" and {state['steps_done']} steps of the next" if state.get("steps_done")
               else "")
            + "; every step that ran is charged in privacy.json. Continue with: python -m "
            f"edp_nlu.train --run_dir={run_dir} --resume"))
    return budget_refused


def _budget_stop(done: int, epochs: int, budget_refused: bool, ledger) -> Optional[str]:
    """Why the run ended before its last epoch, when the privacy budget ended it; else None."""
    stopped = None
    if done < epochs and (budget_refused or (ledger is not None
                                             and ledger.stopped_after_epoch is not None)):
        stopped = (f"stopped by the privacy budget after {done} of {epochs} epochs "
                   "(a higher --target_epsilon on --resume continues it)")
    return stopped


def _fit_remaining(trainer, ds, epochs: int, steps: int, first_epoch: int, steps_done: int,
                   callbacks: list, run_checkpoints, ledger) -> bool:
    """Trains epochs `first_epoch`..`epochs` - 1, of which `steps_done` steps of the first ran
    before a checkpoint inside it: that epoch's rest is a fit of its own, then the others.
    Returns whether the budget refused an epoch before its first step."""
    fits = [(first_epoch, epochs, steps)]
    if steps_done:
        run_checkpoints.continued = (first_epoch, steps_done)
        fits = [(first_epoch, first_epoch + 1, steps - steps_done)]
        if first_epoch + 1 < epochs:
            fits.append((first_epoch + 1, epochs, steps))
    for initial, end, length in fits:
        try:
            trainer.fit(ds, epochs=end, initial_epoch=initial, steps_per_epoch=length,
                        verbose="auto", shuffle=False, callbacks=callbacks)  # ds: drawn already
        except edp_tf.BudgetExhaustedError as error:  # a resumed run whose budget is spent
            _log.warning("no further epoch fits the budget: %s", error)
            return True
        except BaseException:
            if ledger is not None:  # what ran is charged now, exactly (a kill: on resume)
                ledger.close_interrupted()
            raise
        graceful = run_checkpoints.graceful
        stopped = graceful is not None and graceful.signum is not None
        if stopped or (ledger is not None and ledger.stopped_after_epoch is not None):
            break
    return False


def _inside_epoch_checkpoints(spec: run_spec.RunSpec, strategy, private: bool,
                              steps: int) -> tuple:
    """RunCheckpoints' (checkpoint_seconds, step_multiple, every_steps, on_signal): checkpoints
    inside an epoch at multiples of BandMF's b (1 otherwise). A multi-worker run's workers must
    write theirs at the same steps, so they take one every quarter epoch (rounded up to that
    multiple), none by time or where a signal stops them."""
    multiple = int(spec.privacy.knob("bandmf_bands")) if private else 1
    seconds = float(spec.run.checkpoint_seconds)
    if not edp_tf.multi_worker.is_multi_worker(strategy):
        return seconds, multiple, 0, True
    quarter = -(-steps // 4)
    every = -(-quarter // multiple) * multiple if seconds > 0 else 0
    return 0.0, multiple, every, False


def _replan(run_dir: str, spec: run_spec.RunSpec, dp, plan, done: int, steps_done: int = 0,
            state: Optional[dict] = None) -> tuple:
    """(DPConfig, PrivacyPlan) of a resumed run with a target epsilon: unchanged if the epochs
    left (`steps_done` steps of epoch `done` ran before its checkpoint), at the run's z0, still
    land within the target after what the ledger has charged (interruptions included); else z0
    recalibrated so that the ledger's epochs plus those left land at the target. The ledger is
    public (its charges depend on when the process died, not on the data), so the new noise is
    chosen from nothing private. BudgetSpentError, before any step, if no noise can, or if it
    would take z0 above --config.resume_noise_limit times the run's first z0."""
    path = os.path.join(run_dir, ledger_lib.FILENAME)
    if done >= plan.epochs or not os.path.exists(path):
        return dp, plan
    records, events = ledger_lib.charged(ledger_lib.read_ledger(path))
    target = float(spec.privacy.target_epsilon)
    left = plan.steps_per_epoch - steps_done if steps_done else None
    if not records or plan.epsilon_after(records, done, events,
                                         first_epoch_steps=left) <= target:
        return dp, plan
    way_out = ("Resume with a higher --target_epsilon"
               + (f", or with --epochs={done} to finish with the {done} epochs trained" if done
                  else ""))
    try:
        replanned = plan.calibrated(target, charged=records, first_epoch=done,
                                    charged_events=events, first_epoch_steps=left)
    except ValueError:
        spent = accounting.compute_epsilon(records, plan.sampling_rate, plan.delta,
                                           tuple(events) + plan.charged_events)
        raise BudgetSpentError(
            f"the privacy budget is spent: {path} has charged epsilon {spent:.4g} of "
            f"--target_epsilon={target:g} (interrupted epochs included), and no noise fits "
            f"epochs {done + 1}..{plan.epochs} in what is left. {way_out}") from None
    z0, first = replanned.mechanism.noise_multiplier, float(
        (state or {}).get("first_noise_multiplier", plan.mechanism.noise_multiplier))
    limit = float(spec.run.resume_noise_limit)
    if limit and z0 > limit * first:
        raise BudgetSpentError(
            f"the privacy budget left is too small: after what {path} has charged "
            f"(interrupted epochs included), epochs {done + 1}..{plan.epochs} fit "
            f"--target_epsilon={target:g} only at z0 {z0:.4g}, {z0 / first:.3g} times the "
            f"run's first z0 {first:.4g} (--config.resume_noise_limit={limit:g}): their "
            f"updates would be mostly noise. {way_out}, or with "
            f"--config.resume_noise_limit=0 to train them anyway")
    _log.warning("resumed after charged interruptions: z0 %.4g -> %.4g, so that epochs %d..%d "
                 "land the run at epsilon %.3g", plan.mechanism.noise_multiplier, z0, done + 1,
                 plan.epochs, target)
    return dp.replace(noise_multiplier=z0), replanned


def _keep_resumed_settings(run_dir: str, spec: run_spec.RunSpec) -> None:
    """A resume's other --epochs, higher --target_epsilon or new execution settings
    (run_files.RESUME_SETTINGS) into config.json, so that later resumes run them too."""
    path = os.path.join(run_dir, CONFIG_FILE)
    saved = read_json(path, None)
    if not saved:
        return
    kept = saved["config"]
    fields = spec.to_dict()
    now = {"epochs": int(fields["epochs"]), "target_epsilon": float(fields["target_epsilon"])}
    for field in run_files.RESUME_SETTINGS:
        value = run_files.get_field(fields, field)
        now[field] = value if isinstance(value, bool) else float(value)
    changed = {f: v for f, v in now.items() if run_files.get_field(kept, f) != v}
    for field, value in changed.items():
        run_files.set_field(kept, field, value)
    if changed:
        write_json(path, saved)


def _start_from(config, spec: run_spec.RunSpec, run_dir: str, resume: bool, strategy) -> str:
    """The run `init_from` names: `init_from` itself, or the plain run on `public_pretraining`,
    trained first (a resumed run's is finished)."""
    if not spec.model.public_pretraining:
        return spec.model.init_from
    if resume:
        return public_start.source_dir(run_dir)
    return public_start.pretrain(config, run_dir, train, strategy)


def _open_run_dir(run_dir: str, resume: bool) -> dict:
    """The state of the run to resume ({} for a new run); refuses to overwrite a run. A new
    run's directory is made by its first file (`_write_run_files`), so a run that fails to
    start leaves no empty directory behind."""
    state = read_json(os.path.join(run_dir, STATE_FILE), {}) if resume else {}
    if resume and not state:
        raise ValueError(f"--resume: {run_dir} has no {STATE_FILE}: nothing to resume")
    if not resume and os.path.exists(os.path.join(run_dir, CONFIG_FILE)):
        raise ValueError(f"{run_dir} already holds a run: pass --resume or another --run_dir")
    return state


def _strategy(run: run_spec.RunWide, strategy):
    """The given strategy, or one of the run's replicas; they must agree."""
    strategy = strategy or edp_tf.make_strategy(int(run.replicas))
    if strategy.num_replicas_in_sync != run.replicas:
        raise ValueError(f"strategy has {strategy.num_replicas_in_sync} replicas, config "
                         f"asks for {run.replicas}")
    return strategy


def _load_data(spec: run_spec.RunSpec, splits, resume: bool, run_dir: str, strategy,
               fixed_seed: Optional[int]) -> _Data:
    """The run's corpus, labels and encodings; a new run's spec resolved for its n (a resumed
    run's was resolved when it started)."""
    splits = splits or builders.load_splits(spec.data)
    units, users = builders.privacy_units(spec.privacy, splits.train)
    log_counts = builders.training_counts_in_logs(spec.privacy, spec.run)
    if users is not None:  # user level: dev and test hold no training user's utterances
        splits, dropped = loading.without_training_users(splits)
        if dropped and log_counts:  # which users train: private
            _log.info("user level: %d dev/test utterances of training users left out", dropped)
        if not splits.test:
            raise ValueError("--config.privacy_unit=user: every test utterance belongs to a "
                             "training user; give splits made by user")
    if not resume:  # auto fields (0) take the data's size into account; config.json keeps them
        spec = spec.resolved(units)
        if spec.model.model == "bert":  # private runs may have taken the bert.private_ fields
            _log.info("%s run: bert.finetune=%s, bert.dropout=%s", spec.privacy.mechanism,
                      spec.model.bert.finetune, spec.model.bert.dropout)
    delta = spec.privacy.delta or accounting.default_delta(units)
    labels = _labels(spec.data, spec.privacy.private, splits, users, delta, run_dir, resume,
                     strategy, fixed_seed)
    if labels.selection is not None:  # unselected labels: [UNK] and O (label_selection.py)
        splits = dataclasses.replace(splits,
                                     train=label_selection.restrict(splits.train, labels))
    unseen = {name: loading.conform(getattr(splits, name), labels.tag_vocabulary,
                                    labels.intent_vocabulary, name)[1].to_dict()
              for name in ("dev", "test")}
    preprocessor, vectors = builders.build_preprocessor(spec.model, splits.train, labels)

    def encode(part):
        return preprocessor.encode([u.tokens for u in part])[0] if part else None

    return _Data(spec, splits, units, users, delta, labels, unseen, preprocessor, vectors,
                 encoding.encode(preprocessor, splits.train, "train", log_counts,
                                 builders.training_copies(spec.data, spec.privacy, spec.run)),
                 encode(splits.dev), encode(splits.test))


def _labels(data: run_spec.DataSpec, private: bool, splits, users, delta: float, run_dir: str,
            resume: bool, strategy, fixed_seed: Optional[int]):
    """The run's label schema (edp_nlu/pipeline/label_selection.py): a resumed run's own
    privately selected one; a given schema; a DP selection from the training split in a private
    run without one; else the training split's labels."""
    if resume:
        saved = label_selection.resumed(run_dir)
        if saved is not None:
            return saved
    if data.label_selection == "schema" and builders.given_label_schema(data) is None:
        raise ValueError("--config.label_selection=schema: no label schema was given "
                         "(--config.label_schema, or schema.json or JointBERT's intent_label.txt "
                         "and slot_label.txt in the data directory)")
    if not label_selection.selects_privately(data, private):
        return builders.label_schema(data, splits)
    seed = fixed_seed  # a fixed seed leaves the run not private anyway
    if seed is None and edp_tf.multi_worker.is_multi_worker(strategy):
        seed = edp_tf.multi_worker.shared_key(strategy)  # every worker must select the same
    return label_selection.select(data, splits.train, users, delta, seed)


def _releases(data: _Data, run_dir: str, resume: bool) -> tuple:
    """The releases made before the first step that the ledger must charge: the private label
    selection, unless a resumed run's ledger has charged it already."""
    event = label_selection.event(data.labels)
    if event is None or (resume and label_selection.charged(run_dir, event.name)):
        return ()
    return (event,)


def _restart_point(run_dir: str, state: dict) -> Optional[checkpoints.Committed]:
    """The newest intact committed checkpoint of a run being resumed (None: from the start);
    a damaged one is named and skipped, and the epochs after the one taken train again (the
    ledger charges them again: they query the data again)."""
    found, skipped = checkpoints.latest(run_dir, state)
    for why in skipped:
        _log.warning("damaged checkpoint skipped: %s", why)
    if skipped or (found is None and int(state.get("epochs_done", 0))):
        where = (f"{os.path.basename(found.prefix)} ({found.epochs_done} epochs)" if found
                 else "the start: no intact checkpoint is left")
        _log.warning("resuming from %s; later epochs train again and are charged again", where)
    state["epochs_done"] = found.epochs_done if found else 0
    state["steps_done"] = found.steps_done if found else 0
    if found is not None and found.steps_done:
        _log.info("resuming inside epoch %d, after its step %d", found.epochs_done + 1,
                  found.steps_done)
    state["layer_scales"] = found.layer_scales if found else None
    state["finished"] = False
    return found


def _build(spec: run_spec.RunSpec, data: _Data, dp, plan, steps: int, strategy,
           restored: Optional[checkpoints.Committed],
           source: Optional[warm_start.Source] = None):
    """(model, what `fit` runs: the PrivateModel or the model, its tf.train.Checkpoint),
    restored from `restored` when resuming, its backbone from `source` when given."""
    with strategy.scope():
        model = builders.build_model(spec.model, data.preprocessor, data.vectors)
        if source is not None:
            copied = warm_start.load_backbone(model, data.preprocessor, source)
            _log.info("warm start: %d variables (the backbone, and label-aware heads' shared "
                      "weights) from %s", copied, source.run_dir)
        optimizer = builders.optimizer(spec.optimizer, spec.sampling.epochs * steps,
                                       spec.privacy.private)
        if dp is not None:
            trainer = edp_tf.PrivateModel(model, dp, plan=plan,
                                          training_statistics=bool(spec.run.diagnostics))
            trainer.compile(optimizer=optimizer, loss=model.per_example_loss)
            _probe_first(spec, model, trainer)
            public_subspace.attach(spec.privacy, trainer, data.preprocessor)
        else:
            trainer = model
            trainer.compile(optimizer=optimizer)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        if restored is not None:
            optimizer.build(model.trainable_variables)
            checkpoint.read(restored.prefix).assert_existing_objects_matched()
            if dp is not None and restored.layer_scales:
                trainer.restore_layer_scales(restored.layer_scales)
    return model, trainer, checkpoint


def _probe_first(spec: run_spec.RunSpec, model, trainer) -> None:
    """--config.probe_epochs: the heads train alone for that many epochs, then the encoder
    joins (the step leaves the encoder's variables out until then: edp_tf freeze_until)."""
    probe, epochs = int(spec.privacy.probe_epochs), int(spec.sampling.epochs)
    if not probe:
        return
    if probe >= epochs:
        raise ValueError(f"--config.probe_epochs={probe} is invalid: expected fewer than the "
                         f"run's {epochs} epochs (the encoder would never train)")
    trainer.freeze_until(probe, model.encoder.trainable_variables)


def _write_run_files(run_dir: str, spec: run_spec.RunSpec, data: _Data, n: int, delta: float,
                     state: dict) -> None:
    """The run's fixed files and its first state (a run killed in its first epoch resumes from
    the start); config.json last, since it marks the directory as holding a run."""
    write_json(os.path.join(run_dir, STATE_FILE), dict(state, epochs_done=0, checkpoints=[]))
    write_json(os.path.join(run_dir, "preprocessor.json"), data.preprocessor.get_config())
    write_json(os.path.join(run_dir, "label_schema.json"),
               dict(data.labels.to_dict(), source=data.labels.source,
                    from_training_data=data.labels.from_training_data,
                    selection=data.labels.selection))
    write_json(os.path.join(run_dir, CONFIG_FILE), {
        "config": spec.to_dict(), "dataset_size": n,
        "data_source": data.splits.source, "delta": delta})


def _not_covered(data: _Data, warm: Optional[dict]) -> list:
    """What the run's statement does not cover: a vocabulary or label names from the training
    text, a pretraining source's corpora (`warm`: Source.facts(); they go into the PrivacyPlan)."""
    seed = int(data.spec.run.seed)
    seeded = data.labels.selection is not None and seed >= 0
    return (builders.vocabulary_not_covered(data.preprocessor)
            + list(schema_lib.not_covered(data.labels))
            + ([f"The label selection's noise was seeded (seed={seed}): the "
                "selected label sets are predictable, so the run is not private."]
               if seeded else [])
            + ([warm["not_covered"]] if warm else []))


def _statement(ledger, run_dir: str) -> dict:
    """The ledger's statement for the summary: the one this fit charged, or, when fit had no
    epoch left to run (a finished run resumed), the one it left in the run directory."""
    if ledger is not None and ledger.records:
        return ledger.statement()
    led = read_json(os.path.join(run_dir, "privacy.json"), {})
    return led | (ledger_lib.headline(led) if led else {})  # the one headline


def _ledger(spec: run_spec.RunSpec, data: _Data, run_dir: str, sampler, n: int, delta: float,
            q: float,
            warm: Optional[dict] = None):
    """The privacy ledger (with the budget when a target epsilon is set), with what the run
    directory's files are, for the statement's scope; a warm start whose source used this run's
    training data outside epsilon (`warm`) leaves the weights uncovered, so the run not private."""
    target = spec.privacy.target_epsilon
    budget = target if target > 0 else None
    reserve = float(spec.privacy.budget_reserve) if budget else 0.0
    ledger = (PrivacyLedger.for_sampler(run_dir, sampler, delta, budget, budget_reserve=reserve)
              if sampler else
              PrivacyLedger(run_dir, dataset_size=n, delta=delta,
                            sampling=spec.sampling.sampling, sampling_rate=q,
                            target_epsilon=budget, budget_reserve=reserve))
    ledger.artifacts = run_files.artifacts(
        bool(spec.run.diagnostics), data.labels,
        bool(getattr(data.preprocessor, "vocabulary_from_training_data", False)),
        _WARM_START_OUTSIDE if (warm or {}).get("private_data_use") else "",
        user_level=data.users is not None)
    return ledger


def _final_metrics(run_dir: str, data: _Data, model, predict_step):
    """Test metrics (and, with diagnostics, the membership attack) into metrics.json."""
    splits, diagnostics = data.splits, bool(data.spec.run.diagnostics)
    # the dev predictions' trace serves the test split too, both decodings (same batch shapes)
    by_decoding = (predictions.scores_by_decoding(model, data.preprocessor, splits.test,
                                                  data.test_x, step=predict_step)
                   if splits.test else {})
    test = by_decoding.get(model.decoding, {})
    record = read_json(os.path.join(run_dir, METRICS_FILE), {"epochs": []})
    attack = (predictions.membership_attack(model, data.preprocessor, data.train, splits.test)
              if splits.test and diagnostics else {})
    # The same attack against the dev split: where the test split is drawn differently from
    # train, test losses are higher for reasons other than membership. No training step uses dev
    # and the trainer selects nothing on it, so its utterances are non-members too.
    attack_dev = (predictions.membership_attack(model, data.preprocessor, data.train, splits.dev,
                                                "dev")
                  if splits.dev and diagnostics else {})
    record.update({"test": test, "decoding": model.decoding, "test_by_decoding": by_decoding,
                   "unseen_labels": data.unseen})
    if diagnostics:
        record.update({"train_encoding": data.train.report, "membership_inference": attack,
                       "membership_inference_dev": attack_dev})
    if attack:
        _log.info("membership inference (loss threshold, %d vs %d): AUC %.3f, TPR %.3f at 1%% FPR",
                  attack["members"], attack["nonmembers"], attack["auc"],
                  attack["tpr_at_1pct_fpr"])
    write_json(os.path.join(run_dir, METRICS_FILE), record)
    return record, test, attack


def summary_line(summary: dict) -> str:
    test = summary["test"]
    eps = summary["epsilon"]
    privacy = ("not private (sgd)" if summary["mechanism"] == "sgd" else
               f"epsilon {eps:.3g} at delta {summary['delta']:.2g}"
               + ("" if summary["private"] else " (NOT private: see privacy.json)"))
    quality = (f"test SER {test['ser']:.4f}, intent acc {test['intent_accuracy']:.4f}, "
               f"slot F1 {test['slot_f1']:.4f} ({summary.get('decoding', 'viterbi')} decoding)"
               if test else "no test split")
    attack = summary.get("membership_inference") or {}
    if attack:
        privacy += f"; membership-inference AUC {attack['auc']:.3f}"
    stopped = f"; {summary['stopped']}" if summary.get("stopped") else ""
    return (f"{summary['model']} / {summary['mechanism']}: {quality}; {privacy}; "
            f"{summary['epochs']} epochs in {summary['seconds']:.0f} s{stopped} -> "
            f"{summary['run_dir']}")
