"""Ghost rules for `Dense` and `EinsumDense` kernels: z = a @ W with a the micro-batch's rows.

With LoRA (`layer.enable_lora(r)`: W frozen, W + s A B used, s = alpha / r) both factors are
matmul uses of the same output z: dL/dA = a^T (s dz B^T) has rows a and output gradient
s dz B^T, and dL/dB = (s a A)^T dz has rows s a A; so their per-example norms are ghost norms
too, and the noise is drawn only for the factor entries.

The factors split the kernel's axes: A holds its first m axes and r, B holds r and the rest,
and the update is the tensordot s A B. Keras' `enable_lora` gives A every axis but the last
(m = ndim - 1): for a query kernel [Din, heads, Dhead] every head gets its own A [Din, r]
(heads r (Din + Dhead) entries in all). An A over the contracted axes only (A [Din, r],
B [r, heads, Dhead]: r (Din + Dout) entries) is the rank-r update of the kernel's matrix view
(Hu et al.'s LoRA). Both are covered whenever B's axes are all output axes.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import keras
import tensorflow as tf
from keras import ops

from edp_tf.ghost.recording import Capture, Use, flat_matmul
from edp_tf.ghost.registry import original_call, register


def dense_call(cap: Capture, layer, inputs, training=None):
    w = cap.weight(layer._kernel, "matmul")
    kernel = cap.read(w, layer._kernel)
    inputs = tf.convert_to_tensor(inputs)
    if inputs.dtype != kernel.dtype:
        inputs = tf.cast(inputs, kernel.dtype)
    rows, z = flat_matmul(cap, inputs, kernel)
    if layer.lora_enabled:
        z = lora(cap, layer, rows, z, [], kernel.shape[-1])
    if layer.bias is not None:
        z = ops.add(z, layer.bias)
    cap.add(w, Use("matmul", rows, z, lambda dz: dz))
    x = tf.reshape(z, shape_with(inputs.shape[:-1], tf.shape(inputs)[:-1], [kernel.shape[-1]]))
    if layer.activation is not None:
        x = layer.activation(x)
    return x


def einsum_plan(equation: str, input_rank: int) -> Optional[Tuple[str, str, str]]:
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


def einsum_dense_call(cap: Capture, layer, inputs, training=None):
    inputs = tf.convert_to_tensor(inputs)
    plan = einsum_plan(layer.equation, len(inputs.shape))
    if plan is None or any(d is None for d in layer._kernel.shape):
        w = cap.weight(layer._kernel, "matmul")
        if w is not None:
            w.reason = f"einsum {layer.equation!r} is not a plain contraction"
        return original_call(keras.layers.EinsumDense)(layer, inputs, training=training)
    inp, ker, out = plan
    b_axes = ker[len(layer.lora_kernel_a.shape) - 1:] if layer.lora_enabled else ""
    if layer.lora_enabled and not set(b_axes) <= set(out):
        for factor in (layer.lora_kernel_a, layer.lora_kernel_b):
            f = cap.weight(factor, "matmul")
            if f is not None:
                f.reason = (f"LoRA on einsum {layer.equation!r}, whose factor B holds a summed "
                            "kernel axis")
        return original_call(keras.layers.EinsumDense)(layer, inputs, training=training)
    w = cap.weight(layer._kernel, "matmul")
    kernel = cap.read(w, layer._kernel)
    if inputs.dtype != kernel.dtype:
        inputs = tf.cast(inputs, kernel.dtype)
    k_size = dict(zip(ker, kernel.shape))
    pos = [c for c in inp if c in out]  # positions (the micro-batch's rows among them)
    con = [c for c in ker if c in inp]
    kout = [c for c in ker if c in out]
    x = transpose(inputs, [inp.index(c) for c in pos + con])
    kernel2d = tf.reshape(transpose(kernel, [ker.index(c) for c in con + kout]),
                          [product(k_size[c] for c in con), product(k_size[c] for c in kout)])
    rows, z = flat_matmul(cap, x, kernel2d)
    if layer.lora_enabled:  # kout = A's output axes (heads), then B's (b_axes), in kernel order
        a_axes, heads = ker[:len(ker) - len(b_axes)], [c for c in kout if c not in b_axes]
        z = lora(cap, layer, rows, z, [k_size[c] for c in heads],
                 product(k_size[c] for c in b_axes), [a_axes.index(c) for c in con + heads])
    cap.add(w, Use("matmul", rows, z, lambda dz: dz))
    grad_letters = con + kout
    if w is not None:
        w.to_variable = lambda g: transpose(
            tf.reshape(g, [k_size[c] for c in grad_letters]),
            [grad_letters.index(c) for c in ker])
    shape = shape_with(x.shape[: len(pos)], tf.shape(x)[: len(pos)], [k_size[c] for c in kout])
    y = transpose(tf.reshape(z, shape), [(pos + kout).index(c) for c in out])
    if layer.bias is not None:
        y = ops.add(y, layer.bias)
    if layer.activation is not None:
        y = layer.activation(y)
    return y


def lora(cap: Capture, layer, rows, z, heads: List[int], dout: int, a_perm=None):
    """z + s (rows A) B for the LoRA factors A [..., r] and B [r, ...] (dout entries after r),
    recording both.

    `rows` [P, Din] and `z` [P, H * dout] are the kernel's 2-D view; `heads` are the output
    axes H that A holds (Keras' EinsumDense layout: each block of dout shares B), and `a_perm`
    orders A's axes as (Din axes, head axes, r) (None: A is already [Din, r]).
    """
    s = layer.lora_alpha / layer.lora_rank
    wa = cap.weight(layer.lora_kernel_a, "matmul")
    wb = cap.weight(layer.lora_kernel_b, "matmul")
    a = cap.read(wa, layer.lora_kernel_a)
    b = cap.read(wb, layer.lora_kernel_b)
    if b.shape.rank > 2:  # B [r, out axes...]: its 2-D view, in the kernel's output order
        b_shape = [int(d) for d in b.shape]
        b = tf.reshape(b, [b_shape[0], dout])
        if wb is not None:
            wb.to_variable = lambda g: tf.reshape(g, b_shape)
    r, h = int(b.shape[0]), product(heads)
    a_order = list(range(a.shape.rank - 1)) if a_perm is None else a_perm
    a2d = tf.reshape(transpose(a, a_order + [a.shape.rank - 1]), [rows.shape[-1], h * r])
    if wa is not None:
        a_shape = [int(a.shape[i]) for i in a_order] + [r]
        wa.to_variable = lambda g: transpose(tf.reshape(g, a_shape),
                                             [a_order.index(i) for i in range(len(a_order))]
                                             + [len(a_order)])
    u = tf.reshape(tf.matmul(rows, a2d), [-1, r])  # [P * H, r]: rows A, one row per head
    z = ops.add(z, tf.reshape(s * tf.matmul(u, b), [-1, h * dout]))
    cap.add(wa, Use("matmul", rows, z, lambda dz: tf.reshape(
        s * tf.matmul(tf.reshape(dz, [-1, dout]), b, transpose_b=True), [-1, h * r])))
    cap.add(wb, Use("matmul", s * u, z, lambda dz: tf.reshape(dz, [-1, dout])))
    return z


def shape_with(static, dynamic, tail: List[int]):
    """static + tail when fully known (keeps static shapes), else the dynamic equivalent."""
    if static.is_fully_defined():
        return static.as_list() + [int(d) for d in tail]
    return tf.concat([dynamic, tf.constant(tail, dynamic.dtype)], 0)


def transpose(t: tf.Tensor, perm: List[int]) -> tf.Tensor:
    return t if perm == sorted(perm) else tf.transpose(t, perm)


def product(values) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result


register(keras.layers.Dense, dense_call)
register(keras.layers.EinsumDense, einsum_dense_call)
