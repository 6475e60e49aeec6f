"""Any finite input pipeline, as the examples `make_private`'s sampler draws its batches from.

Why it is safe to take a pipeline that batches or shuffles: Poisson sampling takes each example
independently with probability q at every step, so it needs the *set* of examples, not their
order or grouping. One pass over a finite pipeline (a `tf.data.Dataset`, batched or not, a
`keras.utils.PyDataset`, or a generator of batches that ends) gives that set; the library then
draws every batch itself, exactly as from arrays (the same step, the same throughput once the
pass is done). What cannot be taken: a pipeline without end (`.repeat()`, an endless
generator), where "the set" is undefined, and a set too large for memory, which the streaming
sampler reads from disk instead (`edp_tf.StreamingPoissonSampler`).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import keras
import numpy as np
import tensorflow as tf

# a pass larger than this is refused: the streaming sampler keeps such corpora on disk
MAX_BYTES = 4 << 30

STREAMING_RECIPE = (
    "for data larger than memory, write its records to disk and train on "
    "edp_tf.StreamingPoissonSampler(n, q).record_dataset(...) through "
    "edp_tf.batch_source.map_rows (docs/design.md, sampling)")

# tf.data's Python classes that group elements into batches, and the one that undoes it
_BATCHING = ("BatchDataset", "PaddedBatchDataset", "ParallelBatchDataset",
             "DenseToRaggedDataset", "DenseToSparseBatchDataset", "RebatchDataset")
_UNBATCHING = ("UnbatchDataset",)


def is_pipeline(x) -> bool:
    """A tf.data.Dataset, a PyDataset or a generator: what `to_arrays` takes."""
    return (isinstance(x, (tf.data.Dataset, keras.utils.PyDataset))
            or hasattr(x, "__next__"))


def to_arrays(x, max_bytes: int = MAX_BYTES) -> tuple:
    """(x, y) as numpy arrays (or dicts / tuples of them), the examples of one pass over `x`.

    `x` yields (x, y) pairs: per example for an unbatched tf.data.Dataset, per batch for a
    batched one, a PyDataset or a generator. Refused in one line: no labels, per-row weights (the
    sampler's mask weighs the rows), a pipeline without end, or more than `max_bytes`."""
    if isinstance(x, tf.data.Dataset):
        cardinality = int(x.cardinality().numpy())
        if cardinality == tf.data.INFINITE_CARDINALITY:
            raise ValueError(
                "make_private's fit got an endless tf.data.Dataset (.repeat()?): it needs one "
                "pass over the examples, from which it draws every batch itself; drop the "
                f"repeat, or {STREAMING_RECIPE}")
        batches = x if is_batched(x) else x.batch(1024)
        return _concatenated(batches.as_numpy_iterator(), "tf.data.Dataset", max_bytes)
    if isinstance(x, keras.utils.PyDataset):
        count = x.num_batches
        if count is None:
            raise ValueError("make_private's fit got a PyDataset without a length (num_batches "
                             "None): it needs one finite pass over the examples")
        return _concatenated((x[i] for i in range(count)), "PyDataset", max_bytes)
    return _concatenated(x, "generator", max_bytes)


def is_batched(dataset: tf.data.Dataset) -> bool:
    """Whether the dataset's elements are batches: the transformation nearest its end that
    groups or ungroups elements is a batching one."""
    node: Optional[Any] = dataset
    while node is not None:
        name = type(node).__name__.lstrip("_")
        if name in _UNBATCHING:
            return False
        if name in _BATCHING:
            return True
        node = getattr(node, "_input_dataset", None)
    return False


def _concatenated(batches: Iterable, what: str, max_bytes: int) -> tuple:
    parts, size = [], 0
    for batch in batches:
        if not isinstance(batch, tuple) or len(batch) < 2:
            raise ValueError(f"make_private's fit: the {what} must yield (x, y) pairs, got "
                             f"{type(batch).__name__}")
        if len(batch) > 2 and batch[2] is not None:
            raise ValueError(f"make_private's fit: the {what} yields sample weights, which it "
                             "does not take: the sampler's mask weighs the rows")
        pair = tf.nest.map_structure(np.asarray, tuple(batch[:2]))
        size += sum(a.nbytes for a in tf.nest.flatten(pair))
        if size > max_bytes:
            raise ValueError(f"make_private's fit: the {what} holds more than {max_bytes >> 20} "
                             f"MiB, more than it keeps in memory: {STREAMING_RECIPE}")
        parts.append(pair)
    if not parts:
        raise ValueError(f"make_private's fit: the {what} yielded no example")
    return tf.nest.map_structure(lambda *a: np.concatenate(a, axis=0), *parts)
