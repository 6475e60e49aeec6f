"""The builders read each field from the spec part that holds it: the sampler, micro-batch size
and DPConfig built from a parsed spec carry the config's values (augmented copies, user level,
BandMF), not a default of the part they were wrongly looked up in."""
import numpy as np
import pytest

from edp_nlu.configs.base import ZERO_IS_NONE, base_config
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor
from edp_nlu.pipeline import builders
from edp_nlu.pipeline.run_spec import RunSpec
from edp_tf import sampling


def _spec(**overrides) -> RunSpec:
    config = base_config()
    config.update(dict(replicas=1, **overrides))
    return RunSpec.parse(config)


def test_the_sampler_is_the_one_the_spec_asks_for():
    augmented = _spec(mechanism="dpsgd", augment_copies=3, augment_variants=5)
    s = builders.poisson_sampler(augmented.data, augmented.privacy, 100, 0.1, 1, 1)
    assert isinstance(s, sampling.AugmentedPoissonSampler) and (s.copies, s.variants) == (3, 5)

    user = _spec(mechanism="dpsgd", privacy_unit="user", examples_per_user=3,
                 user_weight_cap=8.0)
    k = builders.microbatch_size(user.privacy)
    users = [row // 4 for row in range(80)]  # 20 users of 4 rows: each weighs min(4 / 8, 1)
    s = builders.poisson_sampler(user.data, user.privacy, 20, 0.1, k, 1, users=users)
    assert isinstance(s, sampling.UserPoissonSampler)
    assert (k, s.microbatch_size, set(s.user_weights)) == (3, 3, {0.5})

    banded = _spec(mechanism="dpsgd", bandmf_bands=3)
    s = builders.poisson_sampler(banded.data, banded.privacy, 100, 0.1, 1, 1)
    assert isinstance(s, sampling.BandMFSampler) and s.bands == 3
    plain = _spec(mechanism="edp", microbatch_size=4)
    s = builders.poisson_sampler(plain.data, plain.privacy, 100, 0.1,
                                 builders.microbatch_size(plain.privacy), 1)
    assert type(s) is sampling.PoissonSampler and s.microbatch_size == 4


def test_dp_config_carries_every_knob_of_the_privacy_part():
    spec = _spec(mechanism="dpsgd", privacy_unit="user", examples_per_user=4, local_epochs=2,
                 local_batch_size=2, local_learning_rate=0.5, l2_norm_clip=0.7,
                 noise_multiplier=1.3)
    dp = builders.dp_config(spec.privacy, builders.microbatch_size(spec.privacy), 2.0, None)
    for name, value in spec.privacy.knobs:
        assert getattr(dp, name) == (None if name in ZERO_IS_NONE and not value else value), name
    assert (dp.privacy_unit, dp.microbatch_size, dp.expected_batch_size) == ("user", 4, 2.0)
    with pytest.raises(ValueError, match=r"^--config\.l2_norm_clip=-1\.0 is invalid"):
        _spec(mechanism="dpsgd", l2_norm_clip=-1.0)


def test_a_budget_reserve_calibrates_the_noise_for_the_rest_of_the_target():
    """The plan lands at (1 - reserve) x target; the ledger's budget stays the target, so a
    resume can redo lost steps within it."""
    plans = {}
    for reserve in (0.0, 0.1):
        spec = _spec(mechanism="dpsgd", target_epsilon=4.0, budget_reserve=reserve, epochs=2)
        _, plans[reserve] = builders.private_run(spec.sampling, spec.privacy, 1, 10.0, None, 1,
                                                 None, 0.01, 1000, 1e-4, 100)
    assert plans[0.0].epsilon() == pytest.approx(4.0, rel=2e-3)
    assert plans[0.1].epsilon() == pytest.approx(3.6, rel=2e-3)  # more noise for the reserve
    assert plans[0.1].mechanism.noise_multiplier > plans[0.0].mechanism.noise_multiplier
    with pytest.raises(ValueError, match=r"--config\.budget_reserve=0\.5 is invalid"):
        _spec(mechanism="dpsgd", target_epsilon=4.0, budget_reserve=0.5)


def test_name_word_heads_widen_to_the_schema_rather_than_refuse_it():
    """A user's schema with more distinct name words than label_head_dim builds heads with a
    column per word (name_matrix would refuse the narrower width), and the rare tag's name
    keeps each of its words."""
    spec = _spec(model="clc", label_head_dim=4, label_head_names="words",
                 label_head_correction=True)
    tags = [["B-fromloc.city_name", "O", "B-toloc.city_name"], ["B-stoploc.airport_code", "O", "O"]]
    pre = CLCPreprocessor.from_training_data([["from", "x", "to"], ["via", "y", "z"]], tags,
                                             ["flight", "fare"], max_words=3, max_word_length=5)
    model = builders.build_model(spec.model, pre)
    assert model.label_embedding_dim == 8  # from location city name to stop airport code
    names = model.tag_head.label_embeddings.numpy()
    stop = pre.tag_vocabulary.labels.index("B-stoploc.airport_code")
    assert np.count_nonzero(names[stop]) == 4  # stop, location, airport, code
