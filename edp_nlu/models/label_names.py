"""What a label's name says, as words and as vectors: the public side of a label-aware head.

Why: under DP every trained weight gets noise, and a slot type seen 12 times gets 12 clipped
examples' worth of signal against that noise. Its name ("depart date", "playlist owner") is
schema, public, and already close in a word-vector space to the words that fill it and to the
frequent types it resembles. A head whose output weights start from those names
(`edp_nlu/models/label_aware_head.py`) shares what it learns across types instead of learning
each column alone. Nothing here reads training text: the label names are public (see
edp_nlu/models/labels.py), so no epsilon is spent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from edp_nlu.models.labels import OUTSIDE_TAG, UNKNOWN_INTENT

# Spans of a BIO tag, the shared part of a label-aware tag head.
OUTSIDE, BEGIN, INSIDE = 0, 1, 2
SPANS = 3

# Abbreviations of the public schemas (ATIS's location prefixes and codes) spelt as words a
# word-vector vocabulary knows; a word missing from it only drops out of the label's mean.
ABBREVIATIONS = {
    "fromloc": ("from", "location"),
    "toloc": ("to", "location"),
    "stoploc": ("stop", "location"),
    "mod": ("modifier",),
    "iata": ("airport", "code"),
    "dept": ("departure",),
    "desc": ("description",),
    "num": ("number",),
    "qty": ("quantity",),
    "loc": ("location",),
    "poi": ("point", "of", "interest"),
}

# Words a schema puts in front of every label (ATIS's intents): they tell labels nothing apart.
_SCHEMA_WORDS = frozenset({"atis"})


def label_words(label: str) -> list[str]:
    """The words of a label's name: its BIO prefix and a schema's prefix dropped, split at
    `_ . # - /` and camelCase, lower case, abbreviations spelt out. "B-fromloc.city_name" ->
    from location city name; "AddToPlaylist" -> add to playlist; "O" and "[UNK]" -> none."""
    if label in (OUTSIDE_TAG, UNKNOWN_INTENT):
        return []
    name = label[2:] if label[:2] in ("B-", "I-") else label
    words: list[str] = []
    for part in re.split(r"[_.#\-/\s]+", name):
        if not part:
            continue
        for word in _camel_case_words(part):
            word = word.lower()
            if word in _SCHEMA_WORDS:
                continue
            words.extend(ABBREVIATIONS.get(word, (word,)))
    return words


def _camel_case_words(part: str) -> list[str]:
    """"AddToPlaylist" -> Add, To, Playlist; "HTTPServer" -> HTTP, Server; letters of any script
    ("città", "Straßen") stay whole words, digits split off."""
    words = []
    for run in re.findall(r"[^\W\d_]+|\d+", part) or [part]:
        start = 0
        for i in range(1, len(run)):
            upper_after_lower = run[i].isupper() and run[i - 1].islower()
            acronym_end = (run[i].islower() and run[i - 1].isupper()
                           and i - 1 > start and run[i - 2].isupper())
            if upper_after_lower or acronym_end:
                cut = i - 1 if acronym_end else i
                words.append(run[start:cut])
                start = cut
        words.append(run[start:])
    return words


def span_of(tag: str) -> int:
    """OUTSIDE, BEGIN or INSIDE for a BIO tag."""
    if tag == OUTSIDE_TAG:
        return OUTSIDE
    return BEGIN if tag.startswith("B-") else INSIDE


def word_vector_matrix(labels: Sequence[str], words: Sequence[str],
                       vectors: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """([len(labels), dim] the mean vector of each label's known words, zero where none is
    known; the labels with no known word). `words`/`vectors`: a public word-vector table
    (edp_nlu/models/clc/word_vectors.py)."""
    index = {word: i for i, word in enumerate(words)}
    matrix = np.zeros([len(labels), vectors.shape[1]], np.float32)
    unknown = []
    for row, label in enumerate(labels):
        known = [index[w] for w in label_words(label) if w in index]
        if known:
            matrix[row] = vectors[known].mean(axis=0)
        elif label not in (OUTSIDE_TAG, UNKNOWN_INTENT):
            unknown.append(label)
    return matrix, unknown


def encoder_matrix(encoder, preprocessor, labels: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """([len(labels), hidden] the mean of the encoder's `sequence_output` over each label name's
    words (a pretrained encoder's own reading of the name; e.g. MiniLM for BERT); zero where the
    name has no word). Inference only: no training data, no gradient."""
    names = [label_words(label) for label in labels]
    present = [i for i, words in enumerate(names) if words]
    hidden = int(encoder.output["sequence_output"].shape[-1])
    matrix = np.zeros([len(labels), hidden], np.float32)
    if not present:
        return matrix, []
    tokens = [names[i] for i in present]
    x, _, _ = preprocessor.encode(tokens, [[OUTSIDE_TAG] * len(t) for t in tokens],
                                  [preprocessor.intent_vocabulary.unknown] * len(tokens))
    inputs = {name: x[name] for name in encoder.input}
    out = encoder(inputs, training=False)
    mask = np.asarray(out["word_mask"], np.float32)[..., None]
    sums = (np.asarray(out["sequence_output"], np.float32) * mask).sum(axis=1)
    matrix[present] = sums / np.maximum(mask.sum(axis=1), 1.0)
    return matrix, []


def word_count_matrix(labels: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """([len(labels), W] how often each of the W distinct words of the labels' names occurs in
    each label's name; those W words, sorted). Why, beside word vectors: a mean of word vectors
    blurs a composed name ("from location city name" and "to location city name" share three
    of four words), while a column per name word keeps it exact, so a rare type's score is the
    sum of words the frequent types train ("stop location airport code": stop from
    "stoploc.city_name", airport code from "fromloc.airport_code")."""
    names = [label_words(label) for label in labels]
    words = sorted({w for name in names for w in name})
    index = {w: i for i, w in enumerate(words)}
    matrix = np.zeros([len(labels), len(words)], np.float32)
    for row, name in enumerate(names):
        for word in name:
            matrix[row, index[word]] += 1.0
    return matrix, words


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to norm 1 (zero rows stay zero)."""
    matrix = np.asarray(matrix, np.float32)
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def reduced(matrix: np.ndarray, dim: int) -> np.ndarray:
    """`matrix` [labels, d] as [labels, dim]: its top-`dim` singular directions when d > dim
    (a 384-d encoder's names in few dimensions keep the head's trained projection small, hence
    its noise), zero-padded when d or the rank is smaller (a padded column only meets zeros)."""
    matrix = np.asarray(matrix, np.float32)
    if matrix.shape[1] > dim:
        u, s, _ = np.linalg.svd(matrix, full_matrices=False)
        matrix = u[:, :dim] * s[:dim]
    return np.pad(matrix, [(0, 0), (0, dim - matrix.shape[1])])
