"""`PrivateModel`: any Keras model, trained by `fit` with the replica-local (e)DP-SGD step.

On each replica (docs/design.md, mechanism), in `train_step`, top to bottom:
    g_j  = grad(sum_{i in M_j} w_i L_i / k_e)          micro-batch gradients (microbatch.gradients)
    c_j  = (g_j / alpha) * min(1, C / ||g_j / alpha||)   scaled and clipped (NaN/Inf -> 0, counted)
    u_r  = alpha * (sum_j c_j + eta_r) / D               noise, then clipping.to_update
and the optimizer's all-reduce SUMs u_r over replicas, giving alpha * (sum of clipped + summed
noise) / D, with D the expected number of micro-batches in the global batch (N * m for fixed
batches). The constants (k, k_e, D, S, the noise std) are one frozen `Mechanism`, decided before
tracing. The wrapped model stays an ordinary Keras model: save or export `wrapped_model`.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from edp_tf import (
    batch_source,
    bias_corrected_adam,
    clipping,
    ghost,
    iterators,
    local_training,
    microbatch,
    model_state,
    multi_worker,
    noise,
    projection,
    scaling,
    selection,
    step_count,
    step_guard,
)
from edp_tf.config import DPConfig, Features, Incompatible, compatibility
from edp_tf.mechanism import Mechanism
from edp_tf.plan import PrivacyPlan

_log = logging.getLogger(__name__)

_SAVE_WRAPPED = (
    "a PrivateModel has no config of its own: private.save('model.keras') saves the model it "
    "trains (the same weights, no privacy machinery inside), which loads with Keras alone")

TRAINING_STATISTICS_SENTENCE = (
    "fit showed the training loss, compiled metrics and clipping statistics (clipped_fraction, "
    "preclip_norm, nonfinite_microbatches) of every step (PrivateModel(training_statistics="
    "True)): they are computed on the private batches without noise and are not covered by "
    "epsilon (progress bar, History, TensorBoard, callbacks).")


class _EpochSchedule(keras.callbacks.Callback):
    """At the start of each epoch: the step's z_t from the mechanism's schedule (the same
    function the ledger charges), and the frozen variables' joining (`freeze_until`)."""

    def __init__(self, private_model: "PrivateModel"):
        super().__init__()
        self._private_model = private_model

    def on_epoch_begin(self, epoch, logs=None):
        model = self._private_model
        model.dp_noise_multiplier.assign(model.mechanism.noise_multiplier_at(epoch))
        model._unfreeze_if_due(epoch)


# Keras turns class_weight into per-row weights multiplied into the loss before the gradient is
# clipped: an example whose gradient norm exceeds C is clipped back to C whatever its weight, so
# the weighting silently vanishes for most examples (and, on a sampler's dataset, Keras raises
# about a sample_weight the user never passed: the mask).
CLASS_WEIGHT_REFUSED = (
    "PrivateModel.fit does not take class_weight: each example's gradient is clipped to the "
    "norm C after its weight is applied, so the weights would be mostly undone without a word. "
    "A weight inside the loss meets the same cap; rebalance the data instead")


TRAIN_ON_BATCH_REFUSED = (
    "PrivateModel.train_on_batch is refused: its batch is not a Poisson sample and no ledger "
    "charges it; train with fit(sampler.dataset(x, y), steps_per_epoch=k) (make_private's "
    "fit(x, y) samples itself)")


