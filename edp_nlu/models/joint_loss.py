"""The joint intent + slot loss, per example, as the private step needs it.

The private step clips per micro-batch, so it needs one loss value per example (a [batch] vector),
not Keras' batch mean. Inputs are the dicts the joint models use:

  y_true: {"intent": int [batch], "tags": int [batch, words]}
  y_pred: {"intent_logits": [batch, intents], "tag_potentials": [batch, words, tags],
           "tag_mask": bool [batch, words]}
"""

from __future__ import annotations

import tensorflow as tf

from edp_nlu.models.crf import CRF

TAG_REDUCTIONS = ("sum", "mean")


def joint_per_example_loss(
    crf: CRF,
    y_true: dict,
    y_pred: dict,
    intent_weight: float = 1.0,
    tag_weight: float = 1.0,
    tag_reduction: str = "sum",
) -> tf.Tensor:
    """intent cross-entropy + CRF negative log-likelihood of the tag path, shape [batch].

    The CRF term is a sum over the words of the utterance (the sequence's NLL), as in Ma & Hovy,
    or with `tag_reduction="mean"` that sum divided by the utterance's word count: under DP every
    example's gradient is clipped to the same norm, and a summed NLL lets long utterances' slot
    terms crowd out the intent term. An utterance with no words contributes only its intent term.
    """
    if tag_reduction not in TAG_REDUCTIONS:
        raise ValueError(f"tag_reduction must be one of {TAG_REDUCTIONS}, got {tag_reduction!r}")
    logits = tf.cast(y_pred["intent_logits"], tf.float32)
    intent = tf.cast(tf.reshape(y_true["intent"], [-1]), tf.int32)
    intent_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=intent, logits=logits)
    tag_nll = -crf.log_likelihood(y_pred["tag_potentials"], y_true["tags"], y_pred["tag_mask"])
    if tag_reduction == "mean":
        words = tf.reduce_sum(tf.cast(y_pred["tag_mask"], tag_nll.dtype), axis=-1)
        tag_nll = tag_nll / tf.maximum(words, 1.0)
    return intent_weight * intent_loss + tag_weight * tag_nll
