"""The private step's own count of the updates it applied, and what a ledger has accounted of it.

Why: a ledger that watches `fit`'s callbacks sees only the steps `fit` runs. Keras has other ways
to run the same step (`train_on_batch`, the train function or `train_step` called directly, a
custom loop, a callback that steps on its own), and every one of them moves the weights. The
step increments this count in the same graph as `apply_gradients`, so no update can happen
without it; a ledger compares it with what it charged (`take_unaccounted`) before it states
anything, and steps it did not charge void the statement instead of vanishing from it.

The count lives on the wrapper, outside every checkpoint and SavedModel of the wrapped model: a
resumed run starts a new wrapper at 0 and its ledger continues the file's charge.
"""
from __future__ import annotations

import tensorflow as tf


class StepCount:
    """Steps the private step applied (`value`), and how many of them a ledger has accounted
    for, charged or declared outside (`accounted`)."""

    def __init__(self) -> None:
        # as Keras' optimizer.iterations: every replica runs the step, the first one's add
        # stands for the step (the replicas apply one summed update)
        self.variable = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="dp_step_count",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.accounted = 0

    def increment(self):
        """One applied update: called inside the step, after `apply_gradients`."""
        return self.variable.assign_add(1)

    @property
    def value(self) -> int:
        return int(self.variable.numpy())

    def take_unaccounted(self) -> int:
        """Steps applied since the last call that nobody accounted for; they are accounted
        for from now on (the caller states them)."""
        value = self.value
        unaccounted, self.accounted = max(0, value - self.accounted), value
        return unaccounted


# the counts of every wrapper that has trained a model, on the model itself: its weights carry
# their steps whichever wrapper states them
_MARK = "_edp_tf_step_counts"


def claim(model, count: StepCount) -> None:
    """Marks `model` as trained by the wrapper whose step `count` counts (before its fit)."""
    counts = getattr(model, _MARK, ())
    if not any(c is count for c in counts):
        # past Keras' and TensorFlow's attribute tracking: a mark, not state of the model
        object.__setattr__(model, _MARK, tuple(counts) + (count,))


def steps_by_other_wrappers(model, count: StepCount) -> int:
    """Private steps other wrappers applied to `model`'s weights: a ledger of the wrapper that
    counts `count` holds none of them."""
    return sum(c.value for c in getattr(model, _MARK, ()) if c is not count)
