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
