"""Micro-batch gradients: the fast clipped sum equals the plain loop's (scales, a non-finite
example, a padded row), method names are checked, a single clip zeroes a non-finite gradient."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import DPConfig, microbatch
from edp_tf.testing import (
    data_for,
    loop_clipped_sum,
    loop_gradients,
    mixed_model,
    mse,
    small_model,
    small_regression,
    variable_names,
)


def _spy_on_ghost_plans(monkeypatch) -> list:
    """The plans of the ghost passes traced from now on: which variables got a ghost rule is
    read off the clipped sum's own trace (a second ghost trace only for it costs seconds)."""
    plans, ghost_pass = [], microbatch.ghost_pass

    def spy(*args, **kwargs):
        p = ghost_pass(*args, **kwargs)
        plans.append(p.plan)
        return p

    monkeypatch.setattr(microbatch, "ghost_pass", spy)
    return plans


@pytest.mark.parametrize("k", [1, 2])
def test_clipped_sum_matches_plain_loop_with_scales_and_a_nonfinite_example(k, monkeypatch):
    keras.utils.set_random_seed(5)
    model = mixed_model()
    variables = model.trainable_variables
    x, y = data_for(model)
    x = x % 13
    y[5, 0] = np.nan  # example 5 (micro-batch 5 // k) has a NaN loss
    w = np.ones(len(x), "float32")
    w[6] = 0.0  # a padded row (Poisson sampling) contributes nothing
    k_e = float(k)
    rng = np.random.default_rng(0)
    alpha = tuple(float(a) for a in rng.uniform(0.5, 2.0, len(variables)))
    reference = loop_gradients(model, mse, x, y, w, k, k_e)
    finite_norms = [n for n in loop_clipped_sum(reference, alpha, 1e9)[1] if math.isfinite(n)]
    C = float(np.median(finite_norms))  # about half the micro-batches are clipped
    want, want_norms, want_finite = loop_clipped_sum(reference, alpha, C)

    plans = _spy_on_ghost_plans(monkeypatch)
    fn = tf.function(lambda: microbatch.clipped_gradient_sum(
        model, mse, variables, x, y, tf.constant(w), k, k_e, alpha, C), autograph=False)
    result, losses, _ = fn()
    assert len(plans) == 1
    np.testing.assert_array_equal(result.finite.numpy(), want_finite)
    assert not want_finite[5 // k] and want_finite.sum() == len(want_finite) - 1
    np.testing.assert_allclose(result.norms.numpy()[want_finite], want_norms[want_finite],
                               rtol=1e-4)
    for v, got, expected in zip(variables, result.clipped_sum, want):
        got = got.numpy()
        assert np.all(np.isfinite(got)), v.path
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-6, err_msg=v.path)
    assert variable_names(model, [weight.index for weight in plans[0].ghost]) == sorted(
        ["emb/embeddings", "qkv/kernel", "dense/kernel", "head/kernel"]
        + [f"bi/{d}_lstm/lstm_cell/{v}" for d in ("forward", "backward")
           for v in ("kernel", "recurrent_kernel")])


def test_per_example_method_names_are_checked():
    with pytest.raises(ValueError, match="per_example_method"):
        DPConfig(microbatch_size=1, per_example_method="jacobian")
    with pytest.raises(ValueError, match="per-example method"):
        microbatch.clipped_gradient_sum(None, None, [], {}, {}, None, 1, 1.0, [], 1.0, "jacobian")


def test_single_clip_zeroes_a_nonfinite_gradient_exactly():
    def clip(grads):
        return microbatch.SingleGradient(grads, None, None, [1.0] * len(grads)).clip(1.0)

    result = clip([tf.constant([1.0, np.nan]), tf.constant([[2.0]])])
    assert not bool(result.finite[0])
    assert all(np.all(g.numpy() == 0.0) for g in result.clipped_sum)
    result = clip([tf.constant([3.0, 4.0])])
    np.testing.assert_allclose(result.clipped_sum[0].numpy(), [0.6, 0.8], rtol=1e-6)


def _loop_per_layer_sum(grads, alpha, C):
    """sum_j of each variable's scaled part clipped to C / sqrt(K) on its own: the definition."""
    budget = C / math.sqrt(len(alpha))
    total = [np.zeros_like(g) for g in grads[0]]
    for g in grads:
        for s, t, a in zip(total, g, alpha):
            part = t / a
            s += part * min(1.0, budget / max(float(np.sqrt(np.sum(part ** 2))), 1e-30))
    return total


_PER_LAYER_REFERENCE = {}  # (rows per micro-batch, small model): loop_gradients' result


@pytest.mark.parametrize("k, method, small", [
    (1, "ghost", False), (2, "ghost", False), (1, "loop", False), (None, "ghost", False),
    # vectorised per-example gradients of the mixed model's layers hit TF's oneDNN BatchMatMul
    # bug (edp_tf/ghost/recording.py): the Dense-only model checks that method
    (1, "vectorized", True)])
