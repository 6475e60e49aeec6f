"""The O penalty (experiments/o_penalty.py): what it changes in the emissions, what it does to the
constrained decoding, and that b is chosen on dev alone."""
import numpy as np
import tensorflow as tf

from edp_nlu.models import crf as crf_lib
from edp_nlu.models.labels import bio_transitions
from experiments import o_penalty

TAGS = ["O", "B-city", "I-city"]


def test_the_penalty_lowers_only_the_o_column():
    potentials = tf.constant(np.arange(2 * 3 * 3, dtype=np.float32).reshape(2, 3, 3))
    shifted = o_penalty.penalised(potentials, 0, 1.5).numpy()
    np.testing.assert_array_equal(shifted[..., 0], potentials.numpy()[..., 0] - 1.5)
    np.testing.assert_array_equal(shifted[..., 1:], potentials.numpy()[..., 1:])
    np.testing.assert_array_equal(o_penalty.penalised(potentials, 0, 0.0), potentials)


def test_a_penalty_past_the_margin_turns_o_into_a_slot():
    """Word 2 prefers O over B-city by 0.5 (zero transitions): the paths O O and O B-city score
    3 - 2b and 2.5 - b, so b = 0.25 keeps O and b = 1 gives the slot."""
    layer = crf_lib.CRF(len(TAGS), *bio_transitions(TAGS))
    potentials = tf.constant([[[2.0, 0.0, 0.0], [1.0, 0.5, 0.0]]])
    mask = tf.ones([1, 2], tf.bool)

    def decoded(b):
        return layer.decode(o_penalty.penalised(potentials, 0, b), mask)[0].numpy()[0].tolist()

    assert decoded(0.0) == [0, 0]
    assert decoded(0.25) == [0, 0]
    assert decoded(1.0) == [0, 1]


def test_b_is_chosen_on_dev_alone_the_smallest_of_the_best():
    rows = [{"penalty": 0.0, "dev": {"ser": 0.30}, "test": {"ser": 0.10}},
            {"penalty": 1.0, "dev": {"ser": 0.20}, "test": {"ser": 0.40}},
            {"penalty": 2.0, "dev": {"ser": 0.20}, "test": {"ser": 0.05}}]
    assert o_penalty.choose(rows)["penalty"] == 1.0
