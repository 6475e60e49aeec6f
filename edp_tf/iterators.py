"""tf.data pipelines whose iterators are released at once.

With autotuning on (tf.data's default), every iterator runs a model thread that sleeps between
optimizations for a period that doubles up to 60 s, and releasing the iterator waits until that
sleep ends. So the iterator of a fit that ran for minutes over a repeated dataset held the main
thread for up to a minute when fit returned, and as long again for each replica's device
pipeline. Measured in TensorFlow 2.21 (docs/benchmarks.md): 4 of 5 releases of a two-replica
distributed sampler iterator after 150 s took 52-126 s, against 0.02-0.03 s in 4 of 4 with
autotuning off on the input and on the device pipelines.

Autotuning has nothing to tune in these pipelines: a stateless sampling map with a fixed
parallelism, and the one-element device prefetch that the distribution strategy appends.
"""
from __future__ import annotations

import tensorflow as tf

# Parallel sampling calls and batches prefetched by the input pipelines here: one batch being
# gathered while another waits is enough for steps that take milliseconds or more.
PARALLEL_CALLS = 2
PREFETCHED = 2


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data autotuning off, so that its iterators are released at once."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def release_device_iterators_promptly() -> None:
    """Turns autotuning off in the per-replica device pipelines of distributed datasets.

    They are built inside TensorFlow (multi_device_iterator_ops) without a way to pass options,
    so the function that builds them is wrapped once per process. If a TensorFlow version no
    longer has it, nothing changes: releases may then wait as described above.
    """
    from tensorflow.python.data.ops import multi_device_iterator_ops as ops

    build = getattr(ops, "_create_device_dataset", None)
    if build is None or getattr(build, "_edp_tf_without_autotune", False):
        return

    def build_without_autotune(*args, **kwargs):
        return without_autotune(build(*args, **kwargs))

    build_without_autotune._edp_tf_without_autotune = True
    ops._create_device_dataset = build_without_autotune
