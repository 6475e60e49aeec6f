"""Several processes (machines) training one model: TensorFlow's MultiWorkerMirroredStrategy.

Why TensorFlow's own engine: its collective all-reduce is the same SUM the private step relies on
under MirroredStrategy (docs/design.md, mechanism), with `replica_id_in_sync_group` numbered across
workers, so the step, the noise owners and the accounting need nothing new. What a multi-worker run
needs:

* every worker must build the *same* Poisson batches (each keeps its replicas' part of the global
  batch): the sampling key is drawn from OS entropy on worker 0 and all-reduced to the others
  (`shared_key`), never passed on a command line where `ps` would show it;
* every worker draws its noise from its own OS-entropy generator; `edp_tf/multi_worker_test.py`
  checks that the summed noise has the single-process law and no two workers draw alike;
* Keras 3.15 does not run `fit` under this strategy (keras-team/keras#20585: it reduces the first
  batch and the step's scalar logs with `axis=0`); `_patch_keras` fixes those two calls, for
  multi-worker strategies only.

On CPUs the strategy gives each worker one replica (TensorFlow's choice: logical CPU devices are
not used), on GPUs one per GPU. A worker that dies leaves the others blocked in a collective: the
launcher (`edp_nlu.pipeline.worker_processes`) watches its processes and stops the rest; the run
resumes from its last checkpoint.
"""
from __future__ import annotations

import json
import secrets
from typing import Optional, Sequence

import tensorflow as tf

from edp_tf import iterators

MultiWorker = tf.distribute.MultiWorkerMirroredStrategy


def tf_config(addresses: Sequence[str], index: int) -> str:
    """The TF_CONFIG of worker `index` in a cluster of `addresses` ("host:port"); worker 0 is
    the chief."""
    if not 0 <= index < len(addresses):
        raise ValueError(f"worker index {index} is outside the {len(addresses)} addresses")
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": "worker", "index": int(index)}})


def cluster_position(tf_config: str) -> tuple:
    """(this process's worker index, the number of workers) from a TF_CONFIG a cluster manager
    set (Kubeflow's TFJob, Vertex AI, a launcher of the user's), or ValueError in one line.

    The chief is worker 0: a `chief` task, or worker 0 when the cluster has no chief job (as
    MultiWorkerMirroredStrategy numbers them); the workers follow in their order. Other jobs
    (`ps`, `evaluator`) have no part in a synchronous all-reduce and are refused."""
    try:
        parsed = json.loads(tf_config)
        cluster, task = dict(parsed["cluster"]), dict(parsed["task"])
        kind, index = str(task["type"]), int(task["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"TF_CONFIG is not a cluster (JSON with cluster and task.type/index): "
                         f"{error}") from None
    other = sorted(set(cluster) - {"chief", "worker"})
    if other:
        raise ValueError(f"TF_CONFIG names job(s) {other}: a private run is one synchronous "
                         "all-reduce of chief and workers only")
    chiefs, workers = list(cluster.get("chief", [])), list(cluster.get("worker", []))
    if len(chiefs) > 1:
        raise ValueError(f"TF_CONFIG names {len(chiefs)} chiefs: at most one")
    if kind not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG's task type {kind!r} is neither chief nor worker")
    size = len(chiefs) if kind == "chief" else len(workers)
    if not 0 <= index < size:
        raise ValueError(f"TF_CONFIG's task {kind} {index} is not in its cluster ({size} "
                         f"{kind} address(es))")
    position = 0 if kind == "chief" else index + len(chiefs)
    return position, len(chiefs) + len(workers)


def make_multi_worker_strategy(timeout_seconds: Optional[float] = None) -> MultiWorker:
    """The strategy of this worker, from the TF_CONFIG environment variable.

    `timeout_seconds` bounds each collective, so that a worker whose peer died fails instead of
    waiting forever. Call it before any other TensorFlow op (like `make_strategy`).
    """
    _patch_keras()
    iterators.release_device_iterators_promptly()
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def is_multi_worker(strategy) -> bool:
    return isinstance(strategy, MultiWorker) and strategy.extended._num_workers > 1


def worker_index(strategy) -> int:
    """This process's worker number (0, the chief, in a single-process run); with a `chief`
    job in the cluster, the chief is 0 and worker i is i + 1 (cluster_position)."""
    if not is_multi_worker(strategy):
        return 0
    resolver = strategy.cluster_resolver
    index = int(resolver.task_id or 0)
    if resolver.task_type == "chief":
        return 0
    jobs = resolver.cluster_spec().as_dict()
    return index + len(jobs.get("chief", []))


def shared_key(strategy) -> int:
    """A 63-bit key from OS entropy, the same in every worker: worker 0 draws it and the others
    receive it through an all-reduce (a single process simply draws one)."""
    if not is_multi_worker(strategy):
        return secrets.randbits(63)
    mine = secrets.randbits(63) if worker_index(strategy) == 0 else 0
    value = tf.constant(mine, tf.int64)  # an int64 SUM of one key and zeros is exact

    def contribution():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.where(tf.equal(replica, 0), value, tf.zeros_like(value))

    @tf.function(autograph=False)  # an eager strategy.run warns about its overhead
    def summed():
        return strategy.reduce("SUM", strategy.run(contribution), axis=None)

    return int(summed().numpy())


_PATCHED = False


def _patch_keras() -> None:
    """Keras 3.15's TensorFlow trainer under MultiWorkerMirroredStrategy (keras#20585) reduces
    (1) the first data batch across workers to build the model, which fails for per-replica
    values, and (2) each scalar log with `strategy.reduce("MEAN", v, axis=0)`, which fails for
    scalars. (1) builds from this worker's first replica's batch (only shapes matter); (2) takes
    the mean over replicas of each value. Other strategies take Keras' own code path."""
    global _PATCHED
    if _PATCHED:
        return
    from keras.src.backend.tensorflow import trainer as keras_trainer

    build, reduce_per_replica = (keras_trainer.TensorFlowTrainer._maybe_symbolic_build,
                                 keras_trainer.reduce_per_replica)

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or not is_multi_worker(strategy):
            return build(self, iterator, data_batch)
        for _, _, batches in iterator:
            data_batch = tf.nest.map_structure(
                lambda v: (strategy.experimental_local_results(v)[0]
                           if isinstance(v, tf.distribute.DistributedValues) else v),
                next(batches))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce(values, strategy, reduction="auto"):
        if is_multi_worker(strategy) and reduction in ("auto", "mean"):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return reduce_per_replica(values, strategy, reduction)

    keras_trainer.TensorFlowTrainer._maybe_symbolic_build = maybe_symbolic_build
    keras_trainer.reduce_per_replica = reduce
    _PATCHED = True
