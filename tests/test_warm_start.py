"""`--config.init_from`: a run's backbone starts from another run's (trainers/warm_start.py).

One tiny CLC source run on the synthetic corpus serves every test. The target corpora are
joint-format directories written from synthetic splits: the same utterances at another path
(so that the training-text vocabulary of the tiny config matches) or another seed's (so that
it does not).
"""
import os

import keras
import numpy as np
import pytest

from tests.tiny_runs import corpus, read, strategy, tiny_config, write_joint_dir
from trainers import run, warm_start


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    """(config, run_dir) of a finished plain CLC run on the synthetic corpus."""
    config = tiny_config("clc", "sgd", replicas=1)
    run_dir = str(tmp_path_factory.mktemp("source") / "run")
    run.train(config, run_dir, strategy=strategy(1), export=False)
    return config, run_dir


class _StartingWeights(keras.callbacks.Callback):
    """The model's weights when fit begins: (backbone, heads), each in the model's order."""

    def on_train_begin(self, logs=None):
        self.backbone, self.heads = _split(getattr(self.model, "wrapped_model", self.model))


def _split(model):
    backbone = {id(v) for v in model.backbone.weights}
    return ([v.numpy().copy() for v in model.backbone.weights],
            [v.numpy().copy() for v in model.weights if id(v) not in backbone])


def _source_weights(run_dir):
    """The source run's final (backbone, heads) weights, rebuilt from its directory (names
    differ between a process's models, so the tests compare in order, as load_backbone does)."""
    import tensorflow as tf

    from trainers import builders

    source = warm_start.source_config(run_dir)
    pre = warm_start._preprocessor(source, read(run_dir, "preprocessor.json"))
    model = builders.build_model(source, pre)
    tf.train.Checkpoint(model=model).restore(
        tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints"))).expect_partial()
    return _split(model)


def test_private_run_starts_from_the_source_backbone_and_says_so(source_run, tmp_path):
    """Every backbone variable starts equal to the source's trained one, the heads do not; the
    run stays private and its ledger names the source as outside epsilon."""
    _, source_dir = source_run
    config = tiny_config("clc", "dpsgd", replicas=1, init_from=source_dir)
    config.data_dir = write_joint_dir(tmp_path / "joint", corpus(config))
    start = _StartingWeights()
    run_dir = str(tmp_path / "run")
    run.train(config, run_dir, strategy=strategy(1), callbacks=[start], export=False)
    backbone, heads = _source_weights(source_dir)
    assert len(start.backbone) == len(backbone) >= 5  # embeddings, char conv, BiLSTM
    for ours, theirs in zip(start.backbone, backbone):
        np.testing.assert_array_equal(ours, theirs)
    assert len(start.heads) == len(heads) > 0
    assert any(not np.array_equal(ours, theirs)  # fresh heads, not the source's trained ones
               for ours, theirs in zip(start.heads, heads))
    privacy = read(run_dir, "privacy.json")
    assert privacy["private"] is True
    assert any(source_dir in s and "treats that corpus as public" in s
               for s in privacy["not_covered"])


def test_a_source_trained_on_this_runs_corpus_is_refused(source_run, tmp_path):
    """Its weights are a function of the private data: starting from them is an unaccounted use."""
    _, source_dir = source_run
    config = tiny_config("clc", "dpsgd", replicas=1, init_from=source_dir)  # synthetic too
    with pytest.raises(ValueError, match=r"init_from=.*this run's corpus"):
        run.train(config, str(tmp_path / "run"), strategy=strategy(1), export=False)


def test_same_corpus_compares_resolved_paths(tmp_path):
    a, b = tiny_config(), tiny_config()
    os.makedirs(tmp_path / "data")
    os.symlink(tmp_path / "data", tmp_path / "link")
    a.data_dir, b.data_dir = str(tmp_path / "data"), str(tmp_path / "link")
    assert warm_start.same_corpus(a, b)
    b.data_dir = str(tmp_path)
    assert not warm_start.same_corpus(a, b)
    b.data_dir = ""
    assert not warm_start.same_corpus(a, b)


@pytest.mark.parametrize("change, message", [
    (dict(clc_lstm_units=16), r"shape \(.*\) there"),
    (dict(data_seed=1), "word vocabulary differs"),
    (dict(model="bert"), "trained a clc model, this run a bert model"),
])
def test_a_source_that_does_not_fit_names_init_from(source_run, tmp_path, change, message):
    _, source_dir = source_run
    config = tiny_config("clc", "dpsgd", replicas=1, init_from=source_dir)
    splits = corpus(tiny_config(data_seed=change.get("data_seed", 0)))
    config.data_dir = write_joint_dir(tmp_path / "joint", splits)
    if "clc_lstm_units" in change:
        config.clc.lstm_units = change["clc_lstm_units"]
    if "model" in change:
        config.model = change["model"]
    with pytest.raises(ValueError, match=r"--config.init_from=.*" + message):
        run.train(config, str(tmp_path / "run"), strategy=strategy(1), export=False)


def test_init_from_a_directory_that_is_not_a_run(tmp_path):
    config = tiny_config("clc", "dpsgd", replicas=1, init_from=str(tmp_path))
    with pytest.raises(ValueError, match=r"init_from=.*no config.json"):
        run.train(config, str(tmp_path / "run"), strategy=strategy(1), export=False)
