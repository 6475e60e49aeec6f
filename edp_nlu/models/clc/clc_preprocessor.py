"""CLC preprocessing: whitespace words -> fixed-shape word ids and character ids, in TensorFlow ops.

One TensorFlow implementation serves both training (from token lists) and the exported SavedModel
(from raw strings), so training and serving cannot drift apart. It is a `tf.Module` rather than a
Keras layer because its state is lookup tables, which `tf.saved_model.save` tracks directly.

Ids: word 0 = [PAD], 1 = [UNK] (out-of-vocabulary word); char 0 = [PAD], 1 = [UNK] (unseen char).
Words are looked up lower-cased (GloVe 6B is uncased); characters keep their case.
"""

from __future__ import annotations

import collections
import string
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from edp_nlu.models import labels as labels_lib
from edp_nlu.models.clc.word_vectors import WordVectors

PAD, UNK = "[PAD]", "[UNK]"
RESERVED = 2  # [PAD], [UNK]
# Printable ASCII is always in the char vocabulary: it reveals nothing and covers upper case,
# which a lower-cased word list lacks.
PUBLIC_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)
# Whitespace as Python's str.split() sees it (RE2's \s alone is ASCII-only).
WHITESPACE_PATTERN = r"[\s\p{Z}\x{1c}-\x{1f}\x{85}]+"


def split_words(strings: tf.Tensor) -> tf.RaggedTensor:
    """Raw utterances [batch] -> whitespace words [batch, (words)], like `str.split()`."""
    strings = tf.strings.regex_replace(strings, WHITESPACE_PATTERN, " ")
    return tf.strings.split(strings)  # sep=None: no empty words, "" -> []


def _lower(words: tf.Tensor) -> tf.Tensor:
    return tf.strings.lower(words, encoding="utf-8")


