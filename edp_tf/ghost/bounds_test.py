"""Ghost norms as upper bounds: never below the exact norm (float32 alone, and after the float64
fallback), within MAX_MARGIN above it, and float32 in the typical case (else nothing is gained)."""
import numpy as np
import pytest
import tensorflow as tf

from edp_tf.ghost import bounds


def exact_squared_norms(a, z):
    a64, z64 = a.astype(np.float64), z.astype(np.float64)
    return np.array([np.sum((a64[j].T @ z64[j]) ** 2) for j in range(len(a))])


def cancelling(rng, m, p, din, dout, eps):
    """Positions with the same input and nearly opposite output gradients: the micro-batch
    gradient is tiny while every Gram term is large (a float32 <AA^T, dZdZ^T> is percents off)."""
    a = np.repeat(rng.normal(size=(m, 1, din)) * 30, p, axis=1).astype(np.float32)
    c = rng.normal(size=(m, p // 2, dout))
    z = np.concatenate([c, -c + eps * rng.normal(size=c.shape)], axis=1).astype(np.float32)
    return a, z


def random_rows(rng, m, p, din, dout):
    return (rng.normal(size=(m, p, din)).astype(np.float32),
            rng.normal(size=(m, p, dout)).astype(np.float32))


def gram_bound(a, z, dtype):
    grams = bounds.Grams([tf.constant(a), tf.constant(z)])
    return bounds._gram_bound(grams.gram(0, dtype), grams.gram(1, dtype), a.shape[2], z.shape[2],
                              bounds.UNIT_ROUNDOFF[dtype])


@pytest.mark.parametrize("branch", ["gram", "direct"])
def test_float32_bound_alone_is_never_below_the_exact_norm(branch):
    """The proven margin, without the fallback, on cases built to cancel. Fails if the margin is
    dropped or too small: the float32 inner product is then below the exact norm."""
    rng = np.random.default_rng(0)
    below_without_margin = 0
    for eps in (1e-2, 1e-3, 1e-4):
        a, z = cancelling(rng, 16, 4, 64, 48, eps)
        exact = exact_squared_norms(a, z)
        if branch == "gram":
            bound, margin = gram_bound(a, z, tf.float32)
        else:
            bound, margin = bounds._direct_bound(tf.constant(a), tf.constant(z), tf.float32)
        bound, inner = bound.numpy(), (bound - margin).numpy()
        assert np.all(bound >= exact), (branch, eps)
        below_without_margin += int(np.sum(inner < exact))
    if branch == "gram":
        assert below_without_margin > 0  # the cases do cancel below the truth in float32


@pytest.mark.parametrize("make", ["random", "cancelling"])
def test_squared_norm_is_within_max_margin_above_the_exact_norm(make):
    """What the step uses: float32 where its margin is small, float64 where it is not."""
    rng = np.random.default_rng(1)
    if make == "random":
        a, z = random_rows(rng, 16, 12, 40, 24)
    else:
        a, z = cancelling(rng, 16, 12, 40, 24, 1e-4)
    exact = exact_squared_norms(a, z)
    for got in (bounds.Grams([tf.constant(a), tf.constant(z)]).squared_norm(0, 1),
                bounds.direct_squared_norm(tf.constant(a), tf.constant(z))):
        got = got.numpy()
        assert np.all(got >= exact)
        # the float64 fallback's own margin is ~1e-13 of S, far inside MAX_MARGIN
        assert np.all(got <= exact * (1 + bounds.MAX_MARGIN))


def test_the_typical_case_stays_in_float32():
    """Random activations at compact BERT's sizes (48 positions, 312 -> 1200): the float32 margin
    is within MAX_MARGIN, so no batch takes the float64 pass (the speed this module exists for)."""
    rng = np.random.default_rng(2)
    for din, dout in ((312, 312), (312, 1200), (1200, 312)):
        a, z = random_rows(rng, 8, 48, din, dout)
        bound, margin = gram_bound(a, z, tf.float32)
        assert np.all(margin.numpy() <= bounds.MAX_MARGIN * bound.numpy()), (din, dout)


@pytest.mark.parametrize("mode", ["BF16", "tf32", "ANY"])
def test_lower_precision_fpmath_modes_use_float64(monkeypatch, mode):
    assert bounds.float32_matmul_is_ieee()  # this machine: strict float32
    monkeypatch.setenv("TF_SET_ONEDNN_FPMATH_MODE", mode)
    assert not bounds.float32_matmul_is_ieee()
