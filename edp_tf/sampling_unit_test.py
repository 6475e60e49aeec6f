import pytest

from edp_tf import DPConfig, sampling
from edp_tf.mechanism import Mechanism
from edp_tf.sampling_unit import SamplingUnit

UNITS = {
    "example": (SamplingUnit(), sampling.PoissonSampler),
    "user": (SamplingUnit("user", user_rows=3), sampling.UserPoissonSampler),
    "copies": (SamplingUnit(copies=4), sampling.AugmentedPoissonSampler),
    "bands": (SamplingUnit(bands=3), sampling.BandMFSampler),
}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_the_sampler_made_for_a_unit_draws_that_unit(name):
    unit, cls = UNITS[name]
    sampler = sampling.for_unit(unit, 60, 0.05, replicas=2,
                                microbatch_size=3 if name == "user" else 1,
                                users=[i % 20 for i in range(60)], variants=5, seed=1)
    assert type(sampler) is cls and sampler.unit == unit


@pytest.mark.parametrize("config, unit", [
    (DPConfig(microbatch_size=1), SamplingUnit()),
    (DPConfig(microbatch_size=3, privacy_unit="user", expected_batch_size=2.0),
     SamplingUnit("user", 3)),
    (DPConfig(microbatch_size=1, augment_copies=4), SamplingUnit(copies=4)),
    (DPConfig(microbatch_size=1, bandmf_bands=3, expected_batch_size=2.0), SamplingUnit(bands=3)),
])
def test_the_config_and_its_mechanism_say_the_same_unit(config, unit):
    assert config.sampling_unit == unit
    assert Mechanism.from_config(config, 1, 8).sampling_unit == unit


def test_a_mismatch_names_every_differing_field_and_what_must_agree():
    with pytest.raises(ValueError) as error:
        SamplingUnit("user", 3).refuse_other(SamplingUnit(bands=2), "BandMFSampler")
    message = str(error.value)
    assert message.startswith("the BandMFSampler's batches are not the step's unit")
    for part in ("privacy_unit 'example' in the sampler vs 'user'", "user_rows None",
                 "bands 2 in the sampler vs 1", "UserPoissonSampler"):
        assert part in message
    SamplingUnit(copies=2).refuse_other(SamplingUnit(copies=2), "x")  # equal: no error


def test_user_level_needs_the_users():
    with pytest.raises(ValueError, match="user of each training row"):
        sampling.for_unit(SamplingUnit("user", 2), 10, 0.1)
