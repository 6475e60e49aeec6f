"""The joint per-example loss: intent cross-entropy plus the CRF's negative log-likelihood, one
value per example, its tag term summed or averaged over the utterance's words."""
import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models.crf import CRF
from edp_nlu.models.joint_loss import joint_per_example_loss

RNG = np.random.default_rng(0)
BATCH, WORDS, TAGS, INTENTS = 3, 4, 3, 5
Y_TRUE = {"intent": np.array([0, 3, 4]), "tags": np.array([[1, 2, 0, 0], [0, 0, 0, 0],
                                                         [2, 1, 1, 0]])}
Y_PRED = {"intent_logits": RNG.normal(size=(BATCH, INTENTS)).astype(np.float32),
          "tag_potentials": RNG.normal(size=(BATCH, WORDS, TAGS)).astype(np.float32),
          # the second utterance has no words: only its intent term remains
          "tag_mask": np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], bool)}


@pytest.fixture(scope="module")
def crf():
    layer = CRF(TAGS)
    layer.transitions.assign(RNG.normal(size=(TAGS, TAGS)).astype(np.float32))
    return layer


def _intent_cross_entropy():
    logits = Y_PRED["intent_logits"].astype(np.float64)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -log_p[np.arange(BATCH), Y_TRUE["intent"]]


def _tag_nll(crf):
    return -crf.log_likelihood(Y_PRED["tag_potentials"], Y_TRUE["tags"],
                               Y_PRED["tag_mask"]).numpy()


def test_sum_is_the_intent_cross_entropy_plus_the_weighted_crf_nll(crf):
    loss = joint_per_example_loss(crf, Y_TRUE, Y_PRED, intent_weight=0.5, tag_weight=2.0)
    assert loss.shape == (BATCH,)
    want = 0.5 * _intent_cross_entropy() + 2.0 * _tag_nll(crf)
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5)
    assert _tag_nll(crf)[1] == 0.0 and (_tag_nll(crf)[[0, 2]] > 0).all()


def test_mean_divides_the_tag_term_by_the_words_of_each_utterance(crf):
    loss = joint_per_example_loss(crf, Y_TRUE, Y_PRED, tag_reduction="mean")
    words = np.maximum(Y_PRED["tag_mask"].sum(-1), 1)
    np.testing.assert_allclose(loss.numpy(), _intent_cross_entropy() + _tag_nll(crf) / words,
                               rtol=1e-5)


def test_each_example_loss_depends_on_its_own_row_only(crf):
    """The private step clips per example: one row's labels must not move another's loss."""
    before = joint_per_example_loss(crf, Y_TRUE, Y_PRED).numpy()
    changed = {"intent": Y_TRUE["intent"].copy(), "tags": Y_TRUE["tags"].copy()}
    changed["intent"][0], changed["tags"][0, 0] = 1, 2
    after = joint_per_example_loss(crf, changed, Y_PRED).numpy()
    assert after[0] != before[0]
    np.testing.assert_array_equal(after[1:], before[1:])


def test_an_unknown_reduction_is_refused(crf):
    with pytest.raises(ValueError, match="tag_reduction must be one of"):
        joint_per_example_loss(crf, Y_TRUE, Y_PRED, tag_reduction="max")


def test_half_precision_logits_give_a_float32_loss(crf):
    half = dict(Y_PRED, intent_logits=tf.cast(Y_PRED["intent_logits"], tf.float16))
    loss = joint_per_example_loss(crf, Y_TRUE, half)
    assert loss.dtype == tf.float32
    # float16 logits of |x| < 4 round to 2e-3: the cross-entropy moves by about as much
    np.testing.assert_allclose(loss.numpy(), joint_per_example_loss(crf, Y_TRUE, Y_PRED).numpy(),
                               atol=1e-2)
