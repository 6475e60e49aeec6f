"""Micro-batch gradients, in one representation whatever the method, and their clipped sum.

`gradients(...)` returns a `MicrobatchGradients` for the replica's rows: one micro-batch (eDP),
micro-batches of k stacked by `tf.vectorized_map`, ghost-norm factors, or (for the loop method and
for memory-bounded chunks) a sum clipped as it goes. Each gives `clip()`: sum_j clip_C(g_j / alpha),
every term of norm <= C, the quantity whose sensitivity the mechanism states.

The micro-batch loss is `sum_i w_i L_i / k_e`: w is the 0/1 mask of real rows (Poisson sampling
pads), L_i the per-example loss (its positions weighted by the output's Keras mask) and k_e the
expected number of real examples in a micro-batch, so that padding never changes the
normalisation (docs/design.md, sampling: normalise by the expected batch).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from edp_tf import clipping, ghost, local_training, onednn_guard, padding
from edp_tf import selection as row_selection
from edp_tf.config import PER_EXAMPLE_METHODS
from edp_tf.per_example_loss import masks_attached, with_masks
from edp_tf.preprocessing_split import after_preprocessing

_log = logging.getLogger(__name__)


def _weighted_loss(model, loss_fn, x, y, w, k_e):
    """sum_i w_i L_i / k_e; k_e None: the mean over the micro-batch's real rows (a user's, or
    one example's augmented copies: w > 0 marks them, the weight scales the clipped update
    instead, `user_weights`)."""
    y_pred = model(x, training=True)
    per_example = tf.cast(loss_fn(y, y_pred), tf.float32)
    if k_e is None:
        real = tf.cast(w > 0, tf.float32)
        return tf.reduce_sum(per_example * real) / tf.maximum(tf.reduce_sum(real), 1.0), y_pred
    return tf.reduce_sum(per_example * w) / k_e, y_pred


USER_WEIGHT_RANGE = ("privacy_unit='user' or augment_copies > 1: every sample_weight (a user's "
                     "weight w_k, or an augmented example's) must be in [0, 1]: it scales the "
                     "*clipped* update, so a weight above 1 would move the sum by more than C, "
                     "the sensitivity accounted")


def user_weights(w: tf.Tensor, k: int) -> tf.Tensor:
    """[m] the weight w_k of each micro-batch's user (its rows' mask value; 0 for no user).

    Checked in the step, whatever the input pipeline: a weight outside [0, 1] stops training."""
    w = tf.cast(w, tf.float32)
    checks = [tf.debugging.assert_greater_equal(w, 0.0, message=USER_WEIGHT_RANGE),
              tf.debugging.assert_less_equal(w, 1.0, message=USER_WEIGHT_RANGE)]
    with tf.control_dependencies(checks):
        return tf.reduce_max(tf.reshape(w, [-1, k]), axis=1)


def _dense(grads: Sequence, variables: Sequence) -> list:
    # Noise is dense anyway, so sparse embedding gradients are densified once here.
    return [padding.shaped_like(g, v) for g, v in zip(grads, variables)]


def single_microbatch_gradient(
    model, loss_fn, variables, x, y, w, k_e: float
) -> Tuple[list, tf.Tensor, object]:
    """The replica's whole batch as one micro-batch (eDP-SGD): an ordinary backward pass."""
    with tf.GradientTape() as tape:
        loss, y_pred = _weighted_loss(model, loss_fn, x, y, w, k_e)
    grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return _dense(grads, variables), loss[None], y_pred


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
    computation (1.7x a plain step for BERT on CPU, vs 2.9x for a while_loop: docs/benchmarks.md).
    """
    model, x = after_preprocessing(model, x)
    xs, ys, ws = tf.nest.map_structure(lambda t: _split(t, k), (x, y, w))

    def one(args):
        xj, yj, wj = args
        with tf.GradientTape() as tape:
            loss, y_pred = _weighted_loss(model, loss_fn, xj, yj, wj, k_e)
        grads = tape.gradient(
            loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return _dense(grads, variables), loss, with_masks(y_pred)

    grads, losses, y_pred = _vectorized_map(one, (xs, ys, ws))
    return grads, losses, masks_attached(tf.nest.map_structure(_merge, y_pred))


def _vectorized_map(fn, elems):
    """`tf.vectorized_map`, refused when its graph holds a matmul oneDNN miscomputes
    (edp_tf/onednn_guard.py)."""
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    result = tf.vectorized_map(fn, elems)
    onednn_guard.refuse_corrupting_matmuls(graph.get_operations()[first:])
    return result


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
    gradients) and the exact gradients of all other variables (edp_tf/ghost/).
    """
    model, x = after_preprocessing(model, x)
    xs, ys, ws = tf.nest.map_structure(lambda t: _split(t, k), (x, y, w))
    traced = {}

    def one(args):
        xj, yj, wj = args
        with tf.GradientTape() as tape:
            with ghost.capture(model, variables) as cap:
                loss, y_pred = _weighted_loss(model, loss_fn, xj, yj, wj, k_e)
        traced["plan"] = plan = ghost.plan(cap, len(variables))
        rows, fallback = ghost.differentiate(tape, loss, plan, variables)
        return rows, fallback, loss, with_masks(y_pred)

    rows, fallback, losses, y_pred = _vectorized_map(one, (xs, ys, ws))
    plan = traced["plan"]
    _log.info("ghost norms for %d of %d variables; exact per-example gradients for the others%s",
              len(plan.ghost), len(variables), "".join(
                  f"; {getattr(variables[i], 'path', variables[i].name)}: {reason}"
                  for i, reason in plan.reasons.items()))
    return GhostPass(plan, list(rows), list(fallback), losses,
                     masks_attached(tf.nest.map_structure(_merge, y_pred)))


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


