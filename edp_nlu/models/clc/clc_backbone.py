"""CLC backbone (Ma & Hovy 2016): word embeddings + character CNN -> two BiLSTM layers.

Per token: a word embedding (pretrained or trained) concatenated with a char-CNN feature
(char embedding, convolution over the characters, max-pool over the word's characters), then
`num_lstm_layers` bidirectional LSTMs. The pooled state (for the intent head) is a masked max-pool
over the words.

The LSTMs are unrolled (`unroll=True`, the default): the private per-example step runs the model
inside `tf.vectorized_map`, and pfor cannot vectorise the gradient of Keras' `tf.while_loop`
LSTM (measured: TypeError on a variant ZerosLike). Unrolling needs the static `max_words`.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def _checked_vectors(word_embeddings, word_vocabulary_size: int) -> np.ndarray:
    """Pretrained vectors as float32, one row per word of the vocabulary."""
    word_embeddings = np.asarray(word_embeddings, dtype=np.float32)
    if word_embeddings.shape[0] != word_vocabulary_size:
        raise ValueError(
            f"word_embeddings has {word_embeddings.shape[0]} rows, "
            f"word_vocabulary_size is {word_vocabulary_size}"
        )
    return word_embeddings


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"CLCBackbone {name} must be >= 1, got {value}")


@keras.saving.register_keras_serializable(package="edp_models")
class CLCBackbone(keras.Model):
    """Inputs {"word_ids": [batch, max_words], "char_ids": [batch, max_words, max_word_length]}
    (0 = pad); outputs {"sequence_output": [batch, max_words, 2*lstm_units],
    "pooled_output": [batch, 2*lstm_units], "word_mask": bool [batch, max_words]}."""

    def __init__(
        self,
        word_vocabulary_size: int,
        char_vocabulary_size: int,
        max_words: int = 32,
        max_word_length: int = 20,
        word_embedding_dim: int = 100,
        char_embedding_dim: int = 30,
        char_filters: int = 30,
        char_kernel_size: int = 3,
        lstm_units: int = 384,
        num_lstm_layers: int = 2,
        dropout: float = 0.25,
        word_embeddings: np.ndarray | None = None,
        word_embeddings_trainable: bool = True,
        unroll: bool = True,
        **kwargs,
    ):
        if word_embeddings is not None:
            word_embeddings = _checked_vectors(word_embeddings, word_vocabulary_size)
            word_embedding_dim = int(word_embeddings.shape[1])
        _check_sizes(
            word_vocabulary_size=word_vocabulary_size,
            char_vocabulary_size=char_vocabulary_size,
            max_words=max_words,
            max_word_length=max_word_length,
            lstm_units=lstm_units,
            num_lstm_layers=num_lstm_layers,
        )

        # === Layers ===
        self.word_embedding = _word_embedding(
            word_vocabulary_size, word_embedding_dim, word_embeddings, word_embeddings_trainable
        )
        self.char_embedding = keras.layers.Embedding(
            char_vocabulary_size, char_embedding_dim, name="char_embedding"
        )
        self.char_dropout = keras.layers.Dropout(dropout, name="char_dropout")
        # The 1-D convolution over each word's characters is a Dense layer on stacked windows
        # (im2col): pfor has no vectorised Conv2DBackpropFilter and would fall back to a
        # while_loop over the examples of the per-example step (measured: "uses a while_loop").
        self.char_conv = keras.layers.Dense(char_filters, activation="tanh", name="char_conv")
        self.input_dropout = keras.layers.Dropout(dropout, name="input_dropout")
        self.lstm_layers = []
        self.lstm_dropouts = []
        for i in range(num_lstm_layers):
            self.lstm_layers.append(_bidirectional_lstm(lstm_units, unroll, f"bilstm_{i}"))
            self.lstm_dropouts.append(keras.layers.Dropout(dropout, name=f"bilstm_{i}_dropout"))

        # === Functional model ===
        word_ids = keras.Input(shape=(max_words,), dtype="int32", name="word_ids")
        char_ids = keras.Input(shape=(max_words, max_word_length), dtype="int32", name="char_ids")
        word_mask = ops.not_equal(word_ids, 0)
        x = self._word_states(word_ids, char_ids, word_mask, char_kernel_size)
        pooled = ops.max(ops.where(ops.expand_dims(word_mask, -1), x, -1e9), axis=1)
        pooled = ops.where(ops.any(word_mask, axis=1, keepdims=True), pooled, 0.0)
        super().__init__(
            inputs={"word_ids": word_ids, "char_ids": char_ids},
            outputs={"sequence_output": x, "pooled_output": pooled, "word_mask": word_mask},
            **kwargs,
        )

        # === Config ===
        self.word_vocabulary_size = word_vocabulary_size
        self.char_vocabulary_size = char_vocabulary_size
        self.max_words = max_words
        self.max_word_length = max_word_length
        self.word_embedding_dim = word_embedding_dim
        self.char_embedding_dim = char_embedding_dim
        self.char_filters = char_filters
        self.char_kernel_size = char_kernel_size
        self.lstm_units = lstm_units
        self.num_lstm_layers = num_lstm_layers
        self.dropout = dropout
        self.word_embeddings_trainable = word_embeddings_trainable
        self.unroll = unroll

    def _word_states(self, word_ids, char_ids, word_mask, char_kernel_size: int):
        """[batch, max_words, 2*lstm_units]: each word's embedding beside the max-pooled
        convolution of its characters, through the BiLSTM layers; 0 at padding words. Called
        while building the functional model (its layers are set, the Model not yet)."""
        char_mask = ops.expand_dims(ops.not_equal(char_ids, 0), -1)
        words = self.word_embedding(word_ids)
        chars = self.char_dropout(self.char_embedding(char_ids))
        # [batch, words, chars, filters]
        chars = self.char_conv(_char_windows(chars, char_kernel_size))
        chars = ops.max(ops.where(char_mask, chars, -1e9), axis=2)
        has_chars = ops.any(char_mask, axis=2)
        chars = ops.where(has_chars, chars, 0.0)
        x = self.input_dropout(ops.concatenate([words, chars], axis=-1))
        for lstm, drop in zip(self.lstm_layers, self.lstm_dropouts):
            x = ops.where(ops.expand_dims(word_mask, -1), lstm(x, mask=word_mask), 0.0)
            x = drop(x)
        return x

    def get_config(self):
        # Pretrained vectors are weights, not config: restore them with load_weights.
        return {
            "name": self.name,
            "trainable": self.trainable,
            "word_vocabulary_size": self.word_vocabulary_size,
            "char_vocabulary_size": self.char_vocabulary_size,
            "max_words": self.max_words,
            "max_word_length": self.max_word_length,
            "word_embedding_dim": self.word_embedding_dim,
            "char_embedding_dim": self.char_embedding_dim,
            "char_filters": self.char_filters,
            "char_kernel_size": self.char_kernel_size,
            "lstm_units": self.lstm_units,
            "num_lstm_layers": self.num_lstm_layers,
            "dropout": self.dropout,
            "word_embeddings_trainable": self.word_embeddings_trainable,
            "unroll": self.unroll,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _word_embedding(vocabulary_size: int, dim: int, vectors: np.ndarray | None,
                    trainable: bool) -> keras.layers.Embedding:
    """The word table, initialised from pretrained `vectors` when given (else uniform)."""
    initializer = keras.initializers.Constant(vectors) if vectors is not None else "uniform"
    return keras.layers.Embedding(vocabulary_size, dim, embeddings_initializer=initializer,
                                  trainable=trainable, name="word_embedding")


def _bidirectional_lstm(units: int, unroll: bool, name: str) -> keras.layers.Bidirectional:
    """A BiLSTM over right-padded words whose padding the caller zeroes.

    Why the directions keep their outputs at padded steps: Keras' unrolled RNN zeroes a
    `go_backwards` layer's outputs with the mask in forward order while the outputs are in
    reverse order (keras-team/keras#17596), and `Bidirectional` turns that zeroing on: the
    backward direction then gave zeros at the first (max_words - length) words of each
    utterance. Without the zeroing both directions are exact, unrolled or not; the padded steps
    carry a real step's output, which the caller replaces with zeros."""
    bilstm = keras.layers.Bidirectional(
        keras.layers.LSTM(units, return_sequences=True, unroll=unroll), name=name)
    for direction in (bilstm.forward_layer, bilstm.backward_layer):
        direction.zero_output_for_mask = False
    return bilstm


def _char_windows(chars, kernel_size: int):
    """[batch, words, chars, dim] -> [batch, words, chars, kernel_size * dim]: each character's
    zero-padded window ('same' padding), so that a Dense layer on it is a 1-D convolution.

    Why an einsum with a 0/1 shift tensor rather than kernel_size slices of the padded input: the
    gradient of each slice is a full-size StridedSliceGrad, which was the costliest op type of
    the CLC step (about 30 ms of 80 ms at batch 32); an einsum's gradient is an einsum. Each
    window entry is one input entry times 1 plus zeros: the same numbers exactly."""
    length, dim = chars.shape[2], chars.shape[3]
    left = (kernel_size - 1) // 2
    shift = np.zeros([kernel_size, length, length], np.float32)
    for i in range(kernel_size):
        for out in range(length):
            if 0 <= out + i - left < length:
                shift[i, out, out + i - left] = 1.0
    windows = ops.einsum("kec,bwcd->bwekd", ops.convert_to_tensor(shift, chars.dtype), chars)
    return ops.reshape(windows, (-1, chars.shape[1], length, kernel_size * dim))
