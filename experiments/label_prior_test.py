"""Logit adjustment of both heads (experiments/label_prior.py): the prior's order and floor, what
the shifts do to the decoded intents and tags, and that the taus are chosen on dev alone."""
import collections

import numpy as np
import pytest
import tensorflow as tf

from edp_nlu.models import crf as crf_lib
from edp_nlu.models.labels import bio_transitions
from experiments import label_prior

TAGS = ["O", "B-city", "I-city"]


def test_the_prior_follows_the_vocabulary_order_and_floors_unseen_classes_at_one():
    counted = collections.Counter({"O": 100, "B-city": 10})
    np.testing.assert_allclose(label_prior.log_prior(counted, ["B-city", "I-city", "O"]),
                               [np.log(10), 0.0, np.log(100)])


@pytest.mark.parametrize("tau, tags, intent", [(0.0, [0, 0], 0), (0.5, [0, 1], 1)])
def test_the_shifts_favour_the_rarer_tag_and_intent_past_their_margins(tau, tags, intent):
    """Word 2 prefers O over B-city by 0.5 and the utterance intent 0 over intent 1 by 0.5; with
    O 100 times as frequent (log ratio 4.6) and intent 0 10 times (2.3), tau 0.5 moves them by
    2.3 and 1.15, past both margins (word 1's O, ahead by 4, stays), tau 0 by nothing."""
    layer = crf_lib.CRF(len(TAGS), *bio_transitions(TAGS))
    decode = lambda p, m: layer.decode(p, m, constrained=True)[0]  # noqa: E731
    outputs = [(1, {"tag_potentials": tf.constant([[[4.0, 0.0, 0.0], [1.0, 0.5, 0.0]]]),
                    "tag_mask": tf.ones([1, 2], tf.bool),
                    "intent_logits": tf.constant([[1.0, 0.5]])})]
    log_tags = label_prior.log_prior(collections.Counter({"O": 100, "B-city": 1, "I-city": 1}),
                                     TAGS)
    log_intents = np.log([10.0, 1.0])
    (_, decoded), = label_prior._decoded(decode, outputs, tf.constant(tau * log_tags, tf.float32),
                                         tau * log_intents)
    assert decoded["tag_ids"].numpy()[0].tolist() == tags
    assert decoded["intent_ids"].numpy().tolist() == [intent]


def test_the_taus_are_chosen_on_dev_alone_the_smallest_of_the_best():
    rows = [{"tau_tag": 0.0, "tau_intent": 0.0, "dev": {"ser": 0.30}, "test": {"ser": 0.10}},
            {"tau_tag": 0.5, "tau_intent": 0.0, "dev": {"ser": 0.20}, "test": {"ser": 0.40}},
            {"tau_tag": 0.1, "tau_intent": 0.5, "dev": {"ser": 0.20}, "test": {"ser": 0.05}},
            {"tau_tag": 0.1, "tau_intent": 0.25, "dev": {"ser": 0.20}, "test": {"ser": 0.50}}]
    best = label_prior.choose(rows)
    assert (best["tau_tag"], best["tau_intent"]) == (0.1, 0.25)
