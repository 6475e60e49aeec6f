"""Ghost norms: per-micro-batch gradient norms of big weights without per-example gradients.

Why: per-example gradients cost B x (number of parameters) of memory traffic per step (1.8 GB for a
14M-parameter BERT at B = 32); the weights that make up that bulk are used in a few simple ways.
A weight used as z = a @ W (a: [P, Din], the P positions of one micro-batch) has the micro-batch
gradient G = a^T dz, whose squared norm is

    ||G||^2 = <a a^T, dz dz^T>            ("ghost" norm: two P x P Gram matrices)

at a cost of P^2 (Din + Dout) instead of P Din Dout, and whose clipped sum over micro-batches is
one matmul, A^T (f * dZ), the cost of the ordinary weight gradient (book-keeping, Bu et al. 2022):
no second backward pass. An embedding lookup z = W[ids] has G = scatter(dz at ids); its norm comes
from segment sums over the micro-batch's distinct ids (never a vocabulary-sized table per example).

Covered: `Dense` and `EinsumDense` kernels, `Embedding` tables (and keras' `ReversibleEmbedding` used
forwards), `LSTMCell` kernel and recurrent kernel (per step, as long as the RNN is unrolled). Their
layers' `call` is replaced, for the duration of one trace only, by a re-implementation that records
(a, z). Everything else keeps exact per-example gradients from the vectorised tape (the fallback):
biases, LayerNormalization (its per-example gradients are d-vectors: nothing to save), the CRF,
unknown layers, and any covered weight that is also read outside its layer (tied weights), used in
a nested graph (a while_loop RNN) or used in two different ways.

This module runs inside the function given to `tf.vectorized_map` (one micro-batch per iteration),
so "per micro-batch" needs no assumption about a batch axis: it is the vectorised axis.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf
from keras import ops

_active = threading.local()  # the capture of the trace running on this thread, if any
_patch_lock = threading.Lock()


# ------------------------------------------------------------------------------ recording
@dataclasses.dataclass
class _Use:
    """One use of a weight inside one micro-batch: z = a @ W (matmul) or z = W[a] (gather)."""

    kind: str  # "matmul" | "gather"
    a: tf.Tensor  # matmul: [P, Din] inputs; gather: [P] int ids
    z: tf.Tensor  # the tensor differentiated (the layer's pre-activation output)
    dz_to_rows: Callable[[tf.Tensor], tf.Tensor]  # dL/dz -> [P, Dout]


@dataclasses.dataclass
class _Weight:
    """A covered variable: how it was used in the forward pass, and whether ghost norms apply."""

    index: int  # position in the `variables` list
    variable: object
    kind: str
    to_variable: Callable[[tf.Tensor], tf.Tensor]  # [Din, Dout] -> variable shape (matmul)
    uses: List[_Use] = dataclasses.field(default_factory=list)
    handles: set = dataclasses.field(default_factory=set)  # resource tensor names it was read by
    reason: Optional[str] = None  # why it falls back to per-example gradients (None: ghost)


class _Capture:
    """Records covered uses while one micro-batch's forward pass is traced."""

    def __init__(self, variables: Sequence):
        self.graph = tf.compat.v1.get_default_graph()
        self.index = {id(v): i for i, v in enumerate(variables)}
        self.weights: Dict[int, _Weight] = {}
        self.read_ops: set = set()
        self._rows: Dict[tuple, tuple] = {}

    def rows(self, inputs: tf.Tensor, width: int) -> tf.Tensor:
        """inputs as [P, width] rows, one tensor per input (query, key and value projections
        of self-attention share theirs, and so their Gram matrix)."""
        key = (id(inputs), width)
        if key not in self._rows:  # the entry keeps `inputs` alive, so its id stays unique
            self._rows[key] = (inputs, tf.reshape(inputs, [-1, width]))
        return self._rows[key][1]

    def weight(self, variable, kind: str, to_variable=None) -> Optional[_Weight]:
        i = self.index.get(id(variable))
        if i is None:
            return None  # frozen or not requested: no gradient needed
        w = self.weights.get(i)
        if w is None:
            w = self.weights[i] = _Weight(i, variable, kind, to_variable or (lambda g: g))
        elif w.kind != kind:
            w.reason = f"used both as {w.kind} and {kind}"
        return w

    def read(self, weight: Optional[_Weight], variable) -> tf.Tensor:
        """Reads `variable` as the layer would, noting the read op (other reads disqualify it)."""
        # keras' convert_to_tensor would hand back the tf.Variable itself (then read by, e.g., a
        # ResourceGather); reading it once here gives one ReadVariableOp to account for.
        value = tf.convert_to_tensor(variable.value)
        if weight is None:
            return value
        if tf.compat.v1.get_default_graph() is not self.graph:
            weight.reason = "used inside a nested graph (e.g. a tf.while_loop RNN: unroll it)"
            return value
        op = value.op
        while op.type in ("Cast", "Identity") and op.inputs:
            op = op.inputs[0].op
        if op.type != "ReadVariableOp":
            weight.reason = f"read through {op.type}"
            return value
        self.read_ops.add(op.name)
        weight.handles.add(op.inputs[0].name)
        return value

    def add(self, weight: Optional[_Weight], use: _Use) -> None:
        if weight is not None:
            weight.uses.append(use)

    def disqualify_outside_reads(self, new_ops) -> None:
        """A covered weight read anywhere but in its recorded uses cannot use ghost norms."""
        by_handle = {h: w for w in self.weights.values() for h in w.handles}
        if not by_handle:
            return
        for op in new_ops:
            if op.name in self.read_ops:
                continue
            for t in op.inputs:
                w = by_handle.get(t.name) if t.dtype == tf.resource else None
                if w is not None and w.reason is None:
                    w.reason = f"also read outside its layer (by {op.type} {op.name})"

    def ghost_weights(self) -> List[_Weight]:
        for w in self.weights.values():
            if not w.uses and w.reason is None:
                w.reason = "no recorded use"
        return sorted((w for w in self.weights.values() if w.reason is None),
                      key=lambda w: w.index)


