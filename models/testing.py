"""Tiny synthetic utterances and model sizes shared by the models' tests (no TensorFlow ops at import)."""

from __future__ import annotations

TOKENS = [
    ["call", "mum", "at", "0123"],
    ["play", "some", "jazz"],
    ["refill", "my", "aspirin", "prescription", "please"],
    ["call", "dad"],
    ["play", "rock", "music", "now"],
    ["refill", "ibuprofen"],
    ["text", "anna", "hello"],
    ["call", "the", "office", "at", "4567"],
]
TAGS = [
    ["O", "B-contact", "O", "B-phone"],
    ["O", "O", "B-genre"],
    ["O", "O", "B-medication", "O", "O"],
    ["O", "B-contact"],
    ["O", "B-genre", "O", "O"],
    ["O", "B-medication"],
    ["O", "B-contact", "B-message"],
    ["O", "B-contact", "I-contact", "O", "B-phone"],
]
INTENTS = ["call", "music", "refill", "call", "music", "refill", "message", "call"]

TINY_CLC = dict(
    word_embedding_dim=8, char_embedding_dim=4, char_filters=4, lstm_units=8, dropout=0.0, head_dropout=0.0
)
TINY_BERT = dict(num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dropout=0.0, head_dropout=0.0)


def onednn_enabled() -> bool:
    """Whether this process runs TensorFlow's oneDNN (MKL) CPU kernels.

    With oneDNN on, a batched MatMul that pfor makes from keras-hub's EinsumDense (rank-3 x rank-2
    inside `tf.vectorized_map`) corrupts the heap ("free(): invalid pointer"). Set
    TF_ENABLE_ONEDNN_OPTS=0 before TensorFlow is imported to run BERT's per-example path on CPU.
    """
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())
