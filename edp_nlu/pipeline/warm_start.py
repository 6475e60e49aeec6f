"""Public pretraining: start a run's backbone from another run's (`--config.init_from=RUN_DIR`).

Why: CLC's character CNN and BiLSTM start from random weights, and a private run has few, noisy
steps to train them (SNIPS, noise off: clipping and 150 large steps alone take CLC's test SER from
SGD's 0.118 to 0.179). A backbone first trained on a *public* corpus (another benchmark, the
built-in synthetic corpus) only has to be adapted. The intent and slot heads start fresh, so the
two corpora need not share labels (label-aware heads keep the source's shared projection
into the names' space where it serves any labels, GloVe's whole or the name words both schemas
use: `_copy_shared_label_heads`); they must share
the input vocabulary (CLC's public GloVe vocabulary, BERT's WordPiece), so a vocabulary built
from training text will not do.

Privacy: epsilon covers this run's training data. The starting weights are a function of every
corpus the source's weights depend on: for each run of the chain (the source, its own
`init_from` source, and so on), its training split and, if it projected its updates
(`public_subspace`), that public corpus. They add nothing to this run's epsilon *if those
corpora are public*; privacy.json's not-covered sentence names each of them, and for each run
whether it trained with differential privacy (its epsilon, from its privacy.json) or without.
`prepare` compares the utterances themselves with this run's training split (not paths, which
copies and relative paths defeat). A corpus that shares utterances with it is data this run holds
private: if a run of the chain used it without differential privacy (mechanism sgd, a
privacy.json whose `private` is false, a public subspace), or with a differential privacy whose
epsilon this run's does not include, this run is reported as not private (its artifacts'
`release_covered` is false: the weights themselves are outside the proof) and the sentence says
why. That comparison reads the training split: whether the run is reported private is one bit
about it that epsilon does not cover (it changes no weight, and only flags a source that should
not have been used).
Everything is read once, when the run starts: it is recorded in state.json, so a resumed run
neither reads nor needs the source.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re

import numpy as np
import tensorflow as tf

from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor
from edp_nlu.models.clc.word_vectors import WordVectors
from edp_nlu.pipeline import builders, checkpoints, public_subspace, run_files, run_spec
from edp_tf import accounting
from edp_tf import ledger as ledger_lib
from edp_tf.accounting import EpochRecord

MAX_CHAIN = 16  # sources of sources followed before giving up (a loop, or a broken chain)


@dataclasses.dataclass(frozen=True)
class Use:
    """One corpus a run of the chain used, how, and whether it holds this run's private data."""

    run_dir: str
    corpus: str  # which corpus and split
    what: str  # "trained on" or "projected its updates onto gradients of"
    how: str  # "with differential privacy (epsilon ...)" or "without differential privacy (...)"
    private: bool  # the use was differentially private
    shares: bool  # the corpus holds utterances of this run's training split

    def phrase(self) -> str:
        return f"{self.run_dir} {self.what} {self.corpus} {self.how}"


@dataclasses.dataclass(frozen=True)
class Source:
    """The run a backbone starts from: its directory, resolved spec and checkpoint, and every
    corpus its weights depend on (its own uses, then its sources', down the chain)."""

    run_dir: str
    spec: run_spec.RunSpec
    checkpoint: str
    uses: tuple

    def private_data_use(self) -> str:
        """Why the starting weights depend on this run's private data outside its epsilon
        ("" when they do not): the run is then not private."""
        shared = [u for u in self.uses if u.shares]
        if not shared:
            return ""
        items = [u.phrase() + ("" if not u.private else ", a release of this run's data that "
                               "this run's epsilon does not include (the two compose)")
                 for u in shared]
        return ("But this run's training split shares utterances with corpora of that chain: "
                + "; ".join(items) + ". The starting weights depend on this run's private data "
                "outside its epsilon, so the run is not private.")

    def not_covered_sentence(self) -> str:
        """What epsilon does not cover, for privacy.json."""
        sentence = (f"The starting weights (the backbone's, and label-aware heads' shared "
                    f"projection when both runs have them) come from the run {self.run_dir}, "
                    "and so from every corpus of its chain of runs: "
                    + "; ".join(u.phrase() for u in self.uses)
                    + ". Epsilon covers this run's training data only, and treats those corpora "
                    "as public.")
        why = self.private_data_use()
        return sentence + (" " + why if why else "")

    def facts(self) -> dict:
        """What the run records of its source (state.json), so that a resumed run keeps it."""
        return {"run_dir": self.run_dir, "not_covered": self.not_covered_sentence(),
                "private_data_use": self.private_data_use()}


