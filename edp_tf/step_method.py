"""How the per-example pass can run on a model, decided before tracing: the vectorised methods
where `tf.vectorized_map` can run the model, the loop where it cannot; and the model dtypes the
step cannot run (mixed_float16's loss scaling).

Why decided once, before the first trace: `tf.vectorized_map` fails deep inside tracing on a
recurrent layer's own while_loop or on string ops whose shape depends on the data, so those
models are moved to the loop (exact for any layer, slower) with the faster way said once.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import keras
import tensorflow as tf

from edp_tf import ghost, preprocessing_split

_log = logging.getLogger(__name__)


MIXED_FLOAT16_REFUSED = (
    "mixed_float16 needs loss scaling (Keras wraps the optimizer in a LossScaleOptimizer), which "
    "the private step does not do: the optimizer would divide every clipped, noised update by "
    "the loss scale, and training would silently stop. Use "
    "keras.mixed_precision.set_global_policy('mixed_bfloat16') (no loss scaling needed) or "
    "float32, and build the model again")


def check_optimizer(model, optimizer) -> None:
    """What the private step cannot honour in an optimizer, refused at compile: a clip of the
    noisy update (after the privacy step; clipping is DPConfig.l2_norm_clip's) and loss
    scaling."""
    for name in ("clipnorm", "global_clipnorm", "clipvalue"):
        if getattr(optimizer, name, None):
            raise ValueError(f"optimizer.{name} would clip the noisy update after the privacy "
                             "step; clipping belongs to DPConfig.l2_norm_clip")
    refuse_loss_scaling(model, optimizer)


def refuse_loss_scaling(model, optimizer) -> None:
    """mixed_float16 is refused before any step: its loss scaling lives in Keras' own train
    step (scale the loss, unscale the gradients), and the private step has none."""
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    float16 = any(getattr(getattr(layer, "dtype_policy", None), "name", "") == "mixed_float16"
                  for layer in ghost.flatten_layers(model))
    if scaled or float16:
        raise ValueError(MIXED_FLOAT16_REFUSED)


# Keras' unrolled RNN zeroes a go_backwards layer's outputs with the mask in forward order while
# they run backwards (keras-team/keras#17596): over padded inputs, an unrolled Bidirectional
# layer's backward half is zero at the first (length - real length) positions
UNROLLED_NOTE = (". Over padded (masked) inputs, an unrolled Bidirectional layer needs "
                  "zero_output_for_mask = False on its forward_layer and backward_layer "
                  "(keras-team/keras#17596: else its backward half is zero at most positions)")


def unvectorisable_layers(model) -> list:
    """Recurrent layers that are not unrolled: each runs its own while_loop, which
    `tf.vectorized_map` (the ghost and vectorized methods) fails to vectorise over masked
    inputs, deep inside tracing."""
    return [f"{layer.name!r} ({type(layer).__name__}, unroll=False)"
            for layer in ghost.flatten_layers(model)
            if isinstance(layer, keras.layers.RNN) and not getattr(layer, "unroll", True)]


def unvectorisable_strings(model, x) -> bool:
    """The inputs `x` hold strings and the model does not begin with row-wise preprocessing
    that the per-example passes run on the whole batch (preprocessing_split.preprocessing_split):
    string ops (StringSplit) would then run inside `tf.vectorized_map`, which cannot vectorise
    them."""
    takes_strings = any(tf.as_dtype(t.dtype) == tf.string
                        for t in tf.nest.flatten(x) if hasattr(t, "dtype"))
    return takes_strings and (not tf.is_tensor(x)
                              or preprocessing_split.preprocessing_split(model) is None)


def choose(method: str, k: Optional[int], model, x, check: Callable[[str], None],
           said: set) -> str:
    """DPConfig's `method`, or the loop where a layer runs a while_loop of its own (a GRU /
    LSTM / SimpleRNN not unrolled) or string preprocessing (in the first batch `x`) runs ops
    that `tf.vectorized_map` cannot vectorise: exact for any layer, one micro-batch at a time.
    `check(why)` refuses the loop where the config cannot have it (with `why`); the switch is
    said once per `said` (the caller's set), with the faster way."""
    if k is None or method == "loop":
        return method
    layers = unvectorisable_layers(model)
    if not layers and unvectorisable_strings(model, x):
        check("the model takes strings that tf.vectorized_map cannot split per example (its "
              "preprocessing is not a leading row-wise chain, e.g. TextVectorization without "
              "output_sequence_length), so clipping runs the loop: give TextVectorization an "
              "output_sequence_length, or preprocess outside the model")
        if not said:
            _log.info("per-example clipping: the model takes strings whose preprocessing "
                      "tf.vectorized_map cannot vectorise (it is not a leading chain of "
                      "row-wise layers, e.g. TextVectorization without "
                      "output_sequence_length), so micro-batches are clipped one at a "
                      "time (per_example_method='loop': exact, slower); a fixed "
                      "output_sequence_length keeps the vectorised %r method", method)
            said.add("loop")
        return "loop"
    if not layers:
        return method
    check(f"layer(s) {', '.join(layers)} need per-example clipping one micro-batch at a time: "
          "build them with unroll=True (fixed sequence length)" + UNROLLED_NOTE)
    if not said:
        _log.info("per-example clipping: layer(s) %s run a while_loop that cannot be "
                  "vectorised, so micro-batches are clipped one at a time "
                  "(per_example_method='loop': exact, slower); build them with "
                  "unroll=True for the vectorised %r method%s", ", ".join(layers), method,
                  UNROLLED_NOTE)
        said.add("loop")
    return "loop"


# eDP micro-batches this large clip away nearly all of a step's signal (docs/design.md: a
# one-replica Conv2D net stayed at chance where per-example clipping learnt it).
MANY_EXAMPLES_PER_MICROBATCH = 8


def warn_if_few_clipped_vectors(mechanism, said: set) -> None:
    """Says once why eDP with one micro-batch per replica may not learn: the step sums N
    clipped vectors (N replicas) where per-example clipping sums about as many as the batch
    holds, against noise of the same order (sigma = z S C either way)."""
    if mechanism.microbatch_size is not None or "few clipped vectors" in said:
        return
    examples = mechanism.per_replica_batch
    if examples < MANY_EXAMPLES_PER_MICROBATCH:
        return
    said.add("few clipped vectors")
    _log.warning(
        "microbatch_size=None: each replica's %d rows are clipped as one vector, so a step "
        "sums at most %d clipped vector(s) where per-example clipping (microbatch_size=1, "
        "make_private's default) sums about %d, against noise of the same order: expect far "
        "less learning per step unless the replicas are many", examples, mechanism.replicas,
        mechanism.global_batch_size)