@dataclasses.dataclass(frozen=True)
class ClipPlan:
    """How a replica turns its rows into a clipped sum: constants of the traced step."""

    microbatch_size: Optional[int]  # None: the replica's rows are one micro-batch (eDP)
    expected_examples: Optional[float]  # k_e: a micro-batch's loss is sum_i w_i L_i / k_e
    # (None: the mean over its real rows, for user-level micro-batches)
    scales: tuple  # alpha_k per trainable variable: clipping happens on g_k / alpha_k
    l2_norm_clip: float  # C
    method: str = "ghost"  # per-example method: "ghost", "vectorized" or "loop"
    chunk: Optional[int] = None  # at most this many rows at once (memory), None: all
    local: Optional[local_training.LocalTraining] = None  # DP-FedAvg: a user's local epochs
    selection: Optional[row_selection.RowSelection] = None  # sparse embedding noise (AdaFEST)
    per_layer: bool = False  # each variable clipped to C / sqrt(K) (clipping.per_layer_factors)

    def __post_init__(self) -> None:
        if self.method not in PER_EXAMPLE_METHODS:
            raise ValueError(f"per-example method must be one of {PER_EXAMPLE_METHODS}, "
                             f"got {self.method!r}")
        object.__setattr__(self, "scales", tuple(float(a) for a in self.scales))


class MicrobatchGradients:
    """The replica's micro-batch gradients in the scaled space, with their losses [m] and the
    predictions of the batch. Subclasses say how the gradients are held; `clip()` is the one
    contract the step relies on."""

    losses: tf.Tensor
    y_pred: object
    weights: Optional[tf.Tensor] = None  # [m] users' weights: scale each *clipped* update

    def clip(self, l2_norm_clip: float, selection: Optional[row_selection.RowSelection] = None,
             per_layer: bool = False) -> clipping.ClipResult:
        """The clipped sum (flat, or per layer); with `selection`, also the clipped counts of the
        rows each micro-batch touches in the selection's tables."""
        raise NotImplementedError


class _Materialised(MicrobatchGradients):
    """Gradients held until clipping: squared norms first, then the factor-weighted sum."""

    def variable_squared_norms(self) -> list:
        """Per variable, the [m] squared norms of each micro-batch's scaled gradient."""
        raise NotImplementedError

    def squared_norms(self) -> tf.Tensor:
        """[m] squared norm of each micro-batch's scaled gradient."""
        return tf.add_n(self.variable_squared_norms())

    def weighted_sum(self, factors, finite: tf.Tensor) -> list:
        """sum_j f_j g_j / alpha per variable (factors [m], or one [m] per variable);
        non-finite micro-batches contribute exactly 0."""
        raise NotImplementedError

    def presence(self, index: int) -> tf.Tensor:
        """[m, rows] 1.0 where micro-batch j's gradient of table `index` has a nonzero row."""
        raise NotImplementedError

    def clip(self, l2_norm_clip: float, selection: Optional[row_selection.RowSelection] = None,
             per_layer: bool = False) -> clipping.ClipResult:
        squares = self.variable_squared_norms()
        norms = tf.sqrt(tf.add_n(squares))
        factors, finite = clipping.clip_factors(norms, l2_norm_clip)
        if per_layer:
            factors = clipping.per_layer_factors(squares, l2_norm_clip, finite)
        if self.weights is not None:  # w_k <= 1: each user still moves the sum by <= C
            w = tf.cast(self.weights, tf.float32)
            factors = [f * w for f in factors] if per_layer else factors * w
        counts = None
        if selection is not None:
            counts = row_selection.clipped_counts(
                [self.presence(i) for i in selection.indices], selection.clip, finite)
        return clipping.ClipResult(self.weighted_sum(factors, finite), norms, finite, counts)


