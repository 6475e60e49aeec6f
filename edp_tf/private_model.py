"""`PrivateModel`: any Keras model, trained by `fit` with the replica-local (e)DP-SGD step.

The step is named stages (docs/design.md, mechanism), each in its own module, on each replica:
    1. micro-batch gradients   microbatch.gradients            (single / stacked / ghost / loop)
    2. scale and clip          MicrobatchGradients.clip         c_j = clip_C(g_j / alpha)
    3. noise                   noise_stage (Gaussian, BandMF, sparse rows: each owns its state)
    4. normalise               clipping.to_update               u_r = alpha * (sum_j c_j + eta) / D
    5. post-process            post_processing.chain            (the release, summed first,
                                                                then handed back as shares)
    6. apply                   the optimizer (its all-reduce SUMs u_r over the replicas)
with the constants (k, k_e, D, S, the noise std) in one frozen `Mechanism`, decided before
tracing, and the variables trained now chosen by `freezing.Freeze`. The wrapped model stays an
ordinary Keras model, which is what `save` and `export` write (edp_tf/one_object.py).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from edp_tf import (
    batch_source,
    bias_corrected_adam,
    checks,
    clipping_statistics,
    freezing,
    guarded_steps,
    iterators,
    layer_scales,
    microbatch,
    model_state,
    multi_worker,
    noise,
    noise_stage,
    one_object,
    padding,
    per_example_loss,
    privacy_facts,
    projection,
    step_count,
    step_inputs,
    step_method,
    step_stages,
    weight_seal,
)
from edp_tf.config import DPConfig, Features, compatibility
from edp_tf.mechanism import Mechanism
from edp_tf.plan import PrivacyPlan
from edp_tf.untracked import Untracked


class _EpochSchedule(keras.callbacks.Callback):
    """At the start of each epoch: the step's z_t from the mechanism's schedule (the same
    function the ledger charges), and the frozen variables' joining (`freeze_until`)."""

    def __init__(self, private_model: "PrivateModel"):
        super().__init__()
        self._private_model = private_model

    def on_epoch_begin(self, epoch, logs=None):
        model = self._private_model
        model.dp_noise_multiplier.assign(model.mechanism.noise_multiplier_at(epoch))
        model.dp_noise_range.assign([np.inf, -np.inf])  # the epoch's steps record theirs
        model._unfreeze_if_due(epoch)


