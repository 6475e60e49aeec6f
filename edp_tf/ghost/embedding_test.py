"""Embedding ghost rule: per-example norms equal the plain loop's with ids repeated within an
example, for Keras' Embedding and ReversibleEmbedding."""
import keras
import pytest

from edp_tf.testing import assert_fast_norms_exact


def embedding_model(reversible):
    inp = keras.Input((7,), dtype="int32")
    layer = (keras.layers.ReversibleEmbedding(11, 5, name="covered") if reversible
             else keras.layers.Embedding(11, 5, name="covered"))
    h = keras.layers.Flatten()(layer(inp))
    return keras.Model(inp, keras.layers.Dense(2, name="head")(h)), ["covered/embeddings",
                                                                      "head/kernel"]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("reversible", [False, True])
def test_fast_norms_match_per_example_gradients(reversible, k):
    keras.utils.set_random_seed(3)
    assert_fast_norms_exact(*embedding_model(reversible), k)
