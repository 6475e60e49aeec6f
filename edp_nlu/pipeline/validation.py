"""The trainer's config checked field by field before anything runs: ValueError naming the flag.

Why a module of its own: `RunSpec.parse` runs these once; the builders then take checked parts
and build, without re-checking. The command line's ConfigDict is converted to the typed parts
first (spec_parts.parts_of); each part is checked alone (`_data`, `_model`, ...), then the rules
that join two parts (`_across`), each a generator of (field, value, what it must be): the first
is raised, so a config with several bad fields always names the same one first.
"""
from __future__ import annotations

from typing import Iterator

from edp_nlu.data import augment, loading
from edp_nlu.models.bert.choices import POOLING
from edp_nlu.models.bert.finetuning import FINETUNE, LORA_LAYOUTS, LORA_TARGETS
from edp_nlu.models.joint_loss import TAG_REDUCTIONS
from edp_nlu.models.joint_task import DECODINGS
from edp_nlu.models.label_aware_head import NAME_SOURCES
from edp_nlu.pipeline import label_selection, spec_parts
from edp_nlu.pipeline.builders import dp_config, features, microbatch_size, named_as_flags
from edp_nlu.pipeline.optimizers import OPTIMIZERS, SCHEDULES
from edp_nlu.pipeline.spec_parts import (
    DataSpec,
    ModelSpec,
    OptimizerSpec,
    PrivacySpec,
    RunWide,
    SamplingSpec,
)
from edp_tf.config import compatibility
from edp_tf.ledger import SAMPLINGS
from edp_tf.mechanism import PRIVACY_UNITS

MECHANISMS = ("sgd", "edp", "dpsgd")
MODELS = ("clc", "bert")


def check_config(config) -> None:
    """ValueError naming the first bad field as --config.<field> (a ConfigDict, or its dict)."""
    flat = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    check_parts(spec_parts.parts_of(flat))


def check_parts(parts: dict) -> None:
    """The same, on the typed parts ({part name: part}, RunSpec's fields)."""
    for field, value, allowed in problems(parts):
        raise ValueError(f"--config.{field}={value!r} is invalid: expected {allowed}")
    check_mechanism(parts)


def problems(parts: dict) -> Iterator[tuple]:
    """(field, value, what it must be) of the bad fields, each part alone, then across parts."""
    yield from _privacy(parts["privacy"])
    yield from _data(parts["data"])
    yield from _model(parts["model"])
    yield from _optimizer(parts["optimizer"])
    yield from _sampling(parts["sampling"])
    yield from _run(parts["run"])
    yield from _across(parts)


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


def _choice(field: str, value, allowed) -> Iterator[tuple]:
    if value not in allowed:
        yield field, value, allowed


def _count(field: str, value, minimum: int = 1, what: str = "") -> Iterator[tuple]:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        yield field, value, what or f"an integer >= {minimum}"


def _privacy(p: PrivacySpec) -> Iterator[tuple]:
    """The mechanism, its unit and budget, the user-level knobs, augmentation multiplicity, the
    encoder-frozen probe phase and the public subspace."""
    yield from _choice("mechanism", p.mechanism, MECHANISMS)
    yield from _choice("privacy_unit", p.privacy_unit, PRIVACY_UNITS)
    user_level = p.privacy_unit == "user"
    if user_level and p.private and p.examples_per_user < 1:
        yield "examples_per_user", p.examples_per_user, "an integer >= 1 with privacy_unit='user'"
    if p.user_weight_cap < 0 or (p.user_weight_cap and not user_level):
        yield ("user_weight_cap", p.user_weight_cap, "0 (every user weighs 1), or w_hat > 0 "
               "with privacy_unit='user'")
    copies = p.knob("augment_copies")
    yield from _count("augment_copies", copies, 1, "an integer >= 1 (1: no augmented copies)")
    # the copies are averaged inside an example's clip, which plain training does not have;
    # the private rules are edp_tf.config.compatibility's (check_mechanism)
    if copies > 1 and not p.private:
        yield ("augment_copies", copies, "1 with mechanism='sgd': augmentation multiplicity "
               "needs --mechanism=dpsgd (per-example clipping: an example's copies are one "
               "clipped micro-batch)")
    # probe_epochs < epochs is checked once epochs is resolved (training.py _probe_first)
    probe = p.probe_epochs
    if probe and (not isinstance(probe, int) or probe < 0 or not p.private):
        yield ("probe_epochs", probe, "0, or an integer >= 1 with a private mechanism (the "
               "private step freezes the encoder; plain training has no such phase)")
    if p.microbatch_size < 0:
        yield "microbatch_size", p.microbatch_size, "0 (one per replica) or k >= 1"
    if p.target_epsilon < 0:
        yield "target_epsilon", p.target_epsilon, ">= 0 (0 = use noise_multiplier)"
    if not 0 <= p.budget_reserve < 0.5:
        yield ("budget_reserve", p.budget_reserve, "in [0, 0.5): the fraction of "
               "target_epsilon held back for redoing steps a late kill lost")
    if not 0 <= p.delta < 1:
        yield "delta", p.delta, "in [0, 1) (0 = 0.1/n)"
    yield from _public_subspace(p)