class PrivateModel(keras.Model):
    """Wraps `model`; `fit` runs the private step of `config`.

    Create it (and compile it) inside `strategy.scope()`: the noise generator must be created
    there to give each replica its own stream. `public_layers` names preprocessing layers
    (Normalization, TextVectorization, ...) adapted on public data: epsilon assumes they were,
    and any other adaptable layer is refused (edp_tf/model_state.py). `plan`, the run's
    `PrivacyPlan` when one was made (a trainer calibrating z0): the step runs its mechanism,
    refuses batches it was not made for, and reports its sentences to the ledger.

    `training_statistics`: the step's training loss, compiled metrics and clipping statistics
    are computed on the private batches without noise, so by default `fit` logs only the noise
    multiplier (the progress bar, History, TensorBoard and every callback see nothing else);
    True shows them, and the ledger then lists them as not covered by epsilon.

    Keras habits, kept so that an ordinary model trains on the objective its user expects
    (docs/design.md, section 2):

    * Masks: an output with a Keras mask (`Embedding(mask_zero=True)`, `Masking`) weights each
      position's loss by it, as Keras does, so padding adds no gradient. Each example's loss is
      sum_t m_t l_t / T over the padded length T: Keras divides by the batch's count of valid
      positions instead, a data-dependent normaliser clipping cannot use, so the update has
      Keras' direction scaled by valid / (B T) (with several outputs, a masked output's weight
      relative to the others shifts by that factor). Compiled metrics read the mask too.
    * Dropout: eDP (`microbatch_size=None`) and `per_example_method="loop"` draw a mask per row
      as Keras does; the vectorised methods (`"ghost"`, the default, and `"vectorized"`) draw
      once per replica and step for all micro-batches (row r of each micro-batch shares its
      mask; with microbatch_size=1 every example on a replica does). Replicas draw the same
      masks, as in plain Keras under a MirroredStrategy. Epsilon is the same either way: the
      masks depend on no example, so each clipped micro-batch still depends on its own only.
    * Preprocessing inside the model (a `TextVectorization` taking strings): a leading chain of
      row-wise preprocessing layers runs once per batch and the per-example machinery runs on
      the rest; other string models are clipped with the loop. Naming a layer in
      `public_layers` declares the layers it holds (TextVectorization's own StringLookup).
    """

    # what the step logs when training statistics are hidden: public, a function of the schedule
    PUBLIC_LOGS = ("noise_multiplier",)

    def __init__(self, model: keras.Model, config: DPConfig, public_layers: Sequence[str] = (),
                 plan: Optional[PrivacyPlan] = None, training_statistics: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        if not isinstance(config, DPConfig):
            raise ValueError(f"PrivateModel needs an edp_tf.DPConfig, got {type(config).__name__}")
        if not isinstance(model, keras.layers.Layer):
            raise ValueError(f"PrivateModel wraps a keras.Model, got {type(model).__name__}")
        self.wrapped_model = model
        self._dp_config = config
        self._public_layers = tuple(str(name) for name in public_layers)
        if plan is not None and not isinstance(plan, PrivacyPlan):
            raise ValueError(f"PrivateModel's plan must be an edp_tf.PrivacyPlan, "
                             f"got {type(plan).__name__}")
        self._plan = plan
        if not isinstance(training_statistics, bool):
            raise ValueError(f"training_statistics must be True or False, "
                             f"got {training_statistics!r}")
        self._training_statistics = training_statistics
        self._batch_source: Optional[batch_source.BatchSource] = None  # set by each fit
        self._validation = False  # the last fit evaluated validation_data
        # model_state's refusal runs before the first step and again whenever what trains
        # changes (model_state.training_signature)
        self._state_checked_for: Optional[tuple] = None
        self._loop_reported = False  # the automatic per-example loop is said once
        self.dp_noise_multiplier = tf.Variable(float(config.noise_multiplier), trainable=False,
                                               name="dp_noise_multiplier")  # z_t
        # the updates the step applied, counted in the step's own graph: a ledger charges
        # what ran by it, whichever Keras path ran it (edp_tf/step_count.py)
        self.step_count = step_count.StepCount()
        # held outside Keras' and TensorFlow's tracking: a checkpoint or SavedModel of the
        # wrapper must not hold the Philox state (it would predict the next draws and
        # recompute past ones, and a restored copy would replay the same noise)
        self._noise = _Untracked(noise.make_generator(config.seed, config.secure_noise))
        # BandMF's last b - 1 noise vectors, untracked for the same reason and more: with the
        # released updates they would give the past clipped sums away (docs/privacy.md)
        self._noise_history = _Untracked(None)
        self._rng = np.random.default_rng(config.seed)  # the private-scaling query (host side)
        self._layer_scales: Optional[tuple] = None
        self._mechanism: Optional[Mechanism] = None
        self._clip_plan: Optional[microbatch.ClipPlan] = None
        self._sums_over_replicas = False
        self._extra_events: list = []
        self._per_example_loss = None
        self._freeze: Optional[tuple] = None  # (epoch, the frozen variables)
        self._frozen_now = False
        self._first_batch_seen = None  # fit's first batch: _prepare again when frozen ones join
        # called before each step call with the steps it may run (edp_tf/step_guard.py): the
        # ledger makes them durable there, after tracing and before any data is read
        self._before_steps = _Untracked([])
        self._saved = _Untracked([])  # paths save / save_weights / export wrote
        self._after_save = _Untracked([])
        self._subspace: Optional[projection.PublicSubspace] = None
        self._metric_trackers = {
            name: keras.metrics.Mean(name=name)
            for name in ("noise_multiplier", "clipped_fraction", "preclip_norm")
            + (("selected_rows",) if config.sparse_embeddings else ())
        }
        self._nonfinite_tracker = keras.metrics.Sum(name="nonfinite_microbatches")

    # ----------------------------------------------------------------- public surface
    @property
    def dp_config(self) -> DPConfig:
        return self._dp_config

    @property
    def num_replicas(self) -> int:
        return self.distribute_strategy.num_replicas_in_sync

    @property
    def mechanism(self) -> Mechanism:
        """The step's mechanism (known once `fit` has seen the first batch)."""
        if self._mechanism is None:
            raise RuntimeError("the mechanism is known once fit() has seen the first batch")
        return self._mechanism

    @property
    def batch_source(self) -> Optional[batch_source.BatchSource]:
        """Where the last `fit`'s batches came from (edp_tf.batch_source)."""
        return self._batch_source

    @property
    def layer_scales(self) -> Optional[tuple]:
        """alpha per trainable variable (None until the first `fit` decides them)."""
        return self._layer_scales

    def call(self, inputs, training=None):
        return self.wrapped_model(inputs, training=training)

    # One object: what a Keras user does with a model (save, ModelCheckpoint, BackupAndRestore,
    # summary) acts on the model it trains, so every file loads into the user's own
    # architecture with Keras alone and holds no privacy machinery (no noise generator, no
    # mechanism, no ledger). The wrapper itself is never serialised (get_config).
    def save(self, filepath, *args, **kwargs):
        """Saves the trained model (`wrapped_model`): epsilon covers it, and the ledger's
        headline counts every step before the save (an open epoch's too)."""
        result = self.wrapped_model.save(filepath, *args, **kwargs)
        self._note_saved(filepath)
        return result

    def save_weights(self, filepath, *args, **kwargs):
        """The trained model's weights (they load into the user's model)."""
        result = self.wrapped_model.save_weights(filepath, *args, **kwargs)
        self._note_saved(filepath)
        return result

    def load_weights(self, filepath, *args, **kwargs):
        return self.wrapped_model.load_weights(filepath, *args, **kwargs)

    def export(self, filepath, *args, **kwargs):
        """A SavedModel of the trained model, for serving."""
        result = self.wrapped_model.export(filepath, *args, **kwargs)
        self._note_saved(filepath)
        return result

    def summary(self, *args, **kwargs):
        return self.wrapped_model.summary(*args, **kwargs)

    @property
    def saved_files(self) -> tuple:
        """What `save`, `save_weights` and `export` wrote (a ledger lists them as covered)."""
        return tuple(self._saved.value)

    def _note_saved(self, filepath) -> None:
        if str(filepath) not in self._saved.value:
            self._saved.value.append(str(filepath))
        for listener in self._after_save.value:  # a ledger lists the file at once
            listener()

    def add_after_save(self, listener) -> None:
        """Calls `listener()` after each `save`, `save_weights` or `export` (once per one)."""
        if listener not in self._after_save.value:
            self._after_save.value.append(listener)

    def get_config(self):
        raise ValueError(_SAVE_WRAPPED)

    def train_on_batch(self, *args, **kwargs):
        """Refused: a batch the caller chose is no Poisson sample, and a step outside `fit`
        runs without the ledger's durable charge before it."""
        raise ValueError(TRAIN_ON_BATCH_REFUSED)

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None,
                **kwargs):
        """As `keras.Model.compile`: one loss, or one per output (dict by name or list) with
        `loss_weights`; each example's loss is their weighted sum, clipped as a whole."""
        self._per_example_loss = microbatch.as_per_example_loss(
            loss, loss_weights, lambda: getattr(self.wrapped_model, "output_names", None))
        optimizer = keras.optimizers.get(optimizer)
        for name in ("clipnorm", "global_clipnorm", "clipvalue"):
            if getattr(optimizer, name, None):
                raise ValueError(
                    f"optimizer.{name} would clip the noisy update after the privacy step; "
                    "clipping belongs to DPConfig.l2_norm_clip"
                )
        _refuse_loss_scaling(self.wrapped_model, optimizer)
        # The loss is not handed to Keras: its reduction divides by the replica count.
        super().compile(optimizer=optimizer, loss=None, metrics=metrics, **kwargs)
        _refuse_loss_scaling(self.wrapped_model, self.optimizer)  # Keras' own wrapping

    @property
    def metrics(self):
        return super().metrics + list(self._metric_trackers.values()) + [self._nonfinite_tracker]

    def privacy_facts(self) -> dict:
        """What the accountant needs to know about the mechanism (after the first `fit` starts)."""
        mechanism = self.mechanism
        cfg = self._dp_config
        not_covered = list(self._plan.not_covered) if self._plan is not None else []
        if self._public_layers:
            not_covered.append(
                f"Layers {', '.join(self._public_layers)} hold state fitted by adapt(); epsilon "
                "assumes it was fitted on public data, as the user declared.")
        if cfg.scaling == "first_batch":
            not_covered.append(
                "Per-layer scales were measured on the first private batch (the paper's choice): "
                "that information is not covered by epsilon."
            )
        if self._subspace is not None:
            source = self._subspace.source
            not_covered.append(
                f"Each update was projected onto {self._subspace.rank} directions of the "
                f"gradients of {self._subspace.examples} examples declared public "
                "(post-processing)" + (f", from {source}" if source else "")
                + ": epsilon treats those examples as public.")
        if self._training_statistics:
            not_covered.append(TRAINING_STATISTICS_SENTENCE)
        if cfg.seed_fixed:
            not_covered.append(
                f"The noise seed was fixed (seed={cfg.seed}): the noise is predictable, so the run "
                "is not private."
            )
        plan = self._clip_plan
        variables = self._trained_variables()
        sparse = None if plan is None or plan.selection is None else {
            "selection_clip": cfg.selection_clip, "selection_threshold": cfg.selection_threshold,
            "tables": [getattr(variables[i], "path", variables[i].name)
                       for i in plan.selection.indices]}
        return mechanism.to_dict() | {
            "sparse_embeddings": sparse,  # informational: epsilon depends on z_c only
            "clipping": cfg.clipping,  # informational: flat or per layer, S is the same
            "local_epochs": cfg.local_epochs,  # DP-FedAvg's local epochs (0: DP-FedSGD)
            # freeze_until: until this epoch some variables got no signal and no noise
            "frozen_until_epoch": self._freeze[0] if self._freeze else 0,
            "public_subspace": self._subspace.facts() if self._subspace is not None else None,
            "scaling": cfg.scaling,
            "layer_scales": list(self._layer_scales),
            "seed_fixed": cfg.seed_fixed,
            "secure_noise": cfg.secure_noise,  # informational: the same distribution
            "not_covered": not_covered,
            # the model's own queries, then the plan's releases made before the first step
            "extra_events": [dict(e) for e in self._extra_events] + [
                e.to_dict() for e in (self._plan.releases if self._plan is not None else ())],
            # where the last fit's batches came from: the ledger checks it against its sampler
            "batch_source": (self._batch_source.to_dict() if self._batch_source is not None
                             else None),
            "validation_data": self._validation,
            "training_statistics": self._training_statistics,
            # what the plan's epsilon (and a target's calibration) assumed: the ledger checks it
            "plan": None if self._plan is None else {
                "dataset_size": self._plan.dataset_size,
                "sampling_rate": self._plan.sampling_rate, "delta": self._plan.delta},
        }

    def set_public_layer_scales(self, x, y, sample_weight=None) -> tuple:
        """Measures alpha on a batch of public (or synthetic) data; `scaling='public'` uses it."""
        self._ensure_built(x)
        grads = self._eager_gradients(x, y, sample_weight)
        self._layer_scales = scaling.normalize(scaling.per_variable_norms(grads))
        return self._layer_scales

    def project_onto_public_gradients(self, x, y, rank: int, every_steps: int = 1,
                                      sample_weight=None, source: Optional[str] = None) -> None:
        """Each step's noisy update is projected onto the top `rank` directions of these
        *public* examples' gradients, recomputed every `every_steps` steps
        (edp_tf/projection.py): post-processing, so epsilon is unchanged; the noise keeps rank / d
        of its energy, the signal what lies in the subspace. `source` names the examples' corpus
        in the privacy statement. The examples must not be chosen by looking at the training
        data (that choice would be a release epsilon does not count). Call before `fit`."""
        self._check_compatibility(projection=True)
        self._subspace = projection.PublicSubspace(x, y, rank, every_steps, sample_weight,
                                                   source=source)

    def freeze_until(self, epoch: int, variables: Sequence) -> None:
        """The first `epoch` epochs train only the other trainable variables; then all train.

        DP linear probing then fine-tuning (Ke et al. 2024): fresh heads learn before they
        drive the backbone's updates. The frozen variables get no gradient, no clipped signal and
        no noise (their update is exactly zero), so each step stays the same Gaussian mechanism,
        sensitivity C over what trains, and the accounting is unchanged. Decided by epoch, so a
        resumed `fit(initial_epoch=...)` freezes exactly when the uninterrupted run would.
        One optimizer throughout (built with every variable before the first step): joining
        variables start with zero moments, but Keras' bias correction and learning-rate
        schedule count the global step, so their first Adam updates differ from a fresh
        optimizer's. Call before `fit`; `epoch=0` turns it off.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"freeze_until: epoch must be an integer >= 0, got {epoch!r}")
        self._check_compatibility(freeze=bool(epoch))
        trainable = self.wrapped_model.trainable_variables
        known = {id(v) for v in trainable}
        variables = list(variables)
        for v in variables:
            if id(v) not in known:
                raise ValueError(f"freeze_until: {getattr(v, 'path', v)} is not a trainable "
                                 "variable of the wrapped model")
        if epoch and len({id(v) for v in variables}) >= len(trainable):
            raise ValueError("freeze_until would freeze every trainable variable: nothing "
                             "would train in the first epochs")
        self._freeze = (int(epoch), tuple(variables)) if epoch and variables else None
        self._frozen_now = False  # fit decides, from its initial_epoch

    def _unfreeze_if_due(self, epoch: int) -> None:
        """At the freeze's end the frozen variables join: the per-variable constants are
        re-derived and the step retraced, within the same `fit` (Keras reads train_function at
        every step)."""
        if self._frozen_now and epoch >= self._freeze[0]:
            self._frozen_now = False
            self._prepare(self._first_batch_seen)
            self.make_train_function(force=True)

    def _trained_indices(self) -> list:
        """Indices into the trainable variables of those the step trains now."""
        count = len(self.wrapped_model.trainable_variables)
        if self._freeze is None or not self._frozen_now:
            return list(range(count))
        frozen = {id(v) for v in self._freeze[1]}
        return [i for i, v in enumerate(self.wrapped_model.trainable_variables)
                if id(v) not in frozen]

    def _trained_variables(self) -> list:
        variables = self.wrapped_model.trainable_variables
        return [variables[i] for i in self._trained_indices()]

    def _features(self, **changes) -> Features:
        """What this wrapper combines with its DPConfig (edp_tf.config.compatibility)."""
        return dataclasses.replace(Features(
            freeze=self._freeze is not None, projection=self._subspace is not None,
            bias_corrected_adam=isinstance(getattr(self, "optimizer", None),
                                           bias_corrected_adam.BiasCorrectedAdam),
            multi_worker=multi_worker.is_multi_worker(self.distribute_strategy)), **changes)

    def _check_compatibility(self, why: str = "", **changes) -> None:
        """edp_tf.config.compatibility of the config with these features (`why`: the reason a
        feature was chosen for the user, added to the refusal)."""
        try:
            compatibility(self._dp_config, self._features(**changes))
        except Incompatible as error:
            if not why:
                raise
            raise Incompatible(error.field, f"{error} ({why})") from None

    def restore_layer_scales(self, scales) -> None:
        """Reinstates the alpha a resumed run decided earlier (their cost is already accounted)."""
        scales = tuple(float(a) for a in scales)
        count = len(self.wrapped_model.trainable_variables)
        if len(scales) != count or not all(math.isfinite(a) and a > 0 for a in scales):
            raise ValueError(f"restore_layer_scales needs {count} positive finite scales, "
                             f"got {len(scales)}")
        self._layer_scales = scales

    # ----------------------------------------------------------------- fit
    def fit(self, x=None, y=None, batch_size=None, epochs=1, callbacks=None, **kwargs):
        """Keras' `fit`, running the private step on every batch.

        Epsilon (the `PrivacyLedger` among `callbacks`) holds for Poisson batches: pass a
        sampler's dataset, `sampler.dataset(x, y)` (edp_tf.sampling), as `x`. Arrays (which
        Keras shuffles and cuts into fixed batches) and tf.data pipelines the library did not
        sample train, but a ledger for a sampler refuses them before the first step and a ledger
        without one reports the run as not private. `validation_data` is evaluated without
        noise: epsilon covers the training examples, and the statement assumes the validation
        examples are not among them. The training loss, metrics and clipping statistics are
        hidden unless `PrivateModel(..., training_statistics=True)`.
        """
        if kwargs.get("class_weight") is not None:
            raise ValueError(CLASS_WEIGHT_REFUSED)
        iterators.release_device_iterators_promptly()  # under a strategy the user built, too
        callbacks = list(callbacks or [])
        self._batch_source = batch_source.describe(x)
        self._validation = kwargs.get("validation_data") is not None or bool(
            kwargs.get("validation_split"))
        for callback in callbacks:  # a ledger refuses batches its epsilon does not cover
            check = getattr(callback, "check_batch_source", None)
            if check is not None:
                check(self._batch_source)
        first = _first_batch(x, y, kwargs.get("sample_weight"), batch_size)
        cfg = self._dp_config
        steps = kwargs.get("steps_per_epoch")
        if cfg.bandmf_bands > 1 and steps is not None and steps % cfg.bandmf_bands:
            raise ValueError(f"DPConfig.bandmf_bands={cfg.bandmf_bands}: steps_per_epoch="
                             f"{steps} must be a multiple of the bands, so that each epoch is "
                             "whole cycles of the BandMFSampler's groups")
        # a user's weight, or an augmented example's, scales its clipped vector: arrays are
        # checked in full, a dataset's first batch here (the step checks every batch)
        if cfg.privacy_unit == "user" or cfg.augment_copies > 1:
            weights = kwargs.get("sample_weight")
            weights = first[2] if weights is None else weights
            if weights is not None and not np.all((np.asarray(weights) >= 0)
                                                  & (np.asarray(weights) <= 1)):
                raise ValueError(microbatch.USER_WEIGHT_RANGE)
        self._first_batch_seen = first
        self._frozen_now = (self._freeze is not None
                            and int(kwargs.get("initial_epoch") or 0) < self._freeze[0])
        if self._freeze is not None and not self.optimizer.built:
            self._ensure_built(first[0])  # the variables must exist before the optimizer's build
            with self.distribute_strategy.scope():  # every variable: the frozen ones join later
                self.optimizer.build(self.wrapped_model.trainable_variables)
        self._prepare(first)
        step_count.claim(self.wrapped_model, self.step_count)  # the model is the unit
        callbacks = [_EpochSchedule(self)] + callbacks
        if self._subspace is not None:
            callbacks.insert(1, projection.RefreshCallback(self._subspace, self.optimizer))
        if isinstance(x, tf.data.Dataset):
            # Keras ignores `shuffle` for a dataset (a sampler's batches are drawn already), but
            # warns on every fit that its default True is ignored
            kwargs.setdefault("shuffle", False)
        return super().fit(
            x=x, y=y, batch_size=batch_size, epochs=epochs, callbacks=callbacks, **kwargs
        )

    def add_before_steps(self, hook) -> None:
        """Calls `hook(steps)` before each call of the train function (once traced), with the
        number of steps the call may run; once per hook, until `remove_before_steps`."""
        if hook not in self._before_steps.value:
            self._before_steps.value.append(hook)

    def remove_before_steps(self, hook) -> None:
        if hook in self._before_steps.value:
            self._before_steps.value.remove(hook)

    def make_train_function(self, force=False):
        """Keras' train function, traced before its first step reads data, with the
        `add_before_steps` hooks before every call (edp_tf/step_guard.py)."""
        made = self.train_function is None or force
        super().make_train_function(force)
        if made and not getattr(self.train_function, "traced_first", False):
            self.train_function = step_guard.traced_first(
                self.train_function, lambda: tuple(self._before_steps.value),
                lambda: self.steps_per_execution)
        return self.train_function

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras' own, given one replica's share of the first batch, read from the data
        adapter's dataset rather than from a distributed epoch iterator. Why: Keras reads that
        batch only for its shapes and dtypes (every share has the same). Its replicas' MEAN of
        the batch is an AddN TensorFlow refuses over strings (text for an in-model
        TextVectorization). And the distributed iterator it opens for that one element is
        dropped at once by the epoch iterator's `reset()` while the replicas' prefetch may
        still run: that destruction crashed the process now and then (SIGSEGV in
        `epoch_iterator.reset`). `take(1)` of the dataset leaves nothing running."""
        if iterator is not None and self._distribute_strategy is not None:
            element = next(iter(iterator.data_adapter.get_tf_dataset().take(1)))
            rows = int(tf.nest.flatten(element)[0].shape[0])
            share = max(rows // self.distribute_strategy.num_replicas_in_sync, 1)
            data_batch = tf.nest.map_structure(
                lambda t: t[:share] if isinstance(t, (tf.Tensor, tf.RaggedTensor)) else t,
                element)
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _ensure_built(self, x):
        if not self.wrapped_model.built or not self.wrapped_model.trainable_variables:
            self.wrapped_model(_take(x, 1), training=False)
        # The wrapper has no weights of its own: built with its model. Otherwise Keras' fit
        # traces the whole model symbolically to build it (about half a second for CLC).
        self.built = True

    def _prepare(self, first) -> None:
        """Decides the step's constants (the mechanism, alpha) before tracing it."""
        fx, fy, fw = first
        self._ensure_built(fx)
        signature = model_state.training_signature(self.wrapped_model)
        if signature != self._state_checked_for:
            model_state.refuse_state_outside_the_clip(self.wrapped_model, fx,
                                                      self._public_layers)
            self._state_checked_for = signature
        fw = _mask(fx, fw)
        cfg, n = self._dp_config, self.num_replicas
        batch = int(tf.nest.flatten(fx)[0].shape[0])
        k = cfg.microbatch_rows  # an example's augmented copies are one micro-batch of K rows
        if batch % n or (k is not None and batch % (n * k)):
            copies = f" x augment_copies {cfg.augment_copies}" if cfg.augment_copies > 1 else ""
            raise ValueError(
                f"The global batch of {batch} examples must be divisible by replicas x "
                f"microbatch_size{copies} = {n} x {k if k else 'one micro-batch'}"
                f" = {n * (k or 1)}: choose batch_size accordingly"
            )
        method = self._per_example_method(k, fx)
        self._check_compatibility(per_example_method=method)
        changed = self._mechanism is not None and self._mechanism.global_batch_size != batch
        self._mechanism = self._planned(Mechanism.from_config(cfg, n, batch))
        trained = self._trained_indices()
        variables = [self.wrapped_model.trainable_variables[i] for i in trained]
        self._noise_owners = noise.noise_owners([int(np.prod(v.shape)) for v in variables], n)
        if self._mechanism.bands > 1:  # a fresh history: each fit starts the groups' cycle
            with self.distribute_strategy.scope():
                self._noise_history.value = noise.banded_histories(variables,
                                                                   self._mechanism.bands)
        count = len(self.wrapped_model.trainable_variables)
        if self._layer_scales is not None and len(self._layer_scales) != count:
            if cfg.scaling != "uniform":  # decided (and maybe charged) for another set
                raise ValueError(
                    f"the model's trainable variables changed since DPConfig.scaling="
                    f"{cfg.scaling!r} decided {len(self._layer_scales)} scales (now {count}): "
                    "set layer.trainable before the first fit, or wrap the model anew")
            changed = True
        if self._layer_scales is None or changed:  # alpha for every trainable variable
            self._layer_scales = self._decide_layer_scales(fx, fy, fw)
        scales = tuple(self._layer_scales[i] for i in trained)
        local = None
        if cfg.local_epochs:
            local = local_training.LocalTraining(cfg.local_epochs, cfg.local_batch_size or k,
                                                 float(cfg.local_learning_rate))
        self._clip_plan = microbatch.ClipPlan(
            k, self._mechanism.expected_examples_per_microbatch, scales,
            cfg.l2_norm_clip, method, cfg.physical_batch_size, local,
            self._row_selection(), cfg.clipping == "per_layer")
        # Several replicas with sparse tables: the step all-reduces the updates itself (the
        # selected rows as a small dense block, _sum_over_replicas), so Keras must not again.
        # So does a projection: it must act on the replicas' sum, the mechanism's release.
        self._sums_over_replicas = (self._clip_plan.selection is not None
                                    or self._subspace is not None) and n > 1
        self._build_subspace()
        if self._sums_over_replicas:
            if not hasattr(self.optimizer, "_all_reduce_sum_gradients"):  # else: summed twice
                raise NotImplementedError(
                    "sparse_embeddings or a projection on several replicas needs Keras' "
                    "TensorFlow optimizer (its _all_reduce_sum_gradients); this Keras has none")
            self.optimizer._all_reduce_sum_gradients = _already_summed
        self._attach_noise_to_optimizer()
        self.train_function = None  # constants changed: retrace

    def _build_subspace(self) -> None:
        if self._subspace is None:
            return
        strategy = self.distribute_strategy
        device = strategy.extended.worker_devices[0] if hasattr(strategy, "extended") else None
        self._subspace.build(self.wrapped_model, self._require_loss(), self._trained_variables(),
                             self._dp_config.l2_norm_clip, strategy, device)

    def _per_example_method(self, k: Optional[int], x) -> str:
        """DPConfig's method, or the loop where a layer runs a while_loop of its own (a GRU /
        LSTM / SimpleRNN not unrolled) or string preprocessing (in the first batch `x`) runs
        ops that `tf.vectorized_map` cannot vectorise: exact for any layer, one micro-batch at
        a time; said once, with the faster way."""
        method = self._dp_config.per_example_method
        if k is None or method == "loop":
            return method
        layers = _unvectorisable_layers(self.wrapped_model)
        if not layers and _unvectorisable_strings(self.wrapped_model, x):
            self._check_compatibility(
                "the model takes strings that tf.vectorized_map cannot split per example (its "
                "preprocessing is not a leading row-wise chain, e.g. TextVectorization without "
                "output_sequence_length), so clipping runs the loop: give TextVectorization an "
                "output_sequence_length, or preprocess outside the model",
                per_example_method="loop")
            if not self._loop_reported:
                _log.info("per-example clipping: the model takes strings whose preprocessing "
                          "tf.vectorized_map cannot vectorise (it is not a leading chain of "
                          "row-wise layers, e.g. TextVectorization without "
                          "output_sequence_length), so micro-batches are clipped one at a "
                          "time (per_example_method='loop': exact, slower); a fixed "
                          "output_sequence_length keeps the vectorised %r method", method)
                self._loop_reported = True
            return "loop"
        if not layers:
            return method
        self._check_compatibility(
            f"layer(s) {', '.join(layers)} need per-example clipping one micro-batch at a time: "
            "build them with unroll=True (fixed sequence length)" + _UNROLLED_NOTE,
            per_example_method="loop")
        if not self._loop_reported:
            _log.info("per-example clipping: layer(s) %s run a while_loop that cannot be "
                      "vectorised, so micro-batches are clipped one at a time "
                      "(per_example_method='loop': exact, slower); build them with "
                      "unroll=True for the vectorised %r method%s", ", ".join(layers), method,
                      _UNROLLED_NOTE)
            self._loop_reported = True
        return "loop"

    def _planned(self, mechanism: Mechanism) -> Mechanism:
        """The plan's mechanism, if it is the one this config and batch give (else the ledger
        would charge a step that does not run)."""
        if self._plan is None:
            return mechanism
        planned = self._plan.mechanism
        if mechanism.strategy is None:  # BandMF: the plan's strategy, optimised for its run
            mechanism = dataclasses.replace(mechanism, strategy=planned.strategy)
        if planned != mechanism:
            fields = [f.name for f in dataclasses.fields(Mechanism)
                      if getattr(planned, f.name) != getattr(mechanism, f.name)]
            raise ValueError(
                "the PrivacyPlan was made for another step: "
                + ", ".join(f"{f} {getattr(planned, f)!r} planned vs {getattr(mechanism, f)!r} "
                            "here" for f in fields)
                + " (same DPConfig, replicas and global batch size as the plan's)")
        return planned

    def _attach_noise_to_optimizer(self) -> None:
        """Tells a `BiasCorrectedAdam` the noise std of each variable's update at z = 1:
        alpha_k x (the replicas' summed std at z = 1) / D, what `train_step` adds (for the
        clipped-denominator estimator too: its noise is fixed on the average)."""
        if not isinstance(self.optimizer, bias_corrected_adam.BiasCorrectedAdam):
            return
        unit = self._mechanism.summed_noise_std(1.0) / self._mechanism.expected_microbatches
        self.optimizer.attach_noise(self._trained_variables(),
                                    [a * unit for a in self._clip_plan.scales],
                                    self.dp_noise_multiplier)

    def _row_selection(self) -> Optional[selection.RowSelection]:
        cfg = self._dp_config
        if not cfg.sparse_embeddings:
            return None
        indices = selection.embedding_table_indices(self.wrapped_model,
                                                    self._trained_variables())
        if not indices:
            raise ValueError("DPConfig.sparse_embeddings=True but the model has no trainable "
                             "Embedding table")
        summed_std = selection.per_replica_std(cfg.selection_noise_multiplier,
                                               self._mechanism.sensitivity, cfg.selection_clip, 1)
        return selection.RowSelection(indices, cfg.selection_clip,
                                      summed_std / math.sqrt(self.num_replicas),
                                      cfg.selection_threshold * summed_std)

    def _decide_layer_scales(self, fx, fy, fw) -> tuple:
        rows = int(tf.nest.flatten(fx)[0].shape[0])

        def per_example_norms(used: int) -> np.ndarray:
            return self._per_example_variable_norms(
                *tf.nest.map_structure(lambda t: t[:used], (fx, fy, fw)))

        scales, self._extra_events = scaling.choose(
            self._dp_config, len(self.wrapped_model.trainable_variables), self._layer_scales,
            lambda: self._eager_gradients(fx, fy, fw), per_example_norms, rows, self._rng)
        return scales

    def _eager_gradients(self, x, y, w):
        loss_fn = self._require_loss()
        variables = self.wrapped_model.trainable_variables
        w = _mask(x, w)

        def grads_fn(x, y, w):
            g, _, _ = microbatch.single_microbatch_gradient(
                self.wrapped_model, loss_fn, variables, x, y, w, tf.reduce_sum(w))
            return g

        return [g.numpy() for g in self._on_one_replica(grads_fn, x, y, w)]

    def _per_example_variable_norms(self, x, y, w) -> np.ndarray:
        loss_fn = self._require_loss()
        variables = self.wrapped_model.trainable_variables
        w = _mask(x, w)

        def norms_fn(x, y, w):
            # ghost norms where they apply: no per-example copies of embedding tables
            squares, _ = microbatch.per_variable_squared_norms(
                self.wrapped_model, loss_fn, variables, x, y, w, 1, 1.0)
            return tf.sqrt(squares)

        return self._on_one_replica(norms_fn, x, y, w).numpy()

    def _on_one_replica(self, fn, *args):
        """Runs `fn` once, on the first replica's device only (no all-reduce involved)."""
        strategy = self.distribute_strategy
        device = strategy.extended.worker_devices[0] if hasattr(strategy, "extended") else None
        with tf.device(device):
            return tf.function(fn, autograph=False)(*args)

    def _require_loss(self):
        if self._per_example_loss is None:
            raise ValueError("Call PrivateModel.compile(optimizer, loss=...) before fit")
        return self._per_example_loss

    # ----------------------------------------------------------------- the step
    def train_step(self, data):
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        w = _mask(x, w)
        mechanism, plan = self._mechanism, self._clip_plan
        variables = self._trained_variables()  # all trainable ones unless some are frozen
        # 1. this replica's micro-batch gradients (single / stacked / ghost / loop; chunked when
        #    the replica's rows exceed physical_batch_size)
        grads = microbatch.gradients(self.wrapped_model, self._require_loss(), variables, x, y, w,
                                     plan)
        # 2. sum_j clip_C(g_j / alpha): every term has norm <= C, so the sum moves by <= S C
        clip = grads.clip(plan.l2_norm_clip, plan.selection, plan.per_layer)
        # 3. noise: each variable's draw on one owner replica, std sqrt(N) x the per-replica std,
        #    so the replicas' sum carries exactly the mechanism's std z_t S C
        z_t = self.dp_noise_multiplier
        std, denominator = mechanism.per_replica_noise_std(z_t), mechanism.expected_microbatches
        if mechanism.user_estimator == "clipped":  # divide by max(D, users drawn), noise on the
            std, denominator = _clipped_denominator(std, denominator, w, plan)  # average fixed
        noisy = self._noisy_sum(clip, std)
        # 4. back to gradient space, normalised by the expected number of micro-batches D
        if mechanism.user_estimator == "clipped":
            noisy, denominator = [g / tf.cast(denominator, g.dtype) for g in noisy], 1.0
        updates = clipping.to_update(noisy, plan.scales, denominator)
        # 5. the replicas' updates are SUMmed (all-reduce), then applied by the optimizer
        if self._sums_over_replicas:  # several replicas and sparse tables: the step sums
            updates = _sum_over_replicas(updates)
        if self._subspace is not None:  # post-processing of the (summed) release
            updates = self._subspace.project(updates)
        self.optimizer.apply_gradients(zip(updates, variables))
        self.step_count.increment()  # the ledger's truth: no update without it

        self._metric_trackers["noise_multiplier"].update_state(z_t)
        if self._training_statistics:  # else nothing of the private batches is kept, anywhere
            self._record_metrics(grads.losses, clip, w)
            if self._compile_metrics is not None:
                self._compile_metrics.update_state(y, grads.y_pred,
                                                   _metric_weights(grads.y_pred, w))
        elif self._compile_metrics is not None and not self._compile_metrics.built:
            # built, never updated: Keras reads every metric's result at the end of an epoch
            self._compile_metrics.build(y, grads.y_pred)
        return self._step_logs()

    def _noisy_sum(self, clip: clipping.ClipResult, std) -> list:
        """clipped sum + noise; with sparse embedding noise, the tables keep only the rows whose
        noisy counts pass the threshold, with noise for those rows only (edp_tf/selection.py)."""
        plan, n = self._clip_plan, self.num_replicas
        sparse = plan.selection.indices if plan.selection is not None else ()
        dense = [i for i in range(len(clip.clipped_sum)) if i not in sparse]
        noisy = list(clip.clipped_sum)
        owners = [self._noise_owners[i] for i in dense]
        if self._mechanism.bands > 1:  # no sparse tables with BandMF: every variable is dense
            drawn = noise.add_owned_banded_noise(
                noisy, std, self._noise.value, owners, n, self._noise_history.value,
                self._mechanism.strategy_coefficients)
        else:
            drawn = noise.add_owned_noise([noisy[i] for i in dense], std, self._noise.value,
                                          owners, n)
        for i, t in zip(dense, drawn):
            noisy[i] = t
        if sparse:
            chosen = selection.select(clip.counts, plan.selection, self._noise.value, n)
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            for i, mask in zip(sparse, chosen):
                draws = None if n == 1 else tf.equal(replica, self._noise_owners[i])
                rows = selection.noisy_selected_rows(
                    noisy[i], mask, std * math.sqrt(n), self._noise.value, draws)
                # sparse on any number of replicas: Adam and momentum leave the other rows be,
                # and with several replicas the all-reduce carries only the selected rows
                noisy[i] = rows
            self._metric_trackers["selected_rows"].update_state(selection.selected_fraction(chosen))
        return noisy

    def _record_metrics(self, losses, clip: clipping.ClipResult, w) -> None:
        # clipping statistics over the micro-batches that hold a real row: under Poisson sampling
        # the padding rows' zero gradients would count as unclipped (ATIS BERT: 0.76 "clipped"
        # when every real example was), hiding whether real examples fall below C
        real = tf.logical_and(clip.finite, _real_microbatches(w, self._clip_plan.microbatch_size))
        count = tf.maximum(tf.reduce_sum(tf.cast(real, tf.float32)), 1.0)
        safe_norms = tf.where(real, clip.norms, tf.zeros_like(clip.norms))
        clipped = tf.cast(safe_norms > self._dp_config.l2_norm_clip, tf.float32)
        # mean loss per replica batch: sum of micro-batch losses over the replica's share of D
        replica_share = self._mechanism.expected_microbatches / self.num_replicas
        safe_losses = tf.where(tf.math.is_finite(losses), losses, tf.zeros_like(losses))
        self._loss_tracker.update_state(tf.reduce_sum(safe_losses) / replica_share)
        self._metric_trackers["clipped_fraction"].update_state(tf.reduce_sum(clipped) / count)
        self._metric_trackers["preclip_norm"].update_state(tf.reduce_sum(safe_norms) / count)
        finite = tf.cast(clip.finite, tf.float32)
        self._nonfinite_tracker.update_state(tf.reduce_sum(1.0 - finite))

    def _step_logs(self) -> dict:
        logs = self.get_metrics_result()
        if not self._training_statistics:  # unnoised statistics of the private batches
            return {k: v for k, v in logs.items() if k in self.PUBLIC_LOGS}
        # Keras averages per-replica results; a count must be summed, hence the factor N.
        logs["nonfinite_microbatches"] = self._nonfinite_tracker.result() * float(self.num_replicas)
        return logs

    def test_step(self, data):
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        w = _mask(x, w)
        y_pred = self.wrapped_model(x, training=False)
        per_example = tf.cast(self._require_loss()(y, y_pred), tf.float32)
        self._loss_tracker.update_state(
            tf.reduce_sum(per_example * w) / tf.maximum(tf.reduce_sum(w), 1.0))
        if self._compile_metrics is not None:
            self._compile_metrics.update_state(y, y_pred, _metric_weights(y_pred, w))
        return {m.name: m.result() for m in [self._loss_tracker]} | (
            self._compile_metrics.result() if self._compile_metrics is not None else {})


class _Untracked:
    """A plain holder: tracking sees neither it nor what it holds."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


MIXED_FLOAT16_REFUSED = (
    "mixed_float16 needs loss scaling (Keras wraps the optimizer in a LossScaleOptimizer), which "
    "the private step does not do: the optimizer would divide every clipped, noised update by "
    "the loss scale, and training would silently stop. Use "
    "keras.mixed_precision.set_global_policy('mixed_bfloat16') (no loss scaling needed) or "
    "float32, and build the model again")


def _refuse_loss_scaling(model, optimizer) -> None:
    """mixed_float16 is refused before any step: its loss scaling lives in Keras' own train
    step (scale the loss, unscale the gradients), and the private step has none."""
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    float16 = any(getattr(getattr(layer, "dtype_policy", None), "name", "") == "mixed_float16"
                  for layer in ghost.flatten_layers(model))
    if scaled or float16:
        raise ValueError(MIXED_FLOAT16_REFUSED)


def _sum_over_replicas(updates: list) -> list:
    """The replicas' SUM of every update: dense ones in one batched all-reduce, the tables'
    selected rows as IndexedSlices (selection.sum_selected_rows_over_replicas)."""
    dense = [i for i, u in enumerate(updates) if not isinstance(u, tf.IndexedSlices)]
    summed = list(updates)
    if dense:
        reduced = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, [updates[i] for i in dense])
        for i, u in zip(dense, reduced):
            summed[i] = u
    for i, u in enumerate(updates):
        if isinstance(u, tf.IndexedSlices):
            summed[i] = selection.sum_selected_rows_over_replicas(u)
    return summed


def _already_summed(grads_and_vars):
    """Replaces a Keras optimizer's own cross-replica SUM when PrivateModel has done it."""
    return list(grads_and_vars)


# Keras' unrolled RNN zeroes a go_backwards layer's outputs with the mask in forward order while
# they run backwards (keras-team/keras#17596): over padded inputs, an unrolled Bidirectional
# layer's backward half is zero at the first (length - real length) positions
_UNROLLED_NOTE = (". Over padded (masked) inputs, an unrolled Bidirectional layer needs "
                  "zero_output_for_mask = False on its forward_layer and backward_layer "
                  "(keras-team/keras#17596: else its backward half is zero at most positions)")


def _unvectorisable_layers(model) -> list:
    """Recurrent layers that are not unrolled: each runs its own while_loop, which
    `tf.vectorized_map` (the ghost and vectorized methods) fails to vectorise over masked
    inputs, deep inside tracing."""
    return [f"{layer.name!r} ({type(layer).__name__}, unroll=False)"
            for layer in ghost.flatten_layers(model)
            if isinstance(layer, keras.layers.RNN) and not getattr(layer, "unroll", True)]


def _unvectorisable_strings(model, x) -> bool:
    """The inputs `x` hold strings and the model does not begin with row-wise preprocessing
    that the per-example passes run on the whole batch (microbatch.preprocessing_split):
    string ops (StringSplit) would then run inside `tf.vectorized_map`, which cannot vectorise
    them."""
    takes_strings = any(tf.as_dtype(t.dtype) == tf.string
                        for t in tf.nest.flatten(x) if hasattr(t, "dtype"))
    return takes_strings and (not tf.is_tensor(x)
                              or microbatch.preprocessing_split(model) is None)


def _mask(x, w) -> tf.Tensor:
    rows = tf.shape(tf.nest.flatten(x)[0])[0]
    if w is None:
        return tf.ones([rows], tf.float32)
    w = tf.cast(w, tf.float32)
    return tf.reshape(w, [rows, -1])[:, 0] if w.shape.rank != 1 else w


def _metric_weights(y_pred, w):
    """The rows' weights w for the compiled metrics, per output: [B, 1] for an output with a
    Keras mask, which Keras' metrics then fold into the mask position by position (a [B] weight
    against a [B, T] mask is broadcast along T, a shape error in Keras too); [B] otherwise."""
    masked = [microbatch.keras_mask(t) is not None for t in tf.nest.flatten(y_pred)]
    if not any(masked):
        return w
    flat = [w[:, None] if m else w for m in masked]
    return tf.nest.pack_sequence_as(y_pred, flat)


def _real_microbatches(w: tf.Tensor, microbatch_size: Optional[int]) -> tf.Tensor:
    """[m] True for each micro-batch with at least one real row (w > 0): the rows split into
    micro-batches of `microbatch_size` consecutive rows, or one (None), as the step splits them."""
    real = w > 0
    if microbatch_size is None:
        return tf.reduce_any(real, keepdims=True)
    return tf.reduce_any(tf.reshape(real, [-1, microbatch_size]), axis=1)


def _take(x, n: int):
    return tf.nest.map_structure(lambda t: t[:n], x)


def _first_batch(x, y, sample_weight, batch_size):
    """The first (x, y, w) batch `fit` will see, to fix the step's static geometry."""
    if isinstance(x, tf.data.Dataset):
        element = next(iter(x.take(1)))
        return keras.utils.unpack_x_y_sample_weight(element)
    if x is None or isinstance(x, (tf.distribute.DistributedDataset,)):
        raise ValueError("PrivateModel.fit takes arrays or a batched tf.data.Dataset")
    if hasattr(x, "__next__") or isinstance(x, keras.utils.PyDataset):
        raise ValueError(
            "PrivateModel.fit takes arrays or a batched tf.data.Dataset (generators and "
            "PyDatasets cannot be inspected before training)"
        )
    batch_size = batch_size or 32
    rows = len(tf.nest.flatten(x)[0])
    size = min(batch_size, rows)
    take = lambda t: None if t is None else tf.nest.map_structure(  # noqa: E731
        lambda a: tf.convert_to_tensor(a[:size]), t)
    first = (take(x), take(y), take(sample_weight))
    if size < batch_size:
        raise ValueError(
            f"fit got {rows} examples but batch_size={batch_size}: there is no full batch"
        )
    return first


def _clipped_denominator(std, expected_users: float, w, plan):
    """(per-replica noise std, denominator) of the clipped-denominator estimator: the step
    divides by D_t = max(D, users drawn in the whole step) and the noise is scaled by D_t / D,
    so that the average carries noise of std z S C / D whatever D_t is (S = 2)."""
    present = _real_microbatches(w, plan.microbatch_size)  # one user per micro-batch
    users = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.reduce_sum(tf.cast(present, tf.float32)))
    denominator = tf.maximum(float(expected_users), users)
    return std * denominator / float(expected_users), denominator
