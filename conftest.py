"""Test-wide setup: 4 logical CPU devices, configured before TensorFlow initialises its runtime.

Multi-replica tests (MirroredStrategy over these devices) need them; they cannot be added later.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

NUM_TEST_REPLICAS = 4

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_REPLICAS
)

# The files measured longest (processes, several tiny training runs each), longest first: they
# run ahead of the rest so that the short files fill the end of both xdist workers' queues.
LONGEST_FIRST = ("tests/trainer_test.py", "tests/faults_test.py", "tests/workers_test.py",
                 "tests/experiment_test.py", "tests/augmentation_test.py")


def pytest_collection_modifyitems(config, items):
    """Puts the LONGEST_FIRST files' tests ahead, in that order; the rest keep theirs."""
    rank = {config.rootpath.joinpath(path): i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))
