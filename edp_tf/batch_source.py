"""Where `fit`'s batches come from: the Poisson accounting holds only for a sampler's batches.

Why this exists: epsilon composes Poisson-subsampled Gaussians, so it is a bound only when each
step's batch is a Poisson sample drawn by one of the library's samplers. Keras' own batching of
arrays (shuffled, cut into fixed batches, every example in every epoch exactly once), a tf.data
pipeline built by hand, or a sampler's dataset reshaped afterwards (`.shuffle`, `.unbatch()`,
`.filter`, `.batch`) are other samplings, for which that number bounds nothing. A sampler
registers the datasets it makes (`_mark`, in a registry a dataset cannot carry elsewhere);
`PrivateModel.fit` describes what it was given (`describe`); the ledger compares that with the
sampler it accounts for.

A registration survives only the library's own transformations: `repeat=True` of `dataset()`,
and `map_rows`, which parses a sampler's batches one row at a time and puts the sampler's mask
back, so that one example still changes one micro-batch by construction.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Optional

import tensorflow as tf

from edp_tf import iterators

# dataset -> its BatchSource; weak keys: a registration lives exactly as long as its dataset
_SAMPLED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


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


def _mark(dataset: tf.data.Dataset, sampler, row_maps: tuple = ()) -> tf.data.Dataset:
    """Registers `dataset` as the batches `sampler` drew (the samplers call this)."""
    _SAMPLED[dataset] = BatchSource("sampler", sampler, tuple(row_maps))
    return dataset


def map_rows(dataset: tf.data.Dataset, fn: Callable, name: Optional[str] = None
             ) -> tf.data.Dataset:
    """A sampler's batches with `fn` applied to each row, the sampler's mask kept: for parsing
    what a sampler draws (records to features, `StreamingPoissonSampler.record_dataset`).

    `fn` takes one row of the sampler's batch without its mask (`x, y` of `dataset()`, or the
    record of `record_dataset()`) and returns the row's `(x, y)`. The batches are unbatched,
    mapped row by row and batched again at the sampler's `max_batch_size`, with the mask
    zipped back: a row's output depends on that row alone, and the padding keeps mask 0, so one
    example still changes one micro-batch whatever `fn` does.
    """
    source = _SAMPLED.get(dataset)
    if source is None:
        raise ValueError("map_rows keeps the registration of a sampler's dataset; this dataset "
                         "has none (make it with a PoissonSampler's dataset() or "
                         "record_dataset())")

    def row(*element):
        *parts, mask = element
        mapped = fn(*parts)
        if not isinstance(mapped, (tuple, list)) or len(mapped) != 2:
            raise ValueError("map_rows: fn must return one row's (x, y); the mask is the "
                             "sampler's and is kept")
        return tuple(mapped) + (mask,)

    size = source.sampler.max_batch_size
    mapped = dataset.unbatch().map(row, num_parallel_calls=iterators.PARALLEL_CALLS,
                                   deterministic=True).batch(size, drop_remainder=True)
    label = name or getattr(fn, "__name__", None) or type(fn).__name__
    return _mark(iterators.without_autotune(mapped), source.sampler,
                 source.row_maps + (str(label),))


def describe(x) -> BatchSource:
    """The source of the batches `fit(x, ...)` will train on."""
    try:
        source = _SAMPLED.get(x)
    except TypeError:  # unhashable (a dict of arrays): not a registered dataset
        source = None
    if source is not None:
        return source
    if isinstance(x, tf.data.Dataset):
        return BatchSource("dataset")
    if hasattr(x, "__next__") or (hasattr(x, "__getitem__") and hasattr(x, "on_epoch_end")):
        return BatchSource("generator")  # a generator or a keras.utils.PyDataset
    return BatchSource("arrays")


def offer(callbacks, source: BatchSource) -> None:
    """Tells each callback that checks batch sources (a ledger, for its sampler) where a fit's
    batches come from, before the first step: it refuses those its epsilon does not cover."""
    for callback in callbacks:
        check = getattr(callback, "check_batch_source", None)
        if check is not None:
            check(source)
