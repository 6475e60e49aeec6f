"""Automatic defaults (edp_nlu/pipeline/recipes.py) and the learning-rate schedule
(edp_nlu/pipeline/optimizers.py)."""
import math

import numpy as np
import pytest

from edp_nlu.configs.base import base_config
from edp_nlu.configs.snips_bert import get_config
from edp_nlu.data import synthetic
from edp_nlu.pipeline import builders, optimizers, recipes, validation
from edp_nlu.pipeline.run_spec import RunSpec
from edp_tf.bias_corrected_adam import BiasCorrectedAdam
from edp_tf.filtering import KalmanFilter, LowPassFilter


def config(**overrides):
    c = base_config()
    c.update(overrides)
    return c


def test_explicit_values_are_kept():
    c = recipes.resolve(config(batch_size=100, epochs=3, learning_rate=0.5), n=1000)
    assert (c.batch_size, c.epochs, c.learning_rate) == (100, 3, 0.5)


def test_private_auto_batch_is_a_sampling_rate_and_steps_set_the_epochs():
    c = recipes.resolve(config(batch_size=0, epochs=0, learning_rate=0.0, mechanism="dpsgd",
                               replicas=2), n=10_000)
    assert c.batch_size == 2 * round(recipes.PRIVATE_SAMPLING_RATE["clc"] * 10_000 / 2)
    per_epoch = math.ceil(10_000 / c.batch_size)
    assert c.epochs == math.ceil(recipes.PRIVATE_STEPS[("clc", "synthetic")] / per_epoch)
    assert c.learning_rate == recipes.LEARNING_RATE[("clc", True)]


def test_auto_adapts_to_the_dataset_size():
    small = recipes.resolve(config(batch_size=0, epochs=0, mechanism="dpsgd"), n=2_000)
    large = recipes.resolve(config(batch_size=0, epochs=0, mechanism="dpsgd"), n=50_000)
    assert small.batch_size < large.batch_size
    for c, n in ((small, 2_000), (large, 50_000)):  # the same number of steps, whatever n
        steps = recipes.PRIVATE_STEPS[("clc", "synthetic")]
        assert abs(recipes.total_steps(c, n) - steps) < n / c.batch_size + 1


def test_sgd_auto_uses_a_small_batch():
    c = recipes.resolve(config(batch_size=0, epochs=0, learning_rate=0.0, mechanism="sgd",
                               model="bert"), n=13_084)
    assert c.batch_size == recipes.SGD_BATCH["bert"] and c.epochs == recipes.SGD_EPOCHS["bert"]
    assert c.learning_rate == recipes.LEARNING_RATE[("bert", False)]


@pytest.mark.parametrize("model", ["clc", "bert"])
def test_sgd_auto_gives_a_small_corpus_enough_steps(model):
    small = recipes.resolve(config(batch_size=0, epochs=0, mechanism="sgd", model=model), n=1_000)
    assert recipes.total_steps(small, 1_000) >= recipes.SGD_MIN_STEPS[model]
    assert small.epochs > recipes.SGD_EPOCHS[model]
    # SNIPS (13,084 utterances) keeps its measured epochs; ATIS (4,478) gets SNIPS's steps
    snips = recipes.resolve(config(batch_size=0, epochs=0, mechanism="sgd", model=model), n=13_084)
    assert snips.epochs == recipes.SGD_EPOCHS[model]
    atis = recipes.resolve(config(batch_size=0, epochs=0, mechanism="sgd", model=model), n=4_478)
    assert atis.epochs > recipes.SGD_EPOCHS[model]
    assert recipes.total_steps(atis, 4_478) >= recipes.SGD_MIN_STEPS[model]


def test_sampling_rate_and_steps_override_batch_and_epochs():
    c = recipes.resolve(config(sampling_rate=0.3, steps=10, mechanism="edp", microbatch_size=2,
                               replicas=2, epochs=99), n=1_000)
    assert c.batch_size == 300  # round(q n), a multiple of replicas x micro-batch (4)
    assert c.epochs == math.ceil(10 / math.ceil(1_000 / 300))


def test_auto_batch_never_exceeds_the_data():
    c = recipes.resolve(config(batch_size=0, mechanism="sgd"), n=40)
    assert c.batch_size <= 40


@pytest.mark.parametrize("field, value", [("sampling_rate", 2.0), ("steps", -3)])
def test_bad_knobs_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"--config\.{field}="):
        recipes.resolve(config(**{field: value}), n=100)


