"""Public pretraining: start a run's backbone from another run's (`--config.init_from=RUN_DIR`).

Why: CLC's character CNN and BiLSTM start from random weights, and a private run has few, noisy
steps to train them (SNIPS, noise off: clipping and 150 large steps alone take CLC's test SER from
SGD's 0.118 to 0.179). A backbone first trained on a *public* corpus (another benchmark, the
built-in synthetic corpus) only has to be adapted. The intent and slot heads start fresh, so the
two corpora need not share labels.

Privacy: epsilon covers this run's training data. The starting weights are a function of the
source run's corpus only, so they add nothing to this run's epsilon *if that corpus is public*;
the run's privacy.json says so in its not-covered list. A source run trained on this run's own
corpus would be a second, unaccounted use of the private data: `check_source` refuses it.
"""
from __future__ import annotations

import os
import re

import ml_collections
import tensorflow as tf

from trainers import rundir


def source_config(run_dir: str) -> ml_collections.ConfigDict:
    """The source run's resolved config; ValueError naming `--config.init_from` when `run_dir`
    is not a finished run with a checkpoint."""
    def bad(why):
        raise ValueError(f"--config.init_from={run_dir!r}: {why}")

    if not os.path.isdir(run_dir):
        bad("no such run directory")
    for name in (rundir.CONFIG_FILE, "preprocessor.json"):
        if not os.path.isfile(os.path.join(run_dir, name)):
            bad(f"no {name}: not a run directory of trainers.train")
    if tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints")) is None:
        bad("no checkpoint in checkpoints/")
    return rundir.load_run_config(run_dir)


def same_corpus(config, source) -> bool:
    """True when both configs name the same corpus: the same directory (or CSV), or both the
    built-in synthetic corpus (which tests and audits use as the private data, with canaries)."""
    if not config.data_dir or not source.data_dir:
        return not config.data_dir and not source.data_dir
    return os.path.realpath(config.data_dir) == os.path.realpath(source.data_dir)


def check_source(config, source, run_dir: str) -> None:
    """ValueError when `source` cannot initialise `config`'s model, or would use its data."""
    def bad(why):
        raise ValueError(f"--config.init_from={run_dir!r}: {why}")

    if same_corpus(config, source):
        bad(f"that run trained on this run's corpus ({config.data_dir or 'synthetic'}); its "
            "weights are not public, and epsilon would not count that use of the data. "
            "Start from a run on a public corpus.")
    if source.model != config.model:
        bad(f"that run trained a {source.model} model, this run a {config.model} model")


def sentence(run_dir: str, source) -> str:
    """What epsilon does not cover, for privacy.json."""
    return (f"The backbone's starting weights come from the run {run_dir}, trained on "
            f"{source.data_dir or 'the built-in synthetic corpus'}: epsilon covers this run's "
            "training data only, and treats that corpus as public.")


def load_backbone(model, preprocessor, run_dir: str, source) -> int:
    """Copies the source run's trained backbone weights into `model.backbone` (the heads stay as
    built); returns the number of variables copied. The two runs must share the backbone's
    architecture and input vocabularies (CLC's public GloVe vocabulary, BERT's WordPiece)."""
    from trainers import builders

    def bad(why):
        raise ValueError(f"--config.init_from={run_dir!r}: {why}")

    theirs = _preprocessor(source, rundir.read_json(os.path.join(run_dir, "preprocessor.json")))
    for field in ("word_vocabulary", "char_vocabulary", "vocabulary"):
        if getattr(theirs, field, None) != getattr(preprocessor, field, None):
            bad(f"its {field.replace('_', ' ')} differs from this run's, so its embedding rows "
                "mean other tokens")
    source_model = builders.build_model(source, theirs)
    checkpoint = tf.train.Checkpoint(model=source_model)
    checkpoint.restore(tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints"))
                       ).expect_partial()
    theirs_weights = [v for v in source_model.backbone.weights if "lora" not in v.path]
    if len(theirs_weights) != len(source_model.backbone.weights):
        bad("it trained LoRA factors, whose update this copy would drop; start from a run with "
            "bert.finetune='all' or 'no_embeddings'")
    ours = [v for v in model.backbone.weights if "lora" not in v.path]  # own factors: as built
    if len(ours) != len(theirs_weights):
        bad(f"its backbone has {len(theirs_weights)} variables, this run's {len(ours)}: the "
            "backbones differ (compare its config.json)")
    copied = 0
    # In order: Keras numbers the names of a process's second model ("forward_lstm_1"), so
    # names are compared without those counters.
    for variable, other in zip(ours, theirs_weights):
        if _layer_path(variable.path) != _layer_path(other.path):
            bad(f"its variable {other.path} stands where this run has {variable.path}: the "
                "backbones differ (compare its config.json)")
        if tuple(other.shape) != tuple(variable.shape):
            bad(f"{variable.path} has shape {tuple(other.shape)} there, {tuple(variable.shape)} "
                "here: the backbones differ (compare its config.json)")
        variable.assign(other)
        copied += 1
    return copied


def _layer_path(path: str) -> str:
    return re.sub(r"_\d+(?=/|$)", "", path)


def _preprocessor(config, preprocessor_config: dict):
    if config.model == "clc":
        from models.clc.clc_preprocessor import CLCPreprocessor

        return CLCPreprocessor.from_config(preprocessor_config)
    from models.bert.bert_preprocessor import BertPreprocessor

    return BertPreprocessor.from_config(preprocessor_config)