# ------------------------------------------------------------------------------ layer hooks
def _rows(t: tf.Tensor, width: int) -> tf.Tensor:
    return tf.reshape(t, [-1, width])


def _flat_matmul(cap: _Capture, inputs, kernel2d):
    """(rows [P, Din], z [P, Dout]) for inputs [..., Din] @ kernel [Din, Dout], as a 2-D matmul.

    Why 2-D: under vectorized_map a per-example input [1, T, Din] becomes [B, 1, T, Din], and
    TensorFlow 2.21's oneDNN BatchMatMul with such a rank-4 lhs and a rank-2 rhs reads past the
    kernel's buffer (heap corruption, tensorflow/tensorflow#117700). A 2-D MatMul vectorises to
    one [B*P, Din] @ [Din, Dout] matmul instead.
    """
    rows = cap.rows(inputs, kernel2d.shape[0])
    return rows, tf.matmul(rows, kernel2d)


def _dense_call(cap: _Capture, layer, inputs, training=None):
    w = cap.weight(layer._kernel, "matmul")
    kernel = cap.read(w, layer._kernel)
    inputs = tf.convert_to_tensor(inputs)
    if inputs.dtype != kernel.dtype:
        inputs = tf.cast(inputs, kernel.dtype)
    rows, z = _flat_matmul(cap, inputs, kernel)
    if layer.bias is not None:
        z = ops.add(z, layer.bias)
    cap.add(w, _Use("matmul", rows, z, lambda dz: dz))
    x = tf.reshape(z, _shape(inputs.shape[:-1], tf.shape(inputs)[:-1], [kernel.shape[-1]]))
    if layer.activation is not None:
        x = layer.activation(x)
    return x


