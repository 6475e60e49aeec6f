"""Mixin of PrivateModel: Keras' train function, traced before any data is read, with hooks
before every call, and Keras' own build kept off the private batches.

Why apart from the step: none of this is privacy arithmetic. It is where Keras' `fit` is bent
so that a ledger can make the steps it may run durable before they read data
(edp_tf/step_guard.py), and so that building the wrapper never opens a distributed iterator
over the private batches.
"""
from __future__ import annotations

import tensorflow as tf

from edp_tf import step_guard, step_inputs
from edp_tf.untracked import Untracked


class GuardedSteps:
    """`add_before_steps` hooks around Keras' train function; the wrapper built with its model."""

    def _init_guarded_steps(self) -> None:
        # called before each step call with the steps it may run (edp_tf/step_guard.py): the
        # ledger makes them durable there, after tracing and before any data is read
        self._before_steps = Untracked([])

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

    def _ensure_built(self, x) -> None:
        if not self.wrapped_model.built or not self.wrapped_model.trainable_variables:
            self.wrapped_model(step_inputs.take(x, 1), training=False)
        # The wrapper has no weights of its own: built with its model. Otherwise Keras' fit
        # traces the whole model symbolically to build it (about half a second for CLC).
        self.built = True