def test_per_layer_clipping_matches_a_loop_and_keeps_each_contribution_within_c(k, method, small):
    keras.utils.set_random_seed(7)
    model = small_model() if small else mixed_model()
    variables = model.trainable_variables
    if small:
        x, y = small_regression(seed=3, batch=8)
    else:
        x, y = data_for(model)
        x = x % 13
    w = np.ones(len(x), "float32")
    rows = k or len(x)
    rng = np.random.default_rng(1)
    alpha = tuple(float(a) for a in rng.uniform(0.5, 2.0, len(variables)))
    key = (rows, small)  # the same seed builds the same weights: the methods share the loop
    if key not in _PER_LAYER_REFERENCE:
        _PER_LAYER_REFERENCE[key] = loop_gradients(model, mse, x, y, w, rows, float(rows))
    reference = _PER_LAYER_REFERENCE[key]
    C = 0.3 * float(np.median(loop_clipped_sum(reference, alpha, 1e9)[1]))  # most parts clipped
    want = _loop_per_layer_sum(reference, alpha, C)
    fn = tf.function(lambda: microbatch.clipped_gradient_sum(
        model, mse, variables, x, y, tf.constant(w), k, float(rows), alpha, C, method,
        per_layer=True), autograph=False)
    result, _, _ = fn()
    for v, got, expected in zip(variables, result.clipped_sum, want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=2e-4, atol=1e-6, err_msg=v.path)
    # one micro-batch's clipped contribution has norm <= C: the sensitivity of flat clipping
    one = _loop_per_layer_sum(reference[:1], alpha, C)
    assert math.sqrt(sum(float(np.sum(t ** 2)) for t in one)) <= C * (1 + 1e-6)
    flat = loop_clipped_sum(reference, alpha, C)[0]
    assert any(not np.allclose(a, b) for a, b in zip(flat, want))  # not flat clipping


def test_chunks_refuse_a_batch_that_is_not_whole_micro_batches():
    """Padding to whole chunks must not complete a partial micro-batch (9 rows, k = 2)."""
    model = mixed_model()
    x, y = data_for(model, n=9)
    variables = model.trainable_variables
    with pytest.raises(ValueError, match="not divisible by microbatch_size=2"):
        microbatch.clipped_gradient_sum(model, mse, variables, x % 13, y, tf.ones([9]), 2, 2.0,
                                        (1.0,) * len(variables), 0.5, chunk=4)


_UNCHUNKED = {}  # (k, k_e, method, nan_row): the unchunked pass's numpy results


@pytest.mark.parametrize("k, k_e, chunk, method, nan_row", [
    (1, 1.0, 4, "ghost", 7), (2, 2.0, 4, "ghost", 7), (None, 10.0, 4, "ghost", 7),
    (2, None, 6, "ghost", 7), (1, 1.0, 8, "ghost", 7),
    (1, 1.0, 4, "loop", 0)])  # the padding copies a non-finite row: still flagged once
def test_chunks_give_the_unchunked_clipped_sum_norms_and_predictions(k, k_e, chunk, method,
                                                                     nan_row):
    """10 rows in chunks of `chunk` (padded to whole chunks with weight-0 rows: 12 rows for 4 and
    6, 16 for 8) give what one pass gives, the padding left out of the norms, losses and
    predictions, a NaN micro-batch flagged in place; k_e None: micro-batches of one unit's rows
    (a user's, an example's copies)."""
    keras.utils.set_random_seed(3)
    model = mixed_model()
    variables = model.trainable_variables
    x, y = data_for(model, n=10)
    x = x % 13
    y[nan_row, 0] = np.nan
    w = np.ones(len(x), "float32")
    w[4] = 0.0
    alpha = tuple(1.0 for _ in variables)

    def run(physical):
        result, losses, pred = tf.function(lambda: microbatch.clipped_gradient_sum(
            model, mse, variables, x, y, tf.constant(w), k, k_e, alpha, 0.5, method=method,
            chunk=physical), autograph=False)()
        return (result.finite.numpy(), result.norms.numpy(),
                [t.numpy() for t in result.clipped_sum], losses.numpy(), pred.numpy())

    # the unchunked pass depends on the case without its chunk: cases that differ only in the
    # chunk share it (the same seed builds the same weights)
    key = (k, k_e, method, nan_row)
    if key not in _UNCHUNKED:
        _UNCHUNKED[key] = run(None)
    (finite, want_norms, want, want_losses, want_pred) = _UNCHUNKED[key]
    got_finite, got_norms, got, got_losses, got_pred = run(chunk)
    np.testing.assert_array_equal(got_finite, finite)
    np.testing.assert_allclose(got_norms[finite], want_norms[finite], rtol=1e-4)
    for v, a, b in zip(variables, got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6, err_msg=v.path)
    np.testing.assert_allclose(np.nan_to_num(got_losses), np.nan_to_num(want_losses), rtol=1e-4)
    np.testing.assert_allclose(got_pred, want_pred, rtol=1e-4, atol=1e-6)
