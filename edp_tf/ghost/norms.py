"""Ghost norms and clipped sums of the recorded weights, per micro-batch: the plan decided at
trace time, the one backward pass, then (after vectorising) squared norms and weighted sums."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

import tensorflow as tf

from edp_tf import padding
from edp_tf.ghost.bounds import Grams, direct_squared_norm
from edp_tf.ghost.recording import Capture, Weight


@dataclasses.dataclass
class GhostPlan:
    """Which variables use ghost norms, and where their rows are (static, decided at trace time).

    `layout[j] = (a, dz)`: indices into the list of row tensors `differentiate` returns (weights
    sharing an output, like an LSTM's kernel and recurrent kernel, share its dZ rows).
    """

    ghost: List[Weight]
    fallback_indices: List[int]
    reasons: Dict[int, str]
    layout: List[Tuple[int, int]] = dataclasses.field(default_factory=list)


def plan(cap: Capture, num_variables: int) -> GhostPlan:
    ghost = cap.ghost_weights()
    ghost_ids = {w.index for w in ghost}
    reasons = {w.index: w.reason for w in cap.weights.values() if w.reason is not None}
    return GhostPlan(ghost, [i for i in range(num_variables) if i not in ghost_ids], reasons)


def differentiate(tape: tf.GradientTape, loss, ghost_plan: GhostPlan, variables) -> tuple:
    """One backward pass of one micro-batch: (row tensors, fallback variables' gradients).

    Rows per ghost weight: matmul -> A [P, Din] and dZ [P, Dout]; gather -> ids [P] and dZ [P, d],
    the P positions of all its uses concatenated (their gradients add up).
    """
    zs, z_slot = [], {}
    for w in ghost_plan.ghost:
        for use in w.uses:
            if id(use.z) not in z_slot:
                z_slot[id(use.z)] = len(zs)
                zs.append(use.z)
    fallback_vars = [variables[i] for i in ghost_plan.fallback_indices]
    grads = tape.gradient(loss, zs + fallback_vars,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    dzs, fallback_grads = grads[: len(zs)], grads[len(zs):]
    rows, row_slot = [], {}

    def slot(key, build):
        if key not in row_slot:
            row_slot[key] = len(rows)
            rows.append(build())
        return row_slot[key]

    ghost_plan.layout = []
    for w in ghost_plan.ghost:
        a = slot(("a",) + tuple(id(u.a) for u in w.uses),
                 lambda w=w: tf.concat([u.a for u in w.uses], 0))
        dz = slot(("dz",) + tuple((id(u.z), id(u.dz_to_rows)) for u in w.uses),
                  lambda w=w: tf.concat([u.dz_to_rows(tf.convert_to_tensor(dzs[z_slot[id(u.z)]]))
                                         for u in w.uses], 0))
        ghost_plan.layout.append((a, dz))
    return rows, [padding.shaped_like(g, v) for g, v in zip(fallback_grads, fallback_vars)]


def use_gram(p, din, dout) -> bool:
    """Gram matrices (P^2 (Din + Dout)) unless materialising P Din Dout per micro-batch is
    cheaper."""
    if None in (p, din, dout):
        return True
    return p * (din + dout) < din * dout


def squared_norms(ghost_plan: GhostPlan, rows: Sequence, variables) -> List[tf.Tensor]:
    """[m] squared norm of each ghost weight's micro-batch gradient (rows stacked on axis 0),
    never below the exact one: float32 matmuls plus a bound of their rounding (`bounds`).
    Embedding tables work in float64, where products of float32 values are exact (their sums of
    one id's dz cancel too)."""
    grams = Grams(rows)
    result = []
    for w, (ia, iz) in zip(ghost_plan.ghost, ghost_plan.layout):
        a, dz = rows[ia], rows[iz]
        if w.kind == "gather":
            result.append(_gather_squared_norms(a, dz, int(variables[w.index].shape[0])))
        elif use_gram(a.shape[1], a.shape[2], dz.shape[2]):
            result.append(grams.squared_norm(ia, iz))
        else:  # [m, Din, Dout] is small here
            result.append(direct_squared_norm(a, dz))
    return [_float32_not_below(r) for r in result]


def _float32_not_below(t: tf.Tensor) -> tf.Tensor:
    """A float32 value >= the float64 `t`: the cast and the multiply each round by at most
    2^-24 relatively, so the factor (1 + 2^-22) keeps the norm from being underestimated."""
    return tf.cast(t, tf.float32) * (1.0 + 2.0 ** -22)


def _gather_squared_norms(ids: tf.Tensor, dz: tf.Tensor, rows: int) -> tf.Tensor:
    """||scatter(dz at ids)||^2 per micro-batch: sum over distinct ids of ||sum of their dz||^2."""
    m = tf.shape(ids)[0]
    keys = tf.range(tf.cast(m, tf.int64))[:, None] * rows + tf.cast(ids, tf.int64)
    unique, slot = tf.unique(tf.reshape(keys, [-1]))
    per_id = tf.math.unsorted_segment_sum(  # float64: dz of one id at several positions cancel
        tf.reshape(tf.cast(dz, tf.float64), [-1, tf.shape(dz)[-1]]), slot, tf.shape(unique)[0])
    return tf.math.unsorted_segment_sum(
        tf.reduce_sum(tf.square(per_id), axis=1), tf.cast(unique // rows, tf.int32), m)


def weighted_sums(ghost_plan: GhostPlan, rows: Sequence, factors, variables) -> list:
    """sum_j f_j G_j per ghost weight, in the variable's shape and dtype (factors: [m], or a
    list of [m] indexed by variable for per-layer clipping)."""
    result = []
    for w, (ia, iz) in zip(ghost_plan.ghost, ghost_plan.layout):
        var = variables[w.index]
        a, dz = rows[ia], rows[iz]
        f = factors[w.index] if isinstance(factors, (list, tuple)) else factors
        f = tf.cast(f, dz.dtype)[:, None, None]
        if w.kind == "gather":
            g = tf.math.unsorted_segment_sum(
                tf.reshape(dz * f, [-1, dz.shape[-1]]), tf.reshape(tf.cast(a, tf.int32), [-1]),
                int(var.shape[0]))
        else:
            din, dout = a.shape[2], dz.shape[2]
            if use_gram(a.shape[1], din, dout):
                if a.shape[1] is not None and din < dout:
                    a, dz = a * tf.cast(f, a.dtype), dz  # scale the smaller operand
                else:
                    dz = dz * f
                g = tf.matmul(tf.reshape(a, [-1, din]), tf.reshape(dz, [-1, dout]),
                              transpose_a=True)
            else:
                g = tf.tensordot(f[:, 0, 0], tf.matmul(a, dz, transpose_a=True), axes=1)
            g = w.to_variable(g)
        result.append(tf.cast(tf.reshape(g, var.shape), var.dtype))
    return result


def zero_nonfinite(rows: Sequence, finite: tf.Tensor) -> list:
    """Rows of non-finite micro-batches set to 0, so that 0 * NaN never reaches a sum."""
    def clean(t):
        if not t.dtype.is_floating:
            return t
        mask = tf.reshape(finite, [-1] + [1] * (t.shape.rank - 1))
        return tf.where(mask, t, tf.zeros_like(t))

    return [clean(t) for t in rows]