def _embedding_call(cap: _Capture, layer, inputs, reverse=False):
    if reverse:  # ReversibleEmbedding as an output projection: not covered
        w = cap.weight(layer._embeddings, "gather")
        if w is not None:
            w.reason = "also used as an output projection (reverse=True)"
        return _ORIGINAL_CALLS[type(layer)](layer, inputs, reverse=True)
    if inputs.dtype != "int32" and inputs.dtype != "int64":
        inputs = ops.cast(inputs, "int32")
    w = cap.weight(layer._embeddings, "gather")
    table = cap.read(w, layer._embeddings)
    outputs = ops.take(table, inputs, axis=0)
    d = table.shape[-1]
    cap.add(w, _Use("gather", tf.reshape(inputs, [-1]), outputs, lambda dz: _rows(dz, d)))
    return ops.cast(outputs, dtype=layer.compute_dtype)


def _lstm_cell_call(cap: _Capture, layer, inputs, states, training=False):
    """keras.layers.LSTMCell.call, implementation 2 (the default), recording each step."""
    h_tm1, c_tm1 = states[0], states[1]
    if training and 0.0 < layer.dropout < 1.0:
        inputs = inputs * layer.get_dropout_mask(inputs)
    wk = cap.weight(layer.kernel, "matmul")
    wr = cap.weight(layer.recurrent_kernel, "matmul")
    kernel = cap.read(wk, layer.kernel)
    recurrent = cap.read(wr, layer.recurrent_kernel)
    z = ops.matmul(inputs, kernel)
    z = ops.add(z, ops.matmul(h_tm1, recurrent))
    if layer.use_bias:
        z = ops.add(z, layer.bias)
    width = 4 * layer.units
    to_rows = lambda dz: _rows(dz, width)  # noqa: E731
    cap.add(wk, _Use("matmul", _rows(tf.convert_to_tensor(inputs), kernel.shape[0]), z, to_rows))
    cap.add(wr, _Use("matmul", _rows(tf.convert_to_tensor(h_tm1), layer.units), z, to_rows))
    c, o = layer._compute_carry_and_output_fused(ops.split(z, 4, axis=1), c_tm1)
    h = o * layer.activation(c)
    return h, [h, c]


def _einsum_plan(equation: str, input_rank: int) -> Optional[Tuple[str, str, str]]:
    """Explicit (input, kernel, output) letters, or None when the equation is not a plain
    contraction (a letter in all three operands, or one summed away without the kernel)."""
    if "->" not in equation or "," not in equation:
        return None
    left, out = equation.split("->")
    inp, ker = left.split(",")
    if "..." in inp:
        free = [c for c in "zyxwvutsrqponmlkjihgfedcba" if c not in equation]
        fill = "".join(free[: input_rank - (len(inp) - 3)])
        inp, out = inp.replace("...", fill), out.replace("...", fill)
    if "..." in ker or "..." in out or len(inp) != input_rank:
        return None
    si, sk, so = set(inp), set(ker), set(out)
    if (si & sk & so) or not si <= (sk | so) or not sk <= (si | so) or not so <= (si | sk):
        return None
    return inp, ker, out


