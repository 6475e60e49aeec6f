"""Sparsity-preserving embedding noise (DP-AdaFEST, Ghazi et al., NeurIPS 2023).

Why: dense DP noise touches every row of an embedding table at every step (BERT's 30522 x 384
token table is most of eDP's extra time on CPU), although a batch uses a few thousand rows. Per
step, for the embedding tables only:
  1. each micro-batch j says which rows its gradient touches (u_j, over all tables at once) and
     contributes f_j = min(1, C1 / sqrt(|u_j|)) to each: its count vector has norm <= C1;
  2. the replicas' summed counts get Gaussian noise of std z_c S C1 (S as for the gradient);
  3. rows whose noisy count exceeds the threshold tau (a number of count-noise stds) are
     selected, the same rows everywhere: the noisy counts are all-reduced before the comparison;
  4. the clipped gradient sum keeps its selected rows only, and noise is drawn for those rows
     only; every other row's update is exactly 0.

Privacy: one step releases (noisy counts, noisy selected gradient rows), both on the same Poisson
sample. For fixed neighbouring samples it is an adaptive composition of two Gaussian mechanisms
with sensitivities S C1 and S C (the gradient projected on a released set of rows moves by no
more than the whole one) and noise z_c S C1 and z_t S C: by the composition of Gaussian
differential privacy (Dong, Roth, Su 2019) it is dominated by one Gaussian of multiplier
z_joint = (z_t^-2 + z_c^-2)^-1/2, and Poisson subsampling of a mechanism dominated by that pair
is accounted as the subsampled Gaussian of z_joint (Zhu, Dong, Wang 2022). The accountant charges
z_joint per step (`edp_tf.mechanism.joint_noise_multiplier`); nothing else changes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import keras
import tensorflow as tf

from edp_tf import checks, ghost


@dataclasses.dataclass(frozen=True)
class RowSelection:
    """The selection's constants in a traced step.

    Attributes:
      indices: positions (in the trainable variables) of the embedding tables it covers.
      clip: C1, the bound on a micro-batch's count vector (L2, over all tables).
      noise_std: per-replica std of the count noise, so that the replicas' SUM carries z_c S C1.
      threshold: tau, in counts (DPConfig.selection_threshold x the summed count-noise std): a
        row is updated when its noisy count exceeds it.
    """

    indices: tuple
    clip: float
    noise_std: float
    threshold: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(int(i) for i in self.indices))
        if not self.indices:
            raise ValueError("RowSelection needs at least one embedding table")
        checks.number("selection clip", self.clip, 0.0, True)
        checks.number("selection noise std", self.noise_std, 0.0)
        checks.number("selection threshold", self.threshold)


def embedding_table_indices(model, variables: Sequence) -> tuple:
    """Positions in `variables` of the tables of the model's `Embedding` layers (keras-hub's
    `ReversibleEmbedding` and `TokenAndPositionEmbedding` parts included)."""
    tables = {id(layer.embeddings) for layer in ghost.flatten_layers(model)
              if isinstance(layer, keras.layers.Embedding) and hasattr(layer, "embeddings")}
    return tuple(i for i, v in enumerate(variables) if id(v) in tables)


def rows_of_dense(g: tf.Tensor) -> tf.Tensor:
    """[m, rows] 1.0 where a stacked [m, rows, ...] gradient has a nonzero row, else 0."""
    flat = tf.reshape(g, [tf.shape(g)[0], tf.shape(g)[1], -1])
    return tf.cast(tf.reduce_any(tf.not_equal(flat, 0), axis=2), tf.float32)


def rows_of_gather(ids: tf.Tensor, dz: tf.Tensor, rows: int) -> tf.Tensor:
    """[m, rows] 1.0 for the ids of micro-batch j whose output gradient is nonzero (padding
    rows of a Poisson batch have dz = 0: they touch nothing)."""
    m = tf.shape(ids)[0]
    used = tf.reduce_any(tf.not_equal(tf.reshape(dz, [m, tf.shape(ids)[1], -1]), 0), axis=2)
    keys = tf.range(tf.cast(m, tf.int64))[:, None] * rows + tf.cast(ids, tf.int64)
    hits = tf.math.unsorted_segment_max(tf.reshape(tf.cast(used, tf.float32), [-1]),
                                        tf.reshape(keys, [-1]), tf.cast(m, tf.int64) * rows)
    return tf.reshape(tf.maximum(hits, 0.0), [m, rows])  # empty segments give the lowest float


def clipped_counts(presence: Sequence[tf.Tensor], clip: float, finite: tf.Tensor) -> list:
    """sum_j f_j u_j per table: u_j the 0/1 rows micro-batch j touches ([m, rows] per table),
    f_j = min(1, C1 / sqrt(|u_j|)) over all tables, 0 for a non-finite micro-batch. Each
    micro-batch's contribution has norm <= C1, the count's sensitivity."""
    touched = tf.add_n([tf.reduce_sum(p, axis=1) for p in presence])  # [m]
    f = tf.minimum(1.0, clip / tf.sqrt(tf.maximum(touched, 1.0)))
    f = tf.where(finite, f, tf.zeros_like(f))
    return [tf.linalg.matvec(p, f, transpose_a=True) for p in presence]


def select(counts: Sequence[tf.Tensor], selection: RowSelection,
           generator: tf.random.Generator, replicas: int) -> list:
    """Per table, the [rows] bool mask of noisy count > tau, identical on every replica: each
    replica adds its own share of the noise, then the counts are SUMmed across replicas."""
    noisy = [c + generator.normal(tf.shape(c)) * selection.noise_std for c in counts]
    if replicas > 1:
        noisy = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, noisy)
    return [n > selection.threshold for n in noisy]


def noisy_selected_rows(clipped_sum: tf.Tensor, selected: tf.Tensor, stddev,
                        generator: tf.random.Generator,
                        draws: Optional[tf.Tensor] = None) -> tf.IndexedSlices:
    """The clipped sum restricted to the selected rows, plus noise of `stddev` drawn for those
    rows only, as `tf.IndexedSlices`: unselected rows are absent (exactly 0), and the
    optimizer's all-reduce and SGD's update stay sparse, as in plain Keras training of an
    embedding. `draws` False skips the noise (a replica that does not own this table's noise)."""
    rows = tf.cast(tf.where(selected)[:, 0], tf.int32)
    kept = tf.gather(clipped_sum, rows)

    def with_noise():
        return kept + generator.normal(tf.shape(kept), dtype=kept.dtype) * tf.cast(stddev,
                                                                                   kept.dtype)

    if draws is not None:
        kept = tf.cond(draws, with_noise, lambda: kept)
    else:
        kept = with_noise()
    return tf.IndexedSlices(kept, rows, tf.shape(clipped_sum, out_type=tf.int32))


def sum_selected_rows_over_replicas(rows: tf.IndexedSlices) -> tf.IndexedSlices:
    """The replicas' SUM of one table's selected rows, as IndexedSlices of those rows.

    Every replica selected the same rows (the mask comes from all-reduced counts), so the sum is
    a dense all-reduce of the [selected, width] values: a few rows instead of the whole table,
    with no duplicate indices for Adam to mis-apply. TF 2.21's own all-reduce of IndexedSlices
    segfaults in this step (measured), hence this. One zero row rides along, so that the
    collective is never empty."""
    pad = tf.zeros(tf.concat([[1], tf.shape(rows.values)[1:]], axis=0), rows.values.dtype)
    values = tf.concat([rows.values, pad], axis=0)
    summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values)
    return tf.IndexedSlices(summed[:-1], rows.indices, rows.dense_shape)


