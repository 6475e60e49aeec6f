"""The typed parts of a run's spec (edp_nlu/pipeline/run_spec.py): one frozen dataclass per
part of the experiment config (edp_nlu/configs/base.py), read by the builders that need it.

Why a module of their own: the builders take these parts (`builders.poisson_sampler(data,
privacy, ...)`), and `RunSpec.parse` calls `validation.check_config`; the parts sit below both,
so neither imports the other's module. `parts_of` builds them from a config's fields without
checking a value (`RunSpec.parse` checks them, part by part: edp_nlu/pipeline/validation.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Tuple

from edp_nlu.configs.base import dp_knob_defaults


@dataclasses.dataclass(frozen=True)
class ClcSpec:
    word_vectors: str
    vocabulary_size: int
    train_word_embeddings: bool
    lstm_units: int
    num_lstm_layers: int
    char_embedding_dim: int
    char_filters: int
    max_word_length: int
    dropout: float


@dataclasses.dataclass(frozen=True)
class BertSpec:
    checkpoint: str
    vocabulary: str
    sequence_length: int
    num_layers: int
    num_heads: int
    hidden_dim: int
    intermediate_dim: int
    dropout: float
    finetune: str
    lora_rank: int
    lora_alpha: float
    lora_layout: str
    lora_targets: str
    lora_freeze_a: bool
    frozen_layers: int
    pooling: str
    cut_padding: bool
    private_finetune: str
    private_dropout: float


@dataclasses.dataclass(frozen=True)
class DataSpec:
    data_dir: str
    data_seed: int
    label_schema: str
    label_selection: str
    label_selection_noise: float
    label_selection_max_labels: int
    label_selection_delta_share: float
    synthetic_size: int
    synthetic_canaries: int
    synthetic_canary_repeats: int
    augment: str
    augment_word_rate: float
    augment_slot_rate: float
    augment_variants: int
    train_fraction: float


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    model: str
    max_words: int
    init_from: str
    public_pretraining: str
    head_dropout: float
    private_head_dropout: float
    label_head_dim: int
    label_head_names: str
    label_head_correction: bool
    slot_loss: str
    decoding: str
    intent_loss_weight: float
    slot_loss_weight: float
    clc: ClcSpec
    bert: BertSpec


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    optimizer: str
    learning_rate: float
    private_learning_rate: float
    lr_schedule: str
    warmup_fraction: float
    weight_decay: float
    ema_fraction: float
    private_ema_fraction: float
    adam_bc_floor: float
    noise_filter: str


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    sampling: str
    batch_size: int
    sampling_rate: float
    epochs: int
    steps: int
    private_sampling_rate: float
    private_steps: int


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
    mechanism: str
    target_epsilon: float
    budget_reserve: float
    delta: float
    microbatch_size: int
    privacy_unit: str
    examples_per_user: int
    user_weight_cap: float
    probe_epochs: int
    public_subspace: str
    public_subspace_rank: int
    public_subspace_examples: int
    public_subspace_every: int
    public_subspace_labels: str
    knobs: Tuple[Tuple[str, Any], ...]  # edp_tf.DPConfig's knobs, by name (configs/base.py)

    @property
    def private(self) -> bool:
        return self.mechanism != "sgd"

    def knob(self, name: str) -> Any:
        return dict(self.knobs)[name]


@dataclasses.dataclass(frozen=True)
class RunWide:
    name: str
    replicas: int
    seed: int
    diagnostics: bool
    checkpoint_seconds: float
    resume_noise_limit: float


PARTS = {"data": DataSpec, "model": ModelSpec, "optimizer": OptimizerSpec,
         "sampling": SamplingSpec, "privacy": PrivacySpec, "run": RunWide}
NESTED = {"clc": ClcSpec, "bert": BertSpec}


def parts_of(flat: Mapping[str, Any]) -> dict:
    """{part name: part} of a config's fields (every field present; values taken as they are)."""
    knobs = tuple((name, flat[name]) for name in dp_knob_defaults())
    parts = {}
    for part, part_cls in PARTS.items():
        values = {}
        for f in dataclasses.fields(part_cls):
            if f.name == "knobs":
                values["knobs"] = knobs
            elif f.name in NESTED:
                values[f.name] = NESTED[f.name](**flat[f.name])
            else:
                values[f.name] = flat[f.name]
        parts[part] = part_cls(**values)
    return parts


def flat_fields(part) -> dict:
    """A part's fields as the config names them (its knobs by their DPConfig names)."""
    out = {}
    for key, value in dataclasses.asdict(part).items():
        if key == "knobs":
            out.update(dict(value))
        else:
            out[key] = value
    return out
