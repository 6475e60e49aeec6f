"""Autotuning is off wherever a training iterator lives long: the samplers' pipelines and each
replica's device pipeline (the release of an autotuned iterator waits up to a minute)."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

from edp_tf import iterators, sampling, streaming

N = 64


def samplers():
    x, y = np.zeros((N, 3), np.float32), np.zeros(N, np.int32)
    yield sampling.PoissonSampler(dataset_size=N, sampling_rate=0.25, replicas=4).dataset(x, y)
    users = np.repeat(np.arange(N // 2), 2)
    yield sampling.UserPoissonSampler.for_users(users, 0.25, 2, replicas=4).dataset(x, y)
    records = streaming.StreamingPoissonSampler(dataset_size=N, sampling_rate=0.25, replicas=4)
    yield records.record_dataset(lambda: (b"%d" % i for i in range(N))).map(
        lambda strings, mask: (strings, strings, mask))


def device_autotune(strategy, dataset) -> list:
    """Whether each replica's device pipeline of `dataset` distributed by `strategy` autotunes."""
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    devices = iterator._iterators[0]._iterator._device_iterators  # TensorFlow's internals
    # None is TensorFlow's default: on
    return [d._dataset.options().autotune.enabled is not False for d in devices]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_sampler_pipelines_do_not_autotune(index):
    dataset = list(samplers())[index]
    assert dataset.options().autotune.enabled is False
    assert next(iter(dataset))[2].shape[0] > 0  # still batches


def test_device_pipelines_do_not_autotune(strategy, monkeypatch):
    dataset = tf.data.Dataset.from_tensors(tf.zeros([8, 3])).repeat()
    assert device_autotune(strategy, dataset) == [False] * strategy.num_replicas_in_sync
    # TensorFlow's own builder autotunes them: the premise of the fix (and what a later
    # TensorFlow without the wrapped function would do)
    wrapped = multi_device_iterator_ops._create_device_dataset
    monkeypatch.setattr(multi_device_iterator_ops, "_create_device_dataset",
                        wrapped.__closure__[0].cell_contents)
    assert device_autotune(strategy, dataset) == [True] * strategy.num_replicas_in_sync
    iterators.release_device_iterators_promptly()  # wraps again, once
    again = multi_device_iterator_ops._create_device_dataset
    assert again._edp_tf_without_autotune
    iterators.release_device_iterators_promptly()
    assert multi_device_iterator_ops._create_device_dataset is again
