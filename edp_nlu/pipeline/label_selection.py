"""The run's label sets when it is given no schema: selected from the training split with DP.

Why: a model's output layers are sized by its intents and slot types, and the label names are
exported with it (preprocessor.json, the SavedModel). Taken from the training split as they are,
they reveal any label that only training utterances carry, and no epsilon covers them: on a user's
own corpus (`--data_dir=<CSV>`, no schema) the default run was not private. A private run now
selects them by Gaussian thresholding (edp_tf/partition_selection.py): every label with enough
training examples is kept with overwhelming probability, rare ones are dropped, and the selection
is charged to the run's ledger as the extra event "label_selection" (its Gaussian part composed
with the steps, its threshold's delta spent from the run's delta). Target-epsilon calibration
counts it, so the run still ends at or below its target.

What a privacy unit contributes: its intent and the slot types it tags (all of a user's, at user
level), at most `label_selection_max_labels` of them, a random subset when it has more. Training
utterances whose intent was not selected train the `[UNK]` intent (id 0, the class dev and test
utterances with an intent unseen in training already map to), and tags of unselected slot types
become `O`: the same mapping `loading.conform` applies to dev and test, and the dataset size, the
sampling rate and the steps do not change. Scores still count such utterances against their
original labels.

Which source a run takes (`--config.label_selection`): a given schema always wins and costs
nothing; otherwise "private" (the default) selects with DP in a private run and takes the
training split's labels in plain training (nothing to protect there), "training" takes them as they
are (reported as not covered: the run is not private), "schema" refuses to run without a schema.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Optional

from edp_nlu.data import schema as schema_lib
from edp_nlu.data import synthetic
from edp_nlu.data.corpus import OUTSIDE, UNKNOWN_INTENT
from edp_nlu.pipeline.spec_parts import DataSpec
from edp_tf import accounting
from edp_tf.ledger import FILENAME
from edp_tf.partition_selection import GaussianThresholding, select_partitions

_log = logging.getLogger(__name__)

CHOICES = ("private", "training", "schema")
EVENT_NAME = "label_selection"
SOURCE = "the training split, selected with DP partition selection"


def problems(data: DataSpec):
    """(field, value, what it must be) of bad label-selection fields (edp_nlu/pipeline/
    validation.py raises the first)."""
    if data.label_selection not in CHOICES:
        yield "label_selection", data.label_selection, CHOICES
        return
    if data.label_selection != "private":
        return
    if not data.label_selection_noise > 0:
        yield ("label_selection_noise", data.label_selection_noise, "> 0 (the noise std, in "
               "examples)")
    m = data.label_selection_max_labels
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        yield "label_selection_max_labels", m, "an integer >= 1"
    if not 0 < data.label_selection_delta_share < 1:
        yield ("label_selection_delta_share", data.label_selection_delta_share, "in (0, 1)")


def given_schema(data: DataSpec) -> Optional[schema_lib.LabelSchema]:
    """A label schema the run is given, or None: `--config.label_schema`, then schema.json or
    JointBERT's label files in the data directory, then the synthetic corpus's generator
    (edp_nlu/data/schema.py). A given schema always wins and costs no privacy."""
    if data.label_schema:
        return schema_lib.read_schema_file(data.label_schema)
    if not data.data_dir:
        return synthetic.label_schema()
    return schema_lib.read_data_dir_schema(data.data_dir)


def selects_privately(data: DataSpec, private: bool) -> bool:
    """Whether a new run selects its labels with DP: `private`, no schema given."""
    return private and data.label_selection == "private" and given_schema(data) is None


def mechanism(data: DataSpec, delta: float) -> GaussianThresholding:
    """The selection's Gaussian thresholding: the data part's noise and label bound, its
    threshold spending `label_selection_delta_share` of the run's `delta`."""
    return GaussianThresholding.for_delta(float(data.label_selection_noise),
                                          int(data.label_selection_max_labels),
                                          float(data.label_selection_delta_share) * delta)


