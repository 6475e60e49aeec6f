"""Projection of the noisy update onto a subspace of public gradients (PDP-SGD, Zhou et al. 2021;
GEP, Yu et al. 2021, without its separately noised residual).

Why: the Gaussian noise has the same energy in every one of the d trained directions (z C sqrt(d)
in norm), while the clipped examples' sum lies mostly in a few directions, and public examples'
gradients at the same weights span many of them. Keeping only the top `rank` directions of the
public gradients keeps the share of the signal that lies in them and rank / d of the noise's
energy. The signal outside the subspace is lost: a bias traded for less noise.

Privacy: the projection reads the released noisy sum, the current weights (themselves released by
earlier steps) and public examples only, so it is post-processing: the step's Gaussian mechanism,
its sensitivity and epsilon are unchanged. It holds only if the examples are public (never the
private training data): epsilon treats them so, and the ledger says it.
"""
from __future__ import annotations

from typing import Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from edp_tf import checks, clipping, microbatch


def top_directions(gradients: tf.Tensor, rank: int) -> tf.Tensor:
    """[m, d] public per-example gradients -> [d, rank] orthonormal columns: their top `rank`
    right singular vectors, from the m x m Gram matrix (m << d, so no d x d matrix is formed).

    Directions with a singular value of zero (fewer independent gradients than `rank`) come out
    as zero columns: they project nothing, rather than an arbitrary direction.
    """
    g = tf.cast(gradients, tf.float64)  # the Gram matrix squares the condition number
    m = int(g.shape[0])
    if not 1 <= rank <= m:
        raise ValueError(f"rank must be between 1 and the {m} public gradients, got {rank}")
    eigenvalues, eigenvectors = tf.linalg.eigh(tf.matmul(g, g, transpose_b=True))  # ascending
    eigenvalues = tf.reverse(eigenvalues, [0])[:rank]
    eigenvectors = tf.reverse(eigenvectors, [1])[:, :rank]
    tiny = 1e-10 * tf.maximum(eigenvalues[0], 1e-300)
    inverse_sv = tf.where(eigenvalues > tiny, tf.math.rsqrt(tf.maximum(eigenvalues, tiny)),
                          tf.zeros_like(eigenvalues))
    return tf.cast(tf.matmul(g, eigenvectors * inverse_sv, transpose_a=True), gradients.dtype)


def flatten(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """One vector of every tensor's entries, in order."""
    return tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)


def flatten_stacked(stacked: Sequence[tf.Tensor]) -> tf.Tensor:
    """[m, d] from per-variable stacks [m, ...], the columns in `flatten`'s order."""
    return tf.concat([tf.reshape(tf.cast(s, tf.float32), [tf.shape(s)[0], -1])
                      for s in stacked], 1)


def project(updates: Sequence[tf.Tensor], basis: tf.Tensor) -> list:
    """B B^T u for the concatenated update u, split back into the updates' shapes and dtypes."""
    flat = flatten(updates)
    projected = tf.linalg.matvec(basis, tf.linalg.matvec(basis, flat, transpose_a=True))
    sizes = [u.shape.num_elements() for u in updates]
    if None in sizes:
        raise ValueError("projection needs updates of static shape")
    parts = tf.split(projected, sizes)
    return [tf.cast(tf.reshape(p, tf.shape(u)), u.dtype) for p, u in zip(parts, updates)]


