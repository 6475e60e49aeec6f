"""Gaussian noise drawn on each replica, independently.

Why a `tf.random.Generator` created in the strategy's scope: it is the one source measured to give
independent streams per replica that advance at every call (STACK-FACTS.md). `keras.random` with a
SeedGenerator and op-level seeds give the *same* noise on every replica, which would make the
summed noise sqrt(N) times larger than intended in one direction and correlated in another: the
tests check independence through the variance of the summed update.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import tensorflow as tf


def make_generator(seed: Optional[int]) -> tf.random.Generator:
    """A generator seeded from OS entropy unless `seed` is given (then the run is not private).

    Create it inside `strategy.scope()` so that each replica gets its own stream.
    """
    if seed is None:
        return tf.random.Generator.from_non_deterministic_state()
    return tf.random.Generator.from_seed(seed)


def per_replica_stddev(
    noise_multiplier: tf.Tensor,
    l2_norm_clip: float,
    sensitivity: int,
    replicas: int,
    noise_mode: str,
) -> tf.Tensor:
    """Std of the noise one replica adds to its *sum* of clipped micro-batch gradients.

    calibrated: z_t * S / sqrt(N), so the N independent draws sum to exactly z_t * S.
    paper: Algorithm 1 adds y/N, y ~ N(0, (C z_t)^2), to each replica's mean-level update; with one
      micro-batch per replica the mean-level and sum-level updates coincide up to the 1/N of the
      final average, so in the sum space each replica adds z_t * C / N (summed: z_t C / sqrt(N)).
    """
    z = tf.cast(noise_multiplier, tf.float32)
    if noise_mode == "calibrated":
        return z * (sensitivity * l2_norm_clip / math.sqrt(replicas))
    if noise_mode == "paper":
        return z * (l2_norm_clip / replicas)
    raise ValueError(f"noise_mode must be 'calibrated' or 'paper', got {noise_mode!r}")


def add_noise(
    tensors: Sequence[tf.Tensor], stddev: tf.Tensor, generator: tf.random.Generator
) -> list:
    """t + N(0, stddev^2 I), one draw per tensor in its own dtype."""
    return [
        t + generator.normal(tf.shape(t), dtype=t.dtype) * tf.cast(stddev, t.dtype)
        for t in tensors
    ]
