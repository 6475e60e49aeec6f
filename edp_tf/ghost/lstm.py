"""Ghost rule for `LSTMCell` (implementation 2): kernel and recurrent kernel recorded at every
step, as long as the RNN is unrolled (a while_loop RNN runs the cell in a nested graph, where the
weights fall back to exact per-example gradients)."""
from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from edp_tf.ghost.recording import Capture, Use, rows
from edp_tf.ghost.registry import register


def lstm_cell_call(cap: Capture, layer, inputs, states, training=False):
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
    to_rows = lambda dz: rows(dz, width)  # noqa: E731
    cap.add(wk, Use("matmul", rows(tf.convert_to_tensor(inputs), kernel.shape[0]), z, to_rows))
    cap.add(wr, Use("matmul", rows(tf.convert_to_tensor(h_tm1), layer.units), z, to_rows))
    c, o = layer._compute_carry_and_output_fused(ops.split(z, 4, axis=1), c_tm1)
    h = o * layer.activation(c)
    return h, [h, c]


register(keras.layers.LSTMCell, lstm_cell_call, applies=lambda cell: cell.implementation == 2)
