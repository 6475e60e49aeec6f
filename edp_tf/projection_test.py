"""The public-subspace projection: the basis spans the public gradients, the projected update lies
in it (on one replica and after the replicas' sum), and the mechanism is left as it was."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import DPConfig, PrivateModel, projection
from edp_tf.testing import mse, small_model, small_regression


def test_top_directions_are_orthonormal_and_span_a_low_rank_matrix():
    rng = np.random.default_rng(0)
    g = (rng.normal(size=(12, 3)) @ rng.normal(size=(3, 50))).astype(np.float32)
    basis = projection.top_directions(tf.constant(g), 3).numpy()
    np.testing.assert_allclose(basis.T @ basis, np.eye(3), atol=1e-5)
    np.testing.assert_allclose(basis @ (basis.T @ g.T), g.T, rtol=1e-4, atol=1e-4)
    # rank 2 of a rank-3 matrix misses part of it: the span check above can fail
    two = projection.top_directions(tf.constant(g), 2).numpy()
    assert np.linalg.norm(two @ (two.T @ g.T) - g.T) > 1e-2 * np.linalg.norm(g)


def test_directions_beyond_the_gradients_rank_are_zero_not_arbitrary():
    rng = np.random.default_rng(1)
    g = (rng.normal(size=(6, 2)) @ rng.normal(size=(2, 20))).astype(np.float32)
    basis = projection.top_directions(tf.constant(g), 4).numpy()
    norms = np.linalg.norm(basis, axis=0)
    np.testing.assert_allclose(norms[:2], 1.0, atol=1e-5)
    np.testing.assert_allclose(norms[2:], 0.0, atol=1e-6)
    with pytest.raises(ValueError, match="rank must be between 1 and the 6"):
        projection.top_directions(tf.constant(g), 7)


def test_project_keeps_shapes_and_removes_what_is_orthogonal():
    basis = np.zeros((6, 1), np.float32)
    basis[1, 0] = 1.0  # the second entry of the first tensor
    a, b = tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([5.0, 6.0])
    got = projection.project([a, b], tf.constant(basis))
    np.testing.assert_array_equal(got[0].numpy(), [[0.0, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(got[1].numpy(), [0.0, 0.0])


def _one_step(strategy, project: bool, seed=3):
    """(weight change of one noisy SGD step, the basis or None)."""
    x, y = small_regression(seed=seed)
    public_x, public_y = small_regression(seed=seed + 1)
    with strategy.scope():
        inner = small_model()
        private = PrivateModel(inner, DPConfig(l2_norm_clip=1.0, noise_multiplier=1.0,
                                               microbatch_size=1))
        private.compile(optimizer=keras.optimizers.SGD(0.1), loss=mse)
    if project:
        private.project_onto_public_gradients(public_x[:8], public_y[:8], rank=4,
                                              every_steps=100, source="a public corpus P")
    private._ensure_built(x[:1])
    before = np.concatenate([w.numpy().ravel() for w in inner.trainable_variables])
    private.fit(x[:16], y[:16], batch_size=16, epochs=1, shuffle=False, verbose=0)
    after = np.concatenate([w.numpy().ravel() for w in inner.trainable_variables])
    basis = private._subspace.basis.numpy() if project else None
    return after - before, basis, private


def test_the_noisy_update_lies_in_the_public_subspace_after_the_replicas_sum(strategy):
    change, basis, private = _one_step(strategy, project=True)
    assert basis.shape == (change.size, 4)
    np.testing.assert_allclose(basis.T @ basis, np.eye(4), atol=1e-4)
    assert np.linalg.norm(change) > 1e-3
    residual = change - basis @ (basis.T @ change)
    assert np.linalg.norm(residual) < 1e-4 * np.linalg.norm(change)
    # without the projection the noise leaves that subspace: the check above can fail
    plain, _, unprojected = _one_step(strategy, project=False)
    assert np.linalg.norm(plain - basis @ (basis.T @ plain)) > 0.5 * np.linalg.norm(plain)
    # post-processing: the mechanism epsilon is computed from is the same
    assert private.mechanism == unprojected.mechanism
    facts = private.privacy_facts()
    assert facts["public_subspace"] == {"rank": 4, "every_steps": 100, "public_examples": 8,
                                        "source": "a public corpus P"}
    assert any("declared public (post-processing), from a public corpus P" in s
               for s in facts["not_covered"])


def test_the_basis_is_refreshed_on_the_optimizer_step_schedule():
    x, y = small_regression()
    subspace = projection.PublicSubspace(x[:8], y[:8], rank=2, every_steps=3)
    refreshed = []
    subspace.refresh = lambda: refreshed.append(True)
    due = [step for step in range(8) if subspace.refresh_if_due(step)]
    assert due == [0, 3, 6]


def test_bad_arguments_name_themselves():
    x, y = small_regression()
    with pytest.raises(ValueError, match="rank=9 needs at least as many public examples"):
        projection.PublicSubspace(x[:8], y[:8], rank=9)
    with pytest.raises(ValueError, match="every_steps must be an integer >= 1"):
        projection.PublicSubspace(x[:8], y[:8], rank=2, every_steps=0)
