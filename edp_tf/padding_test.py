"""A model that cuts its padding gets the clipped sum, norms, losses and predictions of the
padded step, in the sampler's order, for every way a replica's rows are grouped."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from edp_tf import microbatch, padding

T, VOCAB, CLASSES = 12, 30, 3


class MaskedBag(keras.Model):
    """Mean of the real positions' embeddings, then a dense layer: padded positions reach no
    output. Records the piece length each trace of `call` saw (None: cut to an unknown length)."""

    def __init__(self):
        super().__init__()
        self.embed = keras.layers.Embedding(VOCAB, 6)
        self.hidden = keras.layers.Dense(5, activation="tanh")
        self.out = keras.layers.Dense(CLASSES)
        self.cuts_padding = True
        self.seen = []

    def call(self, x):
        self.seen.append(x["ids"].shape[1])
        mask = tf.cast(x["mask"], tf.float32)[..., None]
        h = self.hidden(self.embed(x["ids"]))
        return self.out(tf.reduce_sum(h * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0))

    def padding_lengths(self, x):
        return tf.reduce_sum(x["mask"], 1)

    def cut_padding(self, x, length):
        return {k: tf.compat.v1.placeholder_with_default(v[:, :length], [v.shape[0], None])
                for k, v in x.items()}


def loss_fn(y, logits):
    return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    n = 12
    # lengths out of order, so that sorting moves rows across chunks and micro-batches
    lengths = np.array([9, 2, 12, 3, 5, 1, 7, 2, 11, 4, 6, 3])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(1, VOCAB, (n, T)).astype(np.int32) * mask
    y = rng.integers(0, CLASSES, n).astype(np.int32)
    w = np.ones(n, np.float32)
    w[4] = 0.0  # a sampler's padding row
    model = MaskedBag()
    model({"ids": ids, "mask": mask})
    return model, {"ids": ids, "mask": mask}, y, w


def _step(model, x, y, w, k, chunk, cuts):
    model.cuts_padding, model.seen = cuts, []
    spec = ({name: tf.TensorSpec(v.shape, v.dtype) for name, v in x.items()},)
    variables = model.trainable_variables

    @tf.function(autograph=False, input_signature=spec)
    def step(xx):
        result, losses, y_pred = microbatch.clipped_gradient_sum(
            model, loss_fn, variables, xx, y, w, k, 4.0, [1.0] * len(variables), 0.5, "ghost",
            chunk)
        return result.clipped_sum, result.norms, losses, y_pred

    out = [tf.nest.map_structure(lambda t: t.numpy(), o) for o in step(x)]
    return out, list(model.seen)


@pytest.mark.parametrize("k, chunk", [(1, None), (1, 4), (2, 4), (None, 4)],
                         ids=["per_example", "per_example_chunks", "pairs_chunks", "edp_chunks"])
def test_cut_step_equals_padded_step(data, k, chunk):
    model, x, y, w = data
    padded, seen_padded = _step(model, x, y, w, k, chunk, cuts=False)
    cut, seen_cut = _step(model, x, y, w, k, chunk, cuts=True)
    assert set(seen_padded) == {T} and set(seen_cut) == {None}  # the cut ran, and only there
    # float32 sums of the same terms in another order: agreement to rounding
    for a, b in zip(padded[0], cut[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for name, a, b in zip(("norms", "losses", "predictions"), padded[1:], cut[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_sorting_only_where_grouping_cannot_matter(data):
    model, x, _, _ = data
    model.cuts_padding = True
    order = tf.function(lambda xx: padding.shortest_first(model, xx), autograph=False)(x).numpy()
    assert list(np.sum(x["mask"], 1)[order]) == sorted(np.sum(x["mask"], 1))
    # eagerly, shapes are concrete: nothing is cut (a static input shape would refuse them)
    assert padding.cut(model, x) is x
    model.cuts_padding = False
    assert tf.function(lambda xx: padding.shortest_first(model, xx), autograph=False)(x) is None


def test_a_model_without_the_methods_is_left_alone():
    model = keras.Sequential([keras.layers.Dense(2)])
    x = tf.ones([3, 4])
    assert padding.lengths(model, x) is None and padding.cut(model, x) is x