class SingleGradient(_Materialised):
    """The replica's whole batch as one micro-batch (eDP-SGD): an ordinary backward pass."""

    def __init__(self, grads, losses, y_pred, scales):
        self.scaled = clipping.scale(grads, scales)
        self.losses, self.y_pred = losses, y_pred

    def variable_squared_norms(self) -> list:
        # l2_loss is one fused pass (sum of squares / 2), no squared temporary.
        return [2.0 * tf.nn.l2_loss(tf.cast(g, tf.float32))[None] for g in self.scaled]

    def weighted_sum(self, factors, finite) -> list:
        # multiply_no_nan gives exactly 0 for a non-finite gradient when the factor is 0, without
        # a select over the whole gradient
        return [tf.math.multiply_no_nan(g, tf.cast(clipping.factor_of(factors, k)[0], g.dtype))
                for k, g in enumerate(self.scaled)]

    def presence(self, index: int) -> tf.Tensor:
        return row_selection.rows_of_dense(self.scaled[index][None])


class StackedGradients(_Materialised):
    """Exact gradients of m micro-batches stacked on a leading axis [m, ...]."""

    def __init__(self, stacked, losses, y_pred, scales):
        self.scaled = clipping.scale(stacked, scales)
        self.losses, self.y_pred = losses, y_pred

    def variable_squared_norms(self) -> list:
        return clipping.stacked_squared_norms(self.scaled)

    def weighted_sum(self, factors, finite) -> list:
        return clipping.weighted_sum(self.scaled, factors, finite)

    def presence(self, index: int) -> tf.Tensor:
        return row_selection.rows_of_dense(self.scaled[index])


class GhostGradients(_Materialised):
    """Ghost norms for covered weights (never their per-example gradients), stacked exact
    gradients for the others.

    Norms in the scaled space are sqrt(sum_k ||G_k||^2 / alpha_k^2); the clipped sum of a covered
    weight is A^T (f * dZ), one matmul like the ordinary weight gradient, so no second backward
    pass is needed.
    """

    def __init__(self, ghost_pass_: "GhostPass", variables, scales):
        self.pass_, self.variables, self.scales = ghost_pass_, variables, list(scales)
        plan = ghost_pass_.plan
        self.fallback = clipping.scale(ghost_pass_.fallback,
                                       [self.scales[i] for i in plan.fallback_indices])
        self.losses, self.y_pred = ghost_pass_.losses, ghost_pass_.y_pred

    def variable_squared_norms(self) -> list:
        p = self.pass_
        squares = [None] * len(self.variables)
        for i, sq in zip(p.plan.fallback_indices, clipping.stacked_squared_norms(self.fallback)):
            squares[i] = sq
        for weight, sq in zip(p.plan.ghost, ghost.squared_norms(p.plan, p.rows, self.variables)):
            a = self.scales[weight.index]
            squares[weight.index] = sq if a == 1.0 else sq * (1.0 / (a * a))
        return squares

    def weighted_sum(self, factors, finite) -> list:
        """Micro-batches with a non-finite norm get f = 0 and their rows are zeroed (only when
        there is one), so they contribute exactly 0."""
        p = self.pass_
        rows = p.rows
        if rows:
            rows = tf.cond(tf.reduce_all(finite), lambda: list(p.rows),
                           lambda: ghost.zero_nonfinite(p.rows, finite))
        summed = [None] * len(self.variables)
        fallback_factors = ([factors[i] for i in p.plan.fallback_indices]
                            if isinstance(factors, (list, tuple)) else factors)
        for i, g in zip(p.plan.fallback_indices,
                        clipping.weighted_sum(self.fallback, fallback_factors, finite)):
            summed[i] = g
        ghost_sums = ghost.weighted_sums(p.plan, rows, factors, self.variables)
        ghost_sums = clipping.scale(ghost_sums, [self.scales[wt.index] for wt in p.plan.ghost])
        for weight, g in zip(p.plan.ghost, ghost_sums):
            summed[weight.index] = g
        return summed

    def presence(self, index: int) -> tf.Tensor:
        p = self.pass_
        if index in p.plan.fallback_indices:
            return row_selection.rows_of_dense(
                self.fallback[p.plan.fallback_indices.index(index)])
        for weight, (ia, iz) in zip(p.plan.ghost, p.plan.layout):
            if weight.index == index and weight.kind == "gather":
                return row_selection.rows_of_gather(p.rows[ia], p.rows[iz],
                                                    int(self.variables[index].shape[0]))
        raise ValueError(f"variable {index} is not an embedding lookup: no rows to select")


