"""Tiny synthetic utterances and model sizes shared by the models' tests (no TensorFlow ops at
import)."""

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
    word_embedding_dim=8,
    char_embedding_dim=4,
    char_filters=4,
    lstm_units=8,
    dropout=0.0,
    head_dropout=0.0,
)
TINY_BERT = dict(
    num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dropout=0.0, head_dropout=0.0
)


def onednn_enabled() -> bool:
    """Whether this process runs TensorFlow's oneDNN (MKL) CPU kernels.

    With oneDNN on, the batched MatMul that pfor makes of a rank-3 x rank-2 `tf.matmul` (keras'
    einsum "abc,cde->abde", i.e. keras-hub's EinsumDense attention projections) inside
    `tf.vectorized_map` corrupts the heap ("free(): invalid pointer") on TF 2.21. edp_tf's default
    ghost-norm path replaces EinsumDense and is not affected; plain per-example gradients of BERT
    by `tf.vectorized_map` need TF_ENABLE_ONEDNN_OPTS=0, set before TensorFlow is imported.
    """
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def rerun_without_onednn(test_file: str, test_id: str) -> None:
    """Runs one pytest test in a fresh process with oneDNN off; fails with its output if it
    fails."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        # -n 0: one process (pytest.ini's addopts would start xdist workers for one test)
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         f"{test_file}::{test_id}"],
        env=env, cwd=root, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout, result.stdout[-2000:]


def encoded(preprocessor_class, **sizes) -> tuple:
    """(preprocessor fitted on the tiny utterances with `sizes`, x, y): the models' tests'
    shared data."""
    pre = preprocessor_class.from_training_data(TOKENS, TAGS, INTENTS, **sizes)
    x, y, _ = pre.encode(TOKENS, TAGS, INTENTS)
    return pre, x, y
