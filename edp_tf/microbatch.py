"""Gradients of micro-batch losses: one per replica (eDP) or many, vectorised.

The micro-batch loss is `sum_i w_i L_i / k_e`: w is the 0/1 mask of real rows (Poisson sampling
pads), L_i the per-example loss and k_e the expected number of real examples in a micro-batch, so
that padding never changes the normalisation (DESIGN.md 2.4: normalise by the expected batch).
"""
from __future__ import annotations

import logging
from typing import Callable, NamedTuple, Sequence, Tuple

import keras
import tensorflow as tf

from edp_tf import clipping, ghost
from edp_tf.config import PER_EXAMPLE_METHODS

_log = logging.getLogger(__name__)


PerExampleLoss = Callable[[object, object], tf.Tensor]


def as_per_example_loss(loss) -> PerExampleLoss:
    """Turns a compiled loss into `(y_true, y_pred) -> [batch]` per-example values.

    A `keras.losses.Loss` is called through `.call` (no reduction and, importantly, none of the
    division by the replica count that Keras applies to reduced losses under a strategy).
    """
    if loss is None:
        raise ValueError("PrivateModel.compile needs a `loss` (per-example losses are clipped).")
    if isinstance(loss, (list, tuple, dict)):
        raise ValueError(
            "PrivateModel.compile takes one loss: a keras.losses.Loss or a callable "
            "(y_true, y_pred) -> per-example vector that handles nested outputs itself."
        )
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    fn = loss.call if isinstance(loss, keras.losses.Loss) else loss
    if not callable(fn):
        raise ValueError(f"PrivateModel.compile: loss {loss!r} is not callable")

    def per_example(y_true, y_pred):
        values = tf.convert_to_tensor(fn(y_true, y_pred))
        if values.shape.rank == 0:
            raise ValueError(
                "The loss returned a scalar; PrivateModel needs per-example values "
                "(shape [batch]): pass a keras.losses.Loss or a function without reduction."
            )
        if values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        return values

    return per_example


def _weighted_loss(model, loss_fn, x, y, w, k_e):
    y_pred = model(x, training=True)
    per_example = tf.cast(loss_fn(y, y_pred), tf.float32)
    return tf.reduce_sum(per_example * w) / k_e, y_pred


def _dense(grads: Sequence) -> list:
    # Noise is dense anyway, so sparse embedding gradients are densified once here.
    return [tf.convert_to_tensor(g) for g in grads]


def single_microbatch_gradient(
    model, loss_fn, variables, x, y, w, k_e: float
) -> Tuple[list, tf.Tensor, object]:
    """The replica's whole batch as one micro-batch (eDP-SGD): an ordinary backward pass."""
    with tf.GradientTape() as tape:
        loss, y_pred = _weighted_loss(model, loss_fn, x, y, w, k_e)
    grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return _dense(grads), loss[None], y_pred


