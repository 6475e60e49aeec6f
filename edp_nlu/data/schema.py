"""The label schema: which intents and slot types a model has, decided before seeing training data.

Why: the label sets are sized into the output layers and exported with the model. Built from the
training split, they reveal any label that only training utterances carry (remove the one
utterance with a rare intent and the model changes), which no epsilon covers. A schema published
with the data (or written by whoever defines the task) is public; one derived from the training
split is reported in the ledger's `not_covered`.

Sources, in order: `--config.label_schema=<file>`; `schema.json` in the data directory; JointBERT's
`intent_label.txt` + `slot_label.txt` (SNIPS and ATIS ship them); the synthetic corpus's generator;
else the training split: selected with DP in a private run (edp_nlu/pipeline/label_selection.py,
`selection` records how; covered by epsilon), taken as it is otherwise (not covered).

schema.json: {"intents": ["...", ...], "slot_types": ["...", ...]}
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable, Optional, Sequence

from edp_nlu.models.labels import OUTSIDE_TAG as OUTSIDE
from edp_nlu.models.labels import UNKNOWN_INTENT, LabelVocabulary

SCHEMA_FILE = "schema.json"
_RESERVED = {"UNK", "PAD", "[UNK]", "[PAD]", OUTSIDE}


@dataclasses.dataclass(frozen=True)
class LabelSchema:
    """The label sets and where they come from. `from_training_data`: taken from the training
    split as they are (outside epsilon). `selection`: chosen from the training split by DP
    partition selection, its parameters (edp_tf.partition_selection.GaussianThresholding's
    to_dict()); such a schema is covered by the run's epsilon, which charges the selection."""

    intents: tuple
    slot_types: tuple
    source: str
    from_training_data: bool = False
    selection: Optional[dict] = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        for name in ("intents", "slot_types"):
            values = tuple(getattr(self, name))
            bad = [v for v in values if not isinstance(v, str) or not v.strip() or " " in v]
            if bad:
                raise ValueError(f"label schema ({self.source}): {name} must be non-empty "
                                 f"strings without spaces, got {bad[:3]}")
            if len(set(values)) != len(values):
                raise ValueError(f"label schema ({self.source}): {name} contain duplicates")
            object.__setattr__(self, name, values)
        if not self.intents:
            raise ValueError(f"label schema ({self.source}): no intents")
        if self.from_training_data and self.selection is not None:
            raise ValueError("a label schema is either taken from the training split as it is "
                             "or selected from it privately, not both")

    @property
    def tags(self) -> tuple:
        """'O', then B-/I- of every slot type."""
        return (OUTSIDE,) + tuple(f"{p}-{s}" for s in self.slot_types for p in ("B", "I"))

    @property
    def tag_vocabulary(self) -> LabelVocabulary:
        """The tags' ids as the model and its export use them."""
        return LabelVocabulary(self.tags)

    @property
    def intent_vocabulary(self) -> LabelVocabulary:
        """`UNKNOWN_INTENT` at id 0, then the intents. No training example has id 0, except,
        with privately selected labels, the utterances whose intent was not selected."""
        return LabelVocabulary((UNKNOWN_INTENT, *self.intents))

    def to_dict(self) -> dict:
        return {"intents": list(self.intents), "slot_types": list(self.slot_types)}


def _lines(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f.read().split("\n") if line.strip()]


def read_schema_file(path: str) -> LabelSchema:
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"label schema {path}: {error}") from error
    if not isinstance(content, dict) or set(content) != {"intents", "slot_types"}:
        raise ValueError(f"label schema {path}: expected an object with exactly the keys "
                         "'intents' and 'slot_types'")
    return LabelSchema(tuple(content["intents"]), tuple(content["slot_types"]), path)


def read_data_dir_schema(data_dir: str) -> Optional[LabelSchema]:
    """schema.json, else JointBERT's label files, in a data directory; None if neither."""
    if not os.path.isdir(data_dir):
        return None
    path = os.path.join(data_dir, SCHEMA_FILE)
    if os.path.isfile(path):
        return read_schema_file(path)
    intent_file = os.path.join(data_dir, "intent_label.txt")
    slot_file = os.path.join(data_dir, "slot_label.txt")
    if os.path.isfile(intent_file) and os.path.isfile(slot_file):
        intents = [i for i in _lines(intent_file) if i not in _RESERVED]
        types, bad = [], []
        for tag in _lines(slot_file):
            if tag in _RESERVED:
                continue
            if tag[:2] not in ("B-", "I-") or len(tag) < 3:
                bad.append(tag)
            elif tag[2:] not in types:
                types.append(tag[2:])
        if bad:
            raise ValueError(f"{slot_file}: tags must be O, B-<type> or I-<type>, got {bad[:3]}")
        return LabelSchema(tuple(intents), tuple(types), f"{intent_file} + {slot_file}")
    return None


def schema_from_training_data(train: Iterable) -> LabelSchema:
    intents, types = set(), set()
    for u in train:
        intents.add(u.intent)
        types.update(t[2:] for t in u.tags if t != OUTSIDE)
    intents.discard(UNKNOWN_INTENT)
    return LabelSchema(tuple(sorted(intents)), tuple(sorted(types)), "the training split",
                       from_training_data=True)


def write_schema(path: str, schema: LabelSchema) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(schema.to_dict(), f, indent=2)


def origin_sentence(schema: LabelSchema) -> str:
    """Where the label sets come from, in one sentence for privacy.json."""
    if schema.selection is not None:
        s = schema.selection
        return (
            f"The label sets ({len(schema.intents)} intents, {len(schema.slot_types)} slot types) "
            "were selected from the training split with differential privacy (Gaussian "
            "thresholding, edp_tf/partition_selection.py): each training "
            f"{s.get('unit', 'example')} counts towards at most {s['max_partitions']} of its "
            "labels (its intents and slot types, a random subset when it has more), each label's "
            f"count gets Gaussian noise of std {s['noise_stddev']:g}, and the labels whose noisy "
            f"count exceeds {s['threshold']:.4g} are kept. Charged as the extra event "
            f"'{s.get('event', 'label_selection')}' (noise multiplier "
            f"{s['effective_noise_multiplier']:.4g}, delta {s['delta']:.3g} spent from the run's "
            f"delta). Utterances of unselected intents train the {UNKNOWN_INTENT} intent; tags "
            f"of unselected slot types are {OUTSIDE}.")
    if schema.from_training_data:
        return ("The label sets were taken from the training split as they are: epsilon does not "
                "cover them.")
    return f"The label sets come from a schema: {schema.source}."


def not_covered(schema: LabelSchema) -> Sequence[str]:
    if not schema.from_training_data:
        return []
    return ["The intent and slot label sets were derived from the training split and are sized "
            "into the output layers and exported (preprocessor.json, the SavedModel): a label that "
            "only training utterances carry is revealed. Epsilon does not cover the label sets; "
            "give a schema (--config.label_schema or schema.json in the data directory), or let "
            "a private run select them with DP (--config.label_selection=private, the "
            "default)."]
