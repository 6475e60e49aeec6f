"""`make_strategy`: a MirroredStrategy over GPUs, or over logical CPU devices when there are
none."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from edp_tf import iterators

# One strategy per device set, each with its own range of collective keys. TensorFlow numbers the
# collective group and instance keys of every MirroredStrategy from the same start, so two
# strategies in one process collide: over the same devices their all-reduces get mixed up ("Shape
# mismatch in the collective instance"), over different device sets the group sizes clash ("joining
# a group with size 4, but that group has size 2"). TensorFlow's own tests separate them the same
# way (strategy_combinations._mirrored_strategy_with_collective_key_base).
_BY_DEVICES: dict = {}
_KEY_RANGE = 1_000_000  # group keys one strategy may use (one per device subset it reduces over)


def _mirrored(devices) -> tf.distribute.MirroredStrategy:
    devices = tuple(devices)
    if devices not in _BY_DEVICES:
        from tensorflow.python.distribute import mirrored_strategy

        cls = mirrored_strategy.MirroredStrategy
        saved = cls._collective_key_base
        cls._collective_key_base = _KEY_RANGE * (1 + len(_BY_DEVICES))
        try:
            _BY_DEVICES[devices] = tf.distribute.MirroredStrategy(list(devices))
        finally:
            cls._collective_key_base = saved
    return _BY_DEVICES[devices]


def make_strategy(replicas: Optional[int] = None) -> tf.distribute.MirroredStrategy:
    """N replicas: the first N visible GPUs, else N logical CPU devices.

    Logical CPU devices can only be configured before TensorFlow initialises its runtime; if it has
    and fewer than `replicas` exist, this raises instead of silently running fewer replicas (the
    noise calibration depends on N).
    """
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int)
                                 or replicas < 1):
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    iterators.release_device_iterators_promptly()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        count = replicas or len(gpus)
        if count > len(gpus):
            raise ValueError(f"replicas={count} but only {len(gpus)} GPU(s) are visible")
        return _mirrored(f"/gpu:{i}" for i in range(count))
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
    return _mirrored(d.name for d in logical[:count])
