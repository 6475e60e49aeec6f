"""Ghost norms as proven upper bounds, mostly in float32.

Why: ||a^T dz||^2 = <A A^T, dZ dZ^T> sums signed terms. Taken naively in float32 it came out 2.1%
below the true norm in a constructed case, and then an example passes the clip with more than C.
Float64 Grams avoid that, but they run on Eigen rather than oneDNN: the per-example CLC step took
1.51x plain training with them against 1.20x with float32 ones (`benchmarks.benchmark`). So the
Grams are float32 matmuls, and each norm is raised by a bound of their rounding error (Higham's
gamma_n, which holds for a dot product summed in any order):

    |<Ga~, Gd~> - <Ga, Gd>| <= g(Din) sum_pq |a_p| |a_q| |Gd~_pq|
                              + g(Dout) sum_pq |Ga~_pq| |dz_p| |dz_q|
                              + g(Din) g(Dout) S,      S = (sum_p |a_p| |dz_p|)^2 >= the norm

(|Ga~_pq - Ga_pq| <= g(Din) |a_p| |a_q|, and likewise for dZ), all of it in float64. The raise is
small unless positions cancel; where it is more than
`MAX_MARGIN` of the norm, the batch is computed again from float64 Grams (same bound with float64's
unit roundoff). Either way the result is never below the exact norm and at most MAX_MARGIN above.
The direct branch (the [m, Din, Dout] gradients, where they are smaller than the Grams) is bounded
the same way.
"""
from __future__ import annotations

import os
from typing import Dict, Sequence

import tensorflow as tf

UNIT_ROUNDOFF = {tf.float32: 2.0 ** -24, tf.float64: 2.0 ** -53}

# A squared norm at most 0.1% high (0.05% on the norm): an example above C contributes at
# least C / 1.0005, which no utility figure can see; the fallback costs a float64 pass.
MAX_MARGIN = 1e-3


def gamma(n, u: float):
    """Higham's gamma_n = n u / (1 - n u), for a Python number or a float64 tensor n."""
    return n * u / (1.0 - n * u)


def float32_matmul_is_ieee() -> bool:
    """False where TensorFlow may run float32 matmuls at lower precision (oneDNN's bf16 / tf32
    fpmath modes, TF32 on a GPU): the float32 bound would then not hold."""
    mode = os.environ.get("TF_SET_ONEDNN_FPMATH_MODE", "").strip().upper()
    if mode not in ("", "STRICT"):
        return False
    return not (tf.config.list_physical_devices("GPU")
                and tf.config.experimental.tensor_float_32_execution_enabled())


class Grams:
    """Per-micro-batch Gram matrices of stacked row tensors [m, P, D], each computed once."""

    def __init__(self, rows: Sequence[tf.Tensor]):
        self.rows = rows
        self._cache: Dict[int, tf.Tensor] = {}  # float32 Grams

    def gram(self, i: int, dtype) -> tf.Tensor:
        if dtype == tf.float64:  # built inside a tf.cond branch: not shared outside it
            return _gram(self.rows[i], dtype)
        if i not in self._cache:
            self._cache[i] = _gram(self.rows[i], dtype)
        return self._cache[i]

    def squared_norm(self, ia: int, iz: int) -> tf.Tensor:
        """[m] float64 upper bound of ||A_j^T dZ_j||^2 per micro-batch j."""
        a, z = self.rows[ia], self.rows[iz]
        return _float32_unless_uncertain(lambda dtype: _gram_bound(
            self.gram(ia, dtype), self.gram(iz, dtype), a.shape[2], z.shape[2],
            UNIT_ROUNDOFF[dtype]), a, z)


def direct_squared_norm(a: tf.Tensor, z: tf.Tensor) -> tf.Tensor:
    """[m] float64 upper bound of ||A_j^T dZ_j||^2, from the [m, Din, Dout] gradients themselves
    (where they are smaller than the Grams). Each entry is a P-term dot product, so
    |G~ - G|_F <= g(P) sum_p |a_p| |dz_p| = g(P) sqrt(S), added to the computed norm."""
    return _float32_unless_uncertain(lambda dtype: _direct_bound(a, z, dtype), a, z)


