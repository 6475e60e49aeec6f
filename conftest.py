"""Test-wide setup: 4 logical CPU devices, configured before TensorFlow initialises its runtime.

Multi-replica tests (MirroredStrategy over these devices) need them; they cannot be added later.
They are configured in the processes that run tests: xdist's controller only hands out files,
and importing TensorFlow there would cost each run ~6 CPU-s while both workers start.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NUM_TEST_REPLICAS = 4

# The files measured longest (processes, several tiny training runs each; 40-170 s of a worker's
# time), longest first: they run ahead of the rest so that the short files fill the end of both
# xdist workers' queues. A long file left late ran alone for ~35 s while the other worker
# had finished.
LONGEST_FIRST = ("tests/trainer_test.py", "tests/faults_test.py", "tests/workers_test.py",
                 "tests/experiment_test.py", "edp_tf/microbatch_test.py",
                 "edp_tf/selection_test.py", "edp_nlu/models/bert/finetuning_test.py",
                 "edp_nlu/models/private_models_test.py", "tests/benchmark_test.py",
                 "tests/preemption_test.py", "edp_tf/private_model_test.py",
                 "tests/warm_start_test.py")


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
    moved = [path for path in LONGEST_FIRST if not config.rootpath.joinpath(path).is_file()]
    if moved:  # a renamed file would silently lose its place
        raise ValueError(f"conftest.py LONGEST_FIRST names files that do not exist: {moved}")
    items.sort(key=lambda item: rank.get(item.path, len(rank)))
