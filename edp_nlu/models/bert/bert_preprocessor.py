"""BERT preprocessing with word alignment: whitespace words -> word pieces, and where each word
starts.

Each whitespace word is word-piece tokenised on its own (keras-hub's `BertTokenizer`, which may
still split it at punctuation: "0123-456" -> 0123, -, 456), so every piece belongs to exactly one
word. The NER head reads the first piece of each word: `word_starts[b, i]` is the position of word
`i`'s first piece in `token_ids` (0, i.e. [CLS], for padding words), which aligns word labels to
pieces and back. A word that yields no piece (e.g. only a zero-width space) becomes [UNK], so no
word loses its tag. Words whose pieces do not fit in `sequence_length` (with [CLS] and [SEP]) are
dropped and counted as truncated.

Like the CLC preprocessor this is one TensorFlow implementation for training and serving, a
`tf.Module`; the exported SavedModel needs `import tensorflow_text` (word-piece ops).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from edp_nlu.models import labels as labels_lib
from edp_nlu.models.clc.clc_preprocessor import split_words

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


class BertPreprocessor(tf.Module):
    """Maps words to {"token_ids", "segment_ids", "padding_mask": [batch, sequence_length],
    "word_starts": [batch, max_words]} (int32)."""

    def __init__(
        self,
        vocabulary: Sequence[str],
        tag_vocabulary: labels_lib.LabelVocabulary,
        intent_vocabulary: labels_lib.LabelVocabulary,
        sequence_length: int = 64,
        max_words: int | None = None,
        lowercase: bool = True,
        strip_accents: bool = True,
        vocabulary_from_training_data: bool = False,
        name: str = "bert_preprocessor",
    ):
        super().__init__(name=name)
        if sequence_length < 3:
            raise ValueError(
                f"sequence_length must be >= 3 ([CLS] word [SEP]), got {sequence_length}"
            )
        max_words = sequence_length - 2 if max_words is None else int(max_words)
        if not 1 <= max_words <= sequence_length - 2:
            raise ValueError(f"max_words must be in [1, sequence_length - 2], got {max_words}")
        missing = [t for t in SPECIAL_TOKENS if t not in vocabulary]
        if missing:
            raise ValueError(f"BERT vocabulary lacks special tokens {missing}")
        self.vocabulary = list(vocabulary)
        self.tag_vocabulary = tag_vocabulary
        self.intent_vocabulary = intent_vocabulary
        self.sequence_length = int(sequence_length)
        self.max_words = max_words
        self.lowercase = bool(lowercase)
        self.strip_accents = bool(strip_accents)
        # True when the word-piece vocabulary was learned from the training text: it is exported
        # with the model and reveals training words, which no epsilon covers.
        self.vocabulary_from_training_data = bool(vocabulary_from_training_data)
        import keras_hub  # here, not at the top: a CLC run's start-up does without it

        self.tokenizer = keras_hub.models.BertTokenizer(
            vocabulary=self.vocabulary, lowercase=self.lowercase, strip_accents=self.strip_accents
        )
        self.cls_id = self.vocabulary.index("[CLS]")
        self.sep_id = self.vocabulary.index("[SEP]")
        self.pad_id = self.vocabulary.index("[PAD]")
        self.unk_id = self.vocabulary.index("[UNK]")

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def from_checkpoint(
        cls, path: str, tags: Sequence[Sequence[str]], intents: Sequence[str], **kwargs
    ) -> "BertPreprocessor":
        """Vocabulary and casing of a local HuggingFace / keras-hub BERT checkpoint directory.

        HuggingFace's uncased BERT strips accents whenever it lower-cases (strip_accents=None);
        keras-hub's `from_preset` does not, so the flags are read here from tokenizer_config.json.
        """
        vocab_path = os.path.join(path, "vocab.txt")
        if not os.path.isfile(vocab_path):
            # a keras-hub preset
            vocab_path = os.path.join(path, "assets", "tokenizer", "vocabulary.txt")
        if not os.path.isfile(vocab_path):
            raise ValueError(
                f"no vocab.txt (or keras-hub vocabulary) under checkpoint directory {path}"
            )
        with open(vocab_path, encoding="utf-8") as handle:
            vocabulary = [line.rstrip("\n") for line in handle]
        lowercase, strip_accents = True, None
        config_path = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as handle:
                config = json.load(handle)
            lowercase = bool(config.get("do_lower_case", True))
            strip_accents = config.get("strip_accents")
        kwargs.setdefault("lowercase", lowercase)
        kwargs.setdefault(
            "strip_accents", lowercase if strip_accents is None else bool(strip_accents)
        )
        label_vocabs = labels_lib.label_vocabularies(tags, intents, kwargs)
        return cls(
            vocabulary,
            *label_vocabs,
            **kwargs,
        )

    @classmethod
    def from_training_data(
        cls,
        tokens: Sequence[Sequence[str]],
        tags: Sequence[Sequence[str]],
        intents: Sequence[str],
        vocabulary_size: int = 8000,
        lowercase: bool = True,
        **kwargs,
    ) -> "BertPreprocessor":
        """Learns a word-piece vocabulary from the training text (offline; reported as training
        data)."""
        labels_lib.check_lengths(tokens, tags, intents)
        text = tf.data.Dataset.from_tensor_slices(
            tf.constant([" ".join(t) for t in tokens] or [""])
        )
        import keras_hub

        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            text,
            vocabulary_size,
            lowercase=lowercase,
            strip_accents=lowercase,
            reserved_tokens=SPECIAL_TOKENS,
        )
        label_vocabs = labels_lib.label_vocabularies(tags, intents, kwargs)
        return cls(
            vocabulary,
            *label_vocabs,
            lowercase=lowercase,
            strip_accents=lowercase,
            vocabulary_from_training_data=True,
            **kwargs,
        )

    def get_config(self) -> dict:
        """JSON-serialisable; `from_config(get_config())` rebuilds the same preprocessor."""
        return {
            "vocabulary": list(self.vocabulary),
            "tag_vocabulary": self.tag_vocabulary.to_config(),
            "intent_vocabulary": self.intent_vocabulary.to_config(),
            "sequence_length": self.sequence_length,
            "max_words": self.max_words,
            "lowercase": self.lowercase,
            "strip_accents": self.strip_accents,
            "vocabulary_from_training_data": self.vocabulary_from_training_data,
        }

    @classmethod
    def from_config(cls, config: dict) -> "BertPreprocessor":
        config = dict(config)
        config["tag_vocabulary"] = labels_lib.LabelVocabulary.from_config(config["tag_vocabulary"])
        config["intent_vocabulary"] = labels_lib.LabelVocabulary.from_config(
            config["intent_vocabulary"]
        )
        return cls(**config)

    # --- TensorFlow path (training and serving) ---------------------------------------------
    def split(self, strings: tf.Tensor) -> tf.RaggedTensor:
        return split_words(strings)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def _tokenize_words(self, words: tf.Tensor) -> tf.RaggedTensor:
        # Traced: eager keras-hub tokenizers return Python lists, graph ones return tensors.
        return tf.cast(self.tokenizer(words), tf.int32)

    def word_pieces(self, words: tf.RaggedTensor) -> tf.RaggedTensor:
        """[batch, (words)] -> [batch, (words), (pieces)] ids; a word with no piece becomes
        [UNK]."""
        flat = words.flat_values
        pieces = self._tokenize_words(flat)  # [n, (pieces)]
        counts = pieces.row_lengths()
        unk = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.shape(flat)[0]], tf.constant(self.unk_id, tf.int32)),
            tf.ones_like(counts),
        )
        with_unk = tf.concat([pieces, unk], axis=1)
        keep = tf.ragged.range(counts + 1) < tf.maximum(counts, 1)[:, None]
        pieces = tf.ragged.boolean_mask(with_unk, keep)
        return tf.RaggedTensor.from_row_splits(pieces, words.row_splits)

    def encode_words(self, words: tf.RaggedTensor) -> dict:
        """[batch, (words)] strings -> fixed-shape int32 BERT inputs + `word_starts`."""
        return self._encode_pieces(self.word_pieces(words))[0]

    def _encode_pieces(self, pieces: tf.RaggedTensor):
        """Returns (inputs dict, kept word count per utterance)."""
        batch = pieces.nrows()
        counts = pieces.row_lengths(axis=2)  # ragged [batch, (words)]
        counts_dense = counts.to_tensor(0)
        num_words = pieces.row_lengths(axis=1)
        positions = tf.range(tf.shape(counts_dense)[1], dtype=num_words.dtype)[None]
        valid = positions < num_words[:, None]
        ends = tf.cumsum(counts_dense, axis=1)
        keep = valid & (ends <= self.sequence_length - 2) & (positions < self.max_words)
        kept_words = tf.reduce_sum(tf.cast(keep, tf.int64), axis=1)
        keep_flat = tf.ragged.boolean_mask(keep, valid).flat_values
        kept = tf.RaggedTensor.from_row_lengths(
            tf.ragged.boolean_mask(pieces.values, keep_flat), kept_words
        ).merge_dims(1, 2)
        cls = tf.fill([batch, 1], tf.constant(self.cls_id, tf.int32))
        sep = tf.fill([batch, 1], tf.constant(self.sep_id, tf.int32))
        tokens = tf.concat([cls, kept, sep], axis=1)
        token_ids = tokens.to_tensor(self.pad_id, shape=[batch, self.sequence_length])
        padding_mask = tf.sequence_mask(tokens.row_lengths(), self.sequence_length, dtype=tf.int32)
        starts = tf.where(keep, 1 + ends - counts_dense, tf.zeros_like(ends))[:, : self.max_words]
        starts = tf.pad(starts, [[0, 0], [0, self.max_words - tf.shape(starts)[1]]])
        inputs = {
            "token_ids": token_ids,
            "segment_ids": tf.zeros_like(token_ids),
            "padding_mask": padding_mask,
            "word_starts": tf.cast(tf.ensure_shape(starts, [None, self.max_words]), tf.int32),
        }
        return inputs, kept_words

    def __call__(self, strings: tf.Tensor) -> dict:
        return self.encode_words(self.split(strings))

    # --- Python path (datasets) ---------------------------------------------------------------
    def encode(
        self,
        tokens: Sequence[Sequence[str]],
        tags: Sequence[Sequence[str]] | None = None,
        intents: Sequence[str] | None = None,
    ) -> tuple[dict, dict | None, labels_lib.EncodingReport]:
        """Token lists (+ labels) -> (x numpy dict, y numpy dict or None, report of counts)."""
        labels_lib.check_lengths(tokens, tags, intents)
        report = labels_lib.EncodingReport(utterances=len(tokens))
        lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        report.words = int(lengths.sum())
        words = tf.RaggedTensor.from_row_lengths(
            tf.constant(
                [w for t in tokens for w in t], dtype=tf.string, shape=[int(lengths.sum())]
            ),
            lengths,
        )
        pieces = self.word_pieces(words)
        x, kept = self._encode_pieces(pieces)
        x = {k: v.numpy() for k, v in x.items()}
        kept = kept.numpy()
        report.truncated_utterances = int(np.sum(kept < lengths))
        report.truncated_words = int(np.sum(lengths - kept))
        word_pieces = pieces.values  # [words, (pieces)], each word has >= 1 piece
        first_pieces = tf.gather(word_pieces.values, word_pieces.row_starts()).numpy()
        report.unknown_words = int(np.sum(first_pieces == self.unk_id))
        tag_ids, intent_ids = labels_lib.encode_labels(
            tags, intents, self.tag_vocabulary, self.intent_vocabulary, report
        )
        y = None
        if tag_ids is not None or intent_ids is not None:
            y = {}
            if tag_ids is not None:
                y["tags"] = np.zeros((len(tokens), self.max_words), dtype=np.int32)
                for i, ids in enumerate(tag_ids):
                    y["tags"][i, : kept[i]] = ids[: kept[i]]
            if intent_ids is not None:
                y["intent"] = np.asarray(intent_ids, dtype=np.int32)
        return x, y, report


def piece_word_index(word_starts: np.ndarray, padding_mask: np.ndarray) -> np.ndarray:
    """For each piece, the index of the word it belongs to, or -1 ([CLS], [SEP], padding).

    Maps piece-level predictions back to words (and word labels to pieces) outside the model.
    """
    word_starts = np.asarray(word_starts)
    lengths = np.asarray(padding_mask).sum(axis=1)
    out = np.full(np.asarray(padding_mask).shape, -1, dtype=np.int64)
    for b in range(word_starts.shape[0]):
        starts = [int(s) for s in word_starts[b] if s > 0]
        bounds = starts + [int(lengths[b]) - 1]  # the last word ends before [SEP]
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            out[b, lo:hi] = i
    return out
