"""BERT joint model: intent head on the utterance's state (BERT's pooled [CLS], or the mean of its
pieces), CRF NER head on each word's first piece."""

from __future__ import annotations

import keras

from edp_nlu.models.bert.bert_backbone import BertWordEncoder, build_bert_backbone
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.joint_task import JointTagger


@keras.saving.register_keras_serializable(package="edp_models")
class BertJoint(JointTagger):
    """Joint intent + slot model on a word-level BERT encoder; train it with `per_example_loss`."""

    def __init__(self, encoder: BertWordEncoder, num_intents: int, num_tags: int, **kwargs):
        super().__init__(encoder, num_intents, num_tags, **kwargs)

    @property
    def backbone(self):
        return self.encoder.backbone

    @classmethod
    def from_preprocessor(
        cls,
        preprocessor: BertPreprocessor,
        checkpoint: str | None = None,
        dropout: float = 0.1,
        head_dropout: float = 0.1,
        intent_weight: float = 1.0,
        tag_weight: float = 1.0,
        tag_reduction: str = "sum",
        decoding: str = "bio",
        label_embedding_dim: int = 0,
        label_correction: bool = False,
        pooling: str = "cls",
        **size,
    ) -> "BertJoint":
        """Random-init compact BERT sized for `preprocessor`, or `checkpoint` (a local directory).

        A random-init model gets only `sequence_length` position embeddings: fewer parameters,
        hence less noise to add under DP.
        """
        backbone = build_bert_backbone(
            vocabulary_size=len(preprocessor.vocabulary),
            max_sequence_length=preprocessor.sequence_length,
            checkpoint=checkpoint,
            dropout=dropout,
            **size,
        )
        encoder = BertWordEncoder(backbone, preprocessor.sequence_length, preprocessor.max_words,
                                  pooling=pooling)
        return cls(
            encoder,
            num_intents=len(preprocessor.intent_vocabulary),
            num_tags=len(preprocessor.tag_vocabulary),
            dropout=head_dropout,
            intent_weight=intent_weight,
            tag_weight=tag_weight,
            tag_reduction=tag_reduction,
            tag_labels=preprocessor.tag_vocabulary.labels,
            decoding=decoding,
            label_embedding_dim=label_embedding_dim,
            label_correction=label_correction,
        )

    def get_config(self):
        return {"encoder": keras.saving.serialize_keras_object(self.encoder), **self.head_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        return cls(**config)
