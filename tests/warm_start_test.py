"""`--config.init_from`: a run's backbone starts from another run's
(edp_nlu/pipeline/warm_start.py).

A tiny CLC source run trains without DP on the synthetic corpus (seed 0); targets train on
joint-format directories: seed 1's corpus without any of the source's training utterances (a
different corpus), or seed 0's at another path (the same one: the run is then not private). A
third corpus (seed 2, sharing no utterance with the other two) lets a chain of private runs use
seed 1's corpus only as a public subspace. All use one public word-vector file, so that their
vocabularies agree as the feature requires.
"""
import dataclasses
import json
import os
import re
import shutil
from types import SimpleNamespace

import keras
import numpy as np
import pytest

from edp_nlu.models import label_names, testing
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor
from edp_nlu.models.clc.word_vectors import WordVectors
from edp_nlu.models.label_aware_head import name_heads
from edp_nlu.pipeline import public_start, run_files, training, warm_start
from edp_nlu.pipeline.run_spec import RunSpec
from tests.tiny_runs import corpus, read, strategy, tiny_config, write_joint_dir


def config_with(vectors, **overrides):
    config = tiny_config("clc", **overrides)
    config.clc.word_vectors = vectors
    config.clc.vocabulary_size = 5000
    return config


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Paths: the word vectors, the source run (synthetic, seed 0), the other corpus (seed 1
    without the source's training utterances), the source's own corpus at another path and a
    third corpus (seed 2 without the training utterances of the other two)."""
    root = tmp_path_factory.mktemp("warm")
    ours, other = corpus(tiny_config()), corpus(tiny_config(data_seed=1))
    third = corpus(tiny_config(data_seed=2))
    words = sorted({w.lower() for s in (ours, other, third) for part in (s.train, s.dev, s.test)
                    for u in part for w in u.tokens})
    rng = np.random.default_rng(0)
    vectors = root / "public.vec"
    vectors.write_text("".join(f"{w} " + " ".join(f"{x:.3f}" for x in rng.normal(size=8)) + "\n"
                               for w in words))
    seen = {tuple(u.tokens) for u in ours.train}
    other = dataclasses.replace(other, train=[u for u in other.train
                                              if tuple(u.tokens) not in seen])
    assert len(other.train) > 50  # the synthetic corpora differ enough for a real run
    seen |= {tuple(u.tokens) for u in other.train}
    third = dataclasses.replace(third, train=[u for u in third.train
                                              if tuple(u.tokens) not in seen])
    assert len(third.train) > 50
    paths = dict(vectors=str(vectors),  # the generator's public labels: a private run stays so
                 other=write_joint_dir(root / "other", other, schema=True),
                 same=write_joint_dir(root / "same", ours, schema=True),
                 third=write_joint_dir(root / "third", third, schema=True),
                 source=str(root / "source"),
                 # each joint directory's training split, as a run on it loads it
                 train={"same": ours.train, "other": other.train, "third": third.train})
    training.train(config_with(paths["vectors"], mechanism="sgd", replicas=1), paths["source"],
                   strategy=strategy(1), export=False)
    return paths


class _StartingWeights(keras.callbacks.Callback):
    """The model's weights when fit begins: (backbone, heads), each in the model's order."""

    def on_train_begin(self, logs=None):
        self.model_seen = getattr(self.model, "wrapped_model", self.model)
        self.backbone, self.heads = _split(self.model_seen)


def _split(model):
    backbone = {id(v) for v in model.backbone.weights}
    return ([v.numpy().copy() for v in model.backbone.weights],
            [v.numpy().copy() for v in model.weights if id(v) not in backbone])


def _source_weights(run_dir):
    """The source run's final (backbone, heads), rebuilt from its files (names differ between a
    process's models, so the tests compare in order, as load_backbone does)."""
    spec, checkpoint = warm_start._read_run(run_dir)
    preprocessor = warm_start.run_preprocessor(run_dir, spec.model)
    return _split(warm_start.trained_model(spec.model, preprocessor, checkpoint, 8))


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
    assert privacy["artifacts"]["release_covered"] is True
    assert any(f"{setup['source']} trained on the train split of the built-in synthetic corpus "
               "(seed 0, 240 utterances) without differential privacy (mechanism 'sgd')" in s
               and "treats those corpora as public" in s and "shares utterances" not in s
               for s in privacy["not_covered"]), privacy["not_covered"]


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


def _warm_start_sentence(privacy):
    found = [s for s in privacy["not_covered"] if s.startswith("The starting weights")]
    assert len(found) == 1, privacy["not_covered"]
    return found[0]


def _assert_not_private(run_dir, summary):
    """The run is reported as not private, and no file computed from its weights is covered."""
    privacy = read(run_dir, "privacy.json")
    assert summary["private"] is False and privacy["private"] is False
    assert privacy["artifacts"]["release_covered"] is False
    assert not any(f.startswith(("checkpoints/", "saved_model/", "metrics.json: test"))
                   for f in privacy["artifacts"]["covered"]), privacy["artifacts"]["covered"]
    sentence = _warm_start_sentence(privacy)
    assert "The starting weights depend on this run's private data outside its epsilon, so the " \
           "run is not private." in sentence
    return sentence


def test_a_source_trained_without_dp_on_this_runs_data_makes_the_run_not_private(setup,
                                                                                  tmp_path):
    """The same corpus at another path: the source's weights are a function of the private data,
    used without noise, so the proof does not cover this run's weights; a resumed run (without
    the source) still says so."""
    config = config_with(setup["vectors"], mechanism="dpsgd", replicas=1,
                         init_from=setup["source"], data_dir=setup["same"])
    run_dir = str(tmp_path / "run")
    sentence = _assert_not_private(
        run_dir, training.train(config, run_dir, strategy=strategy(1), export=False))
    assert (f"shares utterances with corpora of that chain: {setup['source']} trained on the "
            "train split of the built-in synthetic corpus (seed 0, 240 utterances) without "
            "differential privacy (mechanism 'sgd')") in sentence, sentence
    moved = setup["source"] + ".away"
    os.rename(setup["source"], moved)
    try:
        resumed = run_files.load_run_config(run_dir)
        resumed.epochs = 2  # an extended run: the ledger writes its statement again
        summary = training.train(resumed, run_dir, resume=True, strategy=strategy(1),
                                 export=False)
    finally:
        os.rename(moved, setup["source"])
    assert len(read(run_dir, "privacy.json")["epochs"]) == 2
    assert _assert_not_private(run_dir, summary) == sentence


def _decided(setup, init_from, data):
    """What a private run on corpus `data` starting from `init_from` states about its source,
    decided before training (warm_start.prepare); that the decision makes privacy.json say
    "private": false, with nothing of the weights covered, is the end-to-end test above's."""
    config = config_with(setup["vectors"], mechanism="dpsgd", replicas=1, init_from=init_from,
                         data_dir=setup[data])
    source = warm_start.prepare(RunSpec.parse(config).model, setup["train"][data])
    assert source.private_data_use(), "the run would be reported private"
    return source.not_covered_sentence()


def _epsilon_stated_for(sentence, run_dir):
    match = re.search(re.escape(run_dir) + r" trained on .*? with differential privacy "
                      r"\(epsilon ([0-9.e+-]+) at delta", sentence)
    assert match, sentence
    return float(match.group(1))


def test_a_chain_of_sources_is_followed_to_its_end(setup, target_run):
    """The target run (DP) started from the source (SGD on seed 0's corpus): a run on that corpus
    starting from the target depends on its private data through the source, two links down.
    The sentence states the DP link's own epsilon."""
    _, target_dir, _ = target_run
    sentence = _decided(setup, target_dir, "same")
    target_epsilon = read(target_dir, "privacy.json")["epsilon"]
    assert 0 < target_epsilon < float("inf")
    assert _epsilon_stated_for(sentence, target_dir) == pytest.approx(target_epsilon, rel=1e-3)
    assert f"{setup['source']} trained on the train split of the built-in synthetic corpus" \
           in sentence.split("But this run's training split")[1], sentence


def test_a_dp_source_on_this_runs_data_is_a_release_this_epsilon_does_not_include(
        setup, target_run):
    """The target run trained with DP on the other corpus: a run on that corpus starting from it
    has spent the target's epsilon on the same data too, which its own epsilon does not count."""
    _, target_dir, _ = target_run
    sentence = _decided(setup, target_dir, "other")
    shared = sentence.split("But this run's training split")[1]
    assert f"{target_dir} trained on the train split of {setup['other']} with differential " \
           "privacy (epsilon" in shared, sentence
    assert "a release of this run's data that this run's epsilon does not include" in shared
    assert setup["source"] not in shared  # its corpus shares nothing with this run's


@pytest.fixture(scope="module")
def subspace_chain(setup, tmp_path_factory):
    """Run directories (A, B) of a private chain: A trains on seed 0's corpus with its updates
    projected onto gradients of the other corpus; B trains on the third corpus from A."""
    root = tmp_path_factory.mktemp("subspace_chain")
    first, second = str(root / "a"), str(root / "b")
    training.train(config_with(setup["vectors"], mechanism="dpsgd", replicas=1,
                               public_subspace=setup["other"], public_subspace_examples=48,
                               public_subspace_rank=8, public_subspace_every=2),
                   first, strategy=strategy(1), export=False)
    summary = training.train(config_with(setup["vectors"], mechanism="dpsgd", replicas=1,
                                         init_from=first, data_dir=setup["third"]),
                             second, strategy=strategy(1), export=False)
    assert summary["private"]  # B's corpus is in no corpus of A's
    return first, second


def test_a_public_subspace_corpus_down_the_chain_is_followed(setup, subspace_chain):
    """A run on the other corpus starting from B: B's weights depend on A's, and A projected its
    updates onto gradients of this run's training split, used without noise."""
    first, second = subspace_chain
    sentence = _decided(setup, second, "other")
    head, shared = sentence.split("But this run's training split")
    for corpus_name in (f"{second} trained on the train split of {setup['third']} with "
                        "differential privacy",
                        f"{first} trained on the train split of the built-in synthetic corpus",
                        f"{first} projected its updates onto gradients of the train split"):
        assert corpus_name in head, sentence
    assert re.search(re.escape(first) + r" projected its updates onto gradients of the train "
                     r"split \(\d+ utterances\) of " + re.escape(setup["other"]) + " without "
                     "differential privacy", shared), sentence
    assert second not in shared


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


def test_label_aware_heads_keep_the_sources_projection_and_their_own_labels(setup, tmp_path,
                                                                            caplog):
    """With label-aware CLC heads on both runs (names in the public word vectors' space, as
    wide as the heads'), the target starts with the source's projections and B/I/O score;
    every per-label weight (names, bias, correction) is its own."""
    heads = dict(label_head_dim=8, label_head_correction=True)
    source = str(tmp_path / "source")
    training.train(config_with(setup["vectors"], mechanism="sgd", replicas=1, **heads), source,
                   strategy=strategy(1), export=False)
    start = _StartingWeights()
    training.train(config_with(setup["vectors"], mechanism="dpsgd", replicas=1, epochs=1,
                               init_from=source, data_dir=setup["other"], **heads),
                   str(tmp_path / "target"), strategy=strategy(1), callbacks=[start],
                   export=False)
    spec, checkpoint = warm_start._read_run(source)
    caplog.clear()
    theirs = warm_start.trained_model(spec.model, warm_start.run_preprocessor(source, spec.model),
                                      checkpoint, 8)
    # rebuilt with stand-in word vectors, it does not say its names are unknown
    assert "no known word" not in caplog.text
    shared = {"projection", "span_logits"}
    theirs_heads = _model_heads(theirs)
    assert len(theirs_heads) == len(start.heads)  # in order, as load_backbone compares
    copied = 0
    for variable, ours in zip(theirs_heads, start.heads):
        if set(variable.path.split("/")) & shared:
            np.testing.assert_array_equal(ours, variable.numpy())
            copied += 1
        elif variable.trainable and variable.numpy().any():  # trained there, fresh here
            assert not np.array_equal(ours, variable.numpy()), variable.path
    assert copied == 4  # both projections, and the tag head's B/I/O kernel and bias


def _model_heads(model) -> list:
    backbone = {id(v) for v in model.backbone.weights}
    return [v for v in model.weights if id(v) not in backbone]


def _named_clc(tags, intents, source: str, seed: int, dim: int = 8):
    tokens = [["a"] * len(t) for t in tags]
    pre = CLCPreprocessor.from_training_data(tokens, tags, intents, max_words=3,
                                             max_word_length=5)
    vectors = WordVectors(("contact", "name", "phone", "genre"), np.eye(4, dtype="float32"))
    keras.utils.set_random_seed(seed)
    model = CLCJoint.from_preprocessor(pre, word_vectors=vectors, label_embedding_dim=dim,
                                       **{**testing.TINY_CLC, "num_lstm_layers": 1,
                                          "word_embedding_dim": 4})
    name_heads(model, pre, vectors, source)
    return model


def test_heads_named_by_vectors_take_the_sources_whole_projection():
    ours = _named_clc([["B-contact_name", "B-phone"]], ["call"], "vectors", 0)
    theirs = _named_clc([["B-contact", "B-genre_name"]], ["play"], "vectors", 1)
    assert warm_start._copy_shared_label_heads(ours, theirs, SimpleNamespace(model="clc")) == 4
    np.testing.assert_array_equal(ours.tag_head.projection.kernel.numpy(),
                                  theirs.tag_head.projection.kernel.numpy())


def test_heads_named_by_words_take_the_columns_of_the_words_both_schemas_use():
    """A name word's column means that word in both runs, so it carries over; a word only this
    schema has ("phone") starts as built, and a head sharing no word takes nothing."""
    ours = _named_clc([["B-contact_name", "B-phone"]], ["call"], "words", 0)
    theirs = _named_clc([["B-contact", "B-genre_name"]], ["play"], "words", 1)
    before = ours.tag_head.projection.kernel.numpy()
    # the tag head's projection and B/I/O kernel and bias; the intents share no word
    assert warm_start._copy_shared_label_heads(ours, theirs, SimpleNamespace(model="clc")) == 3
    after, source = ours.tag_head.projection.kernel.numpy(), theirs.tag_head.projection.kernel
    our_words, their_words = ours.label_name_words[1], theirs.label_name_words[1]
    for word in ("contact", "name"):
        np.testing.assert_array_equal(after[:, our_words.index(word)],
                                      source.numpy()[:, their_words.index(word)])
    phone = our_words.index("phone")
    np.testing.assert_array_equal(after[:, phone], before[:, phone])
    assert not np.array_equal(after[:, phone], source.numpy()[:, phone])
    np.testing.assert_array_equal(ours.tag_head.span_head.kernel.numpy(),
                                  theirs.tag_head.span_head.kernel.numpy())
    mixed = _named_clc([["B-contact", "B-genre_name"]], ["play"], "vectors", 1)
    assert warm_start._copy_shared_label_heads(ours, mixed, SimpleNamespace(model="clc")) == 0


def test_heads_named_by_words_match_by_word_across_widths():
    """A column per word: a source whose heads are wider (another schema, more words) still
    gives each shared word's column; named by vectors, another width copies nothing."""
    ours = _named_clc([["B-contact_name", "B-phone"]], ["call"], "words", 0)
    theirs = _named_clc([["B-contact", "B-genre_name"]], ["play"], "words", 1, dim=12)
    assert warm_start._copy_shared_label_heads(ours, theirs, SimpleNamespace(model="clc")) == 3
    our_words, their_words = ours.label_name_words[1], theirs.label_name_words[1]
    np.testing.assert_array_equal(
        ours.tag_head.projection.kernel.numpy()[:, our_words.index("name")],
        theirs.tag_head.projection.kernel.numpy()[:, their_words.index("name")])
    wide = _named_clc([["B-contact", "B-genre_name"]], ["play"], "vectors", 1, dim=12)
    narrow = _named_clc([["B-contact_name", "B-phone"]], ["call"], "vectors", 0)
    assert warm_start._copy_shared_label_heads(narrow, wide, SimpleNamespace(model="clc")) == 0


def test_heads_never_named_take_nothing():
    """A model whose heads no name_heads call named says nothing of its names' space."""
    ours = _named_clc([["B-contact_name", "B-phone"]], ["call"], "vectors", 0)
    theirs = _named_clc([["B-contact", "B-genre_name"]], ["play"], "vectors", 1)
    del theirs.label_names_source
    assert warm_start._copy_shared_label_heads(ours, theirs, SimpleNamespace(model="clc")) == 0


def test_a_source_named_by_other_word_rules_is_refused(setup, tmp_path, monkeypatch):
    """If this version reads the source's labels into other words than it trained with, its
    columns would be copied under the wrong words: the start is refused, naming init_from."""
    heads = dict(label_head_dim=64, label_head_names="words", label_head_correction=True)
    source = str(tmp_path / "source")
    training.train(config_with(setup["vectors"], mechanism="sgd", replicas=1, epochs=1, **heads),
                   source, strategy=strategy(1), export=False)
    spec, checkpoint = warm_start._read_run(source)
    theirs = warm_start.run_preprocessor(source, spec.model)
    assert warm_start.trained_model(spec.model, theirs, checkpoint, 8).name_words_as_trained
    label = theirs.tag_vocabulary.labels[-1]
    word = label_names.label_words(label)[0]
    monkeypatch.setitem(label_names.ABBREVIATIONS, word, ("renamed",))
    assert not warm_start.trained_model(spec.model, theirs, checkpoint, 8).name_words_as_trained
    with pytest.raises(ValueError, match="init_from.*name words differ"):
        training.train(config_with(setup["vectors"], mechanism="dpsgd", replicas=1, epochs=1,
                                   init_from=source, data_dir=setup["other"], **heads),
                       str(tmp_path / "target"), strategy=strategy(1), export=False)


def test_a_source_that_averaged_its_weights_is_refused(setup, tmp_path):
    """Its checkpoint holds the last step's weights, not the averaged ones it released: the
    start is refused before any step, naming init_from and how to train a source that serves."""
    source = tmp_path / "averaged"
    shutil.copytree(setup["source"], source)
    saved = json.loads((source / "config.json").read_text())
    saved["config"]["ema_fraction"] = 0.1
    (source / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"init_from.*averaged its weights.*"
                                         r"private_ema_fraction=-1"):
        training.train(config_with(setup["vectors"], mechanism="dpsgd", replicas=1,
                                   init_from=str(source), data_dir=setup["other"]),
                       str(tmp_path / "target"), strategy=strategy(1), export=False)


def test_public_pretraining_trains_a_plain_run_then_starts_from_it(setup, tmp_path):
    """One command: a plain run of this config on the public corpus in RUN_DIR/
    public_pretraining, then the private run starting from its backbone, private (the corpora
    share no utterance) and naming it; a finished plain run found there is not trained again."""
    config = config_with(setup["vectors"], mechanism="dpsgd", replicas=1, epochs=1,
                         data_dir=setup["other"], public_pretraining=setup["third"])
    run_dir, start = str(tmp_path / "run"), _StartingWeights()
    training.train(config, run_dir, strategy=strategy(1), callbacks=[start], export=False)
    source = os.path.join(run_dir, "public_pretraining")
    plain = run_files.load_run_config(source)
    assert (plain.mechanism, plain.data_dir, plain.public_pretraining) == (
        "sgd", setup["third"], "")
    backbone, _ = _source_weights(source)
    for ours, theirs in zip(start.backbone, backbone):
        np.testing.assert_array_equal(ours, theirs)
    privacy = read(run_dir, "privacy.json")
    assert privacy["private"] is True
    assert any(f"{source} trained on the train split of {setup['third']}" in s
               for s in privacy["not_covered"]), privacy["not_covered"]
    assert run_files.load_run_config(run_dir).init_from == ""  # the config says what was asked

    # the training run's own call (training._start_from), without a second private run
    again = tmp_path / "again"
    shutil.copytree(source, again / "public_pretraining")
    state = (again / "public_pretraining" / "state.json").read_bytes()

    def must_not_train(*args, **kwargs):
        raise AssertionError("a finished plain run was trained again")

    assert public_start.pretrain(config, str(again), must_not_train, strategy(1)) == \
        public_start.source_dir(str(again))
    assert (again / "public_pretraining" / "state.json").read_bytes() == state
