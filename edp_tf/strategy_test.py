"""make_strategy: one strategy per device set, and strategies of different sizes coexist."""
import numpy as np
import pytest
import tensorflow as tf

import edp_tf


def replica_ids_summed(strategy) -> float:
    """All-reduce each replica's id: the sum is 0 + 1 + ... + (N - 1) only if the collective
    group really has this strategy's N devices."""

    def replica_fn():
        # an in-replica all-reduce, as Keras' optimizer does: collective ops with group keys
        ctx = tf.distribute.get_replica_context()
        value = tf.cast(ctx.replica_id_in_sync_group, tf.float32) * tf.ones([3])
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)

    @tf.function(autograph=False)
    def step():
        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    return step().numpy()


def test_one_strategy_per_device_set():
    assert edp_tf.make_strategy(2) is edp_tf.make_strategy(2)
    assert edp_tf.make_strategy(2) is not edp_tf.make_strategy(4)
    assert edp_tf.make_strategy(4).num_replicas_in_sync == 4


def test_strategies_of_different_sizes_reduce_independently():
    # Without separate collective key ranges the second strategy's group clashes with the first's
    # ("joining a group with size 4, but that group has size 2"): interleave them to catch that.
    for replicas in (2, 4, 3, 2, 4, 1, 3):
        n = replicas
        np.testing.assert_allclose(
            replica_ids_summed(edp_tf.make_strategy(replicas)), [n * (n - 1) / 2] * 3)


@pytest.mark.parametrize("replicas", [0, -1, 1.5, True, "2"])
def test_bad_replica_counts_are_refused(replicas):
    with pytest.raises(ValueError, match="replicas"):
        edp_tf.make_strategy(replicas)


def test_more_replicas_than_devices_after_initialisation_is_an_error():
    tf.constant(1.0)  # the runtime is initialised (conftest configured 4 logical CPUs)
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("GPU machine: the CPU path is not taken")
    with pytest.raises(RuntimeError, match="replicas=64"):
        edp_tf.make_strategy(64)