def test_warmup_then_linear_decay_to_zero():
    s = optimizers.WarmupDecay(1.0, total_steps=110, warmup_steps=10, decay="linear")
    lr = np.array([float(s(t)) for t in range(0, 120)])
    np.testing.assert_allclose(lr[:10], (np.arange(10) + 1) / 10, rtol=1e-6)
    np.testing.assert_allclose(lr[10], 1.0, rtol=1e-6)
    np.testing.assert_allclose(lr[60], 0.5, rtol=1e-6)
    assert np.all(np.diff(lr[10:110]) < 0) and np.all(lr[110:] == 0)


def test_cosine_and_constant_schedules():
    cos = optimizers.WarmupDecay(2.0, total_steps=100, decay="cosine")
    np.testing.assert_allclose([float(cos(0)), float(cos(50)), float(cos(100))], [2.0, 1.0, 0.0],
                               atol=1e-6)
    const = optimizers.WarmupDecay(2.0, total_steps=100, warmup_steps=4, decay="constant")
    np.testing.assert_allclose([float(const(1)), float(const(4)), float(const(99))],
                               [1.0, 2.0, 2.0], atol=1e-6)


@pytest.mark.parametrize("kwargs, field", [
    (dict(name="rmsprop"), "optimizer"), (dict(learning_rate=0.0), "learning_rate"),
    (dict(schedule="step"), "lr_schedule"), (dict(warmup_fraction=1.0), "warmup_fraction"),
])
def test_optimizer_errors_name_the_field(kwargs, field):
    args = dict(name="adam", learning_rate=1e-3, total_steps=10, schedule="linear")
    args.update(kwargs)
    with pytest.raises(ValueError, match=rf"--config\.{field}="):
        optimizers.build_optimizer(**args)


def test_adamw_with_schedule_is_serialisable():
    import keras

    opt = optimizers.build_optimizer("adamw", 1e-3, 100, "linear", 0.1, weight_decay=0.01)
    assert isinstance(opt, keras.optimizers.AdamW)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert float(again.learning_rate) == pytest.approx(float(opt.learning_rate))


def test_dataset_configs_can_set_private_automatic_values():
    c = config(batch_size=0, epochs=0, learning_rate=0.0, private_sampling_rate=0.2,
               private_steps=20, private_learning_rate=0.03, replicas=1)
    private = recipes.resolve(dict_update(c, mechanism="dpsgd"), n=1_000)
    assert (private.batch_size, private.epochs, private.learning_rate) == (200, 4, 0.03)
    plain = recipes.resolve(dict_update(c, mechanism="sgd"), n=1_000)  # untouched by them
    assert (plain.batch_size, plain.learning_rate) == (
        recipes.SGD_BATCH["clc"], recipes.LEARNING_RATE[("clc", False)])


def test_private_ema_fraction_applies_to_private_runs_only():
    c = config(ema_fraction=0.0, private_ema_fraction=0.1, replicas=1)
    assert recipes.resolve(dict_update(c, mechanism="dpsgd"), n=1_000).ema_fraction == 0.1
    assert recipes.resolve(dict_update(c, mechanism="sgd"), n=1_000).ema_fraction == 0.0
    # as a resumed run's config file is compared with what it recorded
    assert recipes.with_private_fields(dict_update(c, mechanism="dpsgd"), True).ema_fraction == 0.1
    c.private_ema_fraction = -1.0  # unset: the shared value
    assert recipes.resolve(dict_update(c, mechanism="dpsgd", ema_fraction=0.2),
                           n=1_000).ema_fraction == 0.2


def test_private_finetuning_and_dropout_apply_to_private_runs_only():
    c = config(model="bert", batch_size=0, epochs=0, learning_rate=0.0, replicas=1)
    c.bert.update(finetune="no_embeddings", dropout=0.1, private_finetune="lora",
                  private_dropout=0.0)
    private = recipes.resolve(dict_update(c, mechanism="dpsgd"), n=1_000)
    assert (private.bert.finetune, private.bert.dropout) == ("lora", 0.0)
    plain = recipes.resolve(dict_update(c, mechanism="sgd"), n=1_000)
    assert (plain.bert.finetune, plain.bert.dropout) == ("no_embeddings", 0.1)
    c.bert.update(private_finetune="", private_dropout=-1.0)  # unset: the shared values
    private = recipes.resolve(dict_update(c, mechanism="edp"), n=1_000)
    assert (private.bert.finetune, private.bert.dropout) == ("no_embeddings", 0.1)


