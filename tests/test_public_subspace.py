"""--config.public_subspace: a private run projects its updates onto public gradients, says so in
privacy.json, and refuses a "public" corpus that holds its training utterances."""
import pytest

from tests import tiny_runs
from trainers.pipeline import builders, public_subspace, training


def _config(**overrides):
    fields = dict(mechanism="dpsgd", replicas=1, public_subspace="synthetic",
                  public_subspace_examples=48, public_subspace_rank=8, public_subspace_every=2)
    return tiny_runs.tiny_config(**(fields | overrides))


def test_a_projected_run_finishes_and_its_ledger_names_the_public_examples(tmp_path):
    run_dir = str(tmp_path / "run")
    summary = training.train(_config(), run_dir, strategy=tiny_runs.strategy(1), export=False)
    assert summary["private"] and 0 < summary["epsilon"] < float("inf")
    statement = tiny_runs.read(run_dir, "privacy.json")
    assert any("projected onto 8 directions of the gradients of 48 examples declared public"
               in s for s in statement["not_covered"]), statement["not_covered"]


def test_a_corpus_holding_training_utterances_is_refused(tmp_path):
    config = _config()
    splits = tiny_runs.corpus(config)
    config.public_subspace = tiny_runs.write_joint_dir(tmp_path / "copy", splits)
    with pytest.raises(ValueError, match=r"public_subspace=.*utterances are in this run's "
                                         r"training set: that is not a public corpus"):
        public_subspace.public_examples(config, None, splits.train)


@pytest.mark.parametrize("overrides, message", [
    (dict(mechanism="sgd"), "with mechanism='sgd'"),
    (dict(public_subspace_rank=64), "at most public_subspace_examples=48"),
    (dict(public_subspace_every=0), "public_subspace_every=0 is invalid"),
    (dict(public_subspace="/no/such/dir"), "'synthetic' or a public joint-format directory"),
    (dict(probe_epochs=1), "with probe_epochs"),
])
def test_bad_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        builders.check_config(_config(**overrides))
