"""NLU models for edp-tf: CRF, CLC and compact BERT joint intent + slot models, serving export.

Exports resolve lazily, so `import models.crf` does not pull in keras-hub.
"""

_EXPORTS = {
    "CRF": "models.crf",
    "JointTagger": "models.joint_task",
    "joint_per_example_loss": "models.joint_loss",
    "LabelVocabulary": "models.labels",
    "EncodingReport": "models.labels",
    "CLCBackbone": "models.clc.clc_backbone",
    "CLCPreprocessor": "models.clc.clc_preprocessor",
    "CLCJoint": "models.clc.clc_joint",
    "WordVectors": "models.clc.word_vectors",
    "load_word_vectors": "models.clc.word_vectors",
    "GLOVE_6B_50D": "models.clc.word_vectors",
    "BertWordEncoder": "models.bert.bert_backbone",
    "BertPreprocessor": "models.bert.bert_preprocessor",
    "BertJoint": "models.bert.bert_joint",
    "export_serving_model": "models.export",
    "serving_function": "models.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
