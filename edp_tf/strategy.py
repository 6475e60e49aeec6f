"""`make_strategy`: a MirroredStrategy over GPUs, or over logical CPU devices when there are none."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf


def make_strategy(replicas: Optional[int] = None) -> tf.distribute.MirroredStrategy:
    """N replicas: the first N visible GPUs, else N logical CPU devices.

    Logical CPU devices can only be configured before TensorFlow initialises its runtime; if it has
    and fewer than `replicas` exist, this raises instead of silently running fewer replicas (the
    noise calibration depends on N).
    """
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int)
                                 or replicas < 1):
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        count = replicas or len(gpus)
        if count > len(gpus):
            raise ValueError(f"replicas={count} but only {len(gpus)} GPU(s) are visible")
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(count)])
    count = replicas or 1
    cpus = tf.config.list_physical_devices("CPU")
    try:
        existing = tf.config.get_logical_device_configuration(cpus[0])
        if not existing or len(existing) < count:
            tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        pass  # runtime already initialised: check what exists below
    logical = tf.config.list_logical_devices("CPU")
    if len(logical) < count:
        raise RuntimeError(
            f"replicas={count} needs {count} logical CPU devices but TensorFlow is already "
            f"initialised with {len(logical)}: call make_strategy before any TensorFlow op"
        )
    devices = [d.name for d in logical[:count]]
    return tf.distribute.MirroredStrategy(devices)
