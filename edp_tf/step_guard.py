"""Keras' train function, traced before it first reads data, with hooks before each call.

Why: the privacy ledger charges a step from the moment it can read the training data. Keras
traces its train function inside the first call, which then runs the first step without coming
back to Python, so from the callbacks a kill while tracing (tens of seconds for a large model)
looks like a kill inside the first step. `traced_first` traces the function on the iterator's
type alone (`get_concrete_function`: no element is read, no variable changes) and only then runs
the hooks (`PrivacyLedger` makes the steps about to run durable there) and the step. Later calls
reuse that trace; a retrace (a new train function: `freeze_until`) is traced first again.

Where Keras' function does not hold the traced step under the expected name (another Keras
version), the hooks still run before every call and tracing is charged as part of the first
step: safe, only coarser.
"""
from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

# the tf.function inside Keras 3's train function that takes the iterator
_INNER = "multi_step_on_iterator"


def _inner_function(function: Callable) -> Optional[object]:
    """Keras' traced iterator step held by `function`'s closure, or None."""
    names = getattr(getattr(function, "__code__", None), "co_freevars", ())
    cells = getattr(function, "__closure__", None) or ()
    inner = dict(zip(names, (c.cell_contents for c in cells))).get(_INNER)
    return inner if hasattr(inner, "get_concrete_function") else None


def traced_first(function: Callable, hooks: Callable[[], tuple],
                 steps_per_call: Callable[[], int]) -> Callable:
    """`function(iterator)` that traces before its first step, then before every call runs
    each of `hooks()` with the number of steps the call may run (`steps_per_call()`)."""
    inner = _inner_function(function)
    traced = [inner is None]

    def call(iterator):
        if not traced[0] and isinstance(iterator, (tf.data.Iterator,
                                                   tf.distribute.DistributedIterator)):
            inner.get_concrete_function(iterator)  # shapes and dtypes only: reads no element
        traced[0] = True
        steps = int(steps_per_call())
        for hook in hooks():
            hook(steps)
        return function(iterator)

    call.traced_first = True
    return call
