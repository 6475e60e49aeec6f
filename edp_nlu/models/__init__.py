"""NLU models for edp-tf: CRF, CLC and compact BERT joint intent + slot models, serving export.

Exports resolve lazily, so `import edp_nlu.models.crf` does not pull in keras-hub.
"""

_EXPORTS = {
    "CRF": "edp_nlu.models.crf",
    "JointTagger": "edp_nlu.models.joint_task",
    "joint_per_example_loss": "edp_nlu.models.joint_loss",
    "LabelAwareHead": "edp_nlu.models.label_aware_head",
    "name_heads": "edp_nlu.models.label_aware_head",
    "LabelVocabulary": "edp_nlu.models.labels",
    "EncodingReport": "edp_nlu.models.labels",
    "CLCBackbone": "edp_nlu.models.clc.clc_backbone",
    "CLCPreprocessor": "edp_nlu.models.clc.clc_preprocessor",
    "CLCJoint": "edp_nlu.models.clc.clc_joint",
    "WordVectors": "edp_nlu.models.clc.word_vectors",
    "load_word_vectors": "edp_nlu.models.clc.word_vectors",
    "GLOVE_6B_50D": "edp_nlu.models.clc.word_vectors",
    "BertWordEncoder": "edp_nlu.models.bert.bert_backbone",
    "BertPreprocessor": "edp_nlu.models.bert.bert_preprocessor",
    "BertJoint": "edp_nlu.models.bert.bert_joint",
    "export_serving_model": "edp_nlu.models.export",
    "serving_function": "edp_nlu.models.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'edp_nlu.models' has no attribute {name!r}")