def contributions(train, users=None) -> list:
    """One list of labels per privacy unit: ("intent", name) and ("slot", type) of each
    utterance, or of all of a user's utterances when `users` (the user of each row) is given.
    `[UNK]` is no label: it is the unknown class whatever the data says."""
    def labels(u) -> list:
        own = [] if u.intent == UNKNOWN_INTENT else [("intent", u.intent)]
        return own + [("slot", t[2:]) for t in u.tags if t != OUTSIDE]

    if users is None:
        return [labels(u) for u in train]
    by_user: dict = {}
    for u, user in zip(train, users):
        by_user.setdefault(user, []).extend(labels(u))
    return list(by_user.values())


def select(data: DataSpec, train, users, delta: float,
           seed: Optional[int]) -> schema_lib.LabelSchema:
    """The label schema a DP partition selection over `train` releases (module docstring).

    `seed`: None for OS entropy; the run's fixed seed (the run is then not private anyway), or a
    secret key the workers of one run share. ValueError, naming the way out, when no intent is
    kept (too few training examples for this noise)."""
    selector = mechanism(data, delta)
    kept = select_partitions(contributions(train, users), selector, seed)
    intents = tuple(sorted(name for kind, name in kept if kind == "intent"))
    slot_types = tuple(sorted(name for kind, name in kept if kind == "slot"))
    unit = "user" if users is not None else "example"
    if not intents:
        raise ValueError(
            "private label selection kept no intent: no intent has enough training "
            f"{unit}s to pass the threshold {selector.threshold:.3g} (noise std "
            f"{selector.noise_stddev:g}). Give a label schema (--config.label_schema or "
            "schema.json in the data directory), or lower --config.label_selection_noise "
            "(at a higher privacy cost of the selection)")
    _log.info("labels selected with DP: %d intents, %d slot types (noise std %g, threshold "
              "%.3g, at most %d labels per %s)", len(intents), len(slot_types),
              selector.noise_stddev, selector.threshold, selector.max_partitions, unit)
    return schema_lib.LabelSchema(intents, slot_types, SOURCE, selection=dict(
        selector.to_dict(), unit=unit, event=EVENT_NAME))


def event(labels: schema_lib.LabelSchema) -> Optional[accounting.ExtraEvent]:
    """The extra event the ledger charges for a privately selected schema (None otherwise)."""
    s = labels.selection
    if s is None:
        return None
    selector = GaussianThresholding(s["noise_stddev"], s["threshold"], s["max_partitions"])
    return selector.extra_event(s.get("event", EVENT_NAME))


def restrict(train, labels: schema_lib.LabelSchema) -> tuple:
    """`train` with unselected intents mapped to `[UNK]` and tags of unselected slot types to
    `O` (B- and I- of a type are kept or dropped together, so BIO stays well formed)."""
    intents, tags = set(labels.intents), set(labels.tags)
    return tuple(dataclasses.replace(
        u, intent=u.intent if u.intent in intents else UNKNOWN_INTENT,
        tags=tuple(t if t in tags else OUTSIDE for t in u.tags)) for u in train)


def resumed(run_dir: str) -> Optional[schema_lib.LabelSchema]:
    """The privately selected schema a run directory's label_schema.json records, else None.
    A resumed run keeps its labels (its checkpoints are sized by them) and is not charged again
    (see `charged`)."""
    saved = _read_json(os.path.join(run_dir, "label_schema.json"))
    if not saved.get("selection"):
        return None
    return schema_lib.LabelSchema(tuple(saved["intents"]), tuple(saved["slot_types"]),
                                  saved.get("source", SOURCE), selection=saved["selection"])


def charged(run_dir: str, name: str = EVENT_NAME) -> bool:
    """Whether the run directory's ledger already charges an extra event `name` (a run resumed
    after its first epoch began); a run that stopped before leaves it to be charged now."""
    ledger = _read_json(os.path.join(run_dir, FILENAME))
    return any(e.get("name") == name for e in ledger.get("extra_events", []))


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)
