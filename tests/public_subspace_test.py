"""--config.public_subspace: a private run projects its updates onto public gradients, names the
public corpus in privacy.json, and chooses its public examples without reading the training
split."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import edp_tf
from edp_nlu.pipeline import training, validation
from tests import tiny_runs


def _config(**overrides):
    fields = dict(mechanism="dpsgd", replicas=1, public_subspace="synthetic",
                  public_subspace_examples=48, public_subspace_rank=8, public_subspace_every=2)
    return tiny_runs.tiny_config(**(fields | overrides))


def test_a_projected_run_finishes_and_its_ledger_names_the_public_examples(tmp_path):
    run_dir = str(tmp_path / "run")
    summary = training.train(_config(), run_dir, strategy=tiny_runs.strategy(1), export=False)
    assert summary["private"] and 0 < summary["epsilon"] < float("inf")
    statement = tiny_runs.read(run_dir, "privacy.json")
    sentences = [s for s in statement["not_covered"]
                 if "projected onto 8 directions of the gradients of 48 examples declared public"
                 in s]
    assert sentences, statement["not_covered"]
    # the corpus, its split and its size are named, so a reviewer knows what was treated as public
    assert ("48 utterances of the train split (800 utterances) of the built-in synthetic "
            "corpus 'synthetic'" in sentences[0]), sentences[0]


class _Captured(Exception):
    """Stops a run once its public examples are known."""


def _public_examples_of_a_run(monkeypatch, tmp_path, config, splits):
    """The (x, y) a run hands to project_onto_public_gradients, training nothing."""
    captured = {}

    def capture(self, x, y, *args, **kwargs):
        captured["xy"] = (x, y)
        raise _Captured()

    monkeypatch.setattr(edp_tf.PrivateModel, "project_onto_public_gradients", capture)
    with pytest.raises(_Captured):
        training.train(config, str(tmp_path), splits=splits, strategy=tiny_runs.strategy(1),
                       export=False)
    return captured["xy"]


def test_the_public_examples_do_not_depend_on_the_training_split(monkeypatch, tmp_path):
    """Adding one training utterance equal to a public one leaves the chosen public examples (and
    their drawn labels) as they were: the subspace is a function of the public corpus alone, so
    projecting onto it is post-processing. Leaving out public utterances that equal training
    ones would change the choice with the training set."""
    public = tiny_runs.corpus(tiny_runs.tiny_config(data_seed=5))
    config = _config(public_subspace=tiny_runs.write_joint_dir(tmp_path / "public", public))
    splits = tiny_runs.corpus(config)
    ours = {tuple(u.tokens) for u in splits.train}
    extra = next(u for u in public.train if tuple(u.tokens) not in ours)
    with_extra = dataclasses.replace(splits, train=tuple(splits.train) + (extra,))
    without = _public_examples_of_a_run(monkeypatch, tmp_path / "a", config, splits)
    added = _public_examples_of_a_run(monkeypatch, tmp_path / "b", config, with_extra)
    for a, b in zip(tf.nest.flatten(without), tf.nest.flatten(added)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("overrides, message", [
    (dict(mechanism="sgd"), "with mechanism='sgd'"),
    (dict(public_subspace_rank=64), "at most public_subspace_examples=48"),
    (dict(public_subspace_every=0), "public_subspace_every=0 is invalid"),
    (dict(public_subspace="/no/such/dir"), "'synthetic' or a public joint-format directory"),
    (dict(probe_epochs=1), r"--config\.probe_epochs=1 is invalid: probe_epochs cannot be "
                          "combined with public_subspace"),
    (dict(sparse_embeddings=True, per_example_method="ghost"),  # the loop has no sparse path
     r"--config\.public_subspace='synthetic' is invalid: "
     "public_subspace cannot be combined with sparse_embeddings"),
    (dict(optimizer="adam_bc"), r"--config\.optimizer='adam_bc' is invalid: optimizer='adam_bc' "
                                "with public_subspace"),
])
def test_bad_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        validation.check_config(_config(**overrides))
