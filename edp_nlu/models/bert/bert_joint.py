"""BERT joint model: intent head on the utterance's state (BERT's pooled [CLS], or the mean of its
pieces), CRF NER head on each word's first piece."""

from __future__ import annotations

import keras
import tensorflow as tf

from edp_nlu.models.bert.bert_backbone import BertWordEncoder, build_bert_backbone
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.joint_task import JointTagger
from edp_tf import padding


@keras.saving.register_keras_serializable(package="edp_models")
class BertJoint(JointTagger):
    """Joint intent + slot model on a word-level BERT encoder; train it with `per_example_loss`."""

    # the inputs over word pieces, which a private step cuts to a chunk's longest row
    PIECE_INPUTS = ("token_ids", "segment_ids", "padding_mask")

    def __init__(self, encoder: BertWordEncoder, num_intents: int, num_tags: int, **kwargs):
        super().__init__(encoder, num_intents, num_tags, **kwargs)
        # an execution choice, not structure (not saved): False runs the padded step, whose
        # time does not depend on the data (edp_tf/padding.py)
        self.cuts_padding = True

    def padding_lengths(self, x):
        """The word pieces each row uses ([CLS] and [SEP] included), so that a private step runs
        each chunk over its longest row's pieces only (edp_tf/padding.py). Exact: padded pieces
        are masked out of attention and no word's first piece is one, and every output is per
        word or per utterance."""
        return tf.reduce_sum(tf.cast(x["padding_mask"], tf.int32), axis=1)

    def train_step(self, data):
        """Keras' plain step on the batch cut to its longest row's pieces, as a private step
        cuts its chunks: plain training, which private runs are measured against, gets the
        same saving."""
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        return super().train_step(keras.utils.pack_x_y_sample_weight(padding.cut(self, x), y, w))

    def cut_padding(self, x, length):
        """`x` with its piece inputs cut to `length` pieces. Their static length is dropped:
        the encoder declares `sequence_length` pieces and accepts an unknown length, not a
        shorter known one."""
        return {name: (tf.compat.v1.placeholder_with_default(t[:, :length], [t.shape[0], None])
                       if name in self.PIECE_INPUTS else t) for name, t in x.items()}

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
