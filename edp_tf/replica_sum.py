"""The replicas' sum of the private updates, taken by the step itself, and handed back as shares.

Why the step sums where Keras' optimizer would: with sparse embedding noise the selected rows
travel as a small dense block (IndexedSlices), and a projection or a filter must act on the
mechanism's release, the replicas' sum, never on one replica's share. Why shares afterwards: the
optimizer always SUMs what each replica gives it over the replicas, so after post-processing the
step gives each replica release / N (`as_shares`), whose sum is the release again, so no
optimizer method is replaced; the price is one more all-reduce, only on the runs that sum early.
The one exception is a table's selected rows (sparse embedding noise on several replicas): an
IndexedSlices cannot be split into shares whose concatenation Adam treats as their sum, so there
the step still tells the optimizer not to sum again (`already_summed`).
"""
from __future__ import annotations

import tensorflow as tf

from edp_tf import selection


def sum_over_replicas(updates: list) -> list:
    """The replicas' SUM of every update: dense ones in one batched all-reduce, the tables'
    selected rows as IndexedSlices (selection.sum_selected_rows_over_replicas)."""
    context = tf.distribute.get_replica_context()
    if context is None:  # cross-replica context: nothing per replica to sum
        return list(updates)
    dense = [i for i, u in enumerate(updates) if not isinstance(u, tf.IndexedSlices)]
    summed = list(updates)
    if dense:
        reduced = context.all_reduce(
            tf.distribute.ReduceOp.SUM, [updates[i] for i in dense])
        for i, u in zip(dense, reduced):
            summed[i] = u
    for i, u in enumerate(updates):
        if isinstance(u, tf.IndexedSlices):
            summed[i] = selection.sum_selected_rows_over_replicas(u)
    return summed


def as_shares(updates: list) -> list:
    """Each replica's share of a dense release that every replica holds whole: release / N, so
    that the optimizer's own cross-replica SUM gives the release back (for N a power of two,
    bit for bit: the division and the sum are exact)."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if tf.distribute.get_replica_context() is None or replicas == 1:
        return list(updates)
    if any(isinstance(u, tf.IndexedSlices) for u in updates):
        raise ValueError("as_shares: a table's selected rows cannot be shared out (the "
                         "optimizer's sum of IndexedSlices concatenates them, and Adam applied "
                         "to a row twice is not Adam applied to its sum)")
    return [None if u is None else u / replicas for u in updates]


def already_summed(grads_and_vars):
    """A Keras optimizer's cross-replica SUM replaced by the identity: only for the selected
    rows of sparse embedding noise on several replicas, which `as_shares` cannot hand back."""
    return list(grads_and_vars)
