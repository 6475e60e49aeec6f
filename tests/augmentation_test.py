"""Augmentation multiplicity in the trainer: the configs it cannot serve are refused naming the
field, and a tiny private run with 2 copies per example is charged exactly as one without (the
copies themselves are edp_nlu/data/augment_test.py's).

The step's side (one clip per example's copies, S = C whatever K; the ledger of K = 4 equal to
K = 1's) is tested in edp_tf/sensitivity_test.py, sampling_test.py and ledger_test.py.
"""
import math

import pytest

from edp_nlu.pipeline import builders, training, validation
from edp_nlu.pipeline.run_spec import RunSpec
from tests.tiny_runs import corpus, read, strategy, tiny_config


@pytest.mark.parametrize("overrides, reason", [
    (dict(mechanism="edp"), "mechanism='edp'"),
    (dict(mechanism="sgd"), "mechanism='sgd'"),
    (dict(mechanism="dpsgd", sampling="shuffle"), "sampling='shuffle'"),
    (dict(mechanism="dpsgd", privacy_unit="user"), "privacy_unit='user'"),
    (dict(mechanism="dpsgd", augment_variants=2), None),
])
def test_where_copies_cannot_apply_the_field_is_named_in_one_line(overrides, reason):
    config = tiny_config(replicas=1, augment_copies=4, **overrides)
    field = "augment_variants" if reason is None else "augment_copies"
    with pytest.raises(ValueError, match=rf"^--config\.{field}=[^\n]*{reason or ''}[^\n]*$"):
        validation.check_config(config)
    for field, value in (("augment", "mask,crop"), ("augment_word_rate", 1.5)):
        bad = tiny_config("clc", "dpsgd", replicas=1, **{field: value})
        with pytest.raises(ValueError, match=rf"^--config\.{field}="):
            validation.check_config(bad)


def test_a_tiny_run_with_two_copies_is_charged_as_one_copy(tmp_path):
    """K = 2 trains (each example's micro-batch its 2 rows) and its privacy.json states the
    epsilon, q, steps and S of the same run without copies, planned by the trainer's builders."""
    config = tiny_config("clc", "dpsgd", replicas=1, augment_copies=2)
    summary = training.train(config, str(tmp_path / "k2"), strategy=strategy(1), export=False)
    ledger = read(summary["run_dir"], "privacy.json")
    assert ledger["augment_copies"] == 2 and ledger["sensitivity"] == 1
    assert ledger["microbatch_size"] == 1 and ledger["private"] is True

    one = tiny_config("clc", "dpsgd", replicas=1)
    resolved = read(summary["run_dir"], "config.json")["config"]
    one.update(batch_size=resolved["batch_size"], epochs=resolved["epochs"])
    n = ledger["dataset_size"]
    assert n == len(corpus(one).train)  # examples, not rows
    q = one.batch_size / n
    spec = RunSpec.parse(one)
    sampler = builders.poisson_sampler(spec.data, spec.privacy, n, q, 1, 1)
    steps = sampler.steps_per_epoch
    _, plan = builders.private_run(spec.sampling, spec.privacy, 1, sampler.expected_batch_size,
                                   None, 1, sampler, q, n,
                                   ledger["delta"], steps)
    assert ledger["sampling_rate"] == pytest.approx(q)
    assert [e["steps"] for e in ledger["epochs"]] == [steps] * one.epochs
    assert ledger["epsilon"] == pytest.approx(plan.epsilon(), rel=1e-9)
    assert ledger["global_batch_size"] == 2 * sampler.max_batch_size
    assert math.isfinite(summary["test"]["ser"])  # it trained and was scored