class PublicSubspace:
    """The basis B of the projection, refreshed from public examples every `every_steps`
    optimizer steps (and at the first step of each `fit`: the basis is not checkpointed).

    Each public example's gradient at the current weights is clipped to `l2_norm_clip` like a
    private one, so no single public example dominates the directions. Memory: the [m, d]
    public gradients while refreshing and the [d, rank] basis (d trained weights).

    `source` names where the examples come from (a corpus, its split, how many), so that the
    privacy statement says what it treats as public; free text, not checked.
    """

    def __init__(self, x, y, rank: int, every_steps: int = 1, sample_weight=None,
                 chunk: int = 64, source: Optional[str] = None):
        self.source = None if source is None else str(source)
        self.rank = checks.count("rank", rank, 1)
        self.every_steps = checks.count("every_steps", every_steps, 1)
        self.chunk = checks.count("chunk", chunk, 1)
        self._x, self._y = x, y
        self.examples = int(np.shape(tf.nest.flatten(x)[0])[0])
        if self.examples < self.rank:
            raise ValueError(f"rank={rank} needs at least as many public examples, got "
                             f"{self.examples}")
        self._w = (np.ones(self.examples, np.float32) if sample_weight is None
                   else np.asarray(sample_weight, np.float32).reshape(-1))
        self.basis: Optional[tf.Variable] = None
        self._gradients = None
        self._device = None
        self._refreshed_at: Optional[int] = None

    planned = True

    def build(self, model, loss_fn, variables: Sequence, l2_norm_clip: float, strategy) -> None:
        """The basis variable (zeros: nothing passes until the first refresh) and the traced
        public-gradient function, for the variables the step trains."""
        device = (strategy.extended.worker_devices[0] if hasattr(strategy, "extended")
                  else None)
        d = sum(int(np.prod(v.shape)) for v in variables)
        if self.basis is None or tuple(self.basis.shape) != (d, self.rank):
            with strategy.scope():
                self.basis = tf.Variable(tf.zeros([d, self.rank]), trainable=False,
                                         name="public_subspace_basis")
        clip = float(l2_norm_clip)

        def clipped_gradients(x, y, w):
            grads, _, _ = microbatch.stacked_microbatch_gradients(
                model, loss_fn, variables, x, y, w, 1, 1.0)
            flat = flatten_stacked(grads)
            factors, _ = clipping.clip_factors(tf.norm(flat, axis=1), clip)  # NaN/Inf rows -> 0
            return flat * factors[:, None]

        self._gradients = tf.function(clipped_gradients, autograph=False)
        self._device = device
        self._refreshed_at = None  # new variables or a new fit: refresh at the next step

    def refresh_if_due(self, step: int) -> bool:
        if self._refreshed_at is not None and step - self._refreshed_at < self.every_steps:
            return False
        self.refresh()
        self._refreshed_at = step
        return True

    def refresh(self) -> None:
        """B = the top `rank` directions of the public examples' clipped gradients now."""
        if self._gradients is None:
            raise RuntimeError("PublicSubspace.build must run before refresh")
        rows = []
        m, c = self.examples, self.chunk
        with tf.device(self._device):
            for start in range(0, m, c):
                index = np.arange(start, start + c) % m  # the last chunk wraps around ...
                w = np.where(np.arange(start, start + c) < m, self._w[index], 0.0)  # ... at w 0
                x, y = tf.nest.map_structure(lambda t: np.asarray(t)[index], (self._x, self._y))
                rows.append(self._gradients(x, y, w.astype(np.float32))[:min(c, m - start)])
            self.basis.assign(top_directions(tf.concat(rows, 0), self.rank))

    def project(self, updates: Sequence[tf.Tensor]) -> list:
        return project(updates, self.basis)

    @property
    def stage(self):
        """Stage 5's projection (edp_tf/post_processing.py)."""
        return self.project

    def callbacks(self, optimizer) -> list:
        return [RefreshCallback(self, optimizer)]

    def facts(self) -> dict:
        return {"rank": self.rank, "every_steps": self.every_steps,
                "public_examples": self.examples, "source": self.source}

    def not_covered(self) -> list:
        """The statement's sentence: the examples are treated as public."""
        return [f"Each update was projected onto {self.rank} directions of the gradients of "
                f"{self.examples} examples declared public (post-processing)"
                + (f", from {self.source}" if self.source else "")
                + ": epsilon treats those examples as public."]


class NoProjection:
    """The default: stage 5 keeps the release as it is, and nothing is declared public."""

    planned = False
    stage = None

    def build(self, model, loss_fn, variables, l2_norm_clip, strategy) -> None:
        pass

    def callbacks(self, optimizer) -> list:
        return []

    def facts(self) -> None:
        return None

    def not_covered(self) -> list:
        return []


class RefreshCallback(keras.callbacks.Callback):
    """Refreshes `subspace` before the steps it is due at, counted from the optimizer's step
    count when `fit` starts (so a resumed run refreshes on the same schedule) without reading
    the device's counter at every step."""

    def __init__(self, subspace: PublicSubspace, optimizer):
        super().__init__()
        self._subspace, self._optimizer = subspace, optimizer
        self._step = 0

    def on_train_begin(self, logs=None):
        self._step = int(self._optimizer.iterations.numpy())

    def on_train_batch_begin(self, batch, logs=None):
        self._subspace.refresh_if_due(self._step)
        self._step += 1
