"""Clipping of micro-batch gradients in the per-layer scaled space.

The pipeline on one replica is `scale -> clip (and sum) -> + noise -> to_update`, each a small
function (edp_tf/microbatch.py holds the gradients and calls these; the sensitivity S they imply is
stated once, in edp_tf/mechanism.py).
A micro-batch gradient g_j (one tensor per trainable variable k) is scaled to s_jk = g_jk / alpha_k,
the whole vector s_j is clipped to L2 norm C, and the clipped vectors are summed. Each clipped
contribution has norm <= C, so adding or removing one micro-batch moves the sum by at most C
(sensitivity C per micro-batch; 2C per example when a micro-batch holds several examples, because
the example can change one micro-batch's contribution from c to c' with ||c - c'|| <= 2C).

A micro-batch whose gradient is NaN/Inf contributes exactly zero: it is counted, never applied.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import tensorflow as tf


class ClipResult(NamedTuple):
    clipped_sum: list  # per variable: sum_j c_jk (scaled space)
    norms: tf.Tensor  # [m] pre-clip norms of the scaled micro-batch gradients
    finite: tf.Tensor  # [m] bool, False for NaN/Inf micro-batches (they contribute zero)
    counts: Optional[list] = None  # sparse embedding noise: per table, the clipped row counts


def scale(grads: Sequence[tf.Tensor], alpha: Sequence[float]) -> list:
    """s_k = g_k / alpha_k (alpha are Python floats: constants of the compiled step)."""
    return [g if a == 1.0 else g * tf.cast(1.0 / a, g.dtype) for g, a in zip(grads, alpha)]


def unscale(grads: Sequence[tf.Tensor], alpha: Sequence[float]) -> list:
    """g_k = alpha_k * s_k (IndexedSlices stay sparse: sparse embedding noise)."""
    def times(g, a):
        if a == 1.0:
            return g
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values * tf.cast(a, g.values.dtype), g.indices,
                                    g.dense_shape)
        return g * tf.cast(a, g.dtype)

    return [times(g, a) for g, a in zip(grads, alpha)]


def to_update(noisy_sum: Sequence[tf.Tensor], alpha: Sequence[float], denominator: float) -> list:
    """alpha_k * (clipped sum + noise)_k / D: unscaling and the normalisation by the expected
    number of micro-batches D in one multiply per variable."""
    return unscale(noisy_sum, [a / denominator for a in alpha])


def clip_factors(norms: tf.Tensor, l2_norm_clip: float):
    """(f, finite): f_j = min(1, C / ||s_j||), and 0 where the norm is NaN/Inf."""
    finite = tf.math.is_finite(norms)
    safe = tf.where(finite, norms, tf.zeros_like(norms))
    factors = tf.where(finite, tf.minimum(1.0, l2_norm_clip / tf.maximum(safe, 1e-30)),
                       tf.zeros_like(norms))
    return factors, finite


def stacked_squared_norms(stacked: Sequence[tf.Tensor]) -> list:
    """[m] squared L2 norm of each micro-batch's slice of each stacked tensor [m, ...]."""
    return [tf.reduce_sum(tf.reshape(tf.square(tf.cast(s, tf.float32)), [tf.shape(s)[0], -1]), 1)
            for s in stacked]


def per_layer_factors(squared_norms: Sequence[tf.Tensor], l2_norm_clip: float,
                      finite: tf.Tensor) -> list:
    """Per-layer clipping: variable k's part of micro-batch j is clipped to C / sqrt(K) on its
    own, so the whole clipped vector still has norm <= C (the sensitivity is flat clipping's);
    with per-layer scales alpha the budgets are alpha_k C / sqrt(K) in gradient space.
    [m] factors per variable, 0 for a non-finite micro-batch."""
    budget = l2_norm_clip / math.sqrt(len(squared_norms))
    keep = tf.cast(finite, tf.float32)
    return [clip_factors(tf.sqrt(sq), budget)[0] * keep for sq in squared_norms]


def factor_of(factors, k: int) -> tf.Tensor:
    """The [m] factors of variable k: one vector for all (flat clipping) or one per variable."""
    return factors[k] if isinstance(factors, (list, tuple)) else factors


def weighted_sum(stacked: Sequence[tf.Tensor], factors, finite: tf.Tensor) -> list:
    """sum_j f_j s_j per stacked tensor, with non-finite micro-batches contributing exactly 0
    (factors: [m], or one [m] per tensor)."""
    result = []
    for k, s in enumerate(stacked):
        s_finite = tf.where(
            tf.reshape(finite, [-1] + [1] * (s.shape.rank - 1)), s, tf.zeros_like(s))
        result.append(tf.tensordot(tf.cast(factor_of(factors, k), s.dtype), s_finite, axes=1))
    return result