class ClippedAsItWent(MicrobatchGradients):
    """A sum clipped while the gradients were computed (the loop method; memory-bounded chunks):
    the micro-batch gradients never exist all at once, so there is nothing left to hold."""

    def __init__(self, result: clipping.ClipResult, l2_norm_clip: float, losses, y_pred):
        self._result, self._clip = result, l2_norm_clip
        self.losses, self.y_pred = losses, y_pred

    def clip(self, l2_norm_clip: float, selection: Optional[row_selection.RowSelection] = None,
             per_layer: bool = False) -> clipping.ClipResult:
        if l2_norm_clip != self._clip:
            raise ValueError(f"these gradients were clipped to {self._clip}, not {l2_norm_clip}")
        if selection is not None and self._result.counts is None:
            raise ValueError("these gradients were clipped without row counts (the loop "
                             "method does not support sparse embedding noise)")
        return self._result


def gradients(model, loss_fn, variables, x, y, w, plan: ClipPlan) -> MicrobatchGradients:
    """The replica's micro-batch gradients as `plan` says: the one entry point of the step."""
    rows = tf.nest.flatten(x)[0].shape[0]
    if plan.chunk is not None and rows is None:
        raise ValueError("DPConfig.physical_batch_size needs batches of a static size (the "
                         "PoissonSampler's, or .batch(..., drop_remainder=True))")
    if plan.chunk is not None and rows > plan.chunk:
        return _chunked(model, loss_fn, variables, x, y, w, plan)
    return unchunked_gradients(model, loss_fn, variables, padding.cut(model, x), y, w, plan)


def unchunked_gradients(model, loss_fn, variables, x, y, w, plan: ClipPlan) -> MicrobatchGradients:
    """`gradients` for rows processed at once (one chunk)."""
    k, k_e = plan.microbatch_size, plan.expected_examples
    if k is None:
        return SingleGradient(*single_microbatch_gradient(model, loss_fn, variables, x, y, w, k_e),
                              plan.scales)
    rows = tf.shape(tf.nest.flatten(x)[0])[0]
    check = tf.debugging.assert_equal(
        rows % k, 0, message=f"per-replica batch not divisible by microbatch_size={k}")
    with tf.control_dependencies([check]):
        if plan.local is not None or plan.method == "loop":  # (DP-FedAvg: local training)
            return _looped(model, loss_fn, variables, x, y, w, plan)
        if plan.method == "ghost":
            grads = GhostGradients(ghost_pass(model, loss_fn, variables, x, y, w, k, k_e),
                                   variables, plan.scales)
        else:
            grads = StackedGradients(*stacked_microbatch_gradients(
                model, loss_fn, variables, x, y, w, k, k_e), plan.scales)
        if k_e is None:  # one user (one example's copies) a micro-batch, weighted after clip
            grads.weights = user_weights(w, k)
        return grads


def _loop_body(fn: Callable) -> Tuple[Callable, object]:
    """(fn as a function of an int32 scalar, the specs of its outputs) for a `tf.while_loop` body.

    Why: the loop's state needs the outputs' structure and shapes before the loop, and taking
    them from a first call outside it traced the micro-batch's forward and backward pass (and
    `tf.vectorized_map`'s conversion of it, most of a chunked or looped run's start-up) twice,
    and gave Grappler two copies to optimise. The specs come from the one trace, and the loop
    holds the only call.
    """
    traced = tf.function(fn, autograph=False, input_signature=[tf.TensorSpec([], tf.int32)])
    return traced, traced.get_concrete_function().structured_outputs


def _zeros(spec) -> tf.Tensor:
    return tf.zeros(spec.shape, spec.dtype)


def _array(spec, size, element=slice(None)) -> tf.TensorArray:
    """An array of `size` elements shaped like `spec` (or like `spec.shape[element]`)."""
    return tf.TensorArray(spec.dtype, size=size, element_shape=spec.shape[element])