def selected_fraction(selected: Sequence[tf.Tensor]) -> tf.Tensor:
    """Fraction of all covered rows selected in the step (a public quantity: it is released)."""
    total = sum(int(s.shape[0]) for s in selected)
    return tf.add_n([tf.reduce_sum(tf.cast(s, tf.float32)) for s in selected]) / float(total)


def per_replica_std(multiplier: float, sensitivity: float, clip: float, replicas: int) -> float:
    """The per-replica count-noise std whose N-replica sum has std z_c S C1."""
    return float(multiplier) * float(sensitivity) * float(clip) / math.sqrt(replicas)


def for_config(config, model, variables: Sequence, sensitivity: float,
               replicas: int) -> Optional[RowSelection]:
    """The row selection DPConfig(sparse_embeddings=True) asks for, over the Embedding tables
    among the trained `variables` (None without sparse embeddings)."""
    if not config.sparse_embeddings:
        return None
    indices = embedding_table_indices(model, variables)
    if not indices:
        raise ValueError("DPConfig.sparse_embeddings=True but the model has no trainable "
                         "Embedding table")
    summed_std = per_replica_std(config.selection_noise_multiplier, sensitivity,
                                 config.selection_clip, 1)
    return RowSelection(indices, config.selection_clip, summed_std / math.sqrt(replicas),
                        config.selection_threshold * summed_std)
