"""Model state learned outside the clip, refused before the first private step.

Only what passes the clip may learn from the private batches. Two kinds of state escape it:
variables that the forward pass in training mode assigns (BatchNormalization's moving mean and
variance, any layer's running statistics: unnoised functions of each private batch), and the
state of preprocessing layers that `adapt` to data (Normalization, TextVectorization, lookups,
Discretization). Both are saved and exported with the weights, so a model holding either is
refused, naming the layer and the ways out. The check traces the forward pass inside a Keras
`StatelessScope` with only the inputs' shapes: no private value is read and no variable changes.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

import keras
import tensorflow as tf


def _layers(model: keras.layers.Layer) -> list:
    return list(model._flatten_layers(include_self=True, recursive=True))


def seed_states(model: keras.layers.Layer) -> list:
    """Random-number state (Dropout's seed generators): advanced by every call, data-free."""
    return [g.state for layer in _layers(model) for g in getattr(layer, "_seed_generators", ())]


def _seed_states(model: keras.layers.Layer) -> set:
    return {id(state) for state in seed_states(model)}


def _owner(model: keras.layers.Layer, variable) -> str:
    for layer in _layers(model):
        if layer is not model and any(v is variable for v in layer._trainable_variables
                                      + layer._non_trainable_variables):
            return f"{layer.name!r} ({type(layer).__name__})"
    return repr(getattr(variable, "path", variable.name))


def state_assigned_in_training(model: keras.layers.Layer, inputs) -> List[str]:
    """The layers whose non-trainable variables `model(inputs, training=True)` assigns.

    `inputs` only give shapes and dtypes: the call is traced, never run."""
    seeds = _seed_states(model)
    watched = [v for v in model.non_trainable_variables if id(v) not in seeds]
    if not watched:
        return []
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), inputs)
    assigned: list = []

    def forward(x):
        with keras.StatelessScope() as scope:
            model(x, training=True)
        assigned.extend(v for v in watched if scope.get_current_value(v) is not None)
        return tf.constant(0)

    # Unrolled recurrent layers are traced as loops here: the same assignments, in a trace of
    # one cell instead of one per position (seconds for an unrolled BiLSTM).
    unrolled = [layer for layer in _layers(model)
                if isinstance(layer, keras.layers.RNN) and layer.unroll]
    for layer in unrolled:
        layer.unroll = False
    try:
        tf.function(forward, autograph=False).get_concrete_function(specs)
    finally:
        for layer in unrolled:
            layer.unroll = True
    return sorted({_owner(model, v) for v in assigned})


def adaptable_layers(model: keras.layers.Layer, public: Iterable[str] = ()) -> List[str]:
    """Preprocessing layers whose state comes from data (they have `adapt`), except those the
    user declared public by name and the layers inside them.

    Why the inner ones: a layer's `adapt` fits the layers it holds (TextVectorization adapts
    its own StringLookup, named automatically), so declaring the outer layer's state public
    declares theirs; asking for the inner names as well would make a user name layers they
    never built, whose automatic names change from one process to the next."""
    public = set(public)
    covered = {id(inner) for layer in _layers(model) if layer is not model
               and layer.name in public for inner in _layers(layer)}
    adaptable = [layer for layer in _layers(model)
                 if layer is not model and callable(getattr(layer, "adapt", None))]
    # a layer held by another adaptable one is adapted by it (TextVectorization's own
    # StringLookup): the user built, and names, the outer one only
    inner = {id(held) for layer in adaptable for held in _layers(layer) if held is not layer}
    return [f"{layer.name!r} ({type(layer).__name__})" for layer in adaptable
            if id(layer) not in covered and id(layer) not in inner]


def training_signature(model: keras.layers.Layer) -> tuple:
    """What decides which state a training step can assign: every layer's `trainable` flag
    and the model's variables. The refusal is run again whenever it changes (a layer unfrozen
    between fits starts updating its statistics), and only then: tracing costs seconds."""
    return (tuple((id(layer), bool(layer.trainable)) for layer in _layers(model)),
            tuple(id(v) for v in model.variables))


def refuse_state_outside_the_clip(model: keras.layers.Layer, inputs,
                                  public_layers: Sequence[str] = ()) -> None:
    """ValueError naming each layer whose state would learn from the private data unclipped."""
    unknown = set(public_layers) - {layer.name for layer in _layers(model)}
    if unknown:  # a misspelt name would leave a public claim about no layer at all
        raise ValueError(f"public_layers names no layer of the model: {sorted(unknown)}")
    running = state_assigned_in_training(model, inputs)
    if running:
        raise ValueError(
            f"layer(s) {', '.join(running)} update non-trainable state from each training "
            "batch (e.g. BatchNormalization's moving mean and variance): those statistics of "
            "the private data bypass clipping and noise and would be saved with the weights. "
            "Use LayerNormalization or GroupNormalization, or freeze the layer "
            "(layer.trainable = False) so that it keeps statistics from public data")
    adapted = adaptable_layers(model, public_layers)
    if adapted:
        raise ValueError(
            f"layer(s) {', '.join(adapted)} hold state fitted to data by adapt() (a vocabulary, "
            "a mean and variance, bins), which no clipping or noise covers. Adapt them on "
            "public data and name them in make_private(..., public_layers=[...]) (or "
            "PrivateModel(..., public_layers=[...])), or move the preprocessing out of the "
            "model")