def _bad(run_dir: str, why: str):
    raise ValueError(f"--config.init_from={run_dir!r}: {why}")


def _read_run(run_dir: str) -> tuple:
    """(resolved spec, latest checkpoint) of a finished edp_nlu.train run."""
    if not os.path.isdir(run_dir):
        _bad(run_dir, "no such run directory")
    for name in (run_files.CONFIG_FILE, "preprocessor.json"):
        if not os.path.isfile(os.path.join(run_dir, name)):
            _bad(run_dir, f"no {name}: not a run directory of edp_nlu.train")
    checkpoint = checkpoints.latest_prefix(run_dir)
    if checkpoint is None:
        _bad(run_dir, "no intact committed checkpoint in checkpoints/")
    return run_files.load_run_spec(run_dir, "--config.init_from"), checkpoint


def _training_corpus(data: run_spec.DataSpec) -> str:
    """The name of the training split a run's data part reads."""
    if data.data_dir:
        return f"the train split of {data.data_dir}"
    return (f"the train split of the built-in synthetic corpus (seed {data.data_seed}, "
            f"{data.synthetic_size} utterances)")


def _training_utterances(run_dir: str, data: run_spec.DataSpec) -> set:
    """The token sequences a run trained on (its corpus is read again, by its data part)."""
    try:
        train = builders.load_splits(data).train
    except (ValueError, OSError) as error:
        _bad(run_dir, f"cannot read the corpus it trained on ({data.data_dir or 'synthetic'}) "
             f"to compare it with this run's training split: {error}")
    return {tuple(u.tokens) for u in train}


def _how_trained(run_dir: str, privacy: run_spec.PrivacySpec) -> tuple:
    """(private, how): whether a run trained with differential privacy, and a phrase saying so
    with its epsilon (recomputed from its privacy.json, as edp-privacy does) or why not."""
    if not privacy.private:
        return False, "without differential privacy (mechanism 'sgd')"
    path = os.path.join(run_dir, ledger_lib.FILENAME)
    try:
        led = ledger_lib.read_ledger(path)
    except ValueError as error:
        return False, f"without a differential privacy it can show ({error})"
    if led.get("private") is not True:
        return False, ("without differential privacy (its privacy.json says \"private\": "
                       "false)")
    records = [EpochRecord.from_dict(e) for e in led["epochs"]]
    extras = accounting.as_extra_events(led.get("extra_events", []))
    epsilon = max(accounting.compute_epsilon(records, led["sampling_rate"], led["delta"],
                                             extras), float(led.get("epsilon", 0.0)))
    if not math.isfinite(epsilon):
        return False, "without differential privacy (its epsilon is infinite)"
    return True, (f"with differential privacy (epsilon {epsilon:.4g} at delta "
                  f"{led['delta']:.3g}, add/remove-one-{led.get('privacy_unit', 'example')})")


