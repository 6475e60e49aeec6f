"""Where `fit`'s batches come from: the Poisson accounting holds only for a sampler's batches.

Why this exists: epsilon composes Poisson-subsampled Gaussians, so it is a bound only when each
step's batch is a Poisson sample drawn by one of the library's samplers. Keras' own batching of
arrays (shuffled, cut into fixed batches, every example in every epoch exactly once), a tf.data
pipeline built by hand, or a sampler's dataset reshaped afterwards (`.shuffle`, `.unbatch()`,
`.filter`, `.batch`) are other samplings, for which that number bounds nothing. A sampler marks
the datasets it makes (`mark`); `PrivateModel.fit` describes what it was given (`describe`); the
ledger compares that with the sampler it accounts for.

A mark survives only the library's own transformations: `repeat=True` of `dataset()`, and
`map_batches` for a parse that acts on each row on its own (the sensitivity argument needs one
example to change one micro-batch; a map that mixes rows would break it, which the statement
then names as an assumption).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import tensorflow as tf

from edp_tf import iterators

_MARK = "_edp_tf_batch_source"


@dataclasses.dataclass(frozen=True)
class BatchSource:
    """What `fit` trained on: `kind` "sampler" (a library sampler's dataset), "arrays" (Keras
    cuts them), "dataset" (a tf.data pipeline the library did not sample) or "generator";
    `sampler` the
    sampler for "sampler"; `row_maps` the names of per-row maps applied after sampling."""

    kind: str
    sampler: Any = None
    row_maps: tuple = ()

    @property
    def description(self) -> str:
        """Where the batches came from, in the words of the privacy statement."""
        if self.kind == "sampler":
            return f"Poisson batches of an edp_tf {type(self.sampler).__name__}"
        if self.kind == "arrays":
            return ("arrays batched by Keras (shuffled and cut into fixed-size batches: every "
                    "example in every epoch exactly once, not a Poisson sample)")
        if self.kind == "generator":
            return "a generator or PyDataset, whose batches the library cannot inspect"
        return ("a tf.data.Dataset the library did not sample (a pipeline built by hand, or a "
                "sampler's dataset transformed afterwards): its batches are not known to be "
                "Poisson samples")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "row_maps": list(self.row_maps),
                "sampler": type(self.sampler).__name__ if self.sampler is not None else None}


def mark(dataset: tf.data.Dataset, sampler, row_maps: tuple = ()) -> tf.data.Dataset:
    """Marks `dataset` as the batches `sampler` drew (the samplers call this, nobody else)."""
    setattr(dataset, _MARK, BatchSource("sampler", sampler, tuple(row_maps)))
    return dataset


def map_batches(dataset: tf.data.Dataset, fn: Callable, name: Optional[str] = None
                ) -> tf.data.Dataset:
    """`dataset.map(fn)` that keeps a sampler's mark: for parsing a sampler's batches (records
    to features, with the mask kept), e.g. `StreamingPoissonSampler.record_dataset`.

    `fn` receives a whole padded batch and must act on each row on its own (row i of the output
    depends on row i of the input only, and the mask is passed through): then one example still
    changes one micro-batch. The privacy statement names the map as that assumption.
    """
    source = getattr(dataset, _MARK, None)
    if source is None:
        raise ValueError("map_batches keeps the mark of a sampler's dataset; this dataset has "
                         "none (make it with a PoissonSampler's dataset() or record_dataset())")
    mapped = iterators.without_autotune(
        dataset.map(fn, num_parallel_calls=iterators.PARALLEL_CALLS, deterministic=True))
    label = name or getattr(fn, "__name__", None) or type(fn).__name__
    return mark(mapped, source.sampler, source.row_maps + (str(label),))


def describe(x) -> BatchSource:
    """The source of the batches `fit(x, ...)` will train on."""
    source = getattr(x, _MARK, None)
    if isinstance(source, BatchSource):
        return source
    if isinstance(x, tf.data.Dataset):
        return BatchSource("dataset")
    if hasattr(x, "__next__") or (hasattr(x, "__getitem__") and hasattr(x, "on_epoch_end")):
        return BatchSource("generator")  # a generator or a keras.utils.PyDataset
    return BatchSource("arrays")
