"""What the private step reads from a batch: its row mask, the first batch that fixes the step's
geometry, and the weights the compiled metrics take.

Why apart from the step: these are the Keras conventions of a batch (x, y, sample_weight; a
Poisson sampler's mask as the weight; Keras masks on outputs) that every stage reads the same
way, so they are defined once.
"""
from __future__ import annotations

from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from edp_tf import microbatch, per_example_loss

# Keras turns class_weight into per-row weights multiplied into the loss before the gradient is
# clipped: an example whose gradient norm exceeds C is clipped back to C whatever its weight, so
# the weighting silently vanishes for most examples (and, on a sampler's dataset, Keras raises
# about a sample_weight the user never passed: the mask).
CLASS_WEIGHT_REFUSED = (
    "PrivateModel.fit does not take class_weight: each example's gradient is clipped to the "
    "norm C after its weight is applied, so the weights would be mostly undone without a word. "
    "A weight inside the loss meets the same cap; rebalance the data instead")


def check_fit_arguments(config, kwargs: dict, first) -> None:
    """What `fit` refuses before anything is traced: class weights, a BandMF epoch that is not
    whole cycles of the groups, and a user's (or augmented example's) weight outside [0, 1],
    which would scale its clipped vector (arrays checked in full, a dataset's first batch here;
    the step checks every batch)."""
    if kwargs.get("class_weight") is not None:
        raise ValueError(CLASS_WEIGHT_REFUSED)
    steps = kwargs.get("steps_per_epoch")
    if config.bandmf_bands > 1 and steps is not None and steps % config.bandmf_bands:
        raise ValueError(f"DPConfig.bandmf_bands={config.bandmf_bands}: steps_per_epoch="
                         f"{steps} must be a multiple of the bands, so that each epoch is "
                         "whole cycles of the BandMFSampler's groups")
    if config.privacy_unit == "user" or config.augment_copies > 1:
        weights = kwargs.get("sample_weight")
        weights = first[2] if weights is None else weights
        if weights is not None and not np.all((np.asarray(weights) >= 0)
                                              & (np.asarray(weights) <= 1)):
            raise ValueError(microbatch.USER_WEIGHT_RANGE)


def check_global_batch(config, replicas: int, batch: int) -> None:
    """The step splits the global batch evenly over the replicas, and each replica's share
    into whole micro-batches (an example's augmented copies are one micro-batch of K rows)."""
    k = config.microbatch_rows
    if batch % replicas or (k is not None and batch % (replicas * k)):
        copies = f" x augment_copies {config.augment_copies}" if config.augment_copies > 1 else ""
        raise ValueError(
            f"The global batch of {batch} examples must be divisible by replicas x "
            f"microbatch_size{copies} = {replicas} x {k if k else 'one micro-batch'}"
            f" = {replicas * (k or 1)}: choose batch_size accordingly")


def mask(x, w) -> tf.Tensor:
    rows = tf.shape(tf.nest.flatten(x)[0])[0]
    if w is None:
        return tf.ones([rows], tf.float32)
    w = tf.cast(w, tf.float32)
    return tf.reshape(w, [rows, -1])[:, 0] if w.shape.rank != 1 else w


def metric_weights(y_pred, w):
    """The rows' weights w for the compiled metrics, per output: [B, 1] for an output with a
    Keras mask, which Keras' metrics then fold into the mask position by position (a [B] weight
    against a [B, T] mask is broadcast along T, a shape error in Keras too); [B] otherwise."""
    masked = [per_example_loss.keras_mask(t) is not None for t in tf.nest.flatten(y_pred)]
    if not any(masked):
        return w
    flat = [w[:, None] if m else w for m in masked]
    return tf.nest.pack_sequence_as(y_pred, flat)


def real_microbatches(w: tf.Tensor, microbatch_size: Optional[int]) -> tf.Tensor:
    """[m] True for each micro-batch with at least one real row (w > 0): the rows split into
    micro-batches of `microbatch_size` consecutive rows, or one (None), as the step splits them."""
    real = w > 0
    if microbatch_size is None:
        return tf.reduce_any(real, keepdims=True)
    return tf.reduce_any(tf.reshape(real, [-1, microbatch_size]), axis=1)


def take(x, n: int):
    return tf.nest.map_structure(lambda t: t[:n], x)


def first_batch(x, y, sample_weight, batch_size):
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
