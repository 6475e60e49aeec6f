"""A seal on the wrapped model's weights: only the private step may move them.

Why: the step's own count (edp_tf/step_count.py) says how many updates the private step applied;
it cannot see an update that never went through the step, and Keras has many: the wrapped
model's own `fit` (with any optimizer, recompiled afterwards), the wrapper's optimizer applying
raw gradients by hand, a callback's `assign`, `set_weights` of other weights, a layer unfrozen
mid-fit whose forward pass updates its statistics. Each path is different; what they share is
that a weight changes outside the step. So the seal compares the weights themselves:

* In the step (two reductions over the trained variables): before the gradients, the trained
  weights must be those the previous step left (a move between steps counts in `moved`); after
  `apply_gradients` the step seals what it left.
* On the host, wherever a statement is read (the ledger's reconcile, each epoch's close, the
  optimizer's `finalize_variable_values`): the trained weights must be a state the step left
  (the last one, or one at an epoch's end, which `EarlyStopping(restore_best_weights=True)` and
  a `ModelCheckpoint` reloaded may bring back), and every other variable must be as it was when
  the step's variables were chosen (nothing trains them; a forward pass that assigns them
  learns from the private batches unclipped).

The fingerprint is each variable's bit patterns summed as integers: exact, so the step's value
and the host's agree bit for bit on any device and with or without XLA, and it costs one read of
each variable. Changing a weight without changing the sum would take bit patterns that cancel
exactly; no training path does that by accident.

The seal holds no data: it is kept outside every checkpoint, like the step count, and a new
wrapper (a resumed run) starts from the weights it is given.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

import tensorflow as tf

# Integer types of the same width as each floating type: a bitcast reads the bits as they are.
_SAME_WIDTH = {2: tf.int16, 4: tf.int32, 8: tf.int64}


def fingerprint(variables: Sequence) -> tf.Tensor:
    """The int64 sum of every element's bit pattern over `variables` (wrapping on overflow,
    which integer addition makes order-independent: the same on every device)."""
    total = tf.constant(0, tf.int64)
    for variable in variables:
        value = tf.convert_to_tensor(variable)
        dtype = value.dtype
        if dtype.is_floating:
            value = tf.bitcast(value, _SAME_WIDTH[dtype.size])
        elif dtype == tf.bool:
            value = tf.cast(value, tf.int64)
        elif not dtype.is_integer:
            continue  # strings and resources hold no trained weight
        total += tf.reduce_sum(tf.cast(value, tf.int64))
    return total


def _ids(variables: Iterable) -> set:
    return {id(v) for v in variables}


class WeightSeal:
    """What the private step left in the trained variables, and every other variable as the
    step found it; `inspect` says how many moves nobody accounted for."""

    def __init__(self) -> None:
        # as the step count: every replica computes the same value, the first one's stands
        first = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self._sealed = tf.Variable(0, dtype=tf.int64, trainable=False, name="dp_weight_seal",
                                   aggregation=first)
        self._armed = tf.Variable(False, trainable=False, name="dp_weight_seal_armed",
                                  aggregation=first)
        self._moved = tf.Variable(0, dtype=tf.int64, trainable=False, name="dp_weights_moved",
                                  aggregation=first)
        self._moved_taken = 0
        self._pending = 0
        self._trained: List = []
        self._others: List = []
        self._others_sealed = None
        self._known: set = set()  # trained states the step left at an epoch's end

    # ------------------------------------------------------------------ in the step
    def check(self, trained: Sequence):
        """Before the step's gradients: counts a move of the trained weights since the last
        seal (a callback's update between two steps)."""
        moved = tf.logical_and(self._armed, tf.not_equal(fingerprint(trained), self._sealed))
        return self._moved.assign_add(tf.cast(moved, tf.int64))

    def seal(self, trained: Sequence):
        """After `apply_gradients`: what the step left."""
        with tf.control_dependencies([self._sealed.assign(fingerprint(trained))]):
            return self._armed.assign(True)

    # ------------------------------------------------------------------ on the host
    def watch(self, variables: Sequence, trained: Sequence, untouched: Iterable = ()) -> None:
        """Before each trace: the step will train `trained`; every other variable of
        `variables` (the wrapped model's), except `untouched` (state that changes without
        data: Dropout's seed generators), must stay as it is. Moves under the previous choice
        are inspected first; the first call accepts the weights it is given."""
        self.inspect()
        skip = _ids(trained) | _ids(untouched)
        self._trained = list(trained)
        self._others = [v for v in variables if id(v) not in skip]
        self._reseal()

    def inspect(self) -> None:
        """Records the moves nobody accounted for since the last call (`take` hands them on):
        those the step counted between steps, plus one if the weights now are not a state
        the step left or another variable changed. Then seals the weights as they are, so
        that a move is recorded once."""
        if self._others_sealed is None:
            return  # no step chose its variables yet: the weights are the starting point
        moved = int(self._moved.numpy())
        self._pending += moved - self._moved_taken
        self._moved_taken = moved
        if bool(self._armed.numpy()):
            self._known.add(int(self._sealed.numpy()))
        now = int(fingerprint(self._trained).numpy())
        if now not in self._known or self._others_fingerprint() != self._others_sealed:
            self._pending += 1
        self._reseal()

    def take(self) -> int:
        """The moves recorded so far and not yet handed on, after inspecting the weights now."""
        self.inspect()
        found, self._pending = self._pending, 0
        return found

    def accept(self) -> None:
        """The weights as they are now are the step's: after the optimizer's
        `finalize_variable_values`, which writes back a post-processing of the noisy iterates
        (an average, a filter's state) that only the step's updates fed."""
        self._known.add(int(fingerprint(self._trained).numpy()))
        self._reseal()

    def _others_fingerprint(self) -> int:
        return int(fingerprint(self._others).numpy())

    def _reseal(self) -> None:
        now = int(fingerprint(self._trained).numpy())
        self._sealed.assign(now)
        self._armed.assign(True)
        self._known.add(now)
        self._others_sealed = self._others_fingerprint()


def guard_finalize(optimizer, seal: WeightSeal) -> None:
    """Wraps `optimizer.finalize_variable_values` (Keras calls it when `fit` ends; an average
    or a filter writes its state back into the weights): moves before it are recorded, and
    what it writes is accepted as the step's. Once per optimizer."""
    finalize = optimizer.finalize_variable_values
    if getattr(finalize, "edp_tf_seal", None) is seal:
        return

    def finalize_variable_values(var_list):
        seal.inspect()
        result = finalize(var_list)
        seal.accept()
        return result

    finalize_variable_values.edp_tf_seal = seal
    object.__setattr__(optimizer, "finalize_variable_values", finalize_variable_values)
