"""A holder that Keras' and TensorFlow's tracking do not see.

Why: a checkpoint or SavedModel of the wrapper must not hold the noise generator's state (it
would predict the next draws and recompute past ones) nor BandMF's noise history (with the
released updates it gives the clipped sums away); hooks and listeners are no state at all.
"""
from __future__ import annotations


class Untracked:
    """A plain holder: tracking sees neither it nor what it holds."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value
