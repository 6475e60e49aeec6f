"""A seal on the wrapped model's weights: only the private step may move them.

Why: the step's own count (edp_tf/step_count.py) says how many updates the private step applied;
it cannot see an update that never went through the step, and Keras has many: the wrapped
model's own `fit` (with any optimizer, recompiled afterwards), the wrapper's optimizer applying
raw gradients by hand, a callback's `assign`, `set_weights` of other weights, a layer unfrozen
mid-fit whose forward pass updates its statistics. Each path is different; what they share is
that a weight changes outside the step. So the seal compares the weights themselves:

* In the step (two reductions over the trained variables and the optimizer's state): before
  the gradients, both must be what the previous step left (a move between steps counts in
  `moved`); after `apply_gradients` the step seals what it left. The optimizer's state (its
  moments, an average) is watched as the weights are: a raw gradient applied through it and
  the weights set back would reach the weights through the next step. Its learning rate is
  not: a schedule or ReduceLROnPlateau sets it between steps, from no training example.
* On the host, wherever a statement is read (the ledger's reconcile, a save between epochs
  among them; each epoch's close; the optimizer's `finalize_variable_values`): the trained
  weights must be a state the step left (the last one, or one when an epoch closed or a file
  was saved, which
  `EarlyStopping(restore_best_weights=True)` and a reloaded `ModelCheckpoint` bring back), the
  optimizer's state one it left too, and every other variable as it was when the step's
  variables were chosen (nothing trains them; a forward pass that assigns them learns from the
  private batches unclipped). Any mix of states the step released is a function of its
  releases, so each part is checked on its own.

The fingerprint is each variable's bit patterns summed as integers: exact, so the step's value
and the host's agree bit for bit on any device and with or without XLA, and it costs one read of
each variable. Changing a weight without changing the sum would take bit patterns that cancel
exactly; no training path does that by accident.

The seal holds no data: it is kept outside every checkpoint, like the step count, and a new
wrapper (a resumed run) starts from the weights it is given.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

import numpy as np
import tensorflow as tf

# Integer types of the same width as each floating type: a bitcast reads the bits as they are.
_SAME_WIDTH = {2: tf.int16, 4: tf.int32, 8: tf.int64}
_WRAP = 1 << 64


def _bits(value: tf.Tensor):
    """`value` as int64 bit patterns, or None for a type that holds no trained weight."""
    dtype = value.dtype
    if dtype.is_floating:
        value = tf.bitcast(value, _SAME_WIDTH[dtype.size])
    elif not (dtype.is_integer or dtype == tf.bool):
        return None  # strings and resources
    return tf.cast(value, tf.int64)


def fingerprint(variables: Sequence) -> tf.Tensor:
    """The int64 sum of every element's bit pattern over `variables` (wrapping on overflow,
    which integer addition makes order-independent: the same on every device). One sum per
    variable and one over them: the step traces this for every variable, twice."""
    sums = [tf.reduce_sum(bits) for bits in map(_bits, map(tf.convert_to_tensor, variables))
            if bits is not None]
    return tf.reduce_sum(tf.stack(sums)) if sums else tf.constant(0, tf.int64)


def host_fingerprint(variables: Sequence) -> int:
    """`fingerprint`'s value computed by numpy from one read of each variable: on the host,
    eager TensorFlow operations (four per variable) cost more than the reads themselves."""
    total = 0
    for variable in variables:
        dtype = tf.as_dtype(variable.dtype)
        value = np.ascontiguousarray(variable.numpy())
        if dtype.is_floating:
            value = value.view(_SAME_WIDTH[dtype.size].as_numpy_dtype)
        elif not (dtype.is_integer or dtype == tf.bool):
            continue
        total += int(value.astype(np.int64).sum(dtype=np.int64))  # numpy wraps as TF does
    total %= _WRAP
    return total - _WRAP if total >= _WRAP // 2 else total


def _ids(variables: Iterable) -> set:
    return {id(v) for v in variables}


class WeightSeal:
    """What the private step left in the trained variables, and every other variable as the
    step found it; `inspect` says how many moves nobody accounted for."""

    def __init__(self) -> None:
        # as the step count: every replica computes the same value, the first one's stands.
        # [trained weights, optimizer state]
        first = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self._sealed = tf.Variable([0, 0], dtype=tf.int64, trainable=False,
                                   name="dp_weight_seal", aggregation=first)
        self._armed = tf.Variable(False, trainable=False, name="dp_weight_seal_armed",
                                  aggregation=first)
        self._moved = tf.Variable(0, dtype=tf.int64, trainable=False, name="dp_weights_moved",
                                  aggregation=first)
        self._moved_taken = 0
        self._pending = 0
        self._trained: List = []
        self._optimizer_state: List = []
        self._others: List = []
        self._others_sealed = None
        self._known: tuple = (set(), set())  # each part's states the step left

    @property
    def optimizer_state(self) -> list:
        """The optimizer's variables the seal watches (all but the learning rate)."""
        return self._optimizer_state

    def _now(self, trained: Sequence, optimizer_state: Sequence) -> tf.Tensor:
        return tf.stack([fingerprint(trained), fingerprint(optimizer_state)])

    # ------------------------------------------------------------------ in the step
    def check(self, trained: Sequence):
        """Before the step's gradients: counts a move of the trained weights or the
        optimizer's state since the last seal (a callback's update between two steps)."""
        changed = tf.reduce_any(tf.not_equal(self._now(trained, self._optimizer_state),
                                             self._sealed))
        moved = tf.logical_and(self._armed, changed)
        return self._moved.assign_add(tf.cast(moved, tf.int64))

    def seal(self, trained: Sequence):
        """After `apply_gradients`: what the step left."""
        with tf.control_dependencies([self._sealed.assign(
                self._now(trained, self._optimizer_state))]):
            return self._armed.assign(True)

    # ------------------------------------------------------------------ on the host
    def watch(self, variables: Sequence, trained: Sequence, optimizer,
              untouched: Iterable = ()) -> None:
        """Before each trace: the step will train `trained` with `optimizer`; every other
        variable of `variables` (the wrapped model's), except `untouched` (state that changes
        without data: Dropout's seed generators), must stay as it is. Moves under the previous
        choice are inspected first; the first call accepts the weights it is given."""
        self.inspect()
        skip = _ids(trained) | _ids(untouched)
        self._trained = list(trained)
        rate = getattr(optimizer, "_learning_rate", None)
        self._optimizer_state = [v for v in optimizer.variables if v is not rate]
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
        self.remember()
        now, others = self._host_now(), host_fingerprint(self._others)
        if (any(part not in known for part, known in zip(now, self._known))
                or others != self._others_sealed):
            self._pending += 1
        self._reseal(now, others)

    def remember(self) -> None:
        """The state the last step left joins the states a restore may bring back (when an
        epoch closes, when a file is saved: what a checkpoint can hold)."""
        if bool(self._armed.numpy()):
            for part, known in zip(self._sealed.numpy(), self._known):
                known.add(int(part))

    def take(self) -> int:
        """The moves recorded so far and not yet handed on, after inspecting the weights now."""
        self.inspect()
        found, self._pending = self._pending, 0
        return found

    def accept(self) -> None:
        """The weights and the optimizer's state as they are now are the step's: after Keras'
        own post-processing of them (`finalize_variable_values` writing an average or a
        filter's state back, SwapEMAWeights swapping the average in and out), which only
        reads what the step left, checked just before it ran."""
        self._reseal()

    def _host_now(self) -> List[int]:
        return [host_fingerprint(self._trained), host_fingerprint(self._optimizer_state)]

    def _reseal(self, now: Sequence[int] = (), others: int | None = None) -> None:
        now = list(now) or self._host_now()
        self._sealed.assign(now)
        self._armed.assign(True)
        for part, known in zip(now, self._known):
            known.add(part)
        self._others_sealed = host_fingerprint(self._others) if others is None else others


def guard(owner, method: str, seal: WeightSeal) -> None:
    """Wraps `owner.<method>`, a Keras post-processing of what the step left (the optimizer's
    `finalize_variable_values`, SwapEMAWeights' swaps): moves before it are recorded, and
    what it writes is accepted as the step's. Once per owner and seal."""
    original = getattr(owner, method)
    if getattr(original, "edp_tf_seal", None) is seal:
        return

    def guarded(*args, **kwargs):
        seal.inspect()
        result = original(*args, **kwargs)
        seal.accept()
        return result

    guarded.edp_tf_seal = seal
    object.__setattr__(owner, method, guarded)
