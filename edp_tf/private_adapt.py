"""Preprocessing fitted to the private data with differential privacy, charged as a release
before the first step: a `Normalization`'s mean and variance from a Gaussian query, a
`TextVectorization`'s vocabulary by Gaussian partition selection.

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
import tensorflow as tf

from edp_tf import accounting, checks, partition_selection

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

    def adapt(self, x, delta: float = 0.0, rng=None) -> accounting.ExtraEvent:
        """Sets the layer's mean and variance from `x` ([n, d], the layer's input) with DP, and
        returns the release to charge (`delta`: unused, a Gaussian spends none of it).
        `rng`: numpy's generator; default from OS entropy."""
        del delta
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


@dataclasses.dataclass(frozen=True)
class PrivateVocabulary:
    """`layer` (a keras TextVectorization on the model's string input) given the vocabulary
    selected with DP: each example counts at most `max_tokens_per_example` of its distinct
    tokens (as the layer splits them), the counts get N(0, noise_stddev^2) and the tokens above
    a threshold that spends `delta_share` of the run's delta are kept
    (edp_tf/partition_selection.py, the mechanism of the label sets). Only the set is released,
    in sorted order, never the counts."""

    layer: keras.layers.TextVectorization
    max_tokens_per_example: int = 8
    noise_stddev: float = 5.0
    delta_share: float = 0.1

    def __post_init__(self) -> None:
        if not isinstance(self.layer, keras.layers.TextVectorization):
            raise ValueError(f"PrivateVocabulary sets a keras TextVectorization's vocabulary, "
                             f"got {type(self.layer).__name__}")
        checks.count("PrivateVocabulary max_tokens_per_example", self.max_tokens_per_example, 1)
        checks.number("PrivateVocabulary noise_stddev", self.noise_stddev, 0.0, True)
        checks.number("PrivateVocabulary delta_share", self.delta_share, 0.0, True, 1.0, True)

    @property
    def event_name(self) -> str:
        return f"vocabulary_selection:{self.layer.name}"

    def mechanism(self, delta: float) -> partition_selection.GaussianThresholding:
        return partition_selection.GaussianThresholding.for_delta(
            self.noise_stddev, self.max_tokens_per_example, delta * self.delta_share)

    def adapt(self, x, delta: float, rng=None) -> accounting.ExtraEvent:
        """Sets the layer's vocabulary from the strings `x` with DP, spending `delta_share` of
        `delta` on the threshold; returns the release to charge."""
        del rng  # partition_selection draws from OS entropy
        tokens = self.layer._preprocess(tf.constant(np.asarray(x).reshape(-1), tf.string))
        contributions = [[t for t in row] for row in tokens.to_list()]
        mechanism = self.mechanism(delta)
        selected = sorted(partition_selection.select_partitions(contributions, mechanism))
        limit = self.layer._max_tokens
        if limit is not None:  # room for the padding and out-of-vocabulary tokens
            selected = selected[:max(0, limit - 2)]
        self.layer.set_vocabulary([t.decode() if isinstance(t, bytes) else t for t in selected])
        return mechanism.extra_event(self.event_name)


def takes_the_model_input(model, layer) -> bool:
    """The layer is applied to one of the model's inputs, so its input rows are `x`'s."""
    try:
        inputs = list(keras.tree.flatten(layer.input))
    except (AttributeError, ValueError):
        return False
    return any(i is m for i in inputs for m in keras.tree.flatten(model.inputs))
