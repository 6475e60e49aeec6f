"""Intent and slot-tag vocabularies, and the report of what encoding had to drop or map to unknown.

Label names are schema (public); they are the only vocabulary here built from the training split.
Id 0 is reserved in both: the tag "O" (also used under padding, where the CRF mask ignores it) and
the intent "[UNK]" for an intent never seen in training (it then always counts as an error).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

OUTSIDE_TAG = "O"
UNKNOWN_INTENT = "[UNK]"


@dataclasses.dataclass(frozen=True)
class LabelVocabulary:
    """An ordered label list; `unknown` (id 0) receives labels missing from it."""

    labels: tuple[str, ...]

    def __post_init__(self):
        if not self.labels:
            raise ValueError("LabelVocabulary needs at least the reserved label at id 0")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("LabelVocabulary labels must be unique")
        object.__setattr__(self, "_index", {label: i for i, label in enumerate(self.labels)})

    @property
    def unknown(self) -> str:
        return self.labels[0]

    def __len__(self) -> int:
        return len(self.labels)

    def id(self, label: str) -> int:
        return self._index.get(label, 0)

    def __contains__(self, label: str) -> bool:
        return label in self._index

    def to_config(self) -> list[str]:
        return list(self.labels)

    @classmethod
    def from_config(cls, labels: Sequence[str]) -> "LabelVocabulary":
        return cls(tuple(labels))


def label_vocabularies(tags, intents, overrides: dict) -> tuple[LabelVocabulary, LabelVocabulary]:
    """(tag, intent) vocabularies: `overrides["tag_vocabulary"]` / `["intent_vocabulary"]` (popped;
    a LabelVocabulary or a label sequence, e.g. a trainer's vocabulary) or built from the labels."""
    result = []
    for key, labels, build in (
        ("tag_vocabulary", tags, build_tag_vocabulary),
        ("intent_vocabulary", intents, build_intent_vocabulary),
    ):
        given = overrides.pop(key, None)
        if given is None:
            result.append(build(labels))
        elif isinstance(given, LabelVocabulary):
            result.append(given)
        else:
            result.append(LabelVocabulary(tuple(given)))
    return result[0], result[1]


def build_tag_vocabulary(tag_sequences: Iterable[Sequence[str]]) -> LabelVocabulary:
    """'O' first, then the other tags sorted (deterministic, independent of data order)."""
    tags = {t for seq in tag_sequences for t in seq}
    for tag in tags:
        if tag != OUTSIDE_TAG and not (tag.startswith("B-") or tag.startswith("I-")):
            raise ValueError(f"tag {tag!r} is not BIO: expected 'O', 'B-<slot>' or 'I-<slot>'")
    tags.discard(OUTSIDE_TAG)
    return LabelVocabulary((OUTSIDE_TAG, *sorted(tags)))


def bio_transitions(tags: Sequence[str]) -> tuple[list[bool], list[list[bool]]]:
    """(allowed first tags, allowed[previous][next]) of well-formed BIO over the tag list `tags`.

    `I-X` may only follow `B-X` or `I-X`, so it may not start a sequence; everything else is
    allowed. Why decoders want it: a CRF trained under DP noise learns its transition scores
    poorly, and Viterbi then emits `O I-X` or `B-X I-Y`, which the CoNLL chunking rule reads as
    wrong or split slots. The rule comes from the tag names alone (public), so decoding with it
    is post-processing: it costs no privacy.
    """
    for tag in tags:
        if tag != OUTSIDE_TAG and not (tag[:2] in ("B-", "I-") and len(tag) > 2):
            raise ValueError(f"tag {tag!r} is not BIO: expected 'O', 'B-<slot>' or 'I-<slot>'")
    start = [may_follow(None, tag) for tag in tags]
    transitions = [[may_follow(before, tag) for tag in tags] for before in tags]
    return start, transitions


def may_follow(before: str | None, tag: str) -> bool:
    """Whether BIO allows `tag` right after `before` (None: at the start of the sequence)."""
    return not tag.startswith("I-") or (
        before is not None and before != OUTSIDE_TAG and before[2:] == tag[2:])


def is_well_formed_bio(tags: Sequence[str]) -> bool:
    """Whether every tag of the sequence may follow the one before it (`may_follow`)."""
    return all(may_follow(tags[i - 1] if i else None, tag) for i, tag in enumerate(tags))


def build_intent_vocabulary(intents: Iterable[str]) -> LabelVocabulary:
    """'[UNK]' first, then the intents sorted."""
    names = set(intents)
    names.discard(UNKNOWN_INTENT)
    return LabelVocabulary((UNKNOWN_INTENT, *sorted(names)))


@dataclasses.dataclass
class EncodingReport:
    """Counts (never text) of what a preprocessor truncated or mapped to unknown ids."""

    utterances: int = 0
    words: int = 0
    truncated_utterances: int = 0  # utterances that lost words to the length limit
    truncated_words: int = 0  # words dropped by the length limit
    unknown_words: int = 0  # words mapped to the unknown word / word-piece id
    unknown_tags: int = 0  # tags absent from the tag vocabulary (encoded as 'O')
    unknown_intents: int = 0  # intents absent from the intent vocabulary (encoded as '[UNK]')

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def encode_labels(
    tags: Sequence[Sequence[str]] | None,
    intents: Sequence[str] | None,
    tag_vocab: LabelVocabulary,
    intent_vocab: LabelVocabulary,
    report: EncodingReport,
) -> tuple[list[list[int]] | None, list[int] | None]:
    """Maps tag / intent strings to ids, counting unknowns in `report`."""
    tag_ids = None
    if tags is not None:
        tag_ids = []
        for seq in tags:
            ids = [tag_vocab.id(t) for t in seq]
            report.unknown_tags += sum(1 for t in seq if t not in tag_vocab)
            tag_ids.append(ids)
    intent_ids = None
    if intents is not None:
        intent_ids = [intent_vocab.id(i) for i in intents]
        report.unknown_intents += sum(1 for i in intents if i not in intent_vocab)
    return tag_ids, intent_ids


def check_lengths(tokens: Sequence[Sequence[str]], tags, intents) -> None:
    """ValueError naming the utterance index when tags / intents do not line up with tokens."""
    if tags is not None:
        if len(tags) != len(tokens):
            raise ValueError(f"got {len(tokens)} token lists but {len(tags)} tag lists")
        for i, (tok, tag) in enumerate(zip(tokens, tags)):
            if len(tok) != len(tag):
                raise ValueError(f"utterance {i}: {len(tok)} tokens but {len(tag)} tags")
    if intents is not None and len(intents) != len(tokens):
        raise ValueError(f"got {len(tokens)} token lists but {len(intents)} intents")
    for i, tok in enumerate(tokens):
        if isinstance(tok, str):
            raise ValueError(
                f"utterance {i}: expected a list of tokens, got a string (split it first)"
            )