def _public_subspace(p: PrivacySpec) -> Iterator[tuple]:
    source = p.public_subspace
    if not source:
        return
    if not p.private:
        yield "public_subspace", source, "'' with mechanism='sgd' (it projects the noisy update)"
    rank, examples = p.public_subspace_rank, p.public_subspace_examples
    for field, value in (("public_subspace_rank", rank), ("public_subspace_examples", examples),
                         ("public_subspace_every", p.public_subspace_every)):
        yield from _count(field, value)
    yield from _choice("public_subspace_labels", p.public_subspace_labels, ("random", "own"))
    if rank > examples:
        yield "public_subspace_rank", rank, f"at most public_subspace_examples={examples}"


def _data(d: DataSpec) -> Iterator[tuple]:
    """Augmentation and the label selection."""
    try:
        augment.parse_kinds(d.augment)
    except ValueError:
        yield "augment", d.augment, f"a comma-separated subset of {augment.KINDS}"
    for field in ("augment_word_rate", "augment_slot_rate"):
        if not 0 <= getattr(d, field) <= 1:
            yield field, getattr(d, field), "a probability in [0, 1]"
    yield from label_selection.problems(d)


def _model(m: ModelSpec) -> Iterator[tuple]:
    """The model and its heads (and `bert.*`, checked only when the model is BERT)."""
    yield from _choice("model", m.model, MODELS)
    yield from _choice("slot_loss", m.slot_loss, TAG_REDUCTIONS)
    yield from _choice("decoding", m.decoding, DECODINGS)
    if int(m.max_words) < 0:
        yield "max_words", m.max_words, "an integer >= 1, or 0 for the automatic default"
    if m.public_pretraining and m.init_from:
        yield ("public_pretraining", m.public_pretraining, "empty when init_from is given (it "
               "trains the run init_from would start from: give one of the two)")
    label_dim = m.label_head_dim
    if not isinstance(label_dim, int) or label_dim < 0:
        yield "label_head_dim", label_dim, "0 (plain heads), or an integer >= 1"
    elif (label_dim and m.model == "clc" and not m.clc.word_vectors
          and "vectors" in m.label_head_names):
        yield ("label_head_dim", label_dim, "0 when clc.word_vectors is empty (CLC reads the "
               "label names with its public word vectors; label_head_names='words' does not)")
    elif (label_dim and m.model == "bert" and not m.bert.checkpoint
          and "vectors" in m.label_head_names):
        yield ("label_head_dim", label_dim, "0 when bert.checkpoint is empty (BERT reads the "
               "label names with its pretrained encoder, and a random one reads nothing; "
               "label_head_names='words' does not need it)")
    yield from _choice("label_head_names", m.label_head_names, NAME_SOURCES)
    if m.label_head_correction not in (True, False) or (
            m.label_head_correction and not label_dim):
        yield ("label_head_correction", m.label_head_correction,
               "True only with label_head_dim > 0 (it corrects label-aware heads)")
    if not 0 <= m.head_dropout < 1:
        yield "head_dropout", m.head_dropout, "in [0, 1)"
    if not m.private_head_dropout < 1:
        yield ("private_head_dropout", m.private_head_dropout,
               "in [0, 1), or < 0 for head_dropout")
    for field in ("intent_loss_weight", "slot_loss_weight"):
        if not getattr(m, field) >= 0:
            yield field, getattr(m, field), ">= 0"
    if m.model == "bert":
        yield from _bert(m.bert)


