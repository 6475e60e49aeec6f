"""The trainer's config checked field by field before anything runs: ValueError naming the flag.

Why a module of its own: `RunSpec.parse` runs these once on the command line's config; the
builders then take checked parts and build, without re-checking.
"""
from __future__ import annotations

from edp_nlu.data import augment, loading
from edp_nlu.models.bert.choices import POOLING
from edp_nlu.models.bert.finetuning import FINETUNE, LORA_LAYOUTS, LORA_TARGETS
from edp_nlu.models.joint_loss import TAG_REDUCTIONS
from edp_nlu.models.joint_task import DECODINGS
from edp_nlu.pipeline import label_selection, spec_parts
from edp_nlu.pipeline.builders import dp_config, features, microbatch_size, named_as_flags
from edp_nlu.pipeline.optimizers import OPTIMIZERS, SCHEDULES
from edp_tf.config import compatibility
from edp_tf.ledger import SAMPLINGS
from edp_tf.mechanism import PRIVACY_UNITS

MECHANISMS = ("sgd", "edp", "dpsgd")
MODELS = ("clc", "bert")


def _check_augmentation(config, bad) -> None:
    """Augmentation multiplicity runs where one example's copies are one clipped micro-batch:
    private per-example clipping of Poisson-sampled examples."""
    copies = config.augment_copies
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        bad("augment_copies", copies, "an integer >= 1 (1: no augmented copies)")
    variants = config.augment_variants
    if isinstance(variants, bool) or not isinstance(variants, int) or not (
            variants == 0 or variants >= copies):
        bad("augment_variants", variants, f"0 (= augment_copies) or an integer >= "
            f"augment_copies={copies}")
    try:
        augment.parse_kinds(config.augment)
    except ValueError:
        bad("augment", config.augment, f"a comma-separated subset of {augment.KINDS}")
    for field in ("augment_word_rate", "augment_slot_rate"):
        if not 0 <= config[field] <= 1:
            bad(field, config[field], "a probability in [0, 1]")
    # the copies are averaged inside an example's clip, which plain training does not have;
    # the private rules are edp_tf.config.compatibility's (check_config)
    if copies > 1 and config.mechanism == "sgd":
        bad("augment_copies", copies, "1 with mechanism='sgd': augmentation multiplicity needs "
            "--mechanism=dpsgd (per-example clipping: an example's copies are one clipped "
            "micro-batch)")


def check_config(config) -> None:
    """ValueError naming the config field for values the trainer cannot run.

    The checks run in a fixed order (the helpers below, each a group of related fields), so a
    config with several bad fields always names the same one first.
    """
    def bad(field, value, allowed):
        raise ValueError(f"--config.{field}={value!r} is invalid: expected {allowed}")

    _check_choices(config, bad)
    _check_privacy_unit(config, bad)
    _check_augmentation(config, bad)

    label_selection.check_config(config, bad)
    check_mechanism(spec_parts.parts_of(config.to_dict()))
    _check_run_shape(config, bad)
    _check_public_subspace(config, bad)
    _check_sizes_and_rates(config, bad)
    if config.model == "bert":
        _check_bert(config.bert, bad)
    _check_optimizer_and_heads(config, bad)


def check_mechanism(parts: dict) -> None:
    """The DP knobs' ranges and rules of a private run (DPConfig's, named as flags), from its
    spec parts: all a knob changed after parsing (`RunSpec.with_knobs`) needs checked again."""
    privacy = parts["privacy"]
    if not privacy.private:
        return
    dp = dp_config(privacy, microbatch_size(privacy),
                   1.0 if privacy.privacy_unit == "user" else None, None)
    fields = {}
    for part in parts.values():
        fields.update(spec_parts.flat_fields(part))
    named_as_flags(fields, lambda: compatibility(
        dp, features(privacy, parts["optimizer"], parts["sampling"])))


def _check_choices(config, bad) -> None:
    """The fields that name one of a fixed set of options."""
    choices = {"model": MODELS, "mechanism": MECHANISMS, "sampling": SAMPLINGS,
               "privacy_unit": PRIVACY_UNITS,
               "slot_loss": TAG_REDUCTIONS, "optimizer": OPTIMIZERS, "lr_schedule": SCHEDULES}
    for field, allowed in choices.items():
        value = config[field]
        if value not in allowed:
            bad(field, value, allowed)


def _check_privacy_unit(config, bad) -> None:
    """The user-level knobs: they only mean something with privacy_unit='user'."""
    user_level = config.privacy_unit == "user"
    if user_level and config.mechanism != "sgd" and config.examples_per_user < 1:
        bad("examples_per_user", config.examples_per_user, "an integer >= 1 with "
            "privacy_unit='user'")
    if config.user_weight_cap < 0 or (config.user_weight_cap and not user_level):
        bad("user_weight_cap", config.user_weight_cap, "0 (every user weighs 1), or w_hat > 0 "
            "with privacy_unit='user'")


