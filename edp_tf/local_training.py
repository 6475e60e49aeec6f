"""DP-FedAvg's user update: a few epochs of local SGD on one user's examples, returned as a
pseudo-gradient (McMahan et al. 2018, "Learning Differentially Private Recurrent Language
Models", Algorithm 1).

With `DPConfig(privacy_unit="user", local_epochs=E)` each sampled user's micro-batch is not
differentiated once (DP-FedSGD) but trained on: E passes of local SGD with learning rate eta over
batches of `local_batch_size` of the user's rows, starting from the global weights theta. The
user's contribution is theta - theta_local (for one full-batch local step it is eta times the
FedSGD gradient). The step then treats it exactly like a micro-batch gradient: scaled by 1/alpha,
clipped to C, summed, noised, divided by D = qW, and handed to the optimizer, which is the
server optimizer (SGD with learning rate 1 applies the noisy average delta: FedAvg; momentum
gives FedAvgM). Every user still moves the clipped sum by at most C, so the sensitivity, the
noise and the accounting are those of DP-FedSGD.

Local steps use `model.stateless_call` on tensors, so the model's variables are never assigned
and replicas stay independent. A local batch without real rows (padding only) has loss 0 and
leaves the local weights unchanged. Non-trainable state (e.g. normalisation statistics) is not
updated by local steps.
"""
from __future__ import annotations

import dataclasses
import math

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """E local epochs of SGD with learning rate eta over batches of b of a user's k rows."""

    epochs: int
    batch_size: int
    learning_rate: float

    def steps_per_epoch(self, rows: int) -> int:
        return math.ceil(rows / self.batch_size)


def for_config(config, rows_per_microbatch):
    """DP-FedAvg's local training for `config` (None for DP-FedSGD, local_epochs 0); its
    batches default to a user's whole micro-batch."""
    if not config.local_epochs:
        return None
    return LocalTraining(config.local_epochs, config.local_batch_size or rows_per_microbatch,
                         float(config.local_learning_rate))


def pseudo_gradient(model, loss_fn, variables, x, y, w, local: LocalTraining):
    """(theta - theta_local per variable, the user's loss under theta [1], y_pred under theta).

    x, y, w: one user's micro-batch of k rows (w: 1 real, 0 padding), k static.
    """
    if [id(v) for v in variables] != [id(v) for v in model.trainable_variables]:
        raise ValueError("local training needs the model's own trainable variables, in order")
    rows = int(tf.nest.flatten(x)[0].shape[0])
    non_trainable = [tf.convert_to_tensor(v.value) for v in model.non_trainable_variables]
    theta = [tf.convert_to_tensor(v.value) for v in variables]
    params = list(theta)
    first_loss = first_pred = None
    for _ in range(local.epochs):
        for start in range(0, rows, local.batch_size):
            end = min(start + local.batch_size, rows)
            xb, yb, wb = tf.nest.map_structure(lambda t: t[start:end], (x, y, w))
            with tf.GradientTape() as tape:
                tape.watch(params)
                y_pred, _ = model.stateless_call(params, non_trainable, xb, training=True)
                per_example = tf.cast(loss_fn(yb, y_pred), tf.float32)
                real = tf.cast(wb > 0, tf.float32)  # a user's weight scales the clipped update
                loss = tf.reduce_sum(per_example * real) / tf.maximum(tf.reduce_sum(real), 1.0)
            grads = tape.gradient(loss, params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            if first_pred is None:
                first_loss, first_pred = loss, y_pred
            params = [p - local.learning_rate * tf.convert_to_tensor(g)
                      for p, g in zip(params, grads)]
    if local.batch_size < rows:  # the first local batch saw part of the rows only
        first_pred, _ = model.stateless_call(theta, non_trainable, x, training=True)
        per_example = tf.cast(loss_fn(y, first_pred), tf.float32)
        real = tf.cast(w > 0, tf.float32)
        first_loss = tf.reduce_sum(per_example * real) / tf.maximum(tf.reduce_sum(real), 1.0)
    return [t - p for t, p in zip(theta, params)], first_loss[None], first_pred
