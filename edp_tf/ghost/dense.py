"""Ghost rules for `Dense` and `EinsumDense` kernels: z = a @ W with a the micro-batch's rows."""
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
