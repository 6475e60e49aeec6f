import numpy as np
import pytest
import tensorflow as tf

from edp_tf import replica_sum


def test_the_optimizers_sum_of_the_shares_is_the_release(strategy):
    """On the shared strategy's replicas: each replica's share of the same release, summed the
    way Keras' optimizer sums (a SUM all-reduce), is the release bit for bit (N = 2)."""
    release = tf.constant([[0.3, -1.7], [2.5, 1e-3]])

    def step():
        share, = replica_sum.as_shares([release])
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, share)

    summed = strategy.run(tf.function(step, autograph=False))
    for value in strategy.experimental_local_results(summed):
        np.testing.assert_array_equal(value.numpy(), release.numpy())


def test_selected_rows_are_never_shared_out(strategy):
    rows = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3]), tf.constant([5, 2]))
    with pytest.raises(ValueError, match="cannot be shared out"):
        strategy.run(tf.function(lambda: replica_sum.as_shares([rows])[0].values, autograph=False))
