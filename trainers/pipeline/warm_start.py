"""Public pretraining: start a run's backbone from another run's (`--config.init_from=RUN_DIR`).

Why: CLC's character CNN and BiLSTM start from random weights, and a private run has few, noisy
steps to train them (SNIPS, noise off: clipping and 150 large steps alone take CLC's test SER from
SGD's 0.118 to 0.179). A backbone first trained on a *public* corpus (another benchmark, the
built-in synthetic corpus) only has to be adapted. The intent and slot heads start fresh, so the
two corpora need not share labels; they must share the input vocabulary (CLC's public GloVe
vocabulary, BERT's WordPiece), so a vocabulary built from training text will not do.

Privacy: epsilon covers this run's training data. The starting weights are a function of the
source run's corpus (and of its own sources', down the chain), so they add nothing to this run's
epsilon *if those corpora are public*; privacy.json says so in its not-covered list. A source
whose training set shares an utterance with this run's would be an unaccounted use of the private
data: `prepare` compares the utterances themselves (not paths, which copies and relative paths
defeat) and refuses it. Everything is read once, when the run starts: a resumed run restores its
own checkpoint and its ledger already holds the sentence.
"""
from __future__ import annotations

import dataclasses
import os
import re

import ml_collections
import numpy as np
import tensorflow as tf

from trainers.pipeline import checkpoints, run_files

MAX_CHAIN = 16  # sources of sources followed before giving up (a loop, or a broken chain)


@dataclasses.dataclass(frozen=True)
class Source:
    """The run a backbone starts from: its directory, resolved config and checkpoint, and every
    corpus its weights depend on (its own, then its sources')."""

    run_dir: str
    config: ml_collections.ConfigDict
    checkpoint: str
    corpora: tuple

    def not_covered_sentence(self) -> str:
        """What epsilon does not cover, for privacy.json."""
        return (f"The backbone's starting weights come from the run {self.run_dir}, trained on "
                f"{' and '.join(self.corpora)}: epsilon covers this run's training data only, "
                "and treats those corpora as public.")


def _bad(run_dir: str, why: str):
    raise ValueError(f"--config.init_from={run_dir!r}: {why}")


def _read_run(run_dir: str):
    """(resolved config, latest checkpoint) of a finished trainers.train run."""
    if not os.path.isdir(run_dir):
        _bad(run_dir, "no such run directory")
    for name in (run_files.CONFIG_FILE, "preprocessor.json"):
        if not os.path.isfile(os.path.join(run_dir, name)):
            _bad(run_dir, f"no {name}: not a run directory of trainers.train")
    checkpoint = checkpoints.latest_prefix(run_dir)
    if checkpoint is None:
        _bad(run_dir, "no intact committed checkpoint in checkpoints/")
    return run_files.load_run_config(run_dir), checkpoint


def _training_utterances(run_dir: str, config) -> set:
    """The token sequences a run trained on (its corpus is read again, by its config)."""
    from trainers.pipeline import builders

    try:
        train = builders.load_splits(config).train
    except (ValueError, OSError) as error:
        _bad(run_dir, f"cannot read the corpus it trained on ({config.data_dir or 'synthetic'}) "
             f"to check that it shares no utterance with this run's: {error}")
    return {tuple(u.tokens) for u in train}


def prepare(config, train) -> Source:
    """The source of `config.init_from`, checked against this run's training utterances `train`
    and the model; ValueError naming `--config.init_from` when it cannot serve."""
    run_dir = config.init_from
    source_config, checkpoint = _read_run(run_dir)
    if source_config.model != config.model:
        _bad(run_dir, f"that run trained a {source_config.model} model, this run a "
                      f"{config.model} model")
    if source_config.get("ema_fraction", 0.0) > 0:
        _bad(run_dir, "that run averaged its weights (ema_fraction > 0), and its checkpoint "
                      "holds the raw ones; start from a run without ema_fraction")
    ours = {tuple(u.tokens) for u in train}
    corpora, link, cfg = [], run_dir, source_config
    for _ in range(MAX_CHAIN):
        shared = len(ours & _training_utterances(link, cfg))
        if shared:
            _bad(run_dir, f"{'that run' if link == run_dir else f'its source {link}'} trained on "
                          f"{shared} of this run's training utterances; its weights are not "
                          "public, and epsilon would not count that use of the data. Start from "
                          "a run on a public corpus.")
        corpora.append(cfg.data_dir or "the built-in synthetic corpus")
        if not cfg.get("init_from"):
            return Source(run_dir, source_config, checkpoint, tuple(corpora))
        link = cfg.init_from
        cfg, _ = _read_run(link)
    _bad(run_dir, f"its chain of init_from runs is longer than {MAX_CHAIN} (a loop?)")


