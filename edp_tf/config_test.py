"""DPConfig validation and the decay schedule."""
import json
import math

import pytest

from edp_tf import DPConfig
from edp_tf.config import (
    Core,
    Features,
    Incompatible,
    NoiseSchedule,
    UserLevel,
    compatibility,
    defaults,
)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"l2_norm_clip": 0.0}, "l2_norm_clip"),
        ({"l2_norm_clip": -1.0}, "l2_norm_clip"),
        ({"l2_norm_clip": float("nan")}, "l2_norm_clip"),
        ({"noise_multiplier": -0.1}, "noise_multiplier"),
        ({"noise_multiplier": float("inf")}, "noise_multiplier"),
        ({"microbatch_size": 0}, "microbatch_size"),
        ({"microbatch_size": 2.5}, "microbatch_size"),
        ({"noise_mode": "strong"}, "noise_mode"),
        ({"noise_mode": "paper", "microbatch_size": 1}, "noise_mode"),
        ({"decay": "cosine"}, "decay"),
        ({"decay_rate": -1.0}, "decay_rate"),
        ({"scaling": "magic"}, "scaling"),
        ({"scaling": "public", "layer_scales": (1.0, 0.0)}, "layer_scales"),
        ({"scaling": "first_batch", "layer_scales": (1.0,)}, "layer_scales"),
        ({"seed": "abc"}, "seed"),
        ({"secure_noise": "yes"}, "secure_noise"),
        ({"secure_noise": True, "seed": 7}, "secure_noise"),
        ({"expected_batch_size": 0}, "expected_batch_size"),
        ({"scaling_noise_multiplier": 0}, "scaling_noise_multiplier"),
        # the scaling query is charged per row: one user owns up to microbatch_size rows
        ({"scaling": "private", "privacy_unit": "user", "microbatch_size": 8,
          "expected_batch_size": 10.0}, "scaling"),
        ({"augment_copies": 0}, "augment_copies"),
        ({"augment_copies": 2.0, "microbatch_size": 1}, "augment_copies"),
        # one example's copies are one micro-batch: per-example clipping, example level only
        ({"augment_copies": 4}, "augment_copies"),
        ({"augment_copies": 4, "microbatch_size": 2}, "augment_copies"),
        ({"augment_copies": 4, "microbatch_size": 1, "privacy_unit": "user",
          "expected_batch_size": 10.0}, "augment_copies"),
        ({"augment_copies": 4, "microbatch_size": 1, "scaling": "private"}, "augment_copies"),
        ({"bandmf_bands": 0}, "bandmf_bands"),
        ({"bandmf_bands": 2.0}, "bandmf_bands"),
        # BandMF's proof: one constant std, example level, no second release or copies
        ({"bandmf_bands": 2, "decay": "linear", "decay_rate": 0.1}, "bandmf_bands"),
        ({"bandmf_bands": 2, "noise_mode": "paper"}, "bandmf_bands"),
        ({"bandmf_bands": 2, "privacy_unit": "user", "microbatch_size": 4,
          "expected_batch_size": 8.0}, "bandmf_bands"),
        ({"bandmf_bands": 2, "sparse_embeddings": True}, "bandmf_bands"),
        ({"bandmf_bands": 2, "augment_copies": 2, "microbatch_size": 1}, "bandmf_bands"),
    ],
)
def test_invalid_values_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        DPConfig(**changes)


def test_config_is_immutable():
    cfg = DPConfig()
    with pytest.raises(Exception):
        cfg.noise_multiplier = 3.0  # type: ignore[misc]
    assert cfg.replace(noise_multiplier=3.0).noise_multiplier == 3.0
    assert cfg.noise_multiplier == 1.0


def test_decay_schedules_per_epoch():
    z0, tau = 2.0, 0.5
    none = DPConfig(noise_multiplier=z0)
    lin = DPConfig(noise_multiplier=z0, decay="linear", decay_rate=tau)
    exp = DPConfig(noise_multiplier=z0, decay="exponential", decay_rate=tau)
    for t in range(5):
        assert none.noise_multiplier_at(t) == z0
        assert lin.noise_multiplier_at(t) == pytest.approx(z0 / (1 + tau * t))
        assert exp.noise_multiplier_at(t) == pytest.approx(z0 * math.exp(-tau * t))
    assert lin.noise_multiplier_at(0) == exp.noise_multiplier_at(0) == z0
    with pytest.raises(ValueError, match="epoch"):
        lin.noise_multiplier_at(-1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(physical_batch_size=0), "physical_batch_size"),
    (dict(physical_batch_size=3, microbatch_size=2), "multiple of microbatch_size"),
    (dict(physical_batch_size=6, microbatch_size=1, augment_copies=4),
     "multiple of microbatch_size=1 x augment_copies=4"),
])
def test_physical_batch_size_is_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DPConfig(**kwargs)