class PrivateModel(one_object.OneObject, guarded_steps.GuardedSteps, keras.Model):
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
    (docs/design.md, section 2, says why each meets per-example clipping as it does):

    * Masks: an output's Keras mask (`Embedding(mask_zero=True)`, `Masking`) weights each
      position's loss, so padding adds no gradient. Each example's loss is sum_t m_t l_t / T
      over the padded length T (Keras' divisor, the batch's count of valid positions, is data
      dependent): Keras' direction scaled by valid / (B T).
    * Dropout: eDP and `per_example_method="loop"` draw a mask per row; the vectorised methods
      draw once per replica and step for all micro-batches. The masks depend on no example, so
      epsilon is the same either way.
    * Preprocessing inside the model (a `TextVectorization` taking strings) runs once per batch
      before the per-example machinery; naming a layer in `public_layers` declares the layers
      it holds (TextVectorization's own StringLookup).
    """

    # what the step logs when training statistics are hidden: public, a function of the schedule
    PUBLIC_LOGS = clipping_statistics.PUBLIC_LOGS

    def __init__(self, model: keras.Model, config: DPConfig, public_layers: Sequence[str] = (),
                 plan: Optional[PrivacyPlan] = None, training_statistics: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        checks.instance("PrivateModel's config", config, DPConfig, "an edp_tf.DPConfig")
        checks.instance("PrivateModel's model", model, keras.layers.Layer, "a keras.Model")
        checks.instance("PrivateModel's plan", plan, (PrivacyPlan, type(None)),
                        "an edp_tf.PrivacyPlan")
        checks.instance("training_statistics", training_statistics, bool, "True or False")
        self.wrapped_model = model
        self._dp_config = config
        self._public_layers = tuple(str(name) for name in public_layers)
        self._privately_adapted: tuple = ()  # layers adapted with DP (make_private), charged
        self._plan = plan
        self._training_statistics = training_statistics
        self._init_one_object()
        self._init_guarded_steps()
        self._batch_source: Optional[batch_source.BatchSource] = None  # set by each fit
        self._validation = False  # the last fit evaluated validation_data
        # model_state's refusal runs before the first step and again whenever what trains
        # changes (model_state.training_signature)
        self._state_checked_for: Optional[tuple] = None
        self._loop_said: set = set()  # the automatic per-example loop (and eDP's warning) once
        self.dp_noise_multiplier = tf.Variable(float(config.noise_multiplier), trainable=False,
                                               name="dp_noise_multiplier")  # z_t
        # the updates the step applied, counted in the step's own graph: a ledger charges
        # what ran by it, whichever Keras path ran it (edp_tf/step_count.py)
        self.step_count = step_count.StepCount()
        # the lowest and highest z_t the epoch's steps used: the ledger charges the schedule's
        # z_t, which a callback assigning dp_noise_multiplier mid-epoch would make untrue
        self.dp_noise_range = tf.Variable(
            [np.inf, -np.inf], trainable=False, name="dp_noise_range",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        # only the step moves the weights: any other move voids the statement, whichever path
        # made it (edp_tf/weight_seal.py)
        self.weight_seal = weight_seal.WeightSeal()
        self.add_after_save(self.weight_seal.remember)  # a file holds the last step's state
        # held outside Keras' and TensorFlow's tracking (edp_tf/untracked.py): the Philox state
        # would predict the next draws and recompute past ones, and the stage's BandMF history
        # would give the past clipped sums away (docs/privacy.md)
        self._noise = Untracked(noise.make_generator(config.seed, config.secure_noise))
        self._stages = Untracked(None)  # step_stages.StepStages, made before each trace
        self._rng = np.random.default_rng(config.seed)  # the private-scaling query (host side)
        self._layer_scales: Optional[tuple] = None
        self._extra_events: list = []
        self._per_example_loss = None
        self._freeze = freezing.Freeze.nothing()
        self._first_batch_seen = None  # fit's first batch: _prepare again when frozen ones join
        self._subspace = projection.NoProjection()  # stage 5's projection, when one is asked
        self._statistics = clipping_statistics.ClippingStatistics(config.sparse_embeddings)

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
        if self._stages.value is None:
            raise RuntimeError("the mechanism is known once fit() has seen the first batch")
        return self._stages.value.mechanism

    @property
    def noise_stage(self) -> Optional[noise_stage.GaussianNoise]:
        """The step's noise mechanism (known once `fit` has seen the first batch)."""
        return None if self._stages.value is None else self._stages.value.noise

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

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None,
                **kwargs):
        """As `keras.Model.compile`: one loss, or one per output (dict by name or list) with
        `loss_weights`; each example's loss is their weighted sum, clipped as a whole."""
        self._per_example_loss = per_example_loss.as_per_example_loss(
            loss, loss_weights, lambda: getattr(self.wrapped_model, "output_names", None))
        optimizer = keras.optimizers.get(optimizer)
        step_method.check_optimizer(self.wrapped_model, optimizer)
        # The loss is not handed to Keras: its reduction divides by the replica count.
        super().compile(optimizer=optimizer, loss=None, metrics=metrics, **kwargs)
        step_method.refuse_loss_scaling(self.wrapped_model, self.optimizer)  # Keras' wrapping
        weight_seal.guard(self.optimizer, "finalize_variable_values", self.weight_seal)

    @property
    def metrics(self):
        return super().metrics + self._statistics.metrics

    def privacy_facts(self) -> dict:
        """What the accountant needs to know about the mechanism (after the first `fit` starts)."""
        return privacy_facts.describe(
            self.mechanism, self._dp_config, self._stages.value.clip, self._trained_variables(),
            frozen_until_epoch=self._freeze.epoch, subspace=self._subspace,
            layer_scales=self._layer_scales, plan=self._plan, public_layers=self._public_layers,
            training_statistics=self._training_statistics, extra_events=self._extra_events,
            batch_source=self._batch_source, validation_data=self._validation,
            cuts_padding=padding.cuts(self.wrapped_model))

    def set_public_layer_scales(self, x, y, sample_weight=None) -> tuple:
        """Measures alpha on a batch of public (or synthetic) data; `scaling='public'` uses it."""
        self._ensure_built(x)
        self._layer_scales = layer_scales.public(self.wrapped_model, self._require_loss(),
                                                 self.distribute_strategy, x, y, sample_weight)
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
        """The first `epoch` epochs train only the other trainable variables; then all train
        (edp_tf/freezing.py: DP linear probing, then fine-tuning). One optimizer throughout
        (built with every variable before the first step): joining variables start with zero
        moments, but Keras' bias correction and learning-rate schedule count the global step,
        so their first Adam updates differ from a fresh optimizer's. Call before `fit`;
        `epoch=0` turns it off."""
        self._check_compatibility(freeze=bool(epoch))
        self._freeze = freezing.Freeze.checked(epoch, variables,
                                               self.wrapped_model.trainable_variables)

    def _unfreeze_if_due(self, epoch: int) -> None:
        """At the freeze's end the frozen variables join: the per-variable constants are
        re-derived and the step retraced, within the same `fit` (Keras reads train_function at
        every step)."""
        if self._freeze.joins(epoch):
            self._prepare(self._first_batch_seen)
            self.make_train_function(force=True)

    def _trained_indices(self) -> list:
        """Indices into the trainable variables of those the step trains now."""
        return self._freeze.trained_indices(self.wrapped_model.trainable_variables)

    def _trained_variables(self) -> list:
        variables = self.wrapped_model.trainable_variables
        return [variables[i] for i in self._trained_indices()]

    def _features(self, **changes) -> Features:
        """What this wrapper combines with its DPConfig (edp_tf.config.compatibility)."""
        return dataclasses.replace(Features(
            freeze=self._freeze.planned, projection=self._subspace.planned,
            bias_corrected_adam=isinstance(getattr(self, "optimizer", None),
                                           bias_corrected_adam.BiasCorrectedAdam),
            multi_worker=multi_worker.is_multi_worker(self.distribute_strategy)), **changes)

    def _check_compatibility(self, why: str = "", **changes) -> None:
        compatibility(self._dp_config, self._features(**changes), why)

    def restore_layer_scales(self, scales) -> None:
        """Reinstates the alpha a resumed run decided earlier (their cost is already accounted)."""
        self._layer_scales = layer_scales.restored(
            scales, len(self.wrapped_model.trainable_variables))

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
        iterators.release_device_iterators_promptly()  # under a strategy the user built, too
        callbacks = list(callbacks or [])
        self._batch_source = batch_source.describe(x)
        self._validation = kwargs.get("validation_data") is not None or bool(
            kwargs.get("validation_split"))
        batch_source.offer(callbacks, self._batch_source)
        first = step_inputs.first_batch(x, y, kwargs.get("sample_weight"), batch_size)
        step_inputs.check_fit_arguments(self._dp_config, kwargs, first)
        self._first_batch_seen = first
        self._freeze.start(kwargs.get("initial_epoch") or 0)
        self._ensure_built(first[0])
        self._prepare(first)
        step_count.claim(self.wrapped_model, self.step_count)  # the model is the unit
        callbacks = ([_EpochSchedule(self)] + self._subspace.callbacks(self.optimizer)
                     + callbacks)
        for callback in callbacks:  # Keras' swaps of the average in and out of the weights
            if isinstance(callback, keras.callbacks.SwapEMAWeights):
                for method in ("_swap_variables", "_finalize_ema_values"):
                    weight_seal.guard(callback, method, self.weight_seal)
        if isinstance(x, tf.data.Dataset):
            # Keras ignores `shuffle` for a dataset (a sampler's batches are drawn already), but
            # warns on every fit that its default True is ignored
            kwargs.setdefault("shuffle", False)
        return super().fit(
            x=x, y=y, batch_size=batch_size, epochs=epochs, callbacks=callbacks, **kwargs
        )

    def _prepare(self, first) -> None:
        """Decides the step's constants (the mechanism, alpha, the stages) before tracing it."""
        fx, fy, fw = first
        self._ensure_built(fx)
        signature = model_state.training_signature(self.wrapped_model)
        if signature != self._state_checked_for:
            model_state.refuse_state_outside_the_clip(
                self.wrapped_model, fx, self._public_layers + self._privately_adapted)
            self._state_checked_for = signature
        cfg, n = self._dp_config, self.num_replicas
        batch = int(tf.nest.flatten(fx)[0].shape[0])
        step_inputs.check_global_batch(cfg, n, batch)
        method = step_method.choose(
            cfg.per_example_method, cfg.microbatch_rows, self.wrapped_model, fx,
            lambda why: self._check_compatibility(why, per_example_method="loop"),
            self._loop_said)
        self._check_compatibility(per_example_method=method)
        mechanism = Mechanism.from_config(cfg, n, batch)
        mechanism = self._plan.step_mechanism(mechanism) if self._plan else mechanism
        step_method.warn_if_few_clipped_vectors(mechanism, self._loop_said)
        earlier = self._stages.value
        self._layer_scales, self._extra_events = layer_scales.for_fit(
            cfg, self.wrapped_model, self._require_loss(), self.distribute_strategy,
            (fx, fy, step_inputs.mask(fx, fw)), (self._layer_scales, self._extra_events),
            self._rng, earlier is not None and earlier.mechanism.global_batch_size != batch)
        variables = self._trained_variables()
        self._freeze.build_optimizer(self.optimizer, self.wrapped_model.trainable_variables,
                                     self.distribute_strategy)  # its slots exist to be watched
        self.weight_seal.watch(self.wrapped_model.variables, variables, self.optimizer,
                               model_state.seed_states(self.wrapped_model))
        scales = tuple(self._layer_scales[i] for i in self._trained_indices())
        self._subspace.build(self.wrapped_model, self._require_loss(), variables,
                             cfg.l2_norm_clip, self.distribute_strategy)
        self._stages.value = step_stages.make(
            cfg, mechanism, self.wrapped_model, variables, scales, method, self._noise.value,
            self.distribute_strategy, self.optimizer, self._subspace.stage)
        bias_corrected_adam.attach_mechanism_noise(self.optimizer, mechanism, variables,
                                                   scales, self.dp_noise_multiplier)
        self.train_function = None  # constants changed: retrace

    def _require_loss(self):
        if self._per_example_loss is None:
            raise ValueError("Call PrivateModel.compile(optimizer, loss=...) before fit")
        return self._per_example_loss

    # ----------------------------------------------------------------- the step
    def train_step(self, data):
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        w = step_inputs.mask(x, w)
        stages = self._stages.value
        plan, mechanism = stages.clip, stages.mechanism
        variables = self._trained_variables()  # all trainable ones unless some are frozen
        self.weight_seal.check(variables)  # as the previous step left them?
        # 1. this replica's micro-batch gradients (single / stacked / ghost / loop; chunked when
        #    the replica's rows exceed physical_batch_size)
        grads = microbatch.gradients(self.wrapped_model, self._require_loss(), variables, x, y, w,
                                     plan)
        # 2. sum_j clip_C(g_j / alpha): every term has norm <= C, so the sum moves by <= S C
        clip = grads.clip(plan.l2_norm_clip, plan.selection, plan.per_layer)
        # 3. noise: each variable's draw on one owner replica, std sqrt(N) x the per-replica std,
        #    so the replicas' sum carries exactly the mechanism's std z_t S C
        z_t = self.dp_noise_multiplier
        std, denominator = stages.normaliser.noise_std(
            mechanism.per_replica_noise_std(z_t), w, plan.microbatch_size)
        noisy, selected = stages.noise.add(clip, std)
        # 4. back to gradient space, normalised by the expected number of micro-batches D (or,
        #    for the clipped-denominator estimator, by max(D, users drawn))
        updates = stages.normaliser.updates(noisy, plan.scales, denominator)
        # 5. post-processing of the release: the replicas' sum where the step takes it, then
        #    the projection onto public directions
        for stage in stages.post_processing:
            updates = stage(updates)
        # 6. apply (the optimizer SUMs the replicas' updates, or the shares of the release)
        self.optimizer.apply_gradients(zip(updates, variables))
        self.step_count.increment()  # the ledger's truth: no update without it
        self.weight_seal.seal(variables)
        seen = self.dp_noise_range
        self.dp_noise_range.assign(tf.stack([tf.minimum(seen[0], z_t), tf.maximum(seen[1], z_t)]))
        self._statistics.track(
            z_t, selected, grads, clip, y, w, shown=self._training_statistics,
            loss_tracker=self._loss_tracker, compiled_metrics=self._compile_metrics,
            microbatch_size=plan.microbatch_size, l2_norm_clip=plan.l2_norm_clip,
            replica_share=mechanism.expected_microbatches / self.num_replicas)
        return self._statistics.logs(self.get_metrics_result(), self._training_statistics,
                                     self.num_replicas)

    def test_step(self, data):
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        w = step_inputs.mask(x, w)
        y_pred = self.wrapped_model(x, training=False)
        per_example = tf.cast(self._require_loss()(y, y_pred), tf.float32)
        self._loss_tracker.update_state(
            tf.reduce_sum(per_example * w) / tf.maximum(tf.reduce_sum(w), 1.0))
        if self._compile_metrics is not None:
            self._compile_metrics.update_state(y, y_pred, step_inputs.metric_weights(y_pred, w))
        return {m.name: m.result() for m in [self._loss_tracker]} | (
            self._compile_metrics.result() if self._compile_metrics is not None else {})