def run_preprocessor(run_dir: str, config):
    """A finished run's preprocessor, from its preprocessor.json."""
    saved = run_files.read_json(os.path.join(run_dir, "preprocessor.json"))
    if config.model == "clc":
        from models.clc.clc_preprocessor import CLCPreprocessor

        return CLCPreprocessor.from_config(saved)
    from models.bert.bert_preprocessor import BertPreprocessor

    return BertPreprocessor.from_config(saved)


def trained_model(config, preprocessor, checkpoint: str, embedding_dim: int = 0):
    """A finished run's model, rebuilt from its config and preprocessor with the weights of
    `checkpoint`; `embedding_dim` is its CLC word embedding width when it used word vectors."""
    from trainers.pipeline import builders

    model = builders.build_model(config, preprocessor, shape_only_vectors(config, embedding_dim))
    # read, not restore: the run's checkpoints are written without a save counter
    # (trainers/pipeline/checkpoints.py), which restore would expect
    tf.train.Checkpoint(model=model).read(
        checkpoint).expect_partial().assert_existing_objects_matched()
    return model


def load_backbone(model, preprocessor, source: Source) -> int:
    """Copies the source run's trained backbone weights into `model.backbone` (the heads stay as
    built; this run's own LoRA factors too, B = 0: no update yet); returns the number copied."""
    def bad(why):
        _bad(source.run_dir, why)

    theirs = run_preprocessor(source.run_dir, source.config)
    for field in ("word_vocabulary", "char_vocabulary", "vocabulary"):
        if getattr(theirs, field, None) != getattr(preprocessor, field, None):
            bad(f"its {field.replace('_', ' ')} differs from this run's, so its embedding rows "
                "mean other tokens")
    source_model = trained_model(source.config, theirs, source.checkpoint,
                                 int(getattr(model.backbone, "word_embedding_dim", 0)))
    source_vars = [v for v in source_model.backbone.weights if "lora" not in v.path]
    if len(source_vars) != len(source_model.backbone.weights):
        bad("it trained LoRA factors, whose update this copy would drop; start from a run with "
            "bert.finetune='all' or 'no_embeddings'")
    target_vars = [v for v in model.backbone.weights if "lora" not in v.path]
    if len(target_vars) != len(source_vars):
        bad(f"its backbone has {len(source_vars)} variables, this run's {len(target_vars)}: the "
            "backbones differ (compare its config.json)")
    # In order (both backbones are built by the same code from configs whose shapes are checked
    # below): Keras numbers the names of a process's second model ("forward_lstm_1"), so names
    # are compared without those counters.
    for variable, other in zip(target_vars, source_vars):
        if _without_counters(variable.path) != _without_counters(other.path):
            bad(f"its variable {other.path} stands where this run has {variable.path}: the "
                "backbones differ (compare its config.json)")
        if tuple(other.shape) != tuple(variable.shape):
            bad(f"{variable.path} has shape {tuple(other.shape)} there, {tuple(variable.shape)} "
                "here: the backbones differ (compare its config.json)")
        variable.assign(other)
    return len(target_vars)


def shape_only_vectors(config, dim: int):
    """Stand-in word vectors that give a CLC built from `config` the embedding width `dim` (a
    checkpoint then fills every row), instead of reading its vectors file again."""
    if config.model != "clc" or not config.clc.word_vectors:
        return None
    from models.clc.word_vectors import WordVectors

    return WordVectors(("",), np.zeros((1, dim), np.float32))


def _without_counters(path: str) -> str:
    """A variable path without Keras' per-process name counters ("bilstm_0/forward_lstm_1/...")."""
    return re.sub(r"_\d+(?=/|$)", "", path)
