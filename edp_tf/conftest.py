"""The library's tests share one MirroredStrategy over the 4 logical CPU devices that the root
conftest.py configures (a test module may define its own `strategy` with fewer replicas)."""
import pytest

import edp_tf

NUM_TEST_REPLICAS = 4


@pytest.fixture(scope="session")
def strategy():
    s = edp_tf.make_strategy(NUM_TEST_REPLICAS)
    assert s.num_replicas_in_sync == NUM_TEST_REPLICAS
    return s
