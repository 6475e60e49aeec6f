"""Joint intent classification + slot tagging on top of any word-level encoder (CLC or BERT).

The encoder is a Keras model returning {"sequence_output": [batch, words, hidden],
"pooled_output": [batch, hidden], "word_mask": bool [batch, words]}; this task adds an intent head
(dense over the pooled state) and a NER head (dense emissions + CRF).

Training:
* plain Keras: `task.compile(optimizer=...)` and `fit` -- `compute_loss` is the joint loss
  (weighted mean over real rows, scaled for the optimizer's cross-replica SUM);
* private: `edp_tf.PrivateModel(task, cfg).compile(optimizer, loss=task.per_example_loss)`.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import keras
import tensorflow as tf

from edp_nlu.models.crf import CRF
from edp_nlu.models.joint_loss import TAG_REDUCTIONS, joint_per_example_loss
from edp_nlu.models.label_aware_head import LabelAwareHead
from edp_nlu.models.label_names import span_of
from edp_nlu.models.labels import bio_transitions


class JointTagger(keras.Model):
    """Encoder + intent head + CRF tag head; `call` returns the dict `per_example_loss` expects."""

    def __init__(
        self,
        encoder: keras.Model,
        num_intents: int,
        num_tags: int,
        dropout: float = 0.1,
        intent_weight: float = 1.0,
        tag_weight: float = 1.0,
        tag_reduction: str = "sum",
        tag_labels=None,
        decoding: str | None = None,
        label_embedding_dim: int = 0,
        label_correction: bool = False,
        **kwargs,
    ):
        """`tag_labels` (the tag vocabulary's labels, BIO) lets the CRF decode only well-formed
        BIO; `decoding` is what `predict_labels` and the export use: "bio" (the default when
        `tag_labels` is given) or "viterbi" (the unconstrained best path).
        `label_embedding_dim` > 0 makes both heads label-aware (edp_nlu/models/label_aware_head.py:
        weights from the labels' names, which `set_label_embeddings` gives; needs tag_labels);
        `label_correction` adds each label a zero-started column of its own."""
        super().__init__(**kwargs)
        if num_intents < 1 or num_tags < 1:
            raise ValueError(
                f"num_intents and num_tags must be >= 1, got {num_intents}, {num_tags}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.encoder = encoder
        self.num_intents = int(num_intents)
        self.num_tags = int(num_tags)
        self.dropout_rate = float(dropout)
        self.intent_weight = float(intent_weight)
        self.tag_weight = float(tag_weight)
        if tag_reduction not in TAG_REDUCTIONS:
            raise ValueError(
                f"tag_reduction must be one of {TAG_REDUCTIONS}, got {tag_reduction!r}"
            )
        self.tag_reduction = tag_reduction
        self.tag_labels = None if tag_labels is None else tuple(str(t) for t in tag_labels)
        if self.tag_labels is not None and len(self.tag_labels) != num_tags:
            raise ValueError(f"tag_labels has {len(self.tag_labels)} labels for {num_tags} tags")
        self.label_embedding_dim = int(label_embedding_dim)
        self.label_correction = bool(label_correction)
        self.intent_dropout = keras.layers.Dropout(dropout, name="intent_dropout")
        self.tag_dropout = keras.layers.Dropout(dropout, name="tag_dropout")
        self.intent_head, self.tag_head = self._heads()
        self.decoding = decoding or ("viterbi" if tag_labels is None else "bio")
        _check_decoding(self.decoding, self.tag_labels)
        allowed = bio_transitions(self.tag_labels) if self.tag_labels else (None, None)
        self.crf = CRF(num_tags, *allowed, name="crf")
        # Build the heads now (one dummy example), so weights exist before the first fit / load.
        self(_dummy_inputs(encoder), training=False)

    def _heads(self) -> tuple:
        if not self.label_embedding_dim:
            return (keras.layers.Dense(self.num_intents, name="intent_logits"),
                    keras.layers.Dense(self.num_tags, name="tag_potentials"))
        if self.tag_labels is None:
            raise ValueError("label-aware heads (label_embedding_dim > 0) need tag_labels")
        return (LabelAwareHead(self.num_intents, self.label_embedding_dim,
                               correction=self.label_correction, name="intent_logits"),
                LabelAwareHead(self.num_tags, self.label_embedding_dim,
                               spans=[span_of(t) for t in self.tag_labels],
                               correction=self.label_correction, name="tag_potentials"))

    def set_label_embeddings(self, intent_matrix, tag_matrix) -> None:
        """Gives label-aware heads their labels' name vectors ([num_intents | num_tags,
        label_embedding_dim]; edp_nlu/models/label_names.py)."""
        if not self.label_embedding_dim:
            raise ValueError("set_label_embeddings: this model's heads are plain "
                             "(label_embedding_dim 0)")
        self.intent_head.set_label_embeddings(intent_matrix)
        self.tag_head.set_label_embeddings(tag_matrix)

    def call(self, inputs, training=None):
        # The encoder's own input order (nested dicts get key-sorted on the way, which Keras
        # warns about); keys it does not take are dropped.
        inputs = {name: inputs[name] for name in self.encoder.input}
        encoded = self.encoder(inputs, training=training)
        pooled = self.intent_dropout(encoded["pooled_output"], training=training)
        sequence = self.tag_dropout(encoded["sequence_output"], training=training)
        return {
            "intent_logits": self.intent_head(pooled),
            "tag_potentials": self.tag_head(sequence),
            "tag_mask": tf.cast(encoded["word_mask"], tf.bool),
        }

    def infer(self, inputs) -> dict:
        """`call` in inference mode with unrolled recurrent layers run as loops: the same weights
        and outputs, but a trace of one cell instead of one per position (the unrolling is for
        the per-example training step, which cannot vectorise a loop's gradient). For
        evaluation and serving only: never differentiate it per example."""
        with _rolled_recurrences(self):
            return self(inputs, training=False)

    def per_example_loss(self, y_true: dict, y_pred: dict) -> tf.Tensor:
        """Joint loss per example, shape [batch]; uses this model's CRF transitions."""
        return joint_per_example_loss(
            self.crf, y_true, y_pred, intent_weight=self.intent_weight, tag_weight=self.tag_weight,
            tag_reduction=self.tag_reduction)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        per_example = self.per_example_loss(y, y_pred)
        if sample_weight is None:
            weights = tf.ones_like(per_example)
        else:
            weights = tf.cast(tf.reshape(sample_weight, [-1]), per_example.dtype)
        loss = tf.reduce_sum(per_example * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
        # Keras' optimizer SUMs gradients over replicas; its Loss objects divide by the replica
        # count themselves, and so must a hand-written loss.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            loss = loss / replicas
        if self.losses:
            loss = loss + tf.add_n(self.losses)
        return loss

    def predict_labels(self, inputs, decoding: str | None = None) -> dict:
        """Inference: intent id and its probability, Viterbi tag ids (0 where no word), per
        utterance; `decoding` ("bio" / "viterbi") overrides the model's own."""
        decoding = decoding or self.decoding
        return self.predict_labels_by_decoding(inputs, (decoding,))[decoding]

    def decodings(self) -> tuple:
        """The decodings this model can run: "bio" needs its tag labels."""
        return tuple(d for d in DECODINGS if d != "bio" or self.tag_labels is not None)

    def predict_labels_by_decoding(self, inputs, decodings: Sequence[str]) -> dict:
        """{decoding: `predict_labels` with it} from one forward pass: evaluation compares the
        decodings of one model, and one trace serves them all."""
        for decoding in decodings:
            _check_decoding(decoding, self.tag_labels)
        outputs = self.infer(inputs)
        probabilities = tf.nn.softmax(tf.cast(outputs["intent_logits"], tf.float32), axis=-1)
        intent_ids = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        intent_probability = tf.gather(probabilities, intent_ids, batch_dims=1)
        labels = {}
        for decoding in decodings:
            tag_ids, _ = self.crf.decode(outputs["tag_potentials"], outputs["tag_mask"],
                                         constrained=decoding == "bio")
            labels[decoding] = {
                "intent_ids": intent_ids,
                "intent_probability": intent_probability,
                "tag_ids": tag_ids,
                "tag_mask": outputs["tag_mask"],
            }
        return labels

    def head_config(self) -> dict:
        """The constructor arguments of the heads (subclasses add their encoder's)."""
        return {"name": self.name, "num_intents": self.num_intents, "num_tags": self.num_tags,
                "dropout": self.dropout_rate, "intent_weight": self.intent_weight,
                "tag_weight": self.tag_weight, "tag_reduction": self.tag_reduction,
                "tag_labels": None if self.tag_labels is None else list(self.tag_labels),
                "decoding": self.decoding, "label_embedding_dim": self.label_embedding_dim,
                "label_correction": self.label_correction}


DECODINGS = ("bio", "viterbi")


@contextlib.contextmanager
def _rolled_recurrences(model: keras.Model):
    """Runs `model`'s unrolled recurrent layers as loops while the block lasts (a trace)."""
    unrolled = [layer for layer in model._flatten_layers()
                if isinstance(layer, keras.layers.RNN) and layer.unroll]
    for layer in unrolled:
        layer.unroll = False
    try:
        yield
    finally:
        for layer in unrolled:
            layer.unroll = True


def _check_decoding(decoding: str, tag_labels) -> None:
    if decoding not in DECODINGS:
        raise ValueError(f"decoding must be one of {DECODINGS}, got {decoding!r}")
    if decoding == "bio" and tag_labels is None:
        raise ValueError('decoding="bio" needs the tag labels (tag_labels=...)')


def _dummy_inputs(encoder: keras.Model) -> dict:
    """One all-padding example shaped like the encoder's (static) inputs."""
    inputs = encoder.input
    if not isinstance(inputs, dict):
        raise ValueError("the encoder must take a dict of named inputs")
    return {
        name: tf.zeros([1, *tensor.shape[1:]], dtype=tensor.dtype)
        for name, tensor in inputs.items()
    }
