"""Ghost rule for `Embedding` tables (and keras' `ReversibleEmbedding` used forwards): z = W[ids];
the micro-batch gradient is scatter(dz at ids), whose norm comes from segment sums over the
distinct ids (never a vocabulary-sized table per example)."""
from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from edp_tf.ghost.recording import Capture, Use, rows
from edp_tf.ghost.registry import original_call, register


def embedding_call(cap: Capture, layer, inputs, reverse=False):
    if reverse:  # ReversibleEmbedding as an output projection: not covered
        w = cap.weight(layer._embeddings, "gather")
        if w is not None:
            w.reason = "also used as an output projection (reverse=True)"
        return original_call(type(layer))(layer, inputs, reverse=True)
    if inputs.dtype != "int32" and inputs.dtype != "int64":
        inputs = ops.cast(inputs, "int32")
    w = cap.weight(layer._embeddings, "gather")
    table = cap.read(w, layer._embeddings)
    outputs = ops.take(table, inputs, axis=0)
    d = table.shape[-1]
    cap.add(w, Use("gather", tf.reshape(inputs, [-1]), outputs, lambda dz: rows(dz, d)))
    return ops.cast(outputs, dtype=layer.compute_dtype)


def _plain_forward(layer) -> bool:
    # ReversibleEmbedding attaches its mask inside call, and LoRA adds a low-rank table: neither
    # is re-implemented here (exact per-example gradients instead)
    if getattr(layer, "lora_enabled", False):
        return False
    return type(layer) is keras.layers.Embedding or not getattr(layer, "mask_zero", False)


register(keras.layers.Embedding, embedding_call, applies=_plain_forward)
if hasattr(keras.layers, "ReversibleEmbedding"):
    register(keras.layers.ReversibleEmbedding, embedding_call, applies=_plain_forward)