def _float32_unless_uncertain(bound_in, a: tf.Tensor, z: tf.Tensor) -> tf.Tensor:
    """bound_in(float32)'s bound where its margin is within MAX_MARGIN, float64's elsewhere."""
    if not (a.dtype.size <= 4 and z.dtype.size <= 4 and float32_matmul_is_ieee()):
        return bound_in(tf.float64)[0]
    bound, margin = bound_in(tf.float32)
    uncertain = tf.logical_not(margin <= MAX_MARGIN * bound)  # also NaN and inf
    return tf.cond(tf.reduce_any(uncertain),
                   lambda: tf.where(uncertain, bound_in(tf.float64)[0], bound),
                   lambda: bound)


def _gram(rows: tf.Tensor, dtype) -> tf.Tensor:
    t = tf.cast(rows, dtype)
    return tf.matmul(t, t, transpose_b=True)


def _gram_bound(gram_a, gram_z, din: int, dout: int, u: float) -> tuple:
    """(upper bound of the squared norm, the margin it adds), float64, from Grams computed with
    unit roundoff u. With n_p >= |a_p|, m_p >= |dz_p| and E the Grams' errors:
    |sum Ea Gz~| <= g(Din) n^T |Gz~| n and |sum Ga Ez| <= g(Dout) (m^T |Ga~| m + g(Din) S)."""
    ga, gz = tf.cast(gram_a, tf.float64), tf.cast(gram_z, tf.float64)
    inner = tf.reduce_sum(ga * gz, axis=[1, 2])
    g_a, g_z = gamma(din, u), gamma(dout, u)
    # the diagonals are |a_p|^2 (1 + t), |t| <= g(Din): dividing by 1 - g bounds them above
    norm_a = tf.sqrt(tf.maximum(tf.linalg.diag_part(ga), 0.0) / (1.0 - g_a))
    norm_z = tf.sqrt(tf.maximum(tf.linalg.diag_part(gz), 0.0) / (1.0 - g_z))
    s = tf.square(tf.reduce_sum(norm_a * norm_z, axis=1))
    q_a = tf.einsum("mp,mpq,mq->m", norm_a, tf.abs(gz), norm_a)
    q_z = tf.einsum("mp,mpq,mq->m", norm_z, tf.abs(ga), norm_z)
    p = tf.cast(tf.shape(ga)[1], tf.float64)
    u64 = UNIT_ROUNDOFF[tf.float64]
    # float64's own rounding: the P^2-term inner product, then the sums making up the margin
    margin = (g_a * q_a + g_z * q_z + g_a * g_z * s
              + gamma(p * p + 1.0, u64) * (1.0 + g_a) * (1.0 + g_z) * s)
    margin = margin * (1.0 + gamma(p * p + 16.0, u64))
    return inner + margin, margin


def _direct_bound(a: tf.Tensor, z: tf.Tensor, dtype) -> tuple:
    u, u64 = UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF[tf.float64]
    a, z = tf.cast(a, dtype), tf.cast(z, dtype)
    per = tf.cast(tf.matmul(a, z, transpose_a=True), tf.float64)
    din, dout = a.shape[2], z.shape[2]
    inner = tf.reduce_sum(tf.square(per), axis=[1, 2])
    # row norms from sums of squares (positive terms: relative error <= g(D + 1), bounded above)
    norm_a = tf.sqrt(tf.cast(tf.reduce_sum(tf.square(a), 2), tf.float64) / (1 - gamma(din + 1, u)))
    norm_z = tf.sqrt(tf.cast(tf.reduce_sum(tf.square(z), 2), tf.float64) / (1 - gamma(dout + 1, u)))
    p = tf.cast(tf.shape(a)[1], tf.float64)
    error = gamma(p, u) * tf.reduce_sum(norm_a * norm_z, axis=1) * (1.0 + gamma(p + 8.0, u64))
    bound = tf.square(tf.sqrt(inner) * (1.0 + gamma(din * dout + 4.0, u64)) + error)
    return bound, bound - inner