def _einsum_dense_call(cap: _Capture, layer, inputs, training=None):
    inputs = tf.convert_to_tensor(inputs)
    plan = _einsum_plan(layer.equation, len(inputs.shape))
    if plan is None or any(d is None for d in layer._kernel.shape):
        w = cap.weight(layer._kernel, "matmul")
        if w is not None:
            w.reason = f"einsum {layer.equation!r} is not a plain contraction"
        return _ORIGINAL_CALLS[keras.layers.EinsumDense](layer, inputs, training=training)
    inp, ker, out = plan
    w = cap.weight(layer._kernel, "matmul")
    kernel = cap.read(w, layer._kernel)
    if inputs.dtype != kernel.dtype:
        inputs = tf.cast(inputs, kernel.dtype)
    k_size = dict(zip(ker, kernel.shape))
    pos = [c for c in inp if c in out]  # positions (the micro-batch's rows among them)
    con = [c for c in ker if c in inp]
    kout = [c for c in ker if c in out]
    x = _transpose(inputs, [inp.index(c) for c in pos + con])
    kernel2d = tf.reshape(_transpose(kernel, [ker.index(c) for c in con + kout]),
                          [_product(k_size[c] for c in con), _product(k_size[c] for c in kout)])
    rows, z = _flat_matmul(cap, x, kernel2d)
    cap.add(w, _Use("matmul", rows, z, lambda dz: dz))
    grad_letters = con + kout
    if w is not None:
        w.to_variable = lambda g: _transpose(
            tf.reshape(g, [k_size[c] for c in grad_letters]),
            [grad_letters.index(c) for c in ker])
    shape = _shape(x.shape[: len(pos)], tf.shape(x)[: len(pos)], [k_size[c] for c in kout])
    y = _transpose(tf.reshape(z, shape), [(pos + kout).index(c) for c in out])
    if layer.bias is not None:
        y = ops.add(y, layer.bias)
    if layer.activation is not None:
        y = layer.activation(y)
    return y


def _shape(static, dynamic, tail: List[int]):
    """static + tail when fully known (keeps static shapes), else the dynamic equivalent."""
    if static.is_fully_defined():
        return static.as_list() + [int(d) for d in tail]
    return tf.concat([dynamic, tf.constant(tail, dynamic.dtype)], 0)


def _transpose(t: tf.Tensor, perm: List[int]) -> tf.Tensor:
    return t if perm == sorted(perm) else tf.transpose(t, perm)


def _product(values) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result


_HOOKS: Dict[type, Callable] = {}
_ORIGINAL_CALLS: Dict[type, Callable] = {}


def _register(cls, original, hook) -> None:
    _HOOKS[cls] = hook
    _ORIGINAL_CALLS[cls] = original


_register(keras.layers.Dense, keras.layers.Dense.call, _dense_call)
_register(keras.layers.EinsumDense, keras.layers.EinsumDense.call, _einsum_dense_call)
_register(keras.layers.Embedding, keras.layers.Embedding.call, _embedding_call)
_register(keras.layers.LSTMCell, keras.layers.LSTMCell.call, _lstm_cell_call)
if hasattr(keras.layers, "ReversibleEmbedding"):
    _register(keras.layers.ReversibleEmbedding, keras.layers.ReversibleEmbedding.call,
              _embedding_call)


def _hook_for(layer) -> Optional[Callable]:
    """The hook for `layer` if its forward pass is exactly the one the hook re-implements."""
    for cls in type(layer).__mro__:
        if cls in _HOOKS:
            if type(layer).call is not _ORIGINAL_CALLS[cls]:
                return None  # a subclass with its own call
            break
    else:
        return None
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return None
    if getattr(layer, "_remat_mode", None):
        return None
    if isinstance(layer, keras.layers.LSTMCell) and layer.implementation != 2:
        return None
    if isinstance(layer, keras.layers.Embedding) and type(layer) is not keras.layers.Embedding:
        if getattr(layer, "mask_zero", False):
            return None  # ReversibleEmbedding attaches its mask inside call
    return _HOOKS[cls]


def flatten_layers(model) -> list:
    """Every layer of `model`, nested ones included (the model itself first)."""
    if hasattr(model, "_flatten_layers"):
        return model._flatten_layers(include_self=True, recursive=True)
    return [model]


@contextlib.contextmanager
def capture(model, variables: Sequence):
    """Within: covered layers of `model` record their uses of `variables` (this thread only)."""
    cap = _Capture(variables)
    patched = []
    with _patch_lock:
        for layer in flatten_layers(model):
            hook = _hook_for(layer)
            if hook is None or "call" in layer.__dict__:
                continue
            original = layer.call

            def call(*args, __layer=layer, __hook=hook, __original=original, **kwargs):
                current = getattr(_active, "capture", None)
                if current is None:
                    return __original(*args, **kwargs)
                return __hook(current, __layer, *args, **kwargs)

            object.__setattr__(layer, "call", call)
            patched.append(layer)
    previous = getattr(_active, "capture", None)
    _active.capture = cap
    first_op = len(cap.graph.get_operations())
    try:
        yield cap
    finally:
        _active.capture = previous
        with _patch_lock:
            for layer in patched:
                layer.__dict__.pop("call", None)
    cap.disqualify_outside_reads(cap.graph.get_operations()[first_op:])