def _check_run_shape(config, bad) -> None:
    """Decoding, replicas, input length and the encoder-frozen probe phase."""
    if config.decoding not in DECODINGS:
        bad("decoding", config.decoding, DECODINGS)
    if int(config.replicas) < 1:
        bad("replicas", config.replicas, "an integer >= 1")
    if not config.checkpoint_seconds >= 0:
        bad("checkpoint_seconds", config.checkpoint_seconds, ">= 0 (0 = at epochs' ends only)")
    if not (config.resume_noise_limit == 0 or config.resume_noise_limit >= 1):
        bad("resume_noise_limit", config.resume_noise_limit, "0 (no limit) or >= 1")
    if int(config.max_words) < 0:
        bad("max_words", config.max_words, "an integer >= 1, or 0 for the automatic default")
    label_dim = config.label_head_dim
    if not isinstance(label_dim, int) or label_dim < 0:
        bad("label_head_dim", label_dim, "0 (plain heads), or an integer >= 1")
    elif label_dim and config.model == "clc" and not config.clc.word_vectors:
        bad("label_head_dim", label_dim, "0 when clc.word_vectors is empty (CLC reads the "
            "label names with its public word vectors)")
    if config.label_head_correction not in (True, False) or (
            config.label_head_correction and not label_dim):
        bad("label_head_correction", config.label_head_correction,
            "True only with label_head_dim > 0 (it corrects label-aware heads)")
    # probe_epochs < epochs is checked once epochs is resolved (training.py _probe_first)
    probe = config.probe_epochs
    if probe and (not isinstance(probe, int) or probe < 0 or config.mechanism == "sgd"):
        bad("probe_epochs", probe, "0, or an integer >= 1 with a private mechanism (the "
            "private step freezes the encoder; plain training has no such phase)")


def _check_sizes_and_rates(config, bad) -> None:
    """Batch, length, sampling, learning rate and privacy target: 0 mostly means automatic."""
    for field in ("batch_size", "epochs", "steps"):  # 0 = auto (edp_nlu/pipeline/recipes.py)
        if int(config[field]) < 0:
            bad(field, config[field], "an integer >= 1, or 0 for the automatic default")
    if not 0 <= config.sampling_rate <= 1:
        bad("sampling_rate", config.sampling_rate, "in [0, 1] (0 = use batch_size)")
    if config.microbatch_size < 0:
        bad("microbatch_size", config.microbatch_size, "0 (one per replica) or k >= 1")
    if config.learning_rate < 0:
        bad("learning_rate", config.learning_rate, "> 0, or 0 for the automatic default")
    if config.target_epsilon < 0:
        bad("target_epsilon", config.target_epsilon, ">= 0 (0 = use noise_multiplier)")
    if not 0 <= config.budget_reserve < 0.5:
        bad("budget_reserve", config.budget_reserve, "in [0, 0.5): the fraction of "
            "target_epsilon held back for redoing steps a late kill lost")
    if not 0 <= config.delta < 1:
        bad("delta", config.delta, "in [0, 1) (0 = 0.1/n)")


def _check_bert(b, bad) -> None:
    """The `bert.*` fields, checked only when the model is BERT."""
    if b.vocabulary not in ("minilm", "train"):
        bad("bert.vocabulary", b.vocabulary, ("minilm", "train"))
    if b.finetune not in FINETUNE:
        bad("bert.finetune", b.finetune, FINETUNE)
    if b.private_finetune not in FINETUNE + ("",):  # "": bert.finetune
        bad("bert.private_finetune", b.private_finetune, FINETUNE + ("",))
    if not 0 <= b.dropout < 1:
        bad("bert.dropout", b.dropout, "in [0, 1)")
    if not b.private_dropout < 1:
        bad("bert.private_dropout", b.private_dropout, "in [0, 1), or < 0 for bert.dropout")
    if b.lora_layout not in LORA_LAYOUTS:
        bad("bert.lora_layout", b.lora_layout, LORA_LAYOUTS)
    if b.lora_targets not in LORA_TARGETS:
        bad("bert.lora_targets", b.lora_targets, tuple(LORA_TARGETS))
    if b.pooling not in POOLING:
        bad("bert.pooling", b.pooling, POOLING)


def _check_optimizer_and_heads(config, bad) -> None:
    """Schedule fractions, optimizer knobs, head dropout and the loss weights."""
    if not 0 <= config.warmup_fraction < 1:
        bad("warmup_fraction", config.warmup_fraction, "in [0, 1)")
    if not 0 <= config.ema_fraction < 1:
        bad("ema_fraction", config.ema_fraction, "in [0, 1)")
    if not config.adam_bc_floor > 0:
        bad("adam_bc_floor", config.adam_bc_floor, "> 0")
    if not 0 <= config.head_dropout < 1:
        bad("head_dropout", config.head_dropout, "in [0, 1)")
    if not config.private_head_dropout < 1:
        bad("private_head_dropout", config.private_head_dropout,
            "in [0, 1), or < 0 for head_dropout")
    for field in ("intent_loss_weight", "slot_loss_weight", "weight_decay"):
        if not config[field] >= 0:
            bad(field, config[field], ">= 0")

def _check_public_subspace(config, bad) -> None:
    source = config.public_subspace
    if not source:
        return
    if config.mechanism == "sgd":
        bad("public_subspace", source, "'' with mechanism='sgd' (it projects the noisy update)")
    if source == config.data_dir or (source != "synthetic" and not loading.is_joint_dir(source)
                                     and not loading.is_split_dir(source)):
        bad("public_subspace", source, "'synthetic' or a public joint-format directory (or one "
            "split of one) other than data_dir")
    rank, examples = config.public_subspace_rank, config.public_subspace_examples
    for field, value in (("public_subspace_rank", rank), ("public_subspace_examples", examples),
                         ("public_subspace_every", config.public_subspace_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            bad(field, value, "an integer >= 1")
    if config.public_subspace_labels not in ("random", "own"):
        bad("public_subspace_labels", config.public_subspace_labels, ("random", "own"))
    if rank > examples:
        bad("public_subspace_rank", rank, f"at most public_subspace_examples={examples}")
