"""An output layer whose label weights are the labels' names, read by a public encoder.

Why: a plain `Dense(num_labels)` learns every label's column from that label's examples alone,
and under DP a rare label's few clipped examples drown in the noise every column gets. Here the
logit of label j is

    logit_j(h) = <P h, e_j> + s(h)[span(j)] + b_j

with e_j the unit-normed vector of label j's name (fixed, public: edp_nlu/models/label_names.py),
P one learned projection shared by all labels, s a 3-way B/I/O span score shared by every slot
type (tags only) and b_j a per-label bias; with `correction`, plus <w_j, h>, a column per label
that starts at zero (what the names cannot tell apart, "playlist" from "playlist owner", is
learnt there, as a plain head would). What the head learns from frequent types (P, s) moves
the rare ones whose names are near them; and the trained weights (P: hidden x dim, s: hidden x 3)
do not grow with the number of labels, so neither does the noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from edp_nlu.models import label_names
from edp_nlu.models.label_names import SPANS


@keras.saving.register_keras_serializable(package="edp_models")
class LabelAwareHead(keras.layers.Layer):
    """Logits over `num_labels` labels from name vectors of size `embedding_dim`; `spans` (one
    of label_names.OUTSIDE/BEGIN/INSIDE per label) adds the shared B/I/O score. The name vectors
    are a non-trainable weight: `set_label_embeddings` fills them, saving keeps them."""

    def __init__(self, num_labels: int, embedding_dim: int, spans: Sequence[int] | None = None,
                 correction: bool = False, **kwargs):
        super().__init__(**kwargs)
        if num_labels < 1 or embedding_dim < 1:
            raise ValueError(f"LabelAwareHead needs num_labels and embedding_dim >= 1, got "
                             f"{num_labels}, {embedding_dim}")
        self.num_labels = int(num_labels)
        self.embedding_dim = int(embedding_dim)
        self.spans = None if spans is None else [int(s) for s in spans]
        if self.spans is not None and (len(self.spans) != num_labels
                                       or not all(0 <= s < SPANS for s in self.spans)):
            raise ValueError(f"spans must give one of 0..{SPANS - 1} per label ({num_labels})")
        self.projection = keras.layers.Dense(embedding_dim, use_bias=False, name="projection")
        self.span_head = (None if self.spans is None
                          else keras.layers.Dense(SPANS, name="span_logits"))
        self.correction = (keras.layers.Dense(num_labels, use_bias=False,
                                              kernel_initializer="zeros", name="correction")
                           if correction else None)

    def build(self, input_shape):
        self.projection.build(input_shape)
        for layer in (self.span_head, self.correction):
            if layer is not None:
                layer.build(input_shape)
        self.label_embeddings = self.add_weight(
            name="label_embeddings", shape=(self.num_labels, self.embedding_dim),
            initializer="zeros", trainable=False)
        self.label_bias = self.add_weight(name="label_bias", shape=(self.num_labels,),
                                          initializer="zeros")

    def call(self, inputs):
        logits = _matmul_last_axis(self.projection(inputs), self.label_embeddings)
        if self.span_head is not None:
            span_of_label = tf.one_hot(self.spans, SPANS, dtype=logits.dtype)  # [labels, 3]
            logits += _matmul_last_axis(self.span_head(inputs), span_of_label)
        if self.correction is not None:
            logits += self.correction(inputs)
        return logits + self.label_bias

    def set_label_embeddings(self, matrix: np.ndarray) -> None:
        """Stores `matrix` [num_labels, embedding_dim] with unit rows (zero rows stay zero), so
        the logits' scale is P's, whatever the source's vector norms."""
        matrix = np.asarray(matrix, np.float32)
        if matrix.shape != (self.num_labels, self.embedding_dim):
            raise ValueError(f"label embeddings of shape {matrix.shape}, expected "
                             f"{(self.num_labels, self.embedding_dim)}")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        self.label_embeddings.assign(matrix / np.maximum(norms, 1e-12))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.num_labels)

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels,
                "embedding_dim": self.embedding_dim, "spans": self.spans,
                "correction": self.correction is not None}