def _bert(b) -> Iterator[tuple]:
    yield from _choice("bert.vocabulary", b.vocabulary, ("minilm", "train"))
    yield from _choice("bert.finetune", b.finetune, FINETUNE)
    yield from _choice("bert.private_finetune", b.private_finetune, FINETUNE + ("",))
    if not 0 <= b.dropout < 1:
        yield "bert.dropout", b.dropout, "in [0, 1)"
    if not b.private_dropout < 1:
        yield "bert.private_dropout", b.private_dropout, "in [0, 1), or < 0 for bert.dropout"
    yield from _choice("bert.lora_layout", b.lora_layout, LORA_LAYOUTS)
    yield from _choice("bert.lora_targets", b.lora_targets, tuple(LORA_TARGETS))
    if not (isinstance(b.frozen_layers, int) and b.frozen_layers >= 0):
        # the upper bound is the encoder's own layer count, checked once it is built
        yield "bert.frozen_layers", b.frozen_layers, "an integer >= 0"
    yield from _choice("bert.pooling", b.pooling, POOLING)
    if not isinstance(b.cut_padding, bool):
        yield "bert.cut_padding", b.cut_padding, "True or False"


def _optimizer(o: OptimizerSpec) -> Iterator[tuple]:
    yield from _choice("optimizer", o.optimizer, OPTIMIZERS)
    yield from _choice("lr_schedule", o.lr_schedule, SCHEDULES)
    if o.learning_rate < 0:
        yield "learning_rate", o.learning_rate, "> 0, or 0 for the automatic default"
    if not 0 <= o.warmup_fraction < 1:
        yield "warmup_fraction", o.warmup_fraction, "in [0, 1)"
    if not 0 <= o.ema_fraction < 1:
        yield "ema_fraction", o.ema_fraction, "in [0, 1)"
    if not o.private_ema_fraction < 1:
        yield ("private_ema_fraction", o.private_ema_fraction,
               "in [0, 1), or < 0 for ema_fraction's value")
    if not o.adam_bc_floor > 0:
        yield "adam_bc_floor", o.adam_bc_floor, "> 0"
    if not o.weight_decay >= 0:
        yield "weight_decay", o.weight_decay, ">= 0"


def _sampling(s: SamplingSpec) -> Iterator[tuple]:
    """Batch, epochs, steps and sampling rate: 0 mostly means automatic (recipes.py)."""
    yield from _choice("sampling", s.sampling, SAMPLINGS)
    for field in ("batch_size", "epochs", "steps"):
        if int(getattr(s, field)) < 0:
            yield field, getattr(s, field), "an integer >= 1, or 0 for the automatic default"
    if not 0 <= s.sampling_rate <= 1:
        yield "sampling_rate", s.sampling_rate, "in [0, 1] (0 = use batch_size)"


def _run(r: RunWide) -> Iterator[tuple]:
    if int(r.replicas) < 1:
        yield "replicas", r.replicas, "an integer >= 1"
    if not r.checkpoint_seconds >= 0:
        yield "checkpoint_seconds", r.checkpoint_seconds, ">= 0 (0 = at epochs' ends only)"
    if not (r.resume_noise_limit == 0 or r.resume_noise_limit >= 1):
        yield "resume_noise_limit", r.resume_noise_limit, "0 (no limit) or >= 1"


def _across(parts: dict) -> Iterator[tuple]:
    """The rules that join two parts: an example's rows against the copies a step takes, and a
    public corpus that must not be the private one."""
    data, privacy = parts["data"], parts["privacy"]
    copies, variants = privacy.knob("augment_copies"), data.augment_variants
    if isinstance(variants, bool) or not isinstance(variants, int) or not (
            variants == 0 or variants >= copies):
        yield ("augment_variants", variants, f"0 (= augment_copies) or an integer >= "
               f"augment_copies={copies}")
    source = privacy.public_subspace
    if source and (source == data.data_dir or (
            source != "synthetic" and not loading.is_joint_dir(source)
            and not loading.is_split_dir(source))):
        yield ("public_subspace", source, "'synthetic' or a public joint-format directory (or "
               "one split of one) other than data_dir")
