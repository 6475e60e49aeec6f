"""CLC joint model: `CLCBackbone` + intent head + CRF NER head (see
edp_nlu/models/joint_task.py)."""

from __future__ import annotations

import keras

from edp_nlu.models.clc.clc_backbone import CLCBackbone
from edp_nlu.models.clc.clc_preprocessor import RESERVED, CLCPreprocessor
from edp_nlu.models.clc.word_vectors import WordVectors, embedding_matrix
from edp_nlu.models.joint_task import JointTagger


@keras.saving.register_keras_serializable(package="edp_models")
class CLCJoint(JointTagger):
    """Joint intent + slot model on a CLC backbone; train it with `per_example_loss`."""

    def __init__(self, backbone: CLCBackbone, num_intents: int, num_tags: int, **kwargs):
        super().__init__(backbone, num_intents, num_tags, **kwargs)
        self.backbone = backbone

    @classmethod
    def from_preprocessor(
        cls,
        preprocessor: CLCPreprocessor,
        word_vectors: WordVectors | None = None,
        head_dropout: float = 0.1,
        seed: int | None = None,
        intent_weight: float = 1.0,
        tag_weight: float = 1.0,
        tag_reduction: str = "sum",
        decoding: str = "bio",
        label_embedding_dim: int = 0,
        label_correction: bool = False,
        **backbone_kwargs,
    ) -> "CLCJoint":
        """Sizes the model for `preprocessor`; `word_vectors` initialises the word embeddings.

        `seed` only seeds the random rows given to words missing from `word_vectors`.
        """
        if word_vectors is not None:
            matrix, _ = embedding_matrix(preprocessor.word_vocabulary, word_vectors, RESERVED, seed)
            backbone_kwargs["word_embeddings"] = matrix
        backbone = CLCBackbone(
            word_vocabulary_size=len(preprocessor.word_vocabulary),
            char_vocabulary_size=len(preprocessor.char_vocabulary),
            max_words=preprocessor.max_words,
            max_word_length=preprocessor.max_word_length,
            **backbone_kwargs,
        )
        return cls(
            backbone,
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
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            **self.head_config(),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)
