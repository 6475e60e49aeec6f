"""The corpus types every loader shares (no loader imports another's module for them).

Pure Python: no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from edp_nlu.models.labels import OUTSIDE_TAG as OUTSIDE
from edp_nlu.models.labels import UNKNOWN_INTENT  # noqa: F401 (re-exported for the loaders)


@dataclasses.dataclass(frozen=True)
class Utterance:
    """One annotated utterance: tokens, one BIO tag per token, an intent, and the user who spoke
    it when the corpus knows (the unit of user-level privacy)."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    intent: str
    user: str | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.tags):
            raise ValueError(
                f"Utterance has {len(self.tokens)} tokens but {len(self.tags)} tags")


@dataclasses.dataclass(frozen=True)
class Splits:
    """A corpus split three ways.

    `source` describes where the data came from (a path or a generator and its seed; never
    utterance text). `canaries` are utterances planted (repeated) in `train` for membership
    tests, and `canary_controls` utterances drawn from the same distribution but placed in no
    split: the attack's non-member reference. Both are empty for real corpora.
    """

    train: tuple[Utterance, ...]
    dev: tuple[Utterance, ...]
    test: tuple[Utterance, ...]
    source: str = ""
    canaries: tuple[Utterance, ...] = ()
    canary_controls: tuple[Utterance, ...] = ()


class DataFormatError(ValueError):
    """A data file is malformed; `path` and `line` (1-based, or None) say where."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str):
        self.path = os.fspath(path)
        self.line = line
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {message}")


def bio_error(tags: Sequence[str]) -> str | None:
    """Why `tags` is not well-formed BIO, or None when it is.

    Well-formed: every tag is `O`, `B-<type>` or `I-<type>`, and `I-<type>` only follows
    `B-<type>` or `I-<type>` of the same type (the strict reading; CoNLL's lenient reading,
    used for *predictions* in metrics, would start a new chunk instead).
    """
    previous = OUTSIDE
    for position, tag in enumerate(tags):
        if tag != OUTSIDE:
            prefix, _, slot_type = tag.partition("-")
            if prefix not in ("B", "I") or not slot_type:
                return f"token {position + 1}: tag {tag!r} is not O, B-<type> or I-<type>"
            if prefix == "I" and previous not in (f"B-{slot_type}", f"I-{slot_type}"):
                return f"token {position + 1}: {tag!r} follows {previous!r}"
        previous = tag
    return None
