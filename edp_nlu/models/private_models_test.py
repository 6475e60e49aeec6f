"""CLC and BERT joint models train under edp_tf.PrivateModel (eDP and per-example DP-SGD).

Two replicas (of conftest's four logical CPUs): MirroredStrategy traces the step once per replica,
so two keep the test fast while still exercising the cross-replica all-reduce.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_nlu.models import testing
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor

REPLICAS = 2
MODES = [pytest.param(None, id="edp"), pytest.param(1, id="per_example")]


@pytest.fixture(scope="module")
def strategy():
    return edp_tf.make_strategy(REPLICAS)


def _clc(strategy):
    pre = CLCPreprocessor.from_training_data(
        testing.TOKENS, testing.TAGS, testing.INTENTS, max_words=4, max_word_length=5
    )
    with strategy.scope():
        # One BiLSTM layer over 4 words: the unrolled graph is traced per replica and, for the
        # per-example path, vectorised; the two-layer model is covered in edp_nlu/models/clc.
        model = CLCJoint.from_preprocessor(pre, **{**testing.TINY_CLC, "num_lstm_layers": 1})
    return pre, model


def _bert(strategy):
    pre = BertPreprocessor.from_training_data(
        testing.TOKENS, testing.TAGS, testing.INTENTS, vocabulary_size=80, sequence_length=12
    )
    with strategy.scope():
        model = BertJoint.from_preprocessor(pre, **testing.TINY_BERT)
    return pre, model


def _repeated(tree, times: int):
    return tf.nest.map_structure(lambda a: np.concatenate([a] * times), tree)


def _train_privately(strategy, pre, model, microbatch_size):
    x, y, _ = pre.encode(testing.TOKENS, testing.TAGS, testing.INTENTS)
    # Small noise (z = 0.05) so that a few steps show learning; C large enough not to stall it.
    config = edp_tf.DPConfig(l2_norm_clip=5.0, noise_multiplier=0.05,
                             microbatch_size=microbatch_size)
    with strategy.scope():
        private = edp_tf.PrivateModel(model, config, training_statistics=True)
        private.compile(optimizer=keras.optimizers.Adam(0.03), loss=model.per_example_loss)
    before = float(tf.reduce_mean(model.per_example_loss(y, model(x))))
    # 20 steps on the 8 utterances, as one epoch of the data repeated 20 times (the same updates
    # as 20 one-step epochs without a distributed iterator each: 0.4 CPU-s an epoch): with 10
    # steps, CLC under eDP reached loss ratios 0.77-0.79 (6 runs), too close to the 0.8 bar (it
    # failed once in CI-like runs); with 20 it reached 0.69-0.71 (5 runs).
    history = private.fit(_repeated(x, 20), _repeated(y, 20), batch_size=8, epochs=1, verbose=0,
                          shuffle=False)
    after = float(tf.reduce_mean(model.per_example_loss(y, model(x))))
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["nonfinite_microbatches"][-1] == 0
    assert after < 0.8 * before, (before, after)
    facts = private.privacy_facts()
    assert facts["replicas"] == REPLICAS
    assert facts["microbatch_size"] == (microbatch_size or 8 // REPLICAS)
    assert facts["sensitivity"] == (1 if microbatch_size == 1 else 2)
    return private


@pytest.mark.parametrize("microbatch_size", MODES)
def test_clc_trains_privately(strategy, microbatch_size):
    pre, model = _clc(strategy)
    private = _train_privately(strategy, pre, model, microbatch_size)
    assert private.wrapped_model is model


@pytest.mark.parametrize("microbatch_size", MODES)
def test_bert_trains_privately(strategy, microbatch_size):
    # The per-example step uses edp_tf's default method (ghost norms), which runs with oneDNN on;
    # plain vectorised per-example gradients of BERT are checked in
    # edp_nlu/models/bert/bert_joint_test.py.
    pre, model = _bert(strategy)
    _train_privately(strategy, pre, model, microbatch_size)
