"""The replicas' sum of the private updates, taken by the step itself.

Why the step sums where Keras' optimizer would: with sparse embedding noise the selected rows
travel as a small dense block (IndexedSlices), and a projection must act on the mechanism's
release, the replicas' sum, never on one replica's share. The optimizer is then told not to sum
again (`already_summed`).
"""
from __future__ import annotations

import tensorflow as tf

from edp_tf import selection


def sum_over_replicas(updates: list) -> list:
    """The replicas' SUM of every update: dense ones in one batched all-reduce, the tables'
    selected rows as IndexedSlices (selection.sum_selected_rows_over_replicas)."""
    dense = [i for i, u in enumerate(updates) if not isinstance(u, tf.IndexedSlices)]
    summed = list(updates)
    if dense:
        reduced = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, [updates[i] for i in dense])
        for i, u in zip(dense, reduced):
            summed[i] = u
    for i, u in enumerate(updates):
        if isinstance(u, tf.IndexedSlices):
            summed[i] = selection.sum_selected_rows_over_replicas(u)
    return summed


def already_summed(grads_and_vars):
    """Replaces a Keras optimizer's own cross-replica SUM when PrivateModel has done it."""
    return list(grads_and_vars)
