"""What a ghost rule records while one micro-batch's forward pass is traced: each covered
weight's uses (z = a @ W, or z = W[ids]) and why a weight cannot use ghost norms."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence

import tensorflow as tf


@dataclasses.dataclass
class Use:
    """One use of a weight inside one micro-batch: z = a @ W (matmul) or z = W[a] (gather)."""

    kind: str  # "matmul" | "gather"
    a: tf.Tensor  # matmul: [P, Din] inputs; gather: [P] int ids
    z: tf.Tensor  # the tensor differentiated (the layer's pre-activation output)
    dz_to_rows: Callable[[tf.Tensor], tf.Tensor]  # dL/dz -> [P, Dout]


@dataclasses.dataclass
class Weight:
    """A covered variable: how it was used in the forward pass, and whether ghost norms apply."""

    index: int  # position in the `variables` list
    variable: object
    kind: str
    to_variable: Callable[[tf.Tensor], tf.Tensor]  # [Din, Dout] -> variable shape (matmul)
    uses: List[Use] = dataclasses.field(default_factory=list)
    handles: set = dataclasses.field(default_factory=set)  # resource tensor names it was read by
    reason: Optional[str] = None  # why it falls back to per-example gradients (None: ghost)


class Capture:
    """Records covered uses while one micro-batch's forward pass is traced."""

    def __init__(self, variables: Sequence):
        self.graph = tf.compat.v1.get_default_graph()
        self.index = {id(v): i for i, v in enumerate(variables)}
        self.weights: Dict[int, Weight] = {}
        self.read_ops: set = set()
        self._rows: Dict[tuple, tuple] = {}

    def rows(self, inputs: tf.Tensor, width: int) -> tf.Tensor:  # noqa: F811
        """inputs as [P, width] rows, one tensor per input (query, key and value projections
        of self-attention share theirs, and so their Gram matrix)."""
        key = (id(inputs), width)
        if key not in self._rows:  # the entry keeps `inputs` alive, so its id stays unique
            self._rows[key] = (inputs, tf.reshape(inputs, [-1, width]))
        return self._rows[key][1]

    def weight(self, variable, kind: str, to_variable=None) -> Optional[Weight]:
        i = self.index.get(id(variable))
        if i is None:
            return None  # frozen or not requested: no gradient needed
        w = self.weights.get(i)
        if w is None:
            w = self.weights[i] = Weight(i, variable, kind, to_variable or (lambda g: g))
        elif w.kind != kind:
            w.reason = f"used both as {w.kind} and {kind}"
        return w

    def read(self, weight: Optional[Weight], variable) -> tf.Tensor:
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

    def add(self, weight: Optional[Weight], use: Use) -> None:
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

    def ghost_weights(self) -> List[Weight]:
        for w in self.weights.values():
            if not w.uses and w.reason is None:
                w.reason = "no recorded use"
        return sorted((w for w in self.weights.values() if w.reason is None),
                      key=lambda w: w.index)


def rows(t: tf.Tensor, width: int) -> tf.Tensor:
    """t as [P, width] rows."""
    return tf.reshape(t, [-1, width])


def flat_matmul(cap: Capture, inputs, kernel2d):
    """(rows [P, Din], z [P, Dout]) for inputs [..., Din] @ kernel [Din, Dout], as a 2-D matmul.

    Why 2-D: under vectorized_map a per-example input [1, T, Din] becomes [B, 1, T, Din], and
    TensorFlow 2.21's oneDNN BatchMatMul with such a rank-4 lhs and a rank-2 rhs reads past the
    kernel's buffer (heap corruption, tensorflow/tensorflow#117700). A 2-D MatMul vectorises to
    one [B*P, Din] @ [Din, Dout] matmul instead.
    """
    rows = cap.rows(inputs, kernel2d.shape[0])
    return rows, tf.matmul(rows, kernel2d)
