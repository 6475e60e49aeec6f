"""Augmented copies of training utterances, for augmentation multiplicity (De et al. 2022).

A private per-example run with `--config.augment_copies=K` clips each example once over the mean
loss of K rows: the example and augmentations of it (edp_tf DPConfig.augment_copies). Two kinds,
each with tags kept aligned to the words and BIO well-formed:

* "mask": each word outside the slots (tag O) becomes `MASK_TOKEN` with probability
  `word_rate` (word dropout: the model learns intents and slot boundaries from the rest);
* "substitute": each slot whose type has a public filler is replaced with probability
  `slot_rate` by another value of that type, tagged B-<type> I-<type> ... for its own length.

Why only the utterance itself and public data: a copy is part of its example's contribution, so
whatever the copies are, adding or removing the example moves the clipped sum by at most C, and
epsilon is unchanged. A filler taken from another training utterance would make one example's
copies depend on another example, two micro-batches would change, and the sensitivity would not
be C. The fillers are the synthetic generator's (edp_nlu/data/synthetic.py, in this repository),
found by slot-type name, never values read from a corpus.

The copies need no secret randomness (their bound on the sum does not depend on it): each
example's copies come from its own `random.Random` seeded by the run's key and the example's
index, so a fixed seed reproduces them. Pure Python: no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Optional, Sequence

from edp_nlu.data import synthetic
from edp_nlu.data.corpus import OUTSIDE, Utterance

KINDS = ("mask", "substitute")
# What a masked word becomes: a zero-width space, which both models encode as their unknown word
# (CLC: word [UNK], char [UNK]; BERT: a word with no word piece becomes [UNK]), where a string
# like "[UNK]" is split by BERT's tokenizer into four pieces. It is not whitespace (str.split
# keeps it), so the token stays one word.
MASK_TOKEN = "\u200b"

Filler = Callable[[random.Random], str]


def _either(*names: str) -> Filler:
    return lambda rng: synthetic.SLOT_GENERATORS[rng.choice(names)](rng)


# Slot-type names of public corpora whose values the synthetic generator's fillers cover, by the
# name alone (ATIS's "fromloc.city_name" is looked up as "city_name"): SNIPS's city and
# timeRange, ATIS's city names, times, dates, day and month names.
ALIASES: dict[str, Filler] = {
    "city_name": synthetic.SLOT_GENERATORS["city"],
    "timeRange": _either("date", "time"),
    "day_name": lambda rng: rng.choice(synthetic.WEEKDAYS),
    "month_name": lambda rng: rng.choice(synthetic.MONTHS),
}


def filler(slot_type: str) -> Optional[Filler]:
    """The public filler of a slot type: the synthetic generator's of that name, an alias, or
    None (the slot is never substituted)."""
    for name in (slot_type, slot_type.rpartition(".")[2]):
        if name in synthetic.SLOT_GENERATORS:
            return synthetic.SLOT_GENERATORS[name]
        if name in ALIASES:
            return ALIASES[name]
    return None


def parse_kinds(text: str) -> tuple[str, ...]:
    """"mask,substitute" -> ("mask", "substitute"); ValueError naming an unknown kind."""
    kinds = tuple(k.strip() for k in str(text).split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"augmentation kinds must be a comma-separated subset of {KINDS}, "
                         f"got {text!r}")
    return tuple(dict.fromkeys(kinds))


def spans(tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """(start, end, type) of each slot: a B-<type>, or an I-<type> that does not continue one,
    followed by the I-<type> that continue it."""
    found: list[tuple[int, int, str]] = []
    for i, tag in enumerate(tags):
        if tag == OUTSIDE:
            continue
        prefix, _, slot_type = tag.partition("-")
        if prefix == "I" and found and found[-1][1] == i and found[-1][2] == slot_type:
            found[-1] = (found[-1][0], i + 1, slot_type)
        else:
            found.append((i, i + 1, slot_type))
    return found


@dataclasses.dataclass(frozen=True)
class Augmenter:
    """Makes one augmented copy of an utterance (`__call__`) with the kinds asked for."""

    kinds: tuple[str, ...] = KINDS
    word_rate: float = 0.15  # probability that a word outside the slots is masked
    slot_rate: float = 0.5  # probability that a slot with a public filler gets another value
    mask_token: str = MASK_TOKEN

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", parse_kinds(",".join(self.kinds)))
        for name in ("word_rate", "slot_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")

    def __call__(self, utterance: Utterance, rng: random.Random) -> Utterance:
        tokens, tags = list(utterance.tokens), list(utterance.tags)
        if "substitute" in self.kinds:
            for start, end, slot_type in reversed(spans(tags)):  # right to left: indices hold
                fill = filler(slot_type)
                if fill is None or rng.random() >= self.slot_rate:
                    continue
                words = fill(rng).split()
                tokens[start:end] = words
                tags[start:end] = [f"B-{slot_type}"] + [f"I-{slot_type}"] * (len(words) - 1)
        if "mask" in self.kinds:
            tokens = [self.mask_token if tag == OUTSIDE and rng.random() < self.word_rate
                      else token for token, tag in zip(tokens, tags)]
        return dataclasses.replace(utterance, tokens=tuple(tokens), tags=tuple(tags))


def example_rng(key: int, index: int) -> random.Random:
    """The random stream of example `index`'s copies in the run keyed `key` (a string seed:
    hashed by SHA-512, the same on every machine and Python run)."""
    return random.Random(f"edp-tf augment {key} {index}")


def with_copies(utterances: Sequence[Utterance], variants: int, augmenter: Augmenter,
                key: int) -> tuple[Utterance, ...]:
    """len(utterances) x `variants` utterances, each example's consecutive: the example itself,
    then variants - 1 augmentations of it (the rows edp_tf's AugmentedPoissonSampler groups)."""
    if isinstance(variants, bool) or not isinstance(variants, int) or variants < 1:
        raise ValueError(f"variants must be an integer >= 1, got {variants!r}")
    out: list[Utterance] = []
    for index, utterance in enumerate(utterances):
        rng = example_rng(key, index)
        out.append(utterance)
        out.extend(augmenter(utterance, rng) for _ in range(variants - 1))
    return tuple(out)
