"""Test-wide setup: 4 logical CPU devices, configured before TensorFlow initialises its runtime.

Multi-replica tests (MirroredStrategy over these devices) need them; they cannot be added later.
They are configured in the processes that run tests: xdist's controller only hands out files,
and importing TensorFlow there would cost each run ~6 CPU-s while both workers start.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NUM_TEST_REPLICAS = 4

# The files measured longest (processes, several tiny training runs each), longest first: they
# run ahead of the rest so that the short files fill the end of both xdist workers' queues.
LONGEST_FIRST = ("tests/trainer_test.py", "tests/faults_test.py", "tests/workers_test.py",
                 "tests/experiment_test.py", "tests/augmentation_test.py")


def pytest_configure(config):
    """The logical devices, in every process that runs tests (an xdist worker, or the one
    process of `-n 0`), before any test module imports TensorFlow."""
    controller = (not hasattr(config, "workerinput")
                  and getattr(config.option, "numprocesses", None) not in (None, 0))
    if controller:
        return
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_REPLICAS)


def pytest_collection_modifyitems(config, items):
    """Puts the LONGEST_FIRST files' tests ahead, in that order; the rest keep theirs."""
    rank = {config.rootpath.joinpath(path): i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))