def _matmul_last_axis(x: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """x [..., d] @ labels [n, d]^T as one 2-D MatMul. Why 2-D: the per-example step runs this
    under `tf.vectorized_map`, where a rank-3 x rank-2 matmul becomes a rank-4 BatchMatMul that
    TensorFlow 2.21's oneDNN kernel reads past its buffer with (heap corruption that garbled
    another tensor's ids; edp_tf/ghost/recording.py flat_matmul says the same)."""
    rows = tf.reshape(x, [-1, x.shape[-1]])
    out = tf.linalg.matmul(rows, labels, transpose_b=True)
    return tf.reshape(out, tf.concat([tf.shape(x)[:-1], [labels.shape[0]]], 0))


# Where a label's name vector comes from (`name_heads`' `source`, --config.label_head_names).
NAME_SOURCES = ("vectors", "words", "vectors+words")


def name_heads(task, preprocessor, word_vectors=None, source: str = "vectors") -> list[str]:
    """Fills `task`'s label-aware heads (JointTagger with label_embedding_dim > 0) with its
    labels' name vectors and returns the labels none of whose words the vectors know (they keep
    only their bias and span score). `source`:

    * "vectors": the mean vector of the name's words, from `word_vectors` (a public table:
      CLC's GloVe) when given, else from the task's own encoder (a pretrained BERT reading the
      names); reduced to the heads' width.
    * "words": a dimension per distinct word of the labels' names (label_names.
      word_count_matrix): a composed name is the exact sum of its words, so a rare slot type
      borrows each word's weights from the frequent types that share it.
    * "vectors+words": both, each at unit norm, the vectors reduced to the width the words
      leave.
    """
    if source not in NAME_SOURCES:
        raise ValueError(f"label_head_names={source!r}: expected one of {NAME_SOURCES}")
    matrices, unknown, head_words = [], [], []
    for labels in (preprocessor.intent_vocabulary.labels, preprocessor.tag_vocabulary.labels):
        vectors = None
        if "vectors" in source:
            if word_vectors is not None:
                vectors, missing = label_names.word_vector_matrix(labels, word_vectors.words,
                                                                  word_vectors.vectors)
            else:
                vectors, missing = label_names.encoder_matrix(task.encoder, preprocessor, labels)
            unknown += missing
        matrix, words = name_matrix(labels, source, int(task.label_embedding_dim), vectors)
        matrices.append(matrix)
        head_words.append(words)
    task.set_label_embeddings(*matrices)
    task.label_names_source = source
    # with "words": the word of each of the intent and tag projections' first columns
    task.label_name_words = tuple(head_words) if source == "words" else None
    return unknown


def head_width(dim: int, source: str, label_sets: Sequence[Sequence[str]]) -> int:
    """The label-aware heads' width for `dim` (--config.label_head_dim) and the labels of each
    head. With "words" it is at least the most distinct name words a head has: a column per
    word is the point of that source, so a user's larger schema widens the heads rather than
    being refused (a width that was enough stays exactly `dim`, so runs resume as built).
    "vectors" reduce to any width, and "vectors+words" keeps `dim` (name_matrix refuses one
    that leaves the vectors no room), since there the split between the two is the choice."""
    if dim <= 0 or source != "words":
        return int(dim)
    return max(int(dim), *(len(label_names.word_count_matrix(labels)[1]) for labels in label_sets))


def name_matrix(labels: Sequence[str], source: str, dim: int,
                vectors: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
    """([len(labels), dim] the labels' name vectors from `source` (see `name_heads`; `vectors`
    [len(labels), d] their mean word vectors, for "vectors" and "vectors+words"), the words of
    its word dimensions (none for "vectors"). Name words take a dimension each and come first
    for "words", after the vectors' `dim - len(words)` for "vectors+words"."""
    if source == "vectors":
        return label_names.reduced(vectors, dim), []
    counts, words = label_names.word_count_matrix(labels)
    need = len(words) + (source == "vectors+words")
    if dim < need:
        raise ValueError(f"label_head_dim={dim}: the names of these {len(labels)} labels have "
                         f"{len(words)} distinct words, one dimension each with "
                         f"label_head_names={source!r}; give label_head_dim >= {need}")
    if source == "words":
        return label_names.reduced(counts, dim), words
    vector_part = label_names.reduced(vectors, dim - len(words))
    return np.concatenate([label_names.unit_rows(vector_part), label_names.unit_rows(counts)],
                          axis=1), words