def _uses(run_dir: str, spec: run_spec.RunSpec, ours: set) -> list:
    """The corpora one run of the chain used, each compared with this run's training split."""
    private, how = _how_trained(run_dir, spec.privacy)
    uses = [Use(run_dir, _training_corpus(spec.data), "trained on", how, private,
                bool(ours & _training_utterances(run_dir, spec.data)))]
    if spec.privacy.public_subspace:
        try:
            utterances, name = public_subspace.corpus(spec.privacy)
        except ValueError as error:
            _bad(run_dir, f"cannot read its public subspace corpus to compare it with this run's "
                          f"training split: {error}")
        # the whole split it drew from: the subset it chose may have been drawn otherwise
        uses.append(Use(run_dir, name, "projected its updates onto gradients of",
                        "without differential privacy (it treated that corpus as public)", False,
                        bool(ours & {tuple(u.tokens) for u in utterances})))
    return uses


def prepare(model: run_spec.ModelSpec, train) -> Source:
    """The source of `model.init_from`, with every corpus of its chain compared with this run's
    training utterances `train`, and checked against the model; ValueError naming
    `--config.init_from` when it cannot serve."""
    run_dir = model.init_from
    source_spec, checkpoint = _read_run(run_dir)
    if source_spec.model.model != model.model:
        _bad(run_dir, f"that run trained a {source_spec.model.model} model, this run a "
                      f"{model.model} model")
    if source_spec.optimizer.ema_fraction > 0:
        _bad(run_dir, "that run averaged its weights (ema_fraction > 0; private runs of the "
                      "default and the CLC configs do), and its checkpoint holds the raw ones; "
                      "start from a run that did not (--config.private_ema_fraction=-1 "
                      "--config.ema_fraction=0)")
    ours = {tuple(u.tokens) for u in train}
    uses, link, spec = [], run_dir, source_spec
    for _ in range(MAX_CHAIN):
        uses += _uses(link, spec, ours)
        if not spec.model.init_from:
            return Source(run_dir, source_spec, checkpoint, tuple(uses))
        link = spec.model.init_from
        spec, _ = _read_run(link)
    _bad(run_dir, f"its chain of init_from runs is longer than {MAX_CHAIN} (a loop?)")


def run_preprocessor(run_dir: str, model: run_spec.ModelSpec):
    """A finished run's preprocessor, from its preprocessor.json."""
    saved = run_files.read_json(os.path.join(run_dir, "preprocessor.json"))
    if model.model == "clc":
        return CLCPreprocessor.from_config(saved)

    return BertPreprocessor.from_config(saved)


def trained_model(spec: run_spec.ModelSpec, preprocessor, checkpoint: str,
                  embedding_dim: int = 0):
    """A finished run's model, rebuilt from its model part and preprocessor with the weights of
    `checkpoint`; `embedding_dim` is its CLC word embedding width when it used word vectors."""
    model = builders.build_model(spec, preprocessor, shape_only_vectors(spec, embedding_dim),
                                 warn_unknown_names=False)
    as_built = _name_word_matrices(model)
    # read, not restore: the run's checkpoints are written without a save counter
    # (edp_nlu/pipeline/checkpoints.py), which restore would expect
    tf.train.Checkpoint(model=model).read(
        checkpoint).expect_partial().assert_existing_objects_matched()
    # Name-word heads map projection columns to words by the order this code derives from the
    # labels; a checkpoint whose names were derived otherwise (another version's word rules)
    # would have its columns copied under the wrong words.
    model.name_words_as_trained = as_built is None or all(
        np.array_equal(built, now) for built, now in zip(as_built, _name_word_matrices(model)))
    return model


def _name_word_matrices(model) -> list | None:
    """The name matrices of heads named by words (intent, tag), else None."""
    if getattr(model, "label_names_source", None) != "words":
        return None
    return [head.label_embeddings.numpy() for head in (model.intent_head, model.tag_head)]