def _looped(model, loss_fn, variables, x, y, w, plan: ClipPlan) -> ClippedAsItWent:
    """One micro-batch at a time in a `tf.while_loop`: exact for any layer, including those
    `tf.vectorized_map` cannot vectorise (a recurrent layer's own while_loop over masked inputs),
    and memory for one micro-batch; slower (no batching).
    """
    xs, ys, ws = tf.nest.map_structure(lambda t: _split(t, plan.microbatch_size), (x, y, w))
    m = tf.shape(ws)[0]

    def one(j):
        xj, yj, wj = tf.nest.map_structure(lambda t: t[j], (xs, ys, ws))
        if plan.local is not None:
            update = local_training.pseudo_gradient(model, loss_fn, variables, xj, yj, wj,
                                                    plan.local)
        else:
            update = single_microbatch_gradient(model, loss_fn, variables, xj, yj, wj,
                                                plan.expected_examples)
        g = SingleGradient(*update, plan.scales)
        if plan.expected_examples is None:  # a user's (an example's) weight, after clipping
            g.weights = user_weights(wj, plan.microbatch_size)
        carried = with_masks(g.y_pred)
        return (g.clip(plan.l2_norm_clip, per_layer=plan.per_layer), g.losses[0],
                tf.nest.flatten(carried), carried)

    one, (first, loss0, preds0, structure) = _loop_body(one)
    one_norm = slice(1, None)  # the norm and flag of the one micro-batch, [1] -> []
    state = (tf.constant(0), [_zeros(t) for t in first.clipped_sum],
             _array(first.norms, m, one_norm), _array(first.finite, m, one_norm),
             _array(loss0, m), [_array(p, m) for p in preds0])

    def body(j, sums, norms, finite, losses, preds):
        result, loss, flat, _ = one(j)
        return (j + 1, [a + b for a, b in zip(sums, result.clipped_sum)],
                norms.write(j, result.norms[0]), finite.write(j, result.finite[0]),
                losses.write(j, loss), [ta.write(j, p) for ta, p in zip(preds, flat)])

    _, sums, norms, finite, losses, preds = tf.while_loop(lambda j, *_: j < m, body, state)
    y_pred = masks_attached(tf.nest.pack_sequence_as(structure, [
        tf.ensure_shape(ta.concat(), [None] + p.shape[1:]) for ta, p in zip(preds, preds0)]))
    return ClippedAsItWent(clipping.ClipResult(sums, norms.stack(), finite.stack()),
                           plan.l2_norm_clip, losses.stack(), y_pred)


