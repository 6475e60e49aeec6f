"""`RunSpec`: a run's config as frozen, typed parts, validated once and resolved once.

    spec = RunSpec.parse(config)        # every field checked (named as --config.<field>)
    spec = spec.resolved(n)             # the automatic fields for n training units
    builders.build_model(spec.model, ...), builders.poisson_sampler(spec.data, spec.privacy, ...)

Each builder takes only the parts it reads (the parts are defined in spec_parts.py, below the
builders, and re-exported here).

Each field of the experiment config (edp_nlu/configs/base.py) belongs to exactly one part:
`data`, `model`, `optimizer`, `sampling`, `privacy` or `run`; the mechanism's knobs are
`privacy.knobs` (edp_tf.DPConfig's names). A part is immutable: what a run decides later (the
chunk size of its clipping) makes a new spec (`with_knobs`), never an edit. config.json holds
`to_dict()`, and `upgrade_saved_config` is the one place that knows what runs written before a
field existed used instead.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from edp_nlu.configs.base import base_config, dp_knob_defaults
from edp_nlu.pipeline import recipes, validation
from edp_nlu.pipeline.spec_parts import (  # noqa: F401 (the parts, named by run_spec's readers)
    NESTED,
    PARTS,
    BertSpec,
    ClcSpec,
    DataSpec,
    ModelSpec,
    OptimizerSpec,
    PrivacySpec,
    RunWide,
    SamplingSpec,
    flat_fields,
    parts_of,
)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    data: DataSpec
    model: ModelSpec
    optimizer: OptimizerSpec
    sampling: SamplingSpec
    privacy: PrivacySpec
    run: RunWide

    @classmethod
    def parse(cls, config) -> "RunSpec":
        """The spec of an experiment config (a ConfigDict or its dict), every field checked
        once: a ValueError names the first bad one as --config.<field>."""
        config = _as_config(config)
        _refuse_unknown_or_missing(config.to_dict())
        validation.check_config(config)
        return cls.of_checked(config)

    @classmethod
    def of_checked(cls, config) -> "RunSpec":
        """The spec of a config checked before: a resolved copy of a parsed one, or a run's
        config.json (read through `upgrade_saved_config`), whose run checked it when it
        started (a check now could refuse what was valid then, e.g. a moved public corpus)."""
        flat = _as_config(config).to_dict()
        _refuse_unknown_or_missing(flat)
        return cls(**parts_of(flat))

    def resolved(self, n: int) -> "RunSpec":
        """The spec with the automatic fields (0) filled for n training units (privacy units),
        and a private run's private_ fields in the places they stand for: the parts that change
        are `dataclasses.replace`d (recipes.resolve_parts), nothing is parsed again."""
        return RunSpec(**recipes.resolve_parts(self.parts(), n))

    def with_knobs(self, **knobs: Any) -> "RunSpec":
        """A copy with these DPConfig knobs changed (what the run decides once it knows its
        batches, e.g. the chunk size of its clipping), the mechanism's rules checked again."""
        unknown = set(knobs) - set(dict(self.privacy.knobs))
        if unknown:
            raise ValueError(f"not DPConfig knobs of a run: {sorted(unknown)}")
        merged = tuple((name, knobs.get(name, value)) for name, value in self.privacy.knobs)
        spec = dataclasses.replace(self, privacy=dataclasses.replace(self.privacy, knobs=merged))
        validation.check_mechanism(spec.parts())
        return spec

    def parts(self) -> dict:
        """{part name: part}."""
        return {part: getattr(self, part) for part in PARTS}

    def to_dict(self) -> dict:
        """The experiment config's fields (what config.json holds), nested as the config is."""
        out = {}
        for part in PARTS:
            out.update(flat_fields(getattr(self, part)))
        return out

    def to_config(self) -> ml_collections.ConfigDict:
        """The spec as an experiment ConfigDict (for what still reads one)."""
        return ml_collections.ConfigDict(self.to_dict())


def _as_config(config) -> ml_collections.ConfigDict:
    if isinstance(config, ml_collections.ConfigDict):
        return config
    return ml_collections.ConfigDict(dict(config))


def _known_fields() -> dict:
    """{field: None, or its nested fields} of every part."""
    known = {}
    for part_cls in PARTS.values():
        for f in dataclasses.fields(part_cls):
            if f.name == "knobs":
                known.update(dict.fromkeys(dp_knob_defaults()))
            elif f.name in NESTED:
                known[f.name] = {g.name for g in dataclasses.fields(NESTED[f.name])}
            else:
                known[f.name] = None
    return known


def _refuse_unknown_or_missing(flat: Mapping[str, Any]) -> None:
    known = _known_fields()
    for key in sorted(set(flat) | set(known)):
        if key not in known:
            raise ValueError(f"--config.{key} is not a field of the experiment config "
                             "(edp_nlu/configs/base.py lists them)")
        if key not in flat:
            raise ValueError(f"--config.{key} is missing: a config starts from "
                             "edp_nlu.configs.base.base_config() (a saved one is read with "
                             "run_spec.upgrade_saved_config)")
        nested = known[key]
        if nested is not None:
            for inner in sorted(set(flat[key]) ^ nested):
                raise ValueError(f"--config.{key}.{inner} is "
                                 + ("missing" if inner in nested else "not a field"))


# What a run whose config.json predates a field used in its place (the code's fallback then):
# the only place old defaults live. A field missing from this table and from a saved config
# takes base_config's value (it was not read by the run, or its default never changed).
OLD_DEFAULTS = {
    "privacy_unit": "example",
    "augment_copies": 1,
    "augment_variants": 0,
    "user_weight_cap": 0.0,
    "decoding": "viterbi",  # runs before the field decoded without the BIO constraint
    "head_dropout": 0.1,
    "private_head_dropout": -1.0,
    "probe_epochs": 0,
    "public_subspace": "",
    "ema_fraction": 0.0,
    "private_ema_fraction": -1.0,
    "adam_bc_floor": 1.0,
    "init_from": "",
    "public_pretraining": "",
    "label_selection": "training",  # before private selection, labels came from the split
    "bert": {"private_finetune": "", "private_dropout": -1.0, "lora_layout": "per_head",
             "lora_targets": "all", "lora_freeze_a": False, "frozen_layers": 0,
             "pooling": "cls"},
}


def upgrade_saved_config(saved: Mapping[str, Any]) -> dict:
    """A config.json's "config" with every field of today's config: a field it lacks gets what
    runs before that field used (OLD_DEFAULTS), else base_config's value."""
    out = base_config().to_dict()
    for key, value in OLD_DEFAULTS.items():
        if isinstance(value, dict):
            out[key].update(value)
        else:
            out[key] = value
    for key, value in saved.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out
