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

Covered (one module per layer family, each registering its rule in `registry`): `Dense` and
`EinsumDense` kernels (dense.py), `Embedding` tables and keras' `ReversibleEmbedding` used forwards
(embedding.py), `LSTMCell` kernel and recurrent kernel, per step of an unrolled RNN (lstm.py),
`Conv1D` / `Conv2D` kernels as matmuls of their input patches (conv.py).
`register(layer_class, rule)` adds a family. A covered layer's `call` is replaced, for the
duration of one trace only, by its rule: a re-implementation that records (a, z).
Everything else keeps exact per-example gradients from the vectorised tape (the fallback):
biases, LayerNormalization (its per-example gradients are d-vectors: nothing to save), the CRF,
unknown layers, and any covered weight that is also read outside its layer (tied weights), used in
a nested graph (a while_loop RNN) or used in two different ways.

This package runs inside the function given to `tf.vectorized_map` (one micro-batch per iteration),
so "per micro-batch" needs no assumption about a batch axis: it is the vectorised axis.
"""
from edp_tf.ghost import conv, dense, embedding, lstm  # noqa: F401  (each registers its rule)
from edp_tf.ghost.norms import (
    GhostPlan,
    differentiate,
    plan,
    squared_norms,
    weighted_sums,
    zero_nonfinite,
)
from edp_tf.ghost.recording import Capture, Use, Weight, flat_matmul, rows
from edp_tf.ghost.registry import (
    capture,
    flatten_layers,
    original_call,
    register,
    registered,
    rule_for,
    unregister,
)

__all__ = [
    "Capture", "GhostPlan", "Use", "Weight", "capture", "differentiate", "flat_matmul",
    "flatten_layers", "original_call", "plan", "register", "registered", "rows", "rule_for",
    "squared_norms", "unregister", "weighted_sums", "zero_nonfinite",
]
