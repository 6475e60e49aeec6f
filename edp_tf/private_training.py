"""`make_private`: one call from any Keras model to private training with an honest epsilon.

Why one call: the lower layer (`PoissonSampler`, `calibrate_noise`, `DPConfig`, `PrivateModel`,
`PrivacyLedger`) needs n, q, delta and the epochs restated three times, and a user who hands
`fit` arrays with a Poisson ledger gets batches the proof does not cover. `make_private` states
the budget once; its first `fit` on arrays reads n, samples Poisson batches itself at
q = batch_size / n with the library's sampler, calibrates the noise for the budget, and keeps the
ledger, so every batch it trains on is one the accounting covers.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from typing import Optional, Sequence

import keras
import tensorflow as tf

from edp_tf import (
    accounting,
    batch_source,
    checkpointer,
    checks,
    input_pipelines,
    multi_worker,
    report,
    sampling,
)
from edp_tf import ledger as ledger_lib
from edp_tf import private_adapt as private_adapt_lib
from edp_tf.config import DPConfig
from edp_tf.ledger import PrivacyLedger
from edp_tf.mechanism import Mechanism
from edp_tf.plan import PrivacyPlan
from edp_tf.private_model import PrivateModel

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Budget:
    """What `make_private` was asked for: epsilon after `epochs` epochs of Poisson batches of
    `batch_size` examples in expectation; delta None is 0.1 / n."""

    target_epsilon: float
    epochs: int
    batch_size: int
    delta: Optional[float] = None
    run_dir: Optional[str] = None
    resume: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.resume, bool):
            raise ValueError(f"resume must be True or False, got {self.resume!r}")
        if self.resume and self.run_dir is None:
            raise ValueError("resume=True continues the ledger of a run_dir: give run_dir")
        checks.number("target_epsilon", self.target_epsilon, 0.0, True)
        checks.count("epochs", self.epochs, 1)
        checks.count("batch_size", self.batch_size, 1)
        if self.delta is not None:
            accounting.check_delta(self.delta)


class AutoPrivateModel(PrivateModel):
    """A `PrivateModel` that samples, calibrates and accounts by itself (`make_private`).

    Its first `fit` on arrays (or a dict of arrays) fixes n, the sampler, the noise and the
    ledger; later fits continue the same ledger (their epochs follow the earlier ones) and stop
    before an epoch that would pass the budget.
    """

    def __init__(self, model: keras.Model, config: DPConfig, budget: Budget,
                 private_adapt: Sequence = (), **kwargs):
        super().__init__(model, config, **kwargs)
        self._budget = budget
        self._private_adapt = tuple(private_adapt)
        for adapt in self._private_adapt:
            if not isinstance(adapt, (private_adapt_lib.PrivateNormalization,
                                      private_adapt_lib.PrivateVocabulary)):
                raise ValueError(f"private_adapt takes edp_tf.PrivateNormalization or "
                                 f"PrivateVocabulary, got {type(adapt).__name__}")
            if not private_adapt_lib.takes_the_model_input(model, adapt.layer):
                raise ValueError(f"private_adapt: layer {adapt.layer.name!r} must be applied to "
                                 "the model's input (its rows are the training examples)")
        self._sampler: Optional[sampling.PoissonSampler] = None
        self._ledger: Optional[PrivacyLedger] = None
        self._epochs_done = 0
        self._earlier_ledger: Optional[dict] = None  # what resume=True continues
        self._checkpointer: Optional[checkpointer.Checkpointer] = None  # with a run_dir

    @property
    def sampler(self) -> Optional[sampling.PoissonSampler]:
        """The Poisson sampler of the run (known once `fit` has seen the data)."""
        return self._sampler

    @property
    def privacy_ledger(self) -> Optional[PrivacyLedger]:
        return self._ledger

    @property
    def epsilon(self) -> float:
        """Epsilon spent so far (0 before the first epoch)."""
        if self._ledger is None:
            return 0.0
        try:
            return float(self._ledger.statement()["epsilon"])  # extra events too
        except RuntimeError:  # no fit has started
            return 0.0

    def epsilon_at(self, delta: float) -> float:
        """Epsilon of the run so far at another `delta` (inf where `delta` is not above what the
        releases before training spent of it: no guarantee holds there)."""
        if self._ledger is None:
            return 0.0
        led = self._ledger.statement()
        try:
            return float(ledger_lib.headline(led, delta)["epsilon"])
        except ValueError as error:
            if "no epsilon holds" in str(error):
                return float("inf")
            raise

    def privacy_statement(self) -> dict:
        """The ledger: epsilon, delta, the mechanism, what it assumes and does not cover, and
        whether the run is private (what `privacy.json` holds when `run_dir` was given)."""
        if self._ledger is None:
            raise RuntimeError("the privacy statement is known once fit() has started")
        return self._ledger.statement()  # reconciled with the step's own count first

    def privacy_report(self, path: str) -> str:
        """Writes a self-contained report of the statement (`.html`, else Markdown):
        edp_tf.report."""
        return report.write(self.privacy_statement(), path)

    def compile(self, optimizer="rmsprop", *args, **kwargs):
        with self.distribute_strategy.scope():  # the optimizer's variables, per replica
            super().compile(_in_scope(optimizer, self.distribute_strategy), *args, **kwargs)

    def fit(self, x=None, y=None, batch_size=None, epochs=None, callbacks=None, **kwargs):
        """Trains on Poisson batches of `x, y` drawn by the library's sampler.

        x: arrays or a dict of arrays with n rows (y likewise): each epoch is ceil(n / B)
          steps, every example in each batch independently with probability q = B / n
          (B = make_private's batch_size). Or any finite pipeline of (x, y): a
          tf.data.Dataset (batched, shuffled or not), a PyDataset or a generator that ends;
          one pass over it gives the n examples, and the library draws the batches from them
          as from arrays (edp_tf/input_pipelines.py; larger than memory: the streaming
          sampler). Or a sampler's dataset (`sampler.dataset(x, y)`), accounted at that
          sampler's q.
        epochs: more epochs to train (default: what is left of make_private's `epochs`); they
          follow the earlier fits' in the ledger and its noise schedule.
        batch_size, shuffle, sample_weight: not taken (the sampler decides the batches and
          their mask).
        Everything else is Keras' (validation_data, callbacks, verbose, steps_per_epoch, ...);
        validation data must not be training data (privacy.json says so).
        """
        for name in ("sample_weight", "validation_split", "class_weight"):
            if kwargs.get(name) is not None:
                raise ValueError(f"make_private's fit does not take {name}: the sampler's mask "
                                 "weighs the rows (give validation_data explicitly)")
        if batch_size not in (None, self._budget.batch_size):
            raise ValueError(f"fit(batch_size={batch_size}) differs from make_private's "
                             f"batch_size={self._budget.batch_size}, which the noise was "
                             "calibrated for")
        kwargs.pop("shuffle", None)  # the sampler draws every batch
        if batch_source.describe(x).kind in ("dataset", "generator"):
            if y is not None:
                raise ValueError("make_private's fit: a pipeline yields its own labels; pass it "
                                 "as x alone")
            x, y = input_pipelines.to_arrays(x)  # one pass: the set the sampler draws from
        if self._ledger is None:
            self._start(x, y)
        dataset = self._batches(x, y)
        initial = self._epochs_done
        if kwargs.get("initial_epoch") not in (None, initial):
            raise ValueError(f"make_private's fit continues at epoch {initial} (the ledger's "
                             f"next): initial_epoch={kwargs['initial_epoch']} is not taken")
        kwargs["initial_epoch"] = initial
        more = (self._budget.epochs - initial if epochs is None
                else checks.count("epochs", epochs, 1))
        if more < 1:
            raise ValueError(f"the {self._budget.epochs} planned epochs have run (epsilon "
                             f"{self.epsilon:.3g}): pass epochs= to train more, which the "
                             "budget then decides")
        try:
            with self.distribute_strategy.scope():
                own = [self._ledger] + ([self._checkpointer] if self._checkpointer else [])
                return super().fit(dataset, epochs=initial + more,
                                   callbacks=own + list(callbacks or []), **kwargs)
        except BaseException:
            self._ledger.close_interrupted()  # what ran is charged before anything else
            raise
        finally:  # the next fit follows the last epoch the ledger charged
            records = self._ledger.records
            self._epochs_done = max((r.epoch for r in records), default=-1) + 1

    # ------------------------------------------------------------------ the first fit
    def _start(self, x, y) -> None:
        """Fixes the sampler, the calibrated noise and the ledger from the data's size."""
        source = batch_source.describe(x)
        replicas = self.num_replicas
        cfg = self.dp_config
        if source.kind == "sampler":
            sampler = source.sampler
        elif source.kind == "arrays":
            n = _rows(x, y)
            if self._budget.batch_size > n:
                raise ValueError(f"make_private: batch_size={self._budget.batch_size} exceeds "
                                 f"the {n} training examples")
            key = (multi_worker.shared_key(self.distribute_strategy)
                   if multi_worker.is_multi_worker(self.distribute_strategy) else None)
            sampler = sampling.for_unit(cfg.sampling_unit, n, self._budget.batch_size / n,
                                        replicas, cfg.microbatch_size, key=key)
        else:  # pipelines were made arrays in fit
            raise ValueError(
                f"make_private's fit takes arrays, a dict of arrays, a finite tf.data.Dataset, "
                f"PyDataset or generator, or a sampler's dataset; it was given "
                f"{source.description}")
        n = sampler.dataset_size
        delta = (self._budget.delta if self._budget.delta is not None
                 else accounting.default_delta(n))
        if delta >= 1.0 / n:  # a mechanism that publishes one random record is (0, 1/n)-DP
            raise ValueError(f"make_private: delta={delta:.3g} must be well below 1/n = "
                             f"{1.0 / n:.3g} (the default is 0.1/n)")
        cfg = cfg.replace(expected_batch_size=sampler.expected_batch_size)
        extras = ([accounting.ExtraEvent("private_layer_scales", cfg.scaling_noise_multiplier)]
                  if cfg.scaling == "private" else ())
        plan = PrivacyPlan(Mechanism.from_config(cfg, replicas, sampler.max_batch_size), n,
                           sampler.sampling_rate, delta, self._budget.epochs,
                           sampler.steps_per_epoch, extras,
                           releases=self._adapt_privately(x, source, delta))
        records, events = self._earlier_run()
        self._epochs_done = max((r.epoch for r in records), default=-1) + 1
        try:
            plan = plan.calibrated(self._budget.target_epsilon, charged=records,
                                   first_epoch=min(self._epochs_done, self._budget.epochs - 1),
                                   charged_events=events)
        except ValueError:
            if not records:
                raise
            raise ledger_lib.BudgetExhaustedError(
                f"make_private: {self._budget.run_dir}'s ledger has spent epsilon "
                f"{ledger_lib.headline(self._earlier_ledger)['epsilon']:.4g} and no noise fits "
                f"the epochs left in target_epsilon={self._budget.target_epsilon:g}: raise "
                "target_epsilon, or use a new run_dir") from None
        self._dp_config = cfg.replace(noise_multiplier=plan.mechanism.noise_multiplier)
        self.dp_noise_multiplier.assign(plan.mechanism.noise_multiplier)
        self._plan = plan
        self._sampler = sampler
        own_dir = self._ledger_dir()
        self._ledger = PrivacyLedger.for_sampler(own_dir, sampler, delta,
                                                 target_epsilon=self._budget.target_epsilon)
        self._start_checkpoints(x, records, own_dir)

    def _start_checkpoints(self, x, records, own_dir: Optional[str]) -> None:
        """The run's checkpoint (edp_tf/checkpointer.py), with a run_dir: a resumed run
        restores it before its first step, so the model continues where the ledger stands.
        Workers of a multi-worker run each write one beside their ledger (run_dir on the
        chief, run_dir/workers/<i> on worker i: reading a variable may be a collective, so all
        write at the same epochs) and every worker restores the chief's, as every worker reads
        the chief's ledger (storage every host sees, docs/multi_host.md)."""
        run_dir = self._budget.run_dir
        if run_dir is None:
            return
        own = os.path.join(own_dir, checkpointer.DIRECTORY)
        self._checkpointer = checkpointer.Checkpointer(own, self._ledger)
        if records:
            first = next(iter(x.take(1)))[0] if isinstance(x, tf.data.Dataset) else x
            self._ensure_built(first)
            chief = os.path.join(run_dir, checkpointer.DIRECTORY)
            epoch = checkpointer.restore(chief, self, self._epochs_done)
            if epoch is not None:
                _log.info("make_private: resumed the model and optimizer of epoch %d from %s",
                          epoch, chief)

    def _adapt_privately(self, x, source, delta: float) -> tuple:
        """The private_adapt layers fitted to `x` with DP, before the first step; their
        releases, which the plan calibrates for and the ledger charges."""
        if not self._private_adapt:
            return ()
        if source.kind != "arrays":
            raise ValueError("private_adapt needs the training examples: fit(x, y) with arrays "
                             "(or a pipeline), not a sampler's dataset")
        events = []
        for adapt in self._private_adapt:
            rows = x
            if isinstance(x, dict):  # the entry of the model input the layer takes
                name = next(i.name for i in keras.tree.flatten(adapt.layer.input))
                rows = x[name.split(":")[0]]
            events.append(adapt.adapt(rows, delta))
            self._privately_adapted += (adapt.layer.name,)
        return tuple(events)

    def _worker_index(self) -> int:
        return multi_worker.worker_index(self.distribute_strategy)

    def _ledger_dir(self) -> Optional[str]:
        """Where this process keeps its ledger: run_dir on the chief (the run's, the one a
        reviewer reads), run_dir/workers/<i> on worker i of several (its copy of the same
        charges); every worker must compute the same noise, so a resumed worker starts from a
        copy of the chief's ledger."""
        run_dir, index = self._budget.run_dir, self._worker_index()
        if run_dir is None or index == 0:
            return run_dir
        own = os.path.join(run_dir, "workers", str(index))
        os.makedirs(own, exist_ok=True)
        chief = os.path.join(run_dir, ledger_lib.FILENAME)
        if self._budget.resume and os.path.exists(chief):
            shutil.copy2(chief, os.path.join(own, ledger_lib.FILENAME))
        elif os.path.exists(os.path.join(own, ledger_lib.FILENAME)):
            os.remove(os.path.join(own, ledger_lib.FILENAME))  # an earlier attempt's copy
        return own

    def _earlier_run(self) -> tuple:
        """(EpochRecords, ExtraEvents) an earlier run left in run_dir, which `resume=True`
        continues; refused in one line, before any step, when resume was not asked. The
        chief's ledger is the run's: every worker reads it (on storage every host sees)."""
        run_dir = self._budget.run_dir
        path = None if run_dir is None else os.path.join(run_dir, ledger_lib.FILENAME)
        if path is None or not os.path.exists(path):
            return (), ()
        if self._worker_index() > 0 and not self._budget.resume:
            return (), ()  # the chief refuses a used run_dir (its ledger may be new already)
        self._earlier_ledger = ledger_lib.read_ledger(path)
        if not self._budget.resume:
            top = ledger_lib.headline(self._earlier_ledger)
            raise ValueError(
                f"make_private: run_dir {run_dir!r} already holds a run: epsilon "
                f"{top['epsilon']:.4g} spent over {top['epochs']} epoch(s) ({path}). Continue "
                "it with make_private(..., resume=True) (its epochs and budget carry on, from "
                "its checkpoint), or give a new run_dir")
        return ledger_lib.charged(self._earlier_ledger)

    def _batches(self, x, y) -> tf.data.Dataset:
        source = batch_source.describe(x)
        if source.kind == "sampler":
            return x  # the ledger checks that it is the run's sampler
        if source.kind != "arrays":
            raise ValueError(f"make_private's fit takes arrays or a sampler's dataset; it was "
                             f"given {source.description}")
        if _rows(x, y) != self._sampler.dataset_size:
            raise ValueError(f"this fit's data has {_rows(x, y)} rows but the run's first had "
                             f"{self._sampler.dataset_size}: n is fixed by the first fit (its "
                             "ledger and noise assume it)")
        return self._sampler.dataset(x, y)


def _in_scope(optimizer, strategy):
    """`optimizer`, made again from its config inside `strategy`'s scope when it was made
    outside it (`keras.optimizers.Adam(...)` written in the compile call): Keras creates its
    step counter at construction, a variable the replicas cannot share, and its first fit
    fails with "Mixing different tf.distribute.Strategy objects". Not yet used, it has no
    state to lose; one that has stepped is left as it is (Keras then says why)."""
    if isinstance(optimizer, str) or not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    variables = [getattr(v, "value", v) for v in optimizer.variables]
    outside = [v for v in variables if not strategy.extended.variable_created_in_scope(v)]
    if not outside or optimizer.built or int(optimizer.iterations.numpy()) != 0:
        return optimizer
    with strategy.scope():
        return optimizer.__class__.from_config(optimizer.get_config())


def _rows(x, y) -> int:
    if y is None:
        raise ValueError("make_private's fit needs labels: fit(x, y)")
    counts = {len(a) for a in tf.nest.flatten((x, y))}
    if len(counts) != 1:
        raise ValueError(f"x and y must have the same number of rows, got {sorted(counts)}")
    return counts.pop()


def make_private(model: keras.Model, *, target_epsilon: float, epochs: int, batch_size: int,
                 l2_norm_clip: float = 1.0, delta: Optional[float] = None,
                 microbatch_size: Optional[int] = 1, run_dir: Optional[str] = None,
                 resume: bool = False,
                 strategy: Optional[tf.distribute.Strategy] = None,
                 public_layers=(), training_statistics: bool = False, private_adapt=(),
                 **dp_options) -> AutoPrivateModel:
    """`model`, trained by `fit` with DP-SGD at (target_epsilon, delta) after `epochs` epochs.

    Then `private.compile(optimizer, loss)` and `private.fit(x, y)` as with any Keras model.
    What happens at the first `fit(x, y)` on arrays (or a dict of arrays) with n rows:
      * batches are Poisson samples drawn by the library: each example independently with
        probability q = batch_size / n at every step, ceil(n / batch_size) steps per epoch,
        padded to a fixed size with a 0/1 mask (the sampling the accounting assumes);
      * the noise multiplier is calibrated so that `epochs` epochs spend exactly the budget
        (PLD accountant, delta = 0.1 / n unless given);
      * a privacy ledger charges every epoch that runs and stops before one that would pass
        the budget; `private.epsilon` and `private.privacy_statement()` read it, and with
        `run_dir` it is written to `run_dir/privacy.json` after each epoch.
    Epsilon covers the trained weights and anything computed from them (export `model`, the
    object given here: it holds no privacy machinery). It assumes n is public and that
    validation data is not training data; the training loss and metrics are hidden unless
    `training_statistics=True` (then listed as not covered).

    Args:
      model: any Keras model, built inside `strategy.scope()` when a strategy is given.
      microbatch_size: 1 is per-example DP-SGD (the default); k > 1 micro-batches of k
        examples (sensitivity 2C); None one micro-batch per replica (the paper's eDP-SGD).
      strategy: a `tf.distribute` strategy (e.g. `edp_tf.make_strategy(replicas=2)`); default
        the current one.
      run_dir: where privacy.json is written (None: the ledger stays in memory). A run_dir
        that holds a ledger already is refused at the first fit unless `resume=True`, which
        continues it: its epochs count, the noise is calibrated for the epochs left to land at
        target_epsilon, and the next epoch follows the last one charged, from the model's
        weights and optimizer state that run_dir/checkpoint holds (written after the ledger
        closes each epoch, restored before the first step: edp_tf/checkpointer.py; the
        workers of a multi-worker run restore the chief's).
      public_layers: preprocessing layers adapted on public data (epsilon assumes it).
      private_adapt: `edp_tf.PrivateNormalization(layer, low, high)` for a Normalization, or
        `edp_tf.PrivateVocabulary(layer)` for a TextVectorization, on the model's input and
        left unadapted: the first fit adapts it to the training data with DP (a Gaussian
        query on the clipped sums; the vocabulary by Gaussian partition selection), charged
        to the ledger, the steps' noise calibrated for the rest of the budget.
      dp_options: further `edp_tf.DPConfig` fields (noise_mode, decay, clipping, ...).
    """
    strategy = strategy or tf.distribute.get_strategy()
    for variable in getattr(model, "variables", []):
        # a Keras variable's `value` is the backend's tf.Variable (mirrored under a strategy)
        if not strategy.extended.variable_created_in_scope(getattr(variable, "value", variable)):
            raise ValueError(
                f"make_private: the model's variable {getattr(variable, 'path', variable.name)} "
                "was not created under the given strategy: build the model inside "
                "strategy.scope() (it is trained where its variables live)")
    for name in ("noise_multiplier", "expected_batch_size", "seed"):
        if name in dp_options:
            raise ValueError(f"make_private decides {name} itself (the noise from the budget, "
                             "the expected batch from batch_size, seeds from OS entropy); use "
                             "edp_tf.PrivateModel to set it")
    budget = Budget(target_epsilon, epochs, batch_size, delta, run_dir, resume)
    config = DPConfig(l2_norm_clip=l2_norm_clip, microbatch_size=microbatch_size,
                      noise_multiplier=1.0, **dp_options)
    with strategy.scope():
        return AutoPrivateModel(model, config, budget, private_adapt=private_adapt,
                                public_layers=public_layers,
                                training_statistics=training_statistics)


__all__ = ["make_private", "AutoPrivateModel", "Budget"]
