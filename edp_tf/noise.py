"""Gaussian noise drawn on each replica, independently.

Why a `tf.random.Generator` created in the strategy's scope: it is the one source measured to give
independent streams per replica that advance at every call (docs/benchmarks.md). `keras.random`
with a SeedGenerator and op-level seeds give the *same* noise on every replica, which would make the
summed noise sqrt(N) times larger than intended in one direction and correlated in another: the
tests check independence through the variance of the summed update.
"""
from __future__ import annotations

import math
import secrets
from typing import Optional, Sequence

import tensorflow as tf


def make_generator(seed: Optional[int], secure: bool = False):
    """A generator seeded from OS entropy unless `seed` is given (then the run is not private);
    `secure`: a `SecureNormal` (DPConfig.secure_noise).

    Create it inside `strategy.scope()` so that each replica gets its own stream.
    """
    if secure:
        if seed is not None:
            raise ValueError("secure noise takes its seed from the OS's CSPRNG: no fixed seed")
        return SecureNormal()
    if seed is None:
        return tf.random.Generator.from_non_deterministic_state()
    return tf.random.Generator.from_seed(seed)


# Gaussian draws summed per secure sample (Opacus' secure_mode sums as many)
SECURE_DRAWS = 4


class SecureNormal:
    """Opacus' `secure_mode` for TensorFlow: what the step asks of its generator (`normal`),
    hardened against the two known ways to predict or invert DP noise.

    * The seed: TensorFlow's `from_non_deterministic_state` seeds each generator from a
      process-wide Mersenne Twister (itself seeded once by the OS), which is not a
      cryptographic generator. Here the whole Philox state (its 64-bit key and 128-bit
      counter) comes from `secrets` (the OS's CSPRNG), with nothing in between.
    * The floating-point attack on the Gaussian (Holohan and Braghin 2021; Jin et al. 2022): a
      single sampled float has a sparse, input-dependent set of possible values, so the noisy
      release can reveal the exact value under it. Each sample is the sum of `SECURE_DRAWS`
      independent standard normals divided by sqrt(SECURE_DRAWS) (exactly N(0, 1) in
      distribution), whose possible values are dense, as in Opacus (which sums 4).
    The cost is `SECURE_DRAWS` times the Gaussian draws of a step (docs/benchmarks.md).
    """

    def __init__(self) -> None:
        state = [secrets.randbits(63) for _ in range(3)]  # Philox: 2 counter words, 1 key
        self.generator = tf.random.Generator.from_state(state, alg="philox")

    def normal(self, shape, dtype=tf.float32) -> tf.Tensor:
        total = self.generator.normal(shape, dtype=dtype)
        for _ in range(SECURE_DRAWS - 1):
            total += self.generator.normal(shape, dtype=dtype)
        return total * tf.cast(1.0 / math.sqrt(SECURE_DRAWS), dtype)


def noise_owners(sizes: Sequence[int], replicas: int) -> tuple:
    """The replica that draws each variable's noise: the largest variables first, each to the
    replica with the fewest entries so far (balanced draws)."""
    load = [0] * replicas
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owners[i] = min(range(replicas), key=lambda r: load[r])
        load[owners[i]] += sizes[i]
    return tuple(owners)


def add_owned_noise(
    tensors: Sequence[tf.Tensor], stddev: tf.Tensor, generator: tf.random.Generator,
    owners: Sequence[int], replicas: int,
) -> list:
    """Each variable's noise drawn once, on its owner replica, with std sqrt(N) * stddev.

    Why: the replicas' SUM then carries N(0, N stddev^2) per entry, exactly the distribution of N
    independent per-replica draws of std `stddev` (docs/design.md, noise on each replica: the summed
    noise is what the accountant sees), with 1/N of the Gaussian draws (BERT's 9.5M-entry embedding
    noise is most of eDP's extra time on CPU). The draw happens inside a `tf.cond`, so other
    replicas skip it.
    """
    if replicas == 1:
        return add_noise(tensors, stddev, generator)
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    owner_std = tf.cast(stddev, tf.float32) * math.sqrt(replicas)
    out = []
    for t, owner in zip(tensors, owners):
        def draw(t=t):
            return t + generator.normal(tf.shape(t), dtype=t.dtype) * tf.cast(owner_std, t.dtype)
        out.append(tf.cond(tf.equal(replica, owner), draw, lambda t=t: t))
    return out


def add_noise(
    tensors: Sequence[tf.Tensor], stddev: tf.Tensor, generator: tf.random.Generator
) -> list:
    """t + N(0, stddev^2 I), one draw per tensor in its own dtype."""
    return [
        t + generator.normal(tf.shape(t), dtype=t.dtype) * tf.cast(stddev, t.dtype)
        for t in tensors
    ]


def banded_histories(variables: Sequence[tf.Variable], bands: int) -> list:
    """One [b - 1, *shape] zero state per variable: the last b - 1 BandMF noise vectors.

    Created inside `strategy.scope()` (ON_READ, each replica reads and writes its own copy:
    the owner's holds the variable's history, the others stay zero) and held by the caller
    outside any tracking, so that no checkpoint or SavedModel contains them (docs/privacy.md:
    the past noise together with the released updates gives the clipped sums away).
    """
    return [tf.Variable(tf.zeros([bands - 1] + list(v.shape), v.dtype), trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM,
                        name="bandmf_noise_history")
            for v in variables]


def add_owned_banded_noise(
    tensors: Sequence[tf.Tensor], stddev: tf.Tensor, generator: tf.random.Generator,
    owners: Sequence[int], replicas: int, histories: Sequence[tf.Variable],
    coefficients: Sequence[float],
) -> list:
    """BandMF's correlated noise, drawn as `add_owned_noise` draws (once, on the owner, std
    sqrt(N) x stddev): y_t = (z_t - sum_{k=1}^{b-1} c_k y_{t-k}) / c_0 with fresh z_t, the
    owner's history shifted by one (edp_tf/bandmf.py: y = C^{-1} z)."""
    c = [float(v) for v in coefficients]
    replica = (None if replicas == 1
               else tf.distribute.get_replica_context().replica_id_in_sync_group)
    owner_std = tf.cast(stddev, tf.float32) * math.sqrt(replicas)
    out = []
    for t, owner, history in zip(tensors, owners, histories):
        def draw(t=t, history=history):
            z = generator.normal(tf.shape(t), dtype=t.dtype) * tf.cast(owner_std, t.dtype)
            past = history.read_value()  # y_{t-1}, ..., y_{t-b+1}
            y = (z - tf.tensordot(tf.constant(c[1:], t.dtype), past, axes=1)) / c[0]
            shift = history.assign(tf.concat([y[None], past[:-1]], axis=0))
            with tf.control_dependencies([shift]):
                return t + y
        out.append(draw() if replica is None
                   else tf.cond(tf.equal(replica, owner), draw, lambda t=t: t))
    return out
