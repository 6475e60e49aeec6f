"""Poisson sampling over a corpus on disk, in memory that does not grow with the corpus.

`PoissonSampler` gathers rows of arrays held in memory. A corpus of millions of utterances is
read instead as a stream of serialized records (lines of sharded text, TFRecord records), once
per epoch, and the sampling keeps exactly the same semantics: at each of the epoch's T steps,
every record is taken independently with probability q; the batch is padded to
`max_batch_size` with mask 0, its records in uniformly random slots; more than
`max_batch_size` taken raises instead of truncating. So the accounting, the ledger
(`PrivacyLedger.for_sampler`) and the sensitivity argument are those of `PoissonSampler`.

How, in one pass: the steps that take a record are the arrivals of a Bernoulli(q) process over
1..T, drawn as geometric gaps (the same law as T independent coin flips, at about 1 + qT draws
per record instead of T). Each (step, record) pair is appended to the spill file of its block of
steps; a block holds about `block_records` records whatever the corpus size, and is read back,
grouped by step and emitted, one block at a time. Peak memory is one block plus I/O buffers;
time is linear in the corpus. Spill files live in a fresh directory under `work_dir` (the
records are training data: it is created private to the user) and are removed after each epoch,
also on error.

The reader must yield exactly `dataset_size` records (n sizes q n, the expected batch the step
divides by); a different count raises before any batch of that epoch is emitted.
"""
from __future__ import annotations

import dataclasses
import math
import os
import secrets
import shutil
import struct
import tempfile
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from edp_tf import batch_source, iterators
from edp_tf.sampling import PoissonSampler, _positive_int

Records = Callable[[], Iterable[bytes]]  # a fresh pass over the corpus on each call
_HEADER = struct.Struct("<II")  # step within the epoch, record length
_CHUNK = 8192  # records drawn for at once