# ------------------------------------------------------------------------------ per micro-batch
@dataclasses.dataclass
class GhostPlan:
    """Which variables use ghost norms, and where their rows are (static, decided at trace time).

    `layout[j] = (a, dz)`: indices into the list of row tensors `differentiate` returns (weights
    sharing an output, like an LSTM's kernel and recurrent kernel, share its dZ rows).
    """

    ghost: List[_Weight]
    fallback_indices: List[int]
    reasons: Dict[int, str]
    layout: List[Tuple[int, int]] = dataclasses.field(default_factory=list)


def plan(cap: _Capture, num_variables: int) -> GhostPlan:
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
    return rows, [tf.convert_to_tensor(g) for g in fallback_grads]


# ------------------------------------------------------------------------------ after vectorising
def _use_gram(p, din, dout) -> bool:
    """Gram matrices (P^2 (Din + Dout)) unless materialising P Din Dout per micro-batch is cheaper."""
    if None in (p, din, dout):
        return True
    return p * (din + dout) < din * dout


def squared_norms(ghost_plan: GhostPlan, rows: Sequence, variables) -> List[tf.Tensor]:
    """[m] squared norm of each ghost weight's micro-batch gradient (rows stacked on axis 0).

    Computed in float64: <A A^T, dZ dZ^T> is a sum of signed terms that cancel when positions'
    contributions do, and in float32 a constructed case came out 2.1% low, i.e. an example could
    pass the clip with more than C. Products of float32 values are exact in float64 and the sums'
    rounding (~n 2^-53 of the terms' magnitude) is far below anything float32 can represent of
    the norm. The Gram matrices cost P^2 (Din + Dout) per micro-batch against P Din Dout for the
    gradient, so float64 here is a few percent of a step for P of a sentence's length.
    """
    grams: Dict[int, tf.Tensor] = {}

    def gram(i):
        if i not in grams:
            t = tf.cast(rows[i], tf.float64)
            grams[i] = tf.matmul(t, t, transpose_b=True)
        return grams[i]

    result = []
    for w, (ia, iz) in zip(ghost_plan.ghost, ghost_plan.layout):
        a, dz = rows[ia], rows[iz]
        if w.kind == "gather":
            result.append(_gather_squared_norms(a, dz, int(variables[w.index].shape[0])))
        elif _use_gram(a.shape[1], a.shape[2], dz.shape[2]):
            result.append(tf.reduce_sum(gram(ia) * gram(iz), axis=[1, 2]))
        else:  # [m, Din, Dout] is small here
            per = tf.matmul(tf.cast(a, tf.float64), tf.cast(dz, tf.float64), transpose_a=True)
            result.append(tf.reduce_sum(tf.square(per), axis=[1, 2]))
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


def weighted_sums(ghost_plan: GhostPlan, rows: Sequence, factors: tf.Tensor, variables) -> list:
    """sum_j f_j G_j per ghost weight, in the variable's shape and dtype."""
    result = []
    for w, (ia, iz) in zip(ghost_plan.ghost, ghost_plan.layout):
        var = variables[w.index]
        a, dz = rows[ia], rows[iz]
        f = tf.cast(factors, dz.dtype)[:, None, None]
        if w.kind == "gather":
            g = tf.math.unsorted_segment_sum(
                tf.reshape(dz * f, [-1, dz.shape[-1]]), tf.reshape(tf.cast(a, tf.int32), [-1]),
                int(var.shape[0]))
        else:
            din, dout = a.shape[2], dz.shape[2]
            if _use_gram(a.shape[1], din, dout):
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
