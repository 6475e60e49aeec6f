"""Ghost rule for `Conv1D` and `Conv2D` kernels: a convolution is a matmul of image patches.

z[p] = patch_p(x) @ W.reshape(kh * kw * Cin, Cout) for every output position p, so a conv kernel
is used exactly as a Dense kernel on P = H' x W' rows of Din = kh kw Cin patch entries, and its
per-micro-batch norm comes from those rows and dz (edp_tf/ghost/norms.py picks Gram matrices or
the small [Din, Dout] gradient, whichever is cheaper: for small kernels the latter). The forward
pass stays the convolution itself; the patches are built beside it for the norm only.

Why a rule and not the vectorised tape: `tf.vectorized_map` has no batched form of the kernel's
gradient (Conv2DBackpropFilter) and falls back to a while_loop over the examples, which made a
small Conv2D net 5x its plain training (results/benchmarks/small_models).

Covered: channels_last, groups 1, padding "valid" or "same" (Conv1D's "causal" and the rest keep
exact per-example gradients); strides and dilation as the layer has them; static spatial sizes.
"""
from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from edp_tf.ghost.recording import Capture, Use
from edp_tf.ghost.registry import original_call, register


def _patches(inputs: tf.Tensor, layer) -> tf.Tensor:
    """[B, H', W', kh kw Cin] patches of a [B, H, W, Cin] input, in the kernel's flat order
    (kh, kw, Cin), padded as the layer pads. Strided slices and one concat, not
    `tf.image.extract_patches`: `tf.vectorized_map` has no batched form of the latter either."""
    kh, kw = layer.kernel_size
    sh, sw = layer.strides
    dh, dw = layer.dilation_rate
    height, width = int(inputs.shape[1]), int(inputs.shape[2])
    if layer.padding == "same":
        pads = [_same_padding(height, kh, sh, dh), _same_padding(width, kw, sw, dw)]
        inputs = tf.pad(inputs, [[0, 0], pads[0], pads[1], [0, 0]])
        height, width = height + sum(pads[0]), width + sum(pads[1])
    out_h = (height - (kh - 1) * dh - 1) // sh + 1
    out_w = (width - (kw - 1) * dw - 1) // sw + 1
    taps = [inputs[:, i * dh: i * dh + (out_h - 1) * sh + 1: sh,
                   j * dw: j * dw + (out_w - 1) * sw + 1: sw, :]
            for i in range(kh) for j in range(kw)]
    return tf.concat(taps, axis=-1)


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> list:
    """[before, after] of TensorFlow's "SAME" padding along one axis."""
    span = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + span - size, 0)
    return [total // 2, total - total // 2]


def conv_call(cap: Capture, layer, inputs, training=None):
    one_d = layer.rank == 1
    w = cap.weight(layer.kernel, "matmul")
    inputs = tf.convert_to_tensor(inputs)
    if None in inputs.shape[1:]:
        if w is not None:
            w.reason = "a convolution over inputs of unknown size"
        conv_class = keras.layers.Conv1D if one_d else keras.layers.Conv2D
        return original_call(conv_class)(layer, inputs)
    kernel = cap.read(w, layer.kernel)
    if inputs.dtype != kernel.dtype:
        inputs = tf.cast(inputs, kernel.dtype)
    images = inputs[:, None] if one_d else inputs  # Conv1D: a 1 x L image
    geometry = _As2D(layer) if one_d else layer
    kernel4d = kernel[None] if one_d else kernel
    # The forward pass and the gradient that flows on to the input are the convolution's own
    # (batched by tf.vectorized_map); the patches are only the rows its kernel norm needs, and
    # no gradient flows through them.
    z = tf.nn.convolution(images, kernel4d, strides=list(geometry.strides),
                          padding=layer.padding.upper(), dilations=list(geometry.dilation_rate))
    if layer.bias is not None:
        z = ops.add(z, layer.bias)
    patches = tf.stop_gradient(_patches(images, geometry))
    rows = cap.rows(patches, int(patches.shape[-1]))
    cout = int(kernel.shape[-1])
    cap.add(w, Use("matmul", rows, z, lambda dz: tf.reshape(dz, [-1, cout])))
    if w is not None:
        shape = kernel.shape
        w.to_variable = lambda g: tf.reshape(g, shape)
    out = z[:, 0] if one_d else z
    if layer.activation is not None:
        out = layer.activation(out)
    return out


class _As2D:
    """A Conv1D's geometry read as a 1 x k Conv2D's."""

    def __init__(self, layer):
        self.kernel_size = (1, layer.kernel_size[0])
        self.strides = (1, layer.strides[0])
        self.dilation_rate = (1, layer.dilation_rate[0])
        self.padding = layer.padding


def _covered(layer) -> bool:
    return (layer.data_format == "channels_last" and layer.groups == 1
            and layer.padding in ("valid", "same") and not getattr(layer, "lora_enabled", False))


register(keras.layers.Conv2D, conv_call, applies=_covered)
register(keras.layers.Conv1D, conv_call, applies=_covered)
