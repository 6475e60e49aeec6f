"""Preprocessing fitted to the private data with differential privacy: a `Normalization`'s mean
and variance from a Gaussian query, charged as a release before the first step.

Why a query of its own: `Normalization.adapt` computes exact statistics of the training data,
which no clipping or noise covers and which every saved model carries. Here each example's
features are clipped to [low, high] (the bounds are the user's, chosen without looking at the
data), the per-feature sums of x and of x^2 are released with Gaussian noise scaled to their
joint sensitivity, and the mean and variance follow from them and the public n
(post-processing). The release is one Gaussian query without sampling, charged to the ledger
beside the steps (`make_private(..., private_adapt=[...])`).
"""
from __future__ import annotations

import dataclasses
import math
import secrets

import keras
import numpy as np

from edp_tf import accounting, checks

# the variance is floored here after the noise (post-processing): a negative or zero estimate
# would make the layer divide by ~0
VARIANCE_FLOOR = 1e-4


@dataclasses.dataclass(frozen=True)
class PrivateNormalization:
    """`layer` (a keras Normalization on the model's input, features on its last axis) adapted
    to the training data with DP: features clipped to [low, high], the sums released with noise
    of `noise_multiplier` times their sensitivity."""

    layer: keras.layers.Normalization
    low: float
    high: float
    noise_multiplier: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.layer, keras.layers.Normalization):
            raise ValueError(f"PrivateNormalization adapts a keras Normalization layer, got "
                             f"{type(self.layer).__name__}")
        low = checks.number("PrivateNormalization low", self.low)
        high = checks.number("PrivateNormalization high", self.high)
        if not low < high:
            raise ValueError(f"PrivateNormalization needs low < high, got [{low}, {high}]")
        checks.number("PrivateNormalization noise_multiplier", self.noise_multiplier, 0.0, True)

    @property
    def event_name(self) -> str:
        return f"normalization_adapt:{self.layer.name}"

    def sensitivity(self, features: int) -> float:
        """L2 sensitivity of (sum x, sum x^2) over `features` clipped features, for adding or
        removing one example: sqrt(d (m^2 + m^4)), m = max(|low|, |high|)."""
        m = max(abs(self.low), abs(self.high))
        return math.sqrt(features * (m ** 2 + m ** 4))

    def adapt(self, x, rng=None) -> accounting.ExtraEvent:
        """Sets the layer's mean and variance from `x` ([n, d], the layer's input) with DP, and
        returns the release to charge. `rng`: numpy's generator; default from OS entropy."""
        x = np.asarray(x, np.float64)
        axis = tuple(self.layer.axis) if self.layer.axis is not None else ()
        if x.ndim != 2 or axis not in ((-1,), (1,)):
            raise ValueError(
                f"PrivateNormalization {self.layer.name!r}: takes rows of features ([n, d], "
                f"axis=-1), got input of shape {x.shape} and axis={self.layer.axis}")
        n, d = x.shape
        rng = rng if rng is not None else np.random.default_rng(secrets.randbits(128))
        clipped = np.clip(x, self.low, self.high)
        std = self.noise_multiplier * self.sensitivity(d)
        first = clipped.sum(axis=0) + rng.normal(0.0, std, d)
        second = (clipped ** 2).sum(axis=0) + rng.normal(0.0, std, d)
        mean = np.clip(first / n, self.low, self.high)
        bound = max(abs(self.low), abs(self.high)) ** 2
        variance = np.clip(second / n - mean ** 2, VARIANCE_FLOOR, bound)
        if not self.layer.built:
            self.layer.build((None, d))
        self.layer.adapt_mean.assign(mean.astype(np.float32))
        self.layer.adapt_variance.assign(variance.astype(np.float32))
        self.layer.finalize_state()
        return accounting.ExtraEvent(self.event_name, self.noise_multiplier)


def takes_the_model_input(model, layer) -> bool:
    """The layer is applied to one of the model's inputs, so its input rows are `x`'s."""
    try:
        inputs = list(keras.tree.flatten(layer.input))
    except (AttributeError, ValueError):
        return False
    return any(i is m for i in inputs for m in keras.tree.flatten(model.inputs))