def test_groups_and_flat_names_are_one_config():
    flat = DPConfig(l2_norm_clip=0.5, microbatch_size=4, expected_batch_size=32.0,
                    decay="linear", decay_rate=0.2, privacy_unit="user")
    grouped = DPConfig(core=Core(l2_norm_clip=0.5, microbatch_size=4, expected_batch_size=32.0),
                       schedule=NoiseSchedule(decay="linear", decay_rate=0.2),
                       user_level=UserLevel(privacy_unit="user"))
    assert flat == grouped and hash(flat) == hash(grouped)
    assert flat.decay == flat.schedule.decay == "linear" and flat.l2_norm_clip == 0.5
    # a flat name given with its group overrides that field of the group only
    mixed = DPConfig(core=Core(l2_norm_clip=0.5, microbatch_size=2), microbatch_size=1)
    assert (mixed.l2_norm_clip, mixed.microbatch_size) == (0.5, 1)
    assert flat.replace(decay_rate=0.4).schedule == NoiseSchedule(decay="linear", decay_rate=0.4)
    with pytest.raises(TypeError, match="l2_norm"):
        DPConfig(l2_norm=1.0)
    with pytest.raises(TypeError, match="Core"):
        DPConfig(core=NoiseSchedule())


def test_saved_configs_read_back_nested_and_flat():
    cfg = DPConfig(l2_norm_clip=0.7, microbatch_size=1, augment_copies=2, scaling="public",
                   layer_scales=(1.0, 2.0), physical_batch_size=4)
    saved = json.loads(json.dumps(cfg.to_dict()))  # tuples come back as lists
    assert DPConfig.from_dict(saved) == cfg
    assert DPConfig.from_dict(json.loads(json.dumps(cfg.flat()))) == cfg  # older, flat files
    assert set(cfg.flat()) == set(defaults())


@pytest.mark.parametrize("changes, features, field", [
    ({"sparse_embeddings": True}, dict(freeze=True), "freeze"),
    ({"local_epochs": 1, "privacy_unit": "user", "microbatch_size": 2,
      "expected_batch_size": 4.0}, dict(freeze=True), "freeze"),
    ({}, dict(freeze=True, projection=True), "freeze"),
    ({"sparse_embeddings": True}, dict(projection=True), "projection"),
    ({}, dict(projection=True, multi_worker=True), "projection"),
    ({}, dict(bias_corrected_adam=True, projection=True), "bias_corrected_adam"),
    ({"sparse_embeddings": True}, dict(bias_corrected_adam=True), "bias_corrected_adam"),
    ({"scaling": "private"}, dict(multi_worker=True), "scaling"),
    ({"scaling": "first_batch"}, dict(multi_worker=True), "scaling"),
    ({"sparse_embeddings": True, "microbatch_size": 1}, dict(per_example_method="loop"),
     "sparse_embeddings"),
    ({"augment_copies": 2, "microbatch_size": 1}, dict(sampling="shuffle"), "augment_copies"),
    ({"privacy_unit": "user", "microbatch_size": 2, "expected_batch_size": 4.0},
     dict(sampling="shuffle"), "privacy_unit"),
])
def test_features_a_config_cannot_combine_with_are_refused_naming_the_field(changes, features,
                                                                             field):
    cfg = DPConfig(**changes)  # valid alone
    compatibility(cfg)
    with pytest.raises(Incompatible) as refused:
        compatibility(cfg, Features(**features))
    assert refused.value.field == field


def test_compatible_features_pass():
    compatibility(DPConfig(scaling="public"), Features(freeze=True, bias_corrected_adam=True,
                                                       multi_worker=True, sampling="shuffle"))
    compatibility(DPConfig(sparse_embeddings=True, microbatch_size=1),
                  Features(per_example_method="ghost", sampling="poisson"))
