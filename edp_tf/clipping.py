"""Clipping of micro-batch gradients in the per-layer scaled space.

The pipeline on one replica is `scale -> clip (and sum) -> + noise -> unscale`, each a small function.
A micro-batch gradient g_j (one tensor per trainable variable k) is scaled to s_jk = g_jk / alpha_k,
the whole vector s_j is clipped to L2 norm C, and the clipped vectors are summed. Each clipped
contribution has norm <= C, so adding or removing one micro-batch moves the sum by at most C
(sensitivity C per micro-batch; 2C per example when a micro-batch holds several examples, because
the example can change one micro-batch's contribution from c to c' with ||c - c'|| <= 2C).

A micro-batch whose gradient is NaN/Inf contributes exactly zero: it is counted, never applied.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import tensorflow as tf


def sensitivity_factor(examples_per_microbatch: int) -> int:
    """S in units of C under add/remove adjacency (DESIGN.md 2.2)."""
    return 1 if examples_per_microbatch == 1 else 2


class ClipResult(NamedTuple):
    clipped_sum: list  # per variable: sum_j c_jk (scaled space)
    norms: tf.Tensor  # [m] pre-clip norms of the scaled micro-batch gradients
    finite: tf.Tensor  # [m] bool, False for NaN/Inf micro-batches (they contribute zero)


def scale(grads: Sequence[tf.Tensor], alpha: Sequence[float]) -> list:
    """s_k = g_k / alpha_k (alpha are Python floats: constants of the compiled step)."""
    return [g if a == 1.0 else g * tf.cast(1.0 / a, g.dtype) for g, a in zip(grads, alpha)]


def unscale(grads: Sequence[tf.Tensor], alpha: Sequence[float]) -> list:
    """g_k = alpha_k * s_k."""
    return [g if a == 1.0 else g * tf.cast(a, g.dtype) for g, a in zip(grads, alpha)]


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


def weighted_sum(stacked: Sequence[tf.Tensor], factors: tf.Tensor, finite: tf.Tensor) -> list:
    """sum_j f_j s_j per stacked tensor, with non-finite micro-batches contributing exactly 0."""
    result = []
    for s in stacked:
        s_finite = tf.where(
            tf.reshape(finite, [-1] + [1] * (s.shape.rank - 1)), s, tf.zeros_like(s))
        result.append(tf.tensordot(tf.cast(factors, s.dtype), s_finite, axes=1))
    return result


def clip_and_sum(stacked: Sequence[tf.Tensor], l2_norm_clip: float) -> ClipResult:
    """Clips each micro-batch (leading axis m) to norm C and sums them.

    Sensitivity: each summand has norm <= C, whatever the inputs (NaN/Inf rows give zero).
    """
    norms = tf.sqrt(tf.add_n(stacked_squared_norms(stacked)))
    factors, finite = clip_factors(norms, l2_norm_clip)
    return ClipResult(weighted_sum(stacked, factors, finite), norms, finite)


def clip_single(grads: Sequence[tf.Tensor], l2_norm_clip: float) -> ClipResult:
    """`clip_and_sum` for one micro-batch without stacking (the eDP fast path).

    One multiply per variable: multiply_no_nan gives exactly 0 for a non-finite gradient when the
    factor is 0, without a select over the whole gradient.
    """
    # l2_loss is one fused pass (sum of squares / 2), no squared temporary.
    sq = [2.0 * tf.nn.l2_loss(tf.cast(g, tf.float32)) for g in grads]
    norm = tf.sqrt(tf.add_n(sq))
    factor, finite = clip_factors(norm, l2_norm_clip)
    clipped = [tf.math.multiply_no_nan(g, tf.cast(factor, g.dtype)) for g in grads]
    return ClipResult(clipped, norm[None], finite[None])
