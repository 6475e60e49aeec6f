"""The library's tests share one MirroredStrategy over 2 of the 4 logical CPU devices that the
root conftest.py configures: two replicas exercise everything that differs from one (per-replica
noise and clipping, the summed all-reduce, noise owners), and a step's cost grows with the
replicas (a selection test's fit: 6.9 CPU-s on 4, 3.0 on 2). A test whose arithmetic needs more
makes its own (`edp_tf.make_strategy(4)`)."""
import pytest

import edp_tf

NUM_TEST_REPLICAS = 2


@pytest.fixture(scope="session")
def strategy():
    s = edp_tf.make_strategy(NUM_TEST_REPLICAS)
    assert s.num_replicas_in_sync == NUM_TEST_REPLICAS
    return s
