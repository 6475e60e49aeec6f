"""Padded sequence rows cut to the longest real row before the per-example pass.

Why: a private step computes every example's forward and backward pass over its padded length,
and most of it is padding (SNIPS utterances take 12 of MiniLM's 32 word pieces in the median;
docs/benchmarks.md, "Cutting BERT's padding", has the step times). Cutting padded
positions that no row of the chunk uses is exact when the model masks them (they reach no output,
so no loss and no gradient). A Poisson batch sorted by length before it is cut into chunks
(`DPConfig.physical_batch_size`) makes most chunks' longest row short. Sorting only regroups rows
where the grouping cannot change the result: micro-batches of one example (the clipped sum is a
sum over examples) or one micro-batch per replica (eDP: the chunks' gradients are summed before
the one clip). Micro-batches of k > 1 examples keep the sampler's grouping and are only cut.

A Keras model opts in with two methods (and out again with `model.cuts_padding = False`):

    def padding_lengths(self, x) -> tf.Tensor:
        # [rows] int32: the positions each row of `x` uses
    def cut_padding(self, x, length) -> x:
        # `x` with its padded axis cut to `length` positions (a scalar int32 tensor)

The price is a step time that follows the sampled rows' lengths: a timing channel outside the
guarantee, which the ledger states (TIMING_SENTENCE).

`cut_padding` must leave the outputs' shapes as they are (cut only an axis the outputs do not
have, e.g. BERT's word pieces under word-level outputs): a per-example loss averaged over a
padded output axis would change with its length.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

TIMING_SENTENCE = (
    "The step runs each chunk of rows over its longest row only (the model cuts its padding: "
    "edp_tf/padding.py), so a step's time depends on the lengths of the sampled rows. Timing is "
    "outside the guarantee: the step times shown or logged, and the step at which an "
    "interruption stops the run (and so the steps charged and a resumed run's noise), depend on "
    "those lengths. Set the model's cuts_padding = False (edp-train: "
    "--config.bert.cut_padding=False) for steps whose time does not depend on the data.")


def shaped_like(gradient, variable) -> tf.Tensor:
    """`gradient` as a dense tensor with `variable`'s static shape. Why: inputs cut to an unknown
    length leave the gradient of a variable read through a slice of that length (a position
    table) without one; a gradient whose shape is known gets no extra op in the step."""
    gradient = tf.convert_to_tensor(gradient)
    if gradient.shape.is_fully_defined():
        return gradient
    return tf.ensure_shape(gradient, variable.shape)


def cuts(model) -> bool:
    """Whether `model` has the two methods and has not opted out."""
    return (callable(getattr(model, "padding_lengths", None))
            and callable(getattr(model, "cut_padding", None))
            and bool(getattr(model, "cuts_padding", True)))


def lengths(model, x) -> Optional[tf.Tensor]:
    """The rows' lengths when `model` cuts its padding (and the trace is a graph), else None."""
    if not cuts(model) or tf.executing_eagerly():  # eagerly, shapes are concrete: a model's
        return None  # static input shapes would refuse a shorter one
    return tf.cast(model.padding_lengths(x), tf.int32)


def cut(model, x):
    """`x` cut to its longest row when `model` cuts its padding, else `x` unchanged."""
    found = lengths(model, x)
    if found is None:
        return x
    return model.cut_padding(x, tf.maximum(tf.reduce_max(found), 1))


def shortest_first(model, x) -> Optional[tf.Tensor]:
    """A permutation of the rows, shortest first (None when `model` does not cut its padding)."""
    found = lengths(model, x)
    if found is None:
        return None
    return tf.argsort(found, stable=True)
