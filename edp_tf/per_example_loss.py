"""Keras' loss, as `compile` takes it, turned into the per-example loss that clipping needs, and
the Keras masks that must survive the per-example machinery.

Why its own module: what a loss *is* per example (one or several outputs, their weights, the
output masks that weight positions) is a question about Keras' contract, apart from how the
micro-batches' gradients are formed from it (edp_tf/microbatch.py).
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import keras
import tensorflow as tf

_log = logging.getLogger(__name__)


PerExampleLoss = Callable[[object, object], tf.Tensor]


def as_per_example_loss(loss, loss_weights=None, output_names=None) -> PerExampleLoss:
    """Turns what `keras.Model.compile` accepts as a loss into `(y_true, y_pred) -> [batch]`.

    One loss (a `keras.losses.Loss`, its name, or a callable), or one per output as Keras takes
    them: a dict keyed by output name or a list in output order (None: that output has no
    loss), with `loss_weights` as a dict or list beside it. The per-example loss is
    sum_k weight_k L_k(example): Keras' own objective, per example (its mean over the batch is
    what `keras.Model.fit` minimises), so clipping acts on the example's whole contribution.
    A `keras.losses.Loss` is called through `.call`: no reduction and, importantly, none of the
    division by the replica count that Keras applies to reduced losses under a strategy.
    An output that carries a Keras mask (`Embedding(mask_zero=True)`, `Masking`) weights each
    position's loss by it, as Keras does: L_i = sum_t m_it l_it / T over the padded length T,
    so padding contributes nothing (`_masked`).
    `output_names`: a callable giving the model's output names (dict losses, list outputs).
    """
    if loss is None:
        raise ValueError("PrivateModel.compile needs a `loss` (per-example losses are clipped).")
    if not isinstance(loss, (list, tuple, dict)):
        if loss_weights is not None and not isinstance(loss_weights, (int, float)):
            raise ValueError("loss_weights for a single loss must be one number, "
                             f"got {loss_weights!r}")
        single = _per_example(loss)
        weight = 1.0 if loss_weights is None else float(loss_weights)
        return single if weight == 1.0 else (lambda y, p: weight * single(y, p))
    keys = list(loss) if isinstance(loss, dict) else list(range(len(loss)))
    losses = {k: _per_example(loss[k]) for k in keys if loss[k] is not None}
    if not losses:
        raise ValueError("PrivateModel.compile: every output's loss is None: nothing to train")
    weights = _loss_weights(loss_weights, keys, isinstance(loss, dict))

    def per_example(y_true, y_pred):
        total = 0.0
        for key, fn in losses.items():
            total += weights[key] * fn(_output(y_true, key, output_names, "y"),
                                       _output(y_pred, key, output_names, "the model's output"))
        return total

    return per_example


def _loss_weights(loss_weights, keys: list, by_name: bool) -> dict:
    if loss_weights is None:
        return {k: 1.0 for k in keys}
    if isinstance(loss_weights, dict):
        unknown = set(loss_weights) - set(keys)
        if unknown:
            raise ValueError(f"loss_weights name outputs without a loss: {sorted(unknown)}")
        return {k: float(loss_weights.get(k, 1.0)) for k in keys}
    if isinstance(loss_weights, (list, tuple)) and len(loss_weights) == len(keys) and not by_name:
        return {k: float(w) for k, w in zip(keys, loss_weights)}
    raise ValueError(f"loss_weights must match the losses: a dict by output name or a list of "
                     f"{len(keys)} numbers, got {loss_weights!r}")


def _output(structure, key, output_names, what: str):
    """Output `key` (a name or an index) of y_true / y_pred, whether Keras hands them over as a
    dict by name, a list in output order, or (one output) a tensor."""
    if isinstance(structure, dict):
        if key in structure:
            return structure[key]
        names = output_names() if output_names else None
        if isinstance(key, int) and names and names[key] in structure:
            return structure[names[key]]
        raise ValueError(f"{what} has no output {key!r} (it has {sorted(structure)})")
    if isinstance(structure, (list, tuple)):
        if isinstance(key, int):
            return structure[key]
        names = list(output_names() or []) if output_names else []
        if key not in names:
            raise ValueError(f"loss for output {key!r}, but the model's outputs are {names}")
        return structure[names.index(key)]
    return structure  # one output


def _per_example(loss) -> PerExampleLoss:
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    fn = loss.call if isinstance(loss, keras.losses.Loss) else loss
    if not callable(fn):
        raise ValueError(f"PrivateModel.compile: loss {loss!r} is not callable")

    def per_example(y_true, y_pred):
        # read before anything converts y_pred: only the model's own output tensor carries it
        mask = keras_mask(y_pred)
        values = fn(y_true, y_pred)
        mask = _both(mask, keras_mask(values))  # e.g. ignore_class masks the loss itself
        values = tf.convert_to_tensor(values)
        if values.shape.rank == 0:
            raise ValueError(
                "The loss returned a scalar; PrivateModel needs per-example values "
                "(shape [batch]): pass a keras.losses.Loss or a function without reduction."
            )
        if mask is not None:
            values = _masked(values, mask)
        if values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        return tf.cast(values, tf.float32)

    return per_example


def keras_mask(t) -> Optional[tf.Tensor]:
    """The mask Keras attached to a layer's output (`Embedding(mask_zero=True)`, `Masking`, and
    the layers that propagate it), or None."""
    if not tf.is_tensor(t):
        return None  # a dict or list of outputs: each output's loss reads its own
    try:
        from keras.src.backend import get_keras_mask
    except ImportError:  # a Keras without the helper keeps the mask as an attribute
        return getattr(t, "_keras_mask", None)
    return get_keras_mask(t)


def with_masks(y_pred) -> tuple:
    """(y_pred, {flat index: that output's Keras mask}): the masks as values of their own.

    Why: the attribute lives on the output tensor only, and what builds the batch's predictions
    anew (tf.vectorized_map's stacking, a loop's TensorArray, the merge of micro-batches) drops
    it; the compiled metrics read it, as Keras' do (`masks_attached` puts it back)."""
    masks = {}
    for i, t in enumerate(tf.nest.flatten(y_pred)):
        mask = keras_mask(t)
        if mask is not None:
            masks[i] = tf.convert_to_tensor(mask)
    return y_pred, masks


def masks_attached(carried: tuple):
    """y_pred of `with_masks`, each output with its mask attached again."""
    y_pred, masks = carried
    flat = tf.nest.flatten(y_pred)
    for i, mask in masks.items():
        try:
            from keras.src.backend import set_keras_mask
        except ImportError:
            flat[i]._keras_mask = mask
        else:
            set_keras_mask(flat[i], mask)
    return y_pred


def _both(a, b):
    if a is None or b is None:
        return a if b is None else b
    return tf.logical_and(tf.cast(a, tf.bool), tf.cast(b, tf.bool))


def _masked(values: tf.Tensor, mask) -> tf.Tensor:
    """values * mask, the mask's axes aligned with the leading axes of the values.

    Why: Keras weights each position's loss by the output mask (`keras.losses.Loss.__call__`),
    so padding positions contribute nothing. Keras then divides by the batch's count of valid
    positions, a data-dependent normaliser that per-example clipping cannot use; the mean over
    the padded length T that follows keeps L_i = sum_t m_it l_it / T, whose sum over the batch
    has exactly the gradient direction of Keras' masked objective (docs/design.md, section 2).
    A loss that already returned fewer axes than the mask has reduced the positions itself:
    its values are used as they are (Keras cannot broadcast that mask either)."""
    mask = tf.cast(mask, values.dtype)
    if mask.shape.rank == values.shape.rank + 1 and mask.shape[-1] == 1:
        mask = tf.squeeze(mask, -1)
    if mask.shape.rank > values.shape.rank:
        _log.warning("the loss returned values of shape %s for an output masked with shape %s: "
                     "used as they are (return one value per position for the mask to apply)",
                     values.shape, mask.shape)
        return values
    mask = tf.reshape(mask, tf.concat(
        [tf.shape(mask), tf.ones([values.shape.rank - mask.shape.rank], tf.int32)], 0))
    return values * mask