def load_backbone(model, preprocessor, source: Source) -> int:
    """Copies the source run's trained backbone weights into `model.backbone` (the heads stay as
    built; this run's own LoRA factors too, B = 0: no update yet); returns the number copied."""
    def bad(why):
        _bad(source.run_dir, why)

    theirs = run_preprocessor(source.run_dir, source.spec.model)
    for field in ("word_vocabulary", "char_vocabulary", "vocabulary"):
        if getattr(theirs, field, None) != getattr(preprocessor, field, None):
            bad(f"its {field.replace('_', ' ')} differs from this run's, so its embedding rows "
                "mean other tokens")
    source_model = trained_model(source.spec.model, theirs, source.checkpoint,
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
    try:
        heads = _copy_shared_label_heads(model, source_model, source.spec.model)
    except ValueError as error:
        bad(str(error))
    return len(target_vars) + heads


def _copy_shared_label_heads(model, source_model, source_spec: run_spec.ModelSpec) -> int:
    """The label-aware heads' shared parts (the projection into the names' space, the B/I/O
    score) where both runs read label names in one space. Why: the projection is the same
    function whatever the labels are, so what a public corpus taught it moves this run's labels
    by their names; the per-label parts (the names, the bias, the correction columns) are this
    run's labels' and stay as built. The spaces that match:

    * CLC's public word vectors whole (label_head_dim at least their width, so no run's names
      were reduced by its own label set's SVD): the whole projection;
    * name words on both runs (label_aware_head.name_heads): the projection's column of each
      word both schemas' names use ("city", "name", "time"), the others start fresh.

    Returns the number of variables copied (a projection counts once however many columns)."""
    dim = int(getattr(model, "label_embedding_dim", 0) or 0)
    their_dim = int(getattr(source_model, "label_embedding_dim", 0) or 0)
    if not dim or not their_dim:
        return 0
    # a model that was never named (name_heads) says nothing of its space: nothing is copied
    sources = {getattr(m, "label_names_source", None) for m in (model, source_model)}
    if sources == {"words"}:
        # a column per word whatever the width: the heads may differ in label_head_dim
        if not getattr(source_model, "name_words_as_trained", True):
            raise ValueError("its heads' name words differ from the ones this version derives "
                             "from its labels, so their projection columns cannot be matched "
                             "by word; start from a run trained with this version, or without "
                             "label-aware heads")
        columns = [_shared_word_columns(ours, theirs) for ours, theirs in
                   zip(model.label_name_words, source_model.label_name_words)]
    else:
        words = int(getattr(model.backbone, "word_embedding_dim", 0) or 0)
        if (sources != {"vectors"} or source_spec.model != "clc" or not words or dim < words
                or their_dim != dim):
            return 0
        columns = [None, None]  # every column
    copied = 0
    for head, other, shared in ((model.intent_head, source_model.intent_head, columns[0]),
                                (model.tag_head, source_model.tag_head, columns[1])):
        if shared is None:
            head.projection.kernel.assign(other.projection.kernel)
        elif shared[0]:
            kernel = head.projection.kernel.numpy()
            kernel[:, shared[0]] = other.projection.kernel.numpy()[:, shared[1]]
            head.projection.kernel.assign(kernel)
        else:
            continue  # no word in common: nothing of this head carries over
        copied += 1
        if head.span_head is not None and other.span_head is not None:
            for variable, value in zip(head.span_head.weights, other.span_head.weights):
                variable.assign(value)
                copied += 1
    return copied


def _shared_word_columns(ours: list, theirs: list) -> tuple:
    """([our column], [their column]) of each name word both heads have."""
    where = {word: i for i, word in enumerate(theirs)}
    pairs = [(i, where[w]) for i, w in enumerate(ours) if w in where]
    return [i for i, _ in pairs], [j for _, j in pairs]


def shape_only_vectors(model: run_spec.ModelSpec, dim: int):
    """Stand-in word vectors that give a CLC built from `model` the embedding width `dim` (a
    checkpoint then fills every row), instead of reading its vectors file again."""
    if model.model != "clc" or not model.clc.word_vectors:
        return None

    return WordVectors(("",), np.zeros((1, dim), np.float32))


def _without_counters(path: str) -> str:
    """A variable path without Keras' per-process name counters ("bilstm_0/forward_lstm_1/...")."""
    return re.sub(r"_\d+(?=/|$)", "", path)