def _split(t: tf.Tensor, k: int) -> tf.Tensor:
    shape = tf.shape(t)
    return tf.reshape(t, tf.concat([[shape[0] // k, k], shape[1:]], 0))


def _merge(t: tf.Tensor) -> tf.Tensor:
    shape = tf.shape(t)
    return tf.reshape(t, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def stacked_microbatch_gradients(
    model, loss_fn, variables, x, y, w, k: int, k_e: float
) -> Tuple[list, tf.Tensor, object]:
    """Gradients of m = b/k micro-batches of k examples, stacked on a leading axis [m, ...].

    `tf.vectorized_map` runs the forward and backward pass of all micro-batches as one batched
    computation (1.7x a plain step for BERT on CPU, vs 2.9x for a while_loop: STACK-FACTS.md).
    """
    xs, ys, ws = tf.nest.map_structure(lambda t: _split(t, k), (x, y, w))

    def one(args):
        xj, yj, wj = args
        with tf.GradientTape() as tape:
            loss, y_pred = _weighted_loss(model, loss_fn, xj, yj, wj, k_e)
        grads = tape.gradient(
            loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return _dense(grads), loss, y_pred

    grads, losses, y_pred = tf.vectorized_map(one, (xs, ys, ws))
    return grads, losses, tf.nest.map_structure(_merge, y_pred)


class GhostPass(NamedTuple):
    """What one vectorised pass over the micro-batches gives (see `ghost_pass`)."""

    plan: ghost.GhostPlan  # which variables use ghost norms (and why the others do not)
    rows: list  # per ghost weight: A / ids and dZ rows, stacked [m, P, ...]
    fallback: list  # exact micro-batch gradients of the other variables, stacked [m, ...]
    losses: tf.Tensor  # [m] micro-batch losses
    y_pred: object  # predictions, micro-batches merged back into the batch


def ghost_pass(model, loss_fn, variables, x, y, w, k: int, k_e: float) -> GhostPass:
    """One vectorised forward and backward pass over micro-batches of k examples.

    Per micro-batch it keeps the inputs A and output gradients dZ of covered weights (never their
    gradients) and the exact gradients of all other variables (edp_tf/ghost.py).
    """
    xs, ys, ws = tf.nest.map_structure(lambda t: _split(t, k), (x, y, w))
    traced = {}

    def one(args):
        xj, yj, wj = args
        with tf.GradientTape() as tape:
            with ghost.capture(model, variables) as cap:
                loss, y_pred = _weighted_loss(model, loss_fn, xj, yj, wj, k_e)
        traced["plan"] = plan = ghost.plan(cap, len(variables))
        rows, fallback = ghost.differentiate(tape, loss, plan, variables)
        return rows, fallback, loss, y_pred

    rows, fallback, losses, y_pred = tf.vectorized_map(one, (xs, ys, ws))
    plan = traced["plan"]
    _log.info("ghost norms for %d of %d variables; exact per-example gradients for the others%s",
              len(plan.ghost), len(variables), "".join(
                  f"; {getattr(variables[i], 'path', variables[i].name)}: {reason}"
                  for i, reason in plan.reasons.items()))
    return GhostPass(plan, list(rows), list(fallback), losses,
                     tf.nest.map_structure(_merge, y_pred))


def per_variable_squared_norms(
    model, loss_fn, variables, x, y, w, k: int, k_e: float
) -> Tuple[tf.Tensor, list]:
    """[m, K] squared norm of each micro-batch's gradient per variable (unscaled), and the
    indices of the variables whose norms came from ghost norms."""
    p = ghost_pass(model, loss_fn, variables, x, y, w, k, k_e)
    columns = [None] * len(variables)
    for i, sq in zip(p.plan.fallback_indices, clipping.stacked_squared_norms(p.fallback)):
        columns[i] = sq
    for weight, sq in zip(p.plan.ghost, ghost.squared_norms(p.plan, p.rows, variables)):
        columns[weight.index] = sq
    return tf.stack(columns, axis=1), [wt.index for wt in p.plan.ghost]


def ghost_clipped_gradient_sum(
    model, loss_fn, variables, x, y, w, k: int, k_e: float, alpha, l2_norm_clip: float
) -> Tuple[clipping.ClipResult, tf.Tensor, object]:
    """`clipped_gradient_sum` for micro-batches of k, with ghost norms where they apply.

    Norms in the scaled space are sqrt(sum_k ||G_k||^2 / alpha_k^2); the clipped sum of a covered
    weight is A^T (f * dZ), one matmul like the ordinary weight gradient, so no second backward
    pass is needed. Micro-batches with a non-finite norm get f = 0 and their rows are zeroed (only
    when there is one), so they contribute exactly 0.
    """
    p = ghost_pass(model, loss_fn, variables, x, y, w, k, k_e)
    alpha = list(alpha)
    fallback = clipping.scale(p.fallback, [alpha[i] for i in p.plan.fallback_indices])
    squares = clipping.stacked_squared_norms(fallback)
    for weight, sq in zip(p.plan.ghost, ghost.squared_norms(p.plan, p.rows, variables)):
        a = alpha[weight.index]
        squares.append(sq if a == 1.0 else sq * (1.0 / (a * a)))
    norms = tf.sqrt(tf.add_n(squares))
    factors, finite = clipping.clip_factors(norms, l2_norm_clip)
    rows = p.rows
    if rows:
        rows = tf.cond(tf.reduce_all(finite), lambda: list(p.rows),
                       lambda: ghost.zero_nonfinite(p.rows, finite))
    summed = [None] * len(variables)
    for i, g in zip(p.plan.fallback_indices, clipping.weighted_sum(fallback, factors, finite)):
        summed[i] = g
    ghost_sums = ghost.weighted_sums(p.plan, rows, factors, variables)
    ghost_sums = clipping.scale(ghost_sums, [alpha[wt.index] for wt in p.plan.ghost])
    for weight, g in zip(p.plan.ghost, ghost_sums):
        summed[weight.index] = g
    return clipping.ClipResult(summed, norms, finite), p.losses, p.y_pred


def looped_clipped_gradient_sum(
    model, loss_fn, variables, x, y, w, k: int, k_e: float, alpha, l2_norm_clip: float
) -> Tuple[clipping.ClipResult, tf.Tensor, object]:
    """`clipped_gradient_sum` one micro-batch at a time in a `tf.while_loop`: exact for any
    layer, including those `tf.vectorized_map` cannot vectorise (a recurrent layer's own
    while_loop over masked inputs), and memory for one micro-batch; slower (no batching).

    Micro-batch 0 runs before the loop: it fixes the structure of the predictions and the sums.
    """
    xs, ys, ws = tf.nest.map_structure(lambda t: _split(t, k), (x, y, w))
    m = tf.shape(ws)[0]

    def one(j):
        xj, yj, wj = tf.nest.map_structure(lambda t: t[j], (xs, ys, ws))
        grads, loss, y_pred = single_microbatch_gradient(model, loss_fn, variables, xj, yj, wj,
                                                         k_e)
        result = clipping.clip_single(clipping.scale(grads, alpha), l2_norm_clip)
        return result, loss[0], tf.nest.flatten(y_pred), y_pred

    first, loss0, preds0, structure = one(0)
    def arrays(dtype, value):
        return tf.TensorArray(dtype, size=m, element_shape=value.shape).write(0, value)

    state = (tf.constant(1), list(first.clipped_sum), arrays(tf.float32, first.norms[0]),
             arrays(tf.bool, first.finite[0]), arrays(tf.float32, loss0),
             [arrays(p.dtype, p) for p in preds0])

    def body(j, sums, norms, finite, losses, preds):
        result, loss, flat, _ = one(j)
        return (j + 1, [a + b for a, b in zip(sums, result.clipped_sum)],
                norms.write(j, result.norms[0]), finite.write(j, result.finite[0]),
                losses.write(j, loss), [ta.write(j, p) for ta, p in zip(preds, flat)])

    _, sums, norms, finite, losses, preds = tf.while_loop(lambda j, *_: j < m, body, state)
    y_pred = tf.nest.pack_sequence_as(structure, [
        tf.ensure_shape(ta.concat(), [None] + p.shape[1:]) for ta, p in zip(preds, preds0)])
    return (clipping.ClipResult(sums, norms.stack(), finite.stack()), losses.stack(), y_pred)


def clipped_gradient_sum(
    model, loss_fn, variables, x, y, w, microbatch_size, k_e: float, alpha, l2_norm_clip: float,
    method: str = "ghost",
) -> Tuple[clipping.ClipResult, tf.Tensor, object]:
    """sum_j clip_C(g_j / alpha) over the replica's micro-batches, with norms and losses.

    `microbatch_size=None`: the replica's batch is one micro-batch (eDP), else micro-batches of
    `microbatch_size` examples, whose gradients come from `method`: "ghost" (ghost norms for
    covered weights, exact per-example gradients for the rest), "vectorized" (per-example
    gradients of every variable: the reference, for benchmarks) or "loop" (one micro-batch at a
    time: any layer).
    Returns (ClipResult in the scaled space, micro-batch losses, y_pred).
    """
    if method not in PER_EXAMPLE_METHODS:
        raise ValueError(f"per-example method must be one of {PER_EXAMPLE_METHODS}, got {method!r}")
    if microbatch_size is None:
        grads, losses, y_pred = single_microbatch_gradient(model, loss_fn, variables, x, y, w, k_e)
        return clipping.clip_single(clipping.scale(grads, alpha), l2_norm_clip), losses, y_pred
    rows = tf.shape(tf.nest.flatten(x)[0])[0]
    check = tf.debugging.assert_equal(
        rows % microbatch_size, 0,
        message=f"per-replica batch not divisible by microbatch_size={microbatch_size}")
    with tf.control_dependencies([check]):
        if method == "ghost":
            return ghost_clipped_gradient_sum(
                model, loss_fn, variables, x, y, w, microbatch_size, k_e, alpha, l2_norm_clip)
        if method == "loop":
            return looped_clipped_gradient_sum(
                model, loss_fn, variables, x, y, w, microbatch_size, k_e, alpha, l2_norm_clip)
        grads, losses, y_pred = stacked_microbatch_gradients(
            model, loss_fn, variables, x, y, w, microbatch_size, k_e)
    return clipping.clip_and_sum(clipping.scale(grads, alpha), l2_norm_clip), losses, y_pred


def chunked_clipped_gradient_sum(
    model, loss_fn, variables, x, y, w, microbatch_size, k_e: float, alpha, l2_norm_clip: float,
    method: str = "ghost", chunk: int | None = None,
) -> Tuple[clipping.ClipResult, tf.Tensor, object]:
    """`clipped_gradient_sum` over chunks of at most `chunk` examples, one after the other.

    Why: per-example clipping holds every example's activations at once, so memory grows with the
    batch (MiniLM at an expected batch of ~1,050 took 17 GB on a CPU), while DP-SGD wants large
    batches. Chunks of whole micro-batches give exactly the same clipped sum (clipping is per
    micro-batch); each chunk starts after the previous one finished (control dependencies), so
    only one chunk's activations are alive. With one micro-batch per replica (eDP) the chunks'
    gradients are summed before the one clip: the same micro-batch gradient.
    """
    rows = tf.nest.flatten(x)[0].shape[0]
    if chunk is not None and rows is None:
        raise ValueError("DPConfig.physical_batch_size needs batches of a static size (the "
                         "PoissonSampler's, or .batch(..., drop_remainder=True))")
    if chunk is None or rows <= chunk:
        return clipped_gradient_sum(model, loss_fn, variables, x, y, w, microbatch_size, k_e,
                                    alpha, l2_norm_clip, method)
    take = lambda t, s, e: tf.nest.map_structure(lambda a: a[s:e], t)  # noqa: E731
    bounds = [(s, min(s + chunk, rows)) for s in range(0, rows, chunk)]
    done = []  # tensors the next chunk waits for
    sums, norms, finite, losses, preds = None, [], [], [], []
    for start, end in bounds:
        with tf.control_dependencies(done):
            xc, yc, wc = (tf.nest.map_structure(tf.identity, take(t, start, end))
                          for t in (x, y, w))
        if microbatch_size is None:
            grads, loss, y_pred = single_microbatch_gradient(model, loss_fn, variables, xc, yc, wc,
                                                             k_e)
            part = [clipping.scale(grads, alpha)]
        else:
            clip, loss, y_pred = clipped_gradient_sum(model, loss_fn, variables, xc, yc, wc,
                                                      microbatch_size, k_e, alpha, l2_norm_clip,
                                                      method)
            part = [clip.clipped_sum]
            norms.append(clip.norms)
            finite.append(clip.finite)
        sums = part[0] if sums is None else [a + b for a, b in zip(sums, part[0])]
        losses.append(loss)
        preds.append(y_pred)
        done = list(sums)  # every accumulated sum: the chunk's work is finished
    y_pred = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *preds)
    if microbatch_size is None:  # one micro-batch: its loss is the chunks' summed loss, [1]
        return clipping.clip_single(sums, l2_norm_clip), tf.add_n(losses), y_pred
    return (clipping.ClipResult(sums, tf.concat(norms, 0), tf.concat(finite, 0)),
            tf.concat(losses, 0), y_pred)