def _chunked(model, loss_fn, variables, x, y, w, plan: ClipPlan) -> ClippedAsItWent:
    """The clipped sum over chunks of at most `plan.chunk` rows, one after the other.

    Why: per-example clipping holds every example's activations at once, so memory grows with the
    batch (MiniLM at an expected batch of ~1,050 took 17 GB on a CPU), while DP-SGD wants large
    batches. Chunks of whole micro-batches give exactly the same clipped sum (clipping is per
    micro-batch). The chunks run in a `tf.while_loop` of one iteration at a time: a Python loop
    traced one graph per chunk and kept about 0.9 GB per chunk of 512 CLC rows alive to the
    step's end (2 chunks 3.5 GB, 8 chunks 9.0 GB), so memory grew with the batch after all.
    The batch is padded to whole chunks with weight-0 copies of its first row (they add nothing:
    no loss, no gradient, no touched embedding row, as the sampler's padding rows), so that no
    shorter last chunk needs a trace of its own (tracing is most of a chunked run's start-up).
    With one micro-batch per replica (eDP) the chunks' gradients are summed before the one clip:
    the same micro-batch gradient.
    """
    x, y, w = tf.nest.map_structure(tf.convert_to_tensor, (x, y, w))
    rows = tf.nest.flatten(x)[0].shape[0]
    size, eager = plan.chunk, plan.microbatch_size is None
    if not eager and rows % plan.microbatch_size:  # padding would complete a micro-batch
        raise ValueError(f"per-replica batch of {rows} rows is not divisible by "
                         f"microbatch_size={plan.microbatch_size}")
    full = -(-rows // size)
    if full * size > rows:
        index = tf.concat([tf.range(rows), tf.zeros([full * size - rows], tf.int32)], 0)
        x, y = tf.nest.map_structure(lambda a: tf.gather(a, index), (x, y))
        w = tf.concat([w, tf.zeros([full * size - rows], w.dtype)], 0)
    # shortest rows first where regrouping them cannot change the result (edp_tf/padding.py)
    order = (padding.shortest_first(model, x)
             if plan.microbatch_size in (None, 1) else None)
    if order is not None:
        x, y, w = tf.nest.map_structure(lambda a: tf.gather(a, order), (x, y, w))

    def one(start):
        """(summed gradient or clipped sum, norms, finite, counts ([] without sparse embedding
        noise), losses, flat y_pred) of `size` rows from `start`, and y_pred's structure."""
        xc, yc, wc = (tf.nest.map_structure(lambda a: tf.ensure_shape(
            a[start:start + size], [size] + a.shape[1:]), t) for t in (x, y, w))
        part = unchunked_gradients(model, loss_fn, variables, padding.cut(model, xc), yc, wc,
                                   plan)
        carried = with_masks(part.y_pred)
        if eager:  # summed before the one clip
            return (list(part.scaled), None, None, [], part.losses,
                    tf.nest.flatten(carried)), carried
        clip = part.clip(plan.l2_norm_clip, plan.selection, plan.per_layer)
        return (list(clip.clipped_sum), clip.norms, clip.finite, list(clip.counts or []),
                part.losses, tf.nest.flatten(carried)), carried

    one, ((sums0, norms0, finite0, counts0, losses0, preds0), structure) = _loop_body(one)
    sums, counts = [_zeros(t) for t in sums0], [_zeros(t) for t in counts0]
    parts = [_array(t, full) for t in ([losses0] + list(preds0)
                                       + ([] if eager else [norms0, finite0]))]

    def body(i, sums, counts, parts):
        (c_sum, c_norms, c_finite, c_counts, c_losses, c_preds), _ = one(i * size)
        sums = [a + b for a, b in zip(sums, c_sum)]
        counts = [a + b for a, b in zip(counts, c_counts)]
        values = [c_losses] + list(c_preds) + ([] if eager else [c_norms, c_finite])
        return i + 1, sums, counts, [ta.write(i, v) for ta, v in zip(parts, values)]

    # one iteration at a time: overlapping iterations would hold several chunks at once
    _, sums, counts, parts = tf.while_loop(
        lambda i, *_: i < full, body, (tf.constant(0), sums, counts, parts),
        parallel_iterations=1)
    stacked = [ta.concat() for ta in parts]
    if order is not None:  # back to the sampler's order: all per row but eDP's chunk losses
        back = tf.math.invert_permutation(order)
        stacked = ([stacked[0] if eager else tf.gather(stacked[0], back)]
                   + [tf.gather(t, back) for t in stacked[1:]])
    losses, preds = stacked[0], [p[:rows] for p in stacked[1:1 + len(preds0)]]
    y_pred = masks_attached(tf.nest.pack_sequence_as(structure, [
        tf.ensure_shape(p, [rows] + p0.shape[1:]) for p, p0 in zip(preds, preds0)]))
    if eager:  # one micro-batch: its loss is the chunks' summed loss, [1]
        whole = SingleGradient(sums, tf.reduce_sum(losses, keepdims=True), y_pred,
                               [1.0] * len(sums))
        return ClippedAsItWent(whole.clip(plan.l2_norm_clip, plan.selection, plan.per_layer),
                               plan.l2_norm_clip, whole.losses, y_pred)
    m = rows // plan.microbatch_size  # the real micro-batches; the padding ones come last
    norms, finite = stacked[-2][:m], stacked[-1][:m]
    return ClippedAsItWent(clipping.ClipResult(sums, norms, finite, counts or None),
                           plan.l2_norm_clip, losses[:m], y_pred)


def clipped_gradient_sum(
    model, loss_fn, variables, x, y, w, microbatch_size, k_e: float, alpha, l2_norm_clip: float,
    method: str = "ghost", chunk: Optional[int] = None, per_layer: bool = False,
) -> Tuple[clipping.ClipResult, tf.Tensor, object]:
    """(sum_j clip_C(g_j / alpha), micro-batch losses, y_pred): `gradients(...).clip()` for
    callers outside the step (tests, benchmarks)."""
    plan = ClipPlan(microbatch_size, k_e, tuple(alpha), l2_norm_clip, method, chunk,
                    per_layer=per_layer)
    g = gradients(model, loss_fn, variables, x, y, w, plan)
    return g.clip(l2_norm_clip, per_layer=per_layer), g.losses, g.y_pred