def test_private_head_dropout_applies_to_private_runs_only():
    c = config(batch_size=0, epochs=0, learning_rate=0.0, replicas=1, head_dropout=0.1,
               private_head_dropout=0.0)
    assert recipes.resolve(dict_update(c, mechanism="dpsgd"), n=1_000).head_dropout == 0.0
    assert recipes.resolve(dict_update(c, mechanism="sgd"), n=1_000).head_dropout == 0.1
    c.private_head_dropout = -1.0  # unset: the shared value
    assert recipes.resolve(dict_update(c, mechanism="edp"), n=1_000).head_dropout == 0.1


def dict_update(c, **kw):
    c = c.copy_and_resolve_references()
    c.update(kw)
    return c


def test_auto_max_words_is_a_public_constant_per_data_kind():
    assert recipes.resolve(config(max_words=0), n=1000).max_words == 20
    assert recipes.resolve(config(max_words=0, data_dir="/some/corpus"), n=1000).max_words == 32
    assert recipes.resolve(config(max_words=7), n=1000).max_words == 7  # explicit wins
    splits = synthetic.synthetic_corpus(seed=1, size=6000)
    longest = max(len(u.tokens) for part in (splits.train, splits.dev, splits.test)
                  for u in part)
    assert longest <= recipes.MAX_WORDS["synthetic"]  # the generator stays within the constant


def test_user_level_batches_count_users_in_multiples_of_the_replicas():
    c = recipes.resolve(config(batch_size=0, epochs=0, privacy_unit="user", replicas=4,
                               microbatch_size=2), n=1000)
    assert c.batch_size % 4 == 0 and c.batch_size == 4 * round(
        recipes.USER_SAMPLING_RATE * 1000 / 4)
    assert c.epochs == math.ceil(recipes.USER_STEPS / math.ceil(1000 / c.batch_size))


def test_snips_bert_gives_private_runs_lora_without_dropout_and_plain_runs_full_finetuning():
    """The recipe results/pilot_snips_bert chose: the grids' pinned rows depend on it."""
    private = recipes.resolve(get_config(), n=13_084)
    assert (private.bert.finetune, private.bert.dropout, private.learning_rate) == (
        "lora", 0.0, 0.005)
    assert private.bert.lora_layout == "matrix"
    assert private.batch_size == 1047 and private.epochs == 24  # q 0.08, 300 steps
    plain = recipes.resolve(dict_update(get_config(), mechanism="sgd"), n=13_084)
    assert (plain.bert.finetune, plain.bert.dropout, plain.learning_rate) == (
        "no_embeddings", 0.1, 1e-4)


@pytest.mark.parametrize("name", ["default", "snips_clc", "snips_bert", "atis_clc", "atis_bert"])
def test_dataset_configs_pass_the_trainers_checks(name):
    import importlib

    config = importlib.import_module(f"edp_nlu.configs.{name}").get_config()
    for mechanism in ("sgd", config.mechanism):
        resolved = recipes.resolve(dict_update(config, mechanism=mechanism), n=5_000)
        validation.check_config(resolved)


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
def test_every_optimizer_averages_weights_when_asked(name):
    assert optimizers.build_optimizer(name, 1e-3, 100, ema_fraction=0.1).use_ema
    assert not optimizers.build_optimizer(name, 1e-3, 100).use_ema


def test_adam_bc_is_the_bias_corrected_adam_only_when_private():
    """Non-private runs have no noise to take out of Adam's second moment: plain Adam."""
    import keras

    private = optimizers.build_optimizer("adam_bc", 1e-3, 100, adam_bc_floor=0.2)
    assert isinstance(private, BiasCorrectedAdam) and private.floor == 0.2
    plain = optimizers.build_optimizer("adam_bc", 1e-3, 100, private=False)
    assert type(plain) is keras.optimizers.Adam
    with pytest.raises(ValueError, match=r"--config\.adam_bc_floor="):
        optimizers.build_optimizer("adam_bc", 1e-3, 100, adam_bc_floor=0.0)


