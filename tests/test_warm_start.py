"""`--config.init_from`: a run's backbone starts from another run's
(trainers/pipeline/warm_start.py).

A tiny CLC source run trains on the synthetic corpus (seed 0); targets train on joint-format
directories: seed 1's corpus without any of the source's training utterances (a different
corpus), or seed 0's at another path (the same one, which must be refused). Both use one public
word-vector file, so that their vocabularies agree as the feature requires.
"""
import dataclasses
import os

import keras
import numpy as np
import pytest

from tests.tiny_runs import corpus, read, strategy, tiny_config, write_joint_dir
from trainers.pipeline import training, warm_start


def config_with(vectors, **overrides):
    config = tiny_config("clc", **overrides)
    config.clc.word_vectors = vectors
    config.clc.vocabulary_size = 5000
    return config


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Paths: the word vectors, the source run (synthetic, seed 0), the other corpus (seed 1
    without the source's training utterances) and the source's own corpus at another path."""
    root = tmp_path_factory.mktemp("warm")
    ours, other = corpus(tiny_config()), corpus(tiny_config(data_seed=1))
    words = sorted({w.lower() for s in (ours, other) for part in (s.train, s.dev, s.test)
                    for u in part for w in u.tokens})
    rng = np.random.default_rng(0)
    vectors = root / "public.vec"
    vectors.write_text("".join(f"{w} " + " ".join(f"{x:.3f}" for x in rng.normal(size=8)) + "\n"
                               for w in words))
    seen = {tuple(u.tokens) for u in ours.train}
    other = dataclasses.replace(other, train=[u for u in other.train
                                              if tuple(u.tokens) not in seen])
    assert len(other.train) > 50  # the synthetic corpora differ enough for a real run
    paths = dict(vectors=str(vectors),  # the generator's public labels: a private run stays so
                 other=write_joint_dir(root / "other", other, schema=True),
                 same=write_joint_dir(root / "same", ours, schema=True),
                 source=str(root / "source"))
    training.train(config_with(paths["vectors"], mechanism="sgd", replicas=1), paths["source"],
                   strategy=strategy(1), export=False)
    return paths


class _StartingWeights(keras.callbacks.Callback):
    """The model's weights when fit begins: (backbone, heads), each in the model's order."""

    def on_train_begin(self, logs=None):
        self.backbone, self.heads = _split(getattr(self.model, "wrapped_model", self.model))


def _split(model):
    backbone = {id(v) for v in model.backbone.weights}
    return ([v.numpy().copy() for v in model.backbone.weights],
            [v.numpy().copy() for v in model.weights if id(v) not in backbone])


def _source_weights(run_dir):
    """The source run's final (backbone, heads), rebuilt from its files (names differ between a
    process's models, so the tests compare in order, as load_backbone does)."""
    config, checkpoint = warm_start._read_run(run_dir)
    preprocessor = warm_start.run_preprocessor(run_dir, config)
    return _split(warm_start.trained_model(config, preprocessor, checkpoint, 8))


@pytest.fixture(scope="module")
def target_run(setup, tmp_path_factory):
    """(config, run_dir, starting weights) of a private run on the other corpus from the source."""
    config = config_with(setup["vectors"], mechanism="dpsgd", replicas=1,
                         init_from=setup["source"], data_dir=setup["other"])
    start = _StartingWeights()
    run_dir = str(tmp_path_factory.mktemp("target") / "run")
    training.train(config, run_dir, strategy=strategy(1), callbacks=[start], export=False)
    return config, run_dir, start


def test_private_run_starts_from_the_source_backbone_and_says_so(setup, target_run):
    """Every backbone variable starts equal to the source's trained one, the heads do not; the
    run stays private and its ledger names the source's corpus as outside epsilon."""
    _, run_dir, start = target_run
    backbone, heads = _source_weights(setup["source"])
    assert len(start.backbone) == len(backbone) >= 5  # embeddings, char conv, BiLSTM
    for ours, theirs in zip(start.backbone, backbone):
        np.testing.assert_array_equal(ours, theirs)
    assert len(start.heads) == len(heads) > 0
    assert any(not np.array_equal(ours, theirs)  # fresh heads, not the source's trained ones
               for ours, theirs in zip(start.heads, heads))
    privacy = read(run_dir, "privacy.json")
    assert privacy["private"] is True
    assert any(setup["source"] in s and "built-in synthetic corpus" in s
               and "treats those corpora as public" in s for s in privacy["not_covered"])


def test_resume_neither_reads_nor_needs_the_source(setup, target_run):
    """A resumed run restores its own checkpoint: it runs with the source gone, and its ledger
    keeps the sentence."""
    config, run_dir, _ = target_run
    moved = setup["source"] + ".away"
    os.rename(setup["source"], moved)
    try:
        training.train(config, run_dir, resume=True, strategy=strategy(1), export=False)
    finally:
        os.rename(moved, setup["source"])
    assert any("treats those corpora as public" in s
               for s in read(run_dir, "privacy.json")["not_covered"])


def test_a_source_trained_on_this_runs_utterances_is_refused(setup, tmp_path):
    """The same corpus at another path: its weights are a function of the private data."""
    for data_dir in (setup["same"], ""):  # a copy of the source's corpus; the corpus itself
        config = config_with(setup["vectors"], mechanism="dpsgd", replicas=1,
                             init_from=setup["source"], data_dir=data_dir)
        with pytest.raises(ValueError, match=r"init_from=.*that run trained on \d+ of this run's "
                                             "training utterances"):
            training.train(config, str(tmp_path / f"run{len(data_dir)}"), strategy=strategy(1),
                           export=False)


def test_a_chain_of_sources_is_checked_to_its_end(setup, target_run, tmp_path):
    """The target run started from the source: a run on the source's corpus may not start from
    it, since its weights depend on that corpus too."""
    _, target_dir, _ = target_run
    config = config_with(setup["vectors"], mechanism="dpsgd", replicas=1, init_from=target_dir,
                         data_dir=setup["same"])
    with pytest.raises(ValueError, match=r"its source .* trained on \d+ of this run's"):
        training.train(config, str(tmp_path / "run"), strategy=strategy(1), export=False)


@pytest.mark.parametrize("change, message", [
    (dict(lstm_units=16), r"shape \(.*\) there"),
    (dict(word_vectors=""), "word vocabulary differs"),
    (dict(model="bert"), "trained a clc model, this run a bert model"),
])
def test_a_source_that_does_not_fit_names_init_from(setup, tmp_path, change, message):
    config = config_with(setup["vectors"], mechanism="dpsgd", replicas=1,
                         init_from=setup["source"], data_dir=setup["other"])
    if "lstm_units" in change:
        config.clc.lstm_units = change["lstm_units"]
    if "word_vectors" in change:
        config.clc.word_vectors = change["word_vectors"]
    if "model" in change:
        config.model = change["model"]
    with pytest.raises(ValueError, match=r"--config.init_from=.*" + message):
        training.train(config, str(tmp_path / "run"), strategy=strategy(1), export=False)


def test_init_from_a_directory_that_is_not_a_run(tmp_path):
    config = tiny_config("clc", "dpsgd", replicas=1, init_from=str(tmp_path))
    with pytest.raises(ValueError, match=r"init_from=.*no config.json"):
        training.train(config, str(tmp_path / "run"), strategy=strategy(1), export=False)
