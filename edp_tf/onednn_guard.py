"""Refuses a per-example step whose vectorised graph holds the matmul oneDNN miscomputes.

Why: under `tf.vectorized_map` a matmul of a per-example tensor [.., T, D] with a weight [D, N]
becomes a BatchMatMul of a rank-4 operand with a rank-2 one, and TensorFlow 2.21's oneDNN CPU
kernel for that pair reads past its buffer (tensorflow/tensorflow#117700). What follows is not a
clean failure: the heap is corrupted, and another tensor of the same step (an embedding's ids,
seen in a user-written output layer) can hold garbage. A clipped gradient computed from garbage
voids the clipping bound the privacy proof rests on, so the step refuses at trace time, naming
the op, instead of training. The library's own layers avoid the pair (ghost rules and
`ghost.flat_matmul` reshape to 2-D first); a user's layer can do the same.
"""
from __future__ import annotations

import tensorflow as tf

_BATCH_MATMULS = ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def onednn_on_cpu() -> bool:
    """Whether this process runs TensorFlow's oneDNN CPU kernels with no GPU to take the op."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled()) and not tf.config.list_physical_devices("GPU")


def corrupting_matmuls(ops) -> list:
    """The BatchMatMul ops among `ops` that pair a rank >= 4 operand holding a size-1 axis (a
    micro-batch of one, stacked) with a rank-2 one: the case the bug report reproduces."""
    found = []
    for op in ops:
        if op.type not in _BATCH_MATMULS:
            continue
        shapes = sorted((t.shape for t in op.inputs[:2]), key=lambda s: s.rank or 0)
        if shapes[0].rank == 2 and (shapes[1].rank or 0) >= 4 and 1 in shapes[1].as_list():
            found.append(op)
    return found


def refuse_corrupting_matmuls(ops) -> None:
    """Raises ValueError naming the first op oneDNN would miscompute (see the module's why)."""
    if not onednn_on_cpu():
        return
    found = corrupting_matmuls(ops)
    if found:
        raise ValueError(
            f"the per-example step would run {found[0].name!r} ({found[0].type} of a rank-"
            f"{max(t.shape.rank for t in found[0].inputs[:2])} and a rank-2 operand), which "
            "TensorFlow's oneDNN CPU kernel miscomputes under tf.vectorized_map (it corrupts "
            "other tensors of the step, so the clipping bound would not hold). In that layer, "
            "reshape the input to 2-D rows before the matmul (x [..., d] -> [-1, d], matmul, "
            "reshape back), or set TF_ENABLE_ONEDNN_OPTS=0 before TensorFlow is imported, or "
            "use DPConfig(per_example_method='loop').")