@dataclasses.dataclass(frozen=True)
class StreamingPoissonSampler(PoissonSampler):
    """Poisson-sampled, padded and masked batches of serialized records read from disk.

    Usage:
        sampler = StreamingPoissonSampler(dataset_size=n, sampling_rate=q, replicas=2)
        batches = sampler.record_dataset(lambda: read_lines(shards))   # (records [M], mask [M])
        model.fit(edp_tf.batch_source.map_rows(batches, parse), epochs=E)
        # parse: one record -> (x, y); the mask is kept. A plain .map() loses the registration
        # that tells the ledger these are Poisson batches (edp_tf.batch_source)
    """

    work_dir: Optional[str] = None  # spill files go to a private temporary directory in here
    block_records: int = 65536  # records held in memory at once (about)

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("block_records", self.block_records)
        if self.work_dir is not None and not os.path.isdir(self.work_dir):
            raise ValueError(f"work_dir={self.work_dir!r} is not a directory")

    @property
    def steps_per_block(self) -> int:
        """Steps whose records one spill file holds: about `block_records` records in all."""
        per_step = max(1.0, self.dataset_size * self.sampling_rate)
        return max(1, int(self.block_records // per_step))

    def batches(self, records: Records, steps: Optional[int] = None,
                epoch: int = 0) -> Iterator[tuple[list, np.ndarray]]:
        """One epoch: `steps` (default steps_per_epoch) pairs (records [max_batch_size] with b""
        padding, float32 mask). Randomness from OS entropy at each call; with a shared secret
        `key` (multi_worker.shared_key) from (key, epoch), so that every worker draws the same
        batches, one Poisson sample per step, as the accounting assumes; with a fixed `seed`
        (not private) from (seed, epoch)."""
        steps = self.steps_per_epoch if steps is None else _positive_int("steps", steps)
        if self.seed is not None:
            entropy = [self.seed % 2**64, epoch]
        elif self.key is not None:  # the stream of "key" apart from any "seed" stream
            entropy = [self.key, epoch, 1]
        else:
            entropy = secrets.randbits(128)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        directory = tempfile.mkdtemp(prefix="edp_tf_poisson_", dir=self.work_dir)
        try:
            files = self._spill(records, steps, rng, directory)
            yield from self._emit(files, steps, rng)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def record_dataset(self, records: Records, steps: Optional[int] = None):
        """`batches` as a tf.data.Dataset of (strings [max_batch_size], mask [max_batch_size]):
        each iteration (each Keras epoch) is a fresh epoch with fresh randomness."""
        import tensorflow as tf

        size = self.max_batch_size
        epochs = iter(range(2**62))

        def generate():
            for batch, mask in self.batches(records, steps, next(epochs)):
                yield np.array(batch, dtype=object), mask

        dataset = tf.data.Dataset.from_generator(generate, output_signature=(
            tf.TensorSpec([size], tf.string), tf.TensorSpec([size], tf.float32)))
        # Keras then knows an epoch's length and re-iterates (a fresh epoch) without warning.
        count = self.steps_per_epoch if steps is None else steps
        return batch_source._mark(iterators.without_autotune(
            dataset.apply(tf.data.experimental.assert_cardinality(count))), self)

    # ------------------------------------------------------------------ the two passes
    def _spill(self, records: Records, steps: int, rng: np.random.Generator,
               directory: str) -> list:
        """Appends each (step, record) pair to its block's file; returns the file paths."""
        per_block = self.steps_per_block
        paths = [os.path.join(directory, f"block{b:06d}") for b in
                 range(math.ceil(steps / per_block))]
        handles = [open(p, "wb", buffering=1 << 20) for p in paths]
        read = 0
        try:
            chunk = []
            for record in records():
                if not isinstance(record, (bytes, bytearray)):
                    raise TypeError(f"records must be bytes, got {type(record).__name__} "
                                    f"(record {read})")
                chunk.append(record)
                read += 1
                if len(chunk) == _CHUNK:
                    self._spill_chunk(chunk, steps, rng, handles, per_block)
                    chunk = []
            if chunk:
                self._spill_chunk(chunk, steps, rng, handles, per_block)
        finally:
            for handle in handles:
                handle.close()
        if read != self.dataset_size:
            raise ValueError(
                f"the reader gave {read} records but the sampler was built for "
                f"dataset_size={self.dataset_size}: q n, the expected batch the step divides "
                "by, and the accounting would be wrong")
        return paths

    def _spill_chunk(self, chunk: list, steps: int, rng: np.random.Generator, handles: list,
                     per_block: int) -> None:
        for index, step in _bernoulli_arrivals(len(chunk), steps, self.sampling_rate, rng):
            record = chunk[index]
            handles[step // per_block].write(_HEADER.pack(step, len(record)) + record)

    def _emit(self, paths: list, steps: int, rng: np.random.Generator):
        size, per_block = self.max_batch_size, self.steps_per_block
        for b, path in enumerate(paths):
            first = b * per_block
            taken = [[] for _ in range(min(per_block, steps - first))]
            with open(path, "rb") as handle:
                data = handle.read()
            offset = 0
            while offset < len(data):
                step, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                taken[step - first].append(data[offset:offset + length])
                offset += length
            del data
            for rows in taken:
                if len(rows) > size:
                    raise ValueError(
                        f"Poisson sample larger than max_batch_size={size} (q="
                        f"{self.sampling_rate}, n={self.dataset_size}): refusing to truncate, "
                        "which the accounting does not cover; raise max_batch_size")
                slots = rng.permutation(size)[:len(rows)]
                batch = [b""] * size
                mask = np.zeros(size, np.float32)
                for slot, row in zip(slots, rows):
                    batch[slot] = row
                mask[slots] = 1.0
                yield batch, mask


def _bernoulli_arrivals(count: int, steps: int, q: float,
                        rng: np.random.Generator) -> Iterator[tuple[int, int]]:
    """(record index, step) for every step in 0..steps-1 at which each of `count` records is
    taken, each independently with probability q: the arrivals of a Bernoulli(q) process,
    drawn as geometric gaps."""
    position = np.zeros(count, np.int64)  # the last arrival, 1-based; 0 = none yet
    active = np.arange(count)
    while active.size:
        position[active] += rng.geometric(q, active.size)
        active = active[position[active] <= steps]
        yield from zip(active.tolist(), (position[active] - 1).tolist())


def text_lines(paths: Iterable[str]) -> Records:
    """A reader of the lines of text files (sharded corpora), as bytes without the line end;
    every line is a record, an empty one included (a corpus decides what a record is)."""
    paths = [os.fspath(p) for p in paths]
    missing = [p for p in paths if not os.path.isfile(p)]
    if not paths or missing:
        raise ValueError(f"text_lines needs existing files, missing: {missing or 'all'}")

    def read():
        for path in paths:
            with open(path, "rb") as handle:
                for line in handle:
                    yield line.rstrip(b"\r\n")
    return read
