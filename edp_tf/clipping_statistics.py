"""The step's statistics of the private batches, without noise: the training loss, the clipped
fraction, the pre-clip norm and the non-finite micro-batches.

Why apart from the step: they are not covered by epsilon, so they are kept only when a user asks
(`training_statistics=True`, then listed as not covered); by default the step's logs are the
public ones alone (the noise multiplier, a function of the schedule).
"""
from __future__ import annotations

import keras
import tensorflow as tf

from edp_tf import clipping, step_inputs

PUBLIC_LOGS = ("noise_multiplier",)


class ClippingStatistics:
    """The step's metric trackers beside Keras' own loss tracker."""

    def __init__(self, sparse: bool):
        names = ("noise_multiplier", "clipped_fraction", "preclip_norm")
        self.trackers = {name: keras.metrics.Mean(name=name)
                         for name in names + (("selected_rows",) if sparse else ())}
        self.nonfinite = keras.metrics.Sum(name="nonfinite_microbatches")

    @property
    def metrics(self) -> list:
        return list(self.trackers.values()) + [self.nonfinite]

    def record(self, loss_tracker, losses, clip: clipping.ClipResult, real, l2_norm_clip: float,
               replica_share: float) -> None:
        """Over the micro-batches that hold a real row (`real`): under Poisson sampling the
        padding rows' zero gradients would count as unclipped (ATIS BERT: 0.76 "clipped" when
        every real example was), hiding whether real examples fall below C. The loss is the
        mean per replica batch: the micro-batch losses over the replica's share of D."""
        real = tf.logical_and(clip.finite, real)
        count = tf.maximum(tf.reduce_sum(tf.cast(real, tf.float32)), 1.0)
        safe_norms = tf.where(real, clip.norms, tf.zeros_like(clip.norms))
        clipped = tf.cast(safe_norms > l2_norm_clip, tf.float32)
        safe_losses = tf.where(tf.math.is_finite(losses), losses, tf.zeros_like(losses))
        loss_tracker.update_state(tf.reduce_sum(safe_losses) / replica_share)
        self.trackers["clipped_fraction"].update_state(tf.reduce_sum(clipped) / count)
        self.trackers["preclip_norm"].update_state(tf.reduce_sum(safe_norms) / count)
        finite = tf.cast(clip.finite, tf.float32)
        self.nonfinite.update_state(tf.reduce_sum(1.0 - finite))

    def track(self, z_t, selected, grads, clip: clipping.ClipResult, y, w, *, shown: bool,
              loss_tracker, compiled_metrics, microbatch_size, l2_norm_clip: float,
              replica_share: float) -> None:
        """One step's logs: z_t and the selected rows always (public: functions of the schedule
        and of the noisy counts); the statistics of the private batches only when `shown`."""
        self.trackers["noise_multiplier"].update_state(z_t)
        if selected is not None:
            self.trackers["selected_rows"].update_state(selected)
        if shown:
            self.record(loss_tracker, grads.losses, clip,
                        step_inputs.real_microbatches(w, microbatch_size), l2_norm_clip,
                        replica_share)
            if compiled_metrics is not None:
                compiled_metrics.update_state(
                    y, grads.y_pred, step_inputs.metric_weights(grads.y_pred, w))
        elif compiled_metrics is not None and not compiled_metrics.built:
            # built, never updated: Keras reads every metric's result at the end of an epoch
            compiled_metrics.build(y, grads.y_pred)

    def logs(self, logs: dict, shown: bool, replicas: int) -> dict:
        """The step's logs: the public ones, or all with `shown`."""
        if not shown:  # unnoised statistics of the private batches
            return {k: v for k, v in logs.items() if k in PUBLIC_LOGS}
        # Keras averages per-replica results; a count must be summed, hence the factor N
        logs["nonfinite_microbatches"] = self.nonfinite.result() * float(replicas)
        return logs
