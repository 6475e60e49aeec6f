"""Token lists to model arrays, and the row helpers every consumer of those arrays shares.

Why in data/: the trainers, the scorers and the experiments all encode utterances the same way
(counts logged, never text), and the scorers sit beside the trainers, not above them; so the
encoding lives below both and none imports the other for it.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import numpy as np

from edp_nlu.data import augment

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainingCopies:
    """How `encode` expands the training split into each example's augmented copies."""

    variants: int  # V rows per example: the example, then V - 1 augmentations
    augmenter: augment.Augmenter
    key: int  # the run's augmentation key: its fixed seed, else OS entropy


@dataclasses.dataclass
class Encoded:
    x: dict
    y: dict
    report: dict


def encode(preprocessor, utterances, split: str, log_counts: bool = True,
           copies: Optional[TrainingCopies] = None) -> Encoded:
    """Token lists -> model inputs; logs only counts (truncations, unknowns), never text, and
    those only with `log_counts` (the training split of a private run: see
    `training_counts_in_logs`). With `copies` (the training split's: `training_copies`) each
    utterance is encoded as its rows of augmented copies."""
    if copies is not None:
        _log.info("%s: each of %d examples as %d rows (itself and %d augmented copies: %s)",
                  split, len(utterances), copies.variants, copies.variants - 1,
                  ", ".join(copies.augmenter.kinds))
        utterances = augment.with_copies(utterances, copies.variants, copies.augmenter,
                                         copies.key)
    x, y, report = preprocessor.encode(
        [u.tokens for u in utterances], [u.tags for u in utterances],
        [u.intent for u in utterances])
    report = report.as_dict()
    if log_counts and report.get("truncated_utterances"):
        _log.warning("%s: %d utterances truncated to the model's length (%d words dropped)",
                     split, report["truncated_utterances"], report["truncated_words"])
    return Encoded(x, y, report)


def rows(x: dict) -> int:
    return int(len(next(iter(x.values()))))


def subset(arrays: dict, index: np.ndarray) -> dict:
    return {k: v[index] for k, v in arrays.items()}