def test_noise_filter_wraps_the_optimizer_of_private_runs_only():
    """--config.noise_filter: the filter around the config's optimizer when private; plain runs
    have no privacy noise to filter; adam_bc's noise variance would be the unfiltered one."""
    import keras

    def built(**fields):
        config = dict_update(base_config(), **fields)
        return builders.optimizer(RunSpec.of_checked(config).optimizer, 10,
                                  private=config.mechanism != "sgd")

    assert type(built()) is keras.optimizers.Adam  # the default: none
    lowpass = built(noise_filter="lowpass", mechanism="dpsgd")
    assert isinstance(lowpass, LowPassFilter)
    assert type(lowpass.inner_optimizer) is keras.optimizers.Adam
    assert isinstance(built(noise_filter="kalman"), KalmanFilter)
    assert type(built(noise_filter="kalman", mechanism="sgd")) is keras.optimizers.Adam
    with pytest.raises(ValueError, match=r"--config\.noise_filter='median'"):
        built(noise_filter="median")
    with pytest.raises(ValueError, match="adam_bc"):
        built(noise_filter="lowpass", optimizer="adam_bc")


def test_ema_momentum_is_one_time_constant_of_the_fraction_of_steps():
    assert optimizers.ema_kwargs(0.0, 100) == {}
    assert optimizers.ema_kwargs(0.1, 200)["ema_momentum"] == pytest.approx(1 - 1 / 20)
    assert optimizers.ema_kwargs(0.1, 5)["ema_momentum"] == 0.0  # under one step: no averaging
    with pytest.raises(ValueError, match=r"--config\.ema_fraction="):
        optimizers.build_optimizer("adam", 1e-3, 10, ema_fraction=1.0)


def test_a_users_corpus_gets_its_own_private_step_count():
    """The built-in corpus's step count is set by the default job's time goal; a user's corpus
    (data_dir) gets the count measured best on the public proxies."""
    built_in = recipes.resolve(config(batch_size=0, epochs=0, mechanism="dpsgd"), n=9_600)
    user = recipes.resolve(config(batch_size=0, epochs=0, mechanism="dpsgd",
                                  data_dir="/any/corpus"), n=9_600)
    assert built_in.batch_size == user.batch_size
    for c, source in ((built_in, "synthetic"), (user, "data_dir")):
        steps = recipes.PRIVATE_STEPS[("clc", source)]
        assert abs(recipes.total_steps(c, 9_600) - steps) < 9_600 / c.batch_size + 1
    assert recipes.total_steps(user, 9_600) > recipes.total_steps(built_in, 9_600)


def _chunk_rows(c, microbatch_rows: int, replica_rows: int) -> int:
    spec = RunSpec.of_checked(c)
    return recipes.chunk_rows(spec.model, spec.privacy, microbatch_rows, replica_rows)


def test_private_runs_clip_large_replica_batches_in_chunks_of_whole_micro_batches():
    per_example = config(mechanism="dpsgd", max_words=32)
    rows = recipes.CHUNK["clc"] // 32  # 256 rows of 32 words
    whole = recipes.UNCHUNKED["clc"] // 32
    assert _chunk_rows(per_example, 1, whole) == 0  # fits: no chunks
    assert _chunk_rows(per_example, 1, whole + 1) == rows
    # the built-in job's batch (1,755 rows of 20 words) stays whole; SNIPS's (2,348 of 32) not
    assert _chunk_rows(config(mechanism="dpsgd", max_words=20), 1, 1755) == 0
    assert _chunk_rows(per_example, 1, 2348) == 256
    # whole micro-batches: eDP's of 3 rows, augmented copies of 4 rows, a user's 600 rows
    assert _chunk_rows(config(mechanism="edp", max_words=32), 3, 4096) == rows // 3 * 3
    assert _chunk_rows(per_example, 4, 4096) == rows // 4 * 4
    assert _chunk_rows(per_example, 600, 4 * 600) == 600
    assert _chunk_rows(config(mechanism="dpsgd", model="bert"), 1, 4096) == \
        recipes.CHUNK["bert"]
    # a user's value and plain training are left as they are
    assert _chunk_rows(config(mechanism="dpsgd", physical_batch_size=64), 1, 4096) == 64
    assert _chunk_rows(config(mechanism="sgd"), 1, 4096) == 0


def test_a_train_fraction_gives_the_run_the_subsets_n():
    """The run's n (its delta and automatic batch) is what builders.load_splits returns."""
    whole = builders.load_splits(RunSpec.of_checked(config(synthetic_size=500)).data)
    part = builders.load_splits(
        RunSpec.of_checked(config(synthetic_size=500, train_fraction=0.25)).data)
    assert (len(whole.train), len(part.train)) == (400, 100)
    assert (part.dev, part.test) == (whole.dev, whole.test)