class CLCPreprocessor(tf.Module):
    """Maps words to {"word_ids": [batch, max_words], "char_ids": [batch, max_words,
    max_word_length]}."""

    def __init__(
        self,
        word_vocabulary: Sequence[str],
        char_vocabulary: Sequence[str],
        tag_vocabulary: labels_lib.LabelVocabulary,
        intent_vocabulary: labels_lib.LabelVocabulary,
        max_words: int = 32,
        max_word_length: int = 20,
        vocabulary_from_training_data: bool = False,
        name: str = "clc_preprocessor",
    ):
        super().__init__(name=name)
        if max_words < 1 or max_word_length < 1:
            raise ValueError(
                f"max_words and max_word_length must be >= 1, got {max_words}, {max_word_length}"
            )
        if any(list(v[:RESERVED]) != [PAD, UNK] for v in (word_vocabulary, char_vocabulary)):
            raise ValueError(f"word and char vocabularies must start with {PAD}, {UNK}")
        self.word_vocabulary = list(word_vocabulary)
        self.char_vocabulary = list(char_vocabulary)
        self.tag_vocabulary = tag_vocabulary
        self.intent_vocabulary = intent_vocabulary
        self.max_words = int(max_words)
        self.max_word_length = int(max_word_length)
        # True when words/chars come from the training text: the vocabulary (exported with the
        # model) then reveals training words, which no epsilon covers.
        self.vocabulary_from_training_data = bool(vocabulary_from_training_data)
        self._word_table = _table(self.word_vocabulary[RESERVED:], first_id=RESERVED, default=1)
        self._char_table = _table(self.char_vocabulary[RESERVED:], first_id=RESERVED, default=1)

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def from_training_data(
        cls,
        tokens: Sequence[Sequence[str]],
        tags: Sequence[Sequence[str]],
        intents: Sequence[str],
        min_count: int = 1,
        max_vocabulary_size: int | None = None,
        **kwargs,
    ) -> "CLCPreprocessor":
        """Word and char vocabularies from the training text (not covered by epsilon: reported)."""
        labels_lib.check_lengths(tokens, tags, intents)
        flat = [w for utterance in tokens for w in utterance]
        counts = collections.Counter(_lower_python(flat))
        words = [
            w for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_count
        ]
        if max_vocabulary_size is not None:
            words = words[: max(0, max_vocabulary_size - RESERVED)]
        chars = sorted(PUBLIC_CHARS | {c for w in flat for c in w})
        label_vocabs = labels_lib.label_vocabularies(tags, intents, kwargs)
        return cls(
            [PAD, UNK, *words],
            [PAD, UNK, *chars],
            *label_vocabs,
            vocabulary_from_training_data=True,
            **kwargs,
        )

    @classmethod
    def from_word_vectors(
        cls,
        vectors: WordVectors,
        tags: Sequence[Sequence[str]],
        intents: Sequence[str],
        max_vocabulary_size: int | None = 20000,
        **kwargs,
    ) -> "CLCPreprocessor":
        """Public vocabulary: the most frequent words of the vectors file and their characters."""
        candidates = list(vectors.words)
        if max_vocabulary_size is not None:
            candidates = candidates[: 2 * max_vocabulary_size]  # room for case duplicates
        words = []
        seen = set()
        for word in _lower_python(candidates):
            if word not in seen and word not in (PAD, UNK):
                seen.add(word)
                words.append(word)
            if max_vocabulary_size is not None and len(words) >= max_vocabulary_size - RESERVED:
                break
        chars = sorted(PUBLIC_CHARS | {c for w in words for c in w})
        label_vocabs = labels_lib.label_vocabularies(tags, intents, kwargs)
        return cls(
            [PAD, UNK, *words],
            [PAD, UNK, *chars],
            *label_vocabs,
            vocabulary_from_training_data=False,
            **kwargs,
        )

    def get_config(self) -> dict:
        """JSON-serialisable; `from_config(get_config())` rebuilds the same preprocessor."""
        return {
            "word_vocabulary": list(self.word_vocabulary),
            "char_vocabulary": list(self.char_vocabulary),
            "tag_vocabulary": self.tag_vocabulary.to_config(),
            "intent_vocabulary": self.intent_vocabulary.to_config(),
            "max_words": self.max_words,
            "max_word_length": self.max_word_length,
            "vocabulary_from_training_data": self.vocabulary_from_training_data,
        }

    @classmethod
    def from_config(cls, config: dict) -> "CLCPreprocessor":
        config = dict(config)
        config["tag_vocabulary"] = labels_lib.LabelVocabulary.from_config(config["tag_vocabulary"])
        config["intent_vocabulary"] = labels_lib.LabelVocabulary.from_config(
            config["intent_vocabulary"]
        )
        return cls(**config)

    # --- TensorFlow path (training and serving) ---------------------------------------------
    def split(self, strings: tf.Tensor) -> tf.RaggedTensor:
        return split_words(strings)

    def encode_words(self, words: tf.RaggedTensor) -> dict:
        """[batch, (words)] strings -> fixed-shape int32 inputs; words past `max_words` are
        dropped."""
        words = words[:, : self.max_words]
        batch = words.nrows()
        word_ids = self._word_table.lookup(tf.ragged.map_flat_values(_lower, words))
        chars = tf.strings.unicode_split(words.flat_values, "UTF-8", errors="replace")
        chars = chars[:, : self.max_word_length]
        char_ids = self._char_table.lookup(chars)
        char_ids = tf.RaggedTensor.from_row_splits(char_ids, words.row_splits)
        return {
            "word_ids": tf.cast(word_ids.to_tensor(0, shape=[batch, self.max_words]), tf.int32),
            "char_ids": tf.cast(
                char_ids.to_tensor(0, shape=[batch, self.max_words, self.max_word_length]), tf.int32
            ),
        }

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
        report.truncated_utterances = int(np.sum(lengths > self.max_words))
        report.truncated_words = int(np.sum(np.maximum(lengths - self.max_words, 0)))
        ragged = tf.RaggedTensor.from_row_lengths(
            tf.constant(
                [w for t in tokens for w in t], dtype=tf.string, shape=[int(lengths.sum())]
            ),
            lengths,
        )
        x = {k: v.numpy() for k, v in self.encode_words(ragged).items()}
        report.unknown_words = int(np.sum(x["word_ids"] == 1))
        tag_ids, intent_ids = labels_lib.encode_labels(
            tags, intents, self.tag_vocabulary, self.intent_vocabulary, report
        )
        y = None
        if tag_ids is not None or intent_ids is not None:
            y = {}
            if tag_ids is not None:
                y["tags"] = _pad(tag_ids, self.max_words)
            if intent_ids is not None:
                y["intent"] = np.asarray(intent_ids, dtype=np.int32)
        return x, y, report


def _table(keys: Sequence[str], first_id: int, default: int) -> tf.lookup.StaticHashTable:
    values = tf.range(first_id, first_id + len(keys), dtype=tf.int64)
    init = tf.lookup.KeyValueTensorInitializer(
        tf.constant(list(keys), dtype=tf.string, shape=[len(keys)]), values
    )
    return tf.lookup.StaticHashTable(init, default_value=default)


def _lower_python(words: list[str]) -> list[str]:
    """Lower-cases exactly as the TensorFlow path does (tf.strings.lower, UTF-8)."""
    if not words:
        return []
    return [w.decode("utf-8") for w in _lower(tf.constant(words)).numpy()]


def _pad(sequences: list[list[int]], length: int) -> np.ndarray:
    out = np.zeros((len(sequences), length), dtype=np.int32)
    for i, seq in enumerate(sequences):
        seq = seq[:length]
        out[i, : len(seq)] = seq
    return out
