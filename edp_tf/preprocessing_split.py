"""A model cut after its leading row-wise preprocessing (TextVectorization, lookups, ...), so that
the per-example passes vectorise only the part with gradients (`preprocessing_split`)."""
from __future__ import annotations

import threading
import weakref
from typing import NamedTuple, Optional

import keras
import tensorflow as tf

# Keras' preprocessing layers whose output row is a function of the input row alone (with no
# trainable weight): computing them on a batch gives each row what computing it on that row
# alone gives. Exact types only: a subclass may override `call`.
_ROW_WISE = tuple(getattr(keras.layers, name) for name in (
    "TextVectorization", "StringLookup", "IntegerLookup", "Hashing", "Normalization",
    "Discretization", "CategoryEncoding", "Rescaling") if hasattr(keras.layers, name))
_SPLITS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_SPLITS_LOCK = threading.Lock()  # a MirroredStrategy traces its replicas on several threads


class PreprocessingSplit(NamedTuple):
    """A model cut after its leading row-wise preprocessing (`preprocessing_split`)."""

    layers: tuple  # the preprocessing layers, in the order the model applies them
    rest: object  # a keras.Model from their output to the model's outputs (the same layers)


def _row_wise(layer) -> bool:
    if type(layer) not in _ROW_WISE or layer.trainable_weights:
        return False
    config = layer.get_config()
    if config.get("ragged") or config.get("sparse"):
        return False  # no dense rows to split into micro-batches
    if not isinstance(layer, keras.layers.TextVectorization):
        return True
    # a user's own standardize or split callable may read the whole batch
    if not all(isinstance(config.get(key), (str, type(None))) for key in ("standardize", "split")):
        return False
    # output_mode="int" without output_sequence_length pads each batch to its longest row: a
    # row's output would depend on the other rows
    return not (config.get("output_mode") == "int"
                and config.get("output_sequence_length") is None)


def preprocessing_split(model) -> Optional[PreprocessingSplit]:
    """The model's leading chain of row-wise preprocessing layers (TextVectorization with a
    fixed output length, lookups, Hashing, Normalization, ...) and the model after it, or None.

    Why: `tf.vectorized_map` cannot vectorise the ops of string preprocessing (StringSplit's
    output shape depends on the data), and the layers have no trainable weight: run once on the
    replica's rows, each row's output is what that example alone gives, so the per-example
    machinery (ghost, vectorized) runs on the rest of the model, whose gradients they are.
    A model with one input whose first layers are such a chain (Sequential or functional);
    cached per model, built once outside any trace.
    """
    graph = _graph_of(model)
    if graph is None:
        return None
    with _SPLITS_LOCK:  # by graph: a Sequential builds a new one when its layers change
        if graph not in _SPLITS:
            _SPLITS[graph] = _split_after_preprocessing(graph)
        return _SPLITS[graph]


def _graph_of(model):
    """The functional graph that `model.call` runs, or None (a subclass with a `call` of its
    own runs something else)."""
    try:
        from keras.src.models.functional import Functional
    except ImportError:
        return None
    graph = model
    if isinstance(model, keras.Sequential):
        if type(model).call is not keras.Sequential.call:
            return None
        graph = getattr(model, "_functional", None)
    if not isinstance(graph, Functional) or type(graph).call is not Functional.call:
        return None
    return graph


def _split_after_preprocessing(graph) -> Optional[PreprocessingSplit]:
    split = None
    if len(graph.inputs) == 1:
        consumers: dict = {}
        for nodes in graph._nodes_by_depth.values():
            for node in nodes:
                for t in node.input_tensors:
                    consumers.setdefault(id(t), []).append(node)
        outputs = {id(t) for t in graph.outputs}
        chain, t = [], graph.inputs[0]
        while id(t) not in outputs and len(consumers.get(id(t), ())) == 1:
            node = consumers[id(t)][0]
            if (not _row_wise(node.operation) or len(node.input_tensors) != 1
                    or len(node.output_tensors) != 1):
                break
            chain.append(node.operation)
            t = node.output_tensors[0]
        if chain:
            with tf.init_scope():  # Keras' symbolic graph, never a trace's tensors
                split = PreprocessingSplit(tuple(chain), keras.Model(t, graph.output))
    return split


def after_preprocessing(model, x):
    """(the model to vectorise, its inputs): the rest of the model and the preprocessing's
    output on the replica's rows when the model begins with row-wise preprocessing."""
    split = preprocessing_split(model) if tf.is_tensor(x) else None
    if split is None:
        return model, x
    for layer in split.layers:
        x = layer(x)
    return split.rest, x
