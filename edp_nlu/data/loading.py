"""Joint IC/NER data: the one entry point that loads every corpus (`load_data`), the standard
joint-format loader, and `conform` (maps dev/test labels a model's vocabularies lack). The
corpus types are in edp_nlu/data/corpus.py; the one label vocabulary class is
edp_nlu.models.labels'.

The joint format (SNIPS, ATIS as in Goo et al. 2018 / JointBERT) is a directory holding
`train/`, `dev/` (or `valid/`) and `test/`, each with three line-aligned files:
`seq.in` (tokens), `seq.out` (one BIO tag per token) and `label` (the intent).

Loaders are strict on purpose: a malformed file raises `DataFormatError` (a `ValueError`)
naming the file and the line, and nothing is silently dropped, because a quietly misaligned
corpus trains a model that looks fine and is wrong. Error messages name files, line numbers,
positions and label names, never utterance text (it may be private).

Pure Python: no TensorFlow, so loading and testing stay fast.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import random
from typing import Iterable, Sequence

from edp_nlu.data import nlu_csv, synthetic
from edp_nlu.data.corpus import (  # noqa: F401
    OUTSIDE,
    UNKNOWN_INTENT,
    DataFormatError,
    Splits,
    Utterance,
    bio_error,
)
from edp_nlu.models.labels import LabelVocabulary

_log = logging.getLogger(__name__)
DEV_DIR_NAMES = ("dev", "valid")  # JointBERT says `dev`, SlotGated-SLU says `valid`.
JOINT_FILES = ("seq.in", "seq.out", "label")


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, without line ends; errors name the file and line.

    A missing file, undecodable bytes, an empty file and blank lines are errors: a blank line
    would otherwise shift or drop an utterance silently.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataFormatError(path, None, "file is missing")
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataFormatError(path, line, f"bytes are not valid UTF-8 ({error.reason})") from None
    # Split on LF only (CRLF tolerated): str.splitlines() would also split on U+2028, U+0085
    # and form feeds inside a line, silently misaligning the line-aligned files.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataFormatError(path, None, "file is empty")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise DataFormatError(path, number, "line is blank")
    return lines


def load_joint_split(split_dir: str | os.PathLike) -> tuple[Utterance, ...]:
    """Reads one split directory (`seq.in`, `seq.out`, `label`) of the joint format."""
    split_dir = os.fspath(split_dir)
    if not os.path.isdir(split_dir):
        raise DataFormatError(split_dir, None, "split directory is missing")
    paths = {name: os.path.join(split_dir, name) for name in JOINT_FILES}
    columns = {name: read_lines(path) for name, path in paths.items()}
    counts = {name: len(lines) for name, lines in columns.items()}
    if len(set(counts.values())) != 1:
        # Blame the file that disagrees with the other two (the longest if all differ), at the
        # first line that has no partner.
        tally = collections.Counter(counts.values())
        odd = [name for name, count in counts.items() if tally[count] == 1]
        culprit = odd[0] if len(odd) == 1 else max(counts, key=counts.get)
        raise DataFormatError(
            paths[culprit], min(counts.values()) + 1,
            f"line counts differ: {counts}; seq.in, seq.out and label must be line-aligned")
    utterances = []
    for number, (text, tag_line, label) in enumerate(
            zip(columns["seq.in"], columns["seq.out"], columns["label"]), start=1):
        tokens, tags = tuple(text.split()), tuple(tag_line.split())
        if len(tokens) != len(tags):
            raise DataFormatError(
                paths["seq.out"], number,
                f"{len(tags)} tags for {len(tokens)} tokens in seq.in line {number}")
        problem = bio_error(tags)
        if problem:
            raise DataFormatError(paths["seq.out"], number, f"bad BIO: {problem}")
        intent = label.strip()
        if len(intent.split()) != 1:
            raise DataFormatError(paths["label"], number, "intent label contains whitespace")
        utterances.append(Utterance(tokens, tags, intent))
    return tuple(utterances)


def _dev_dir(path: str) -> str:
    for name in DEV_DIR_NAMES:
        if os.path.isdir(os.path.join(path, name)):
            return os.path.join(path, name)
    raise DataFormatError(path, None, f"no dev split: expected one of {DEV_DIR_NAMES}/")


def load_joint_dir(path: str | os.PathLike) -> Splits:
    """Loads `path/{train,dev,test}/{seq.in,seq.out,label}` (`valid/` accepted for `dev/`).

    Multi-intent labels such as ATIS's `atis_flight#atis_airfare` are kept as one label string,
    as in JointBERT and the published ATIS results.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DataFormatError(path, None, "data directory is missing")
    return Splits(
        train=load_joint_split(os.path.join(path, "train")),
        dev=load_joint_split(_dev_dir(path)),
        test=load_joint_split(os.path.join(path, "test")),
        source=f"joint format: {os.path.abspath(path)}",
    )


def is_joint_dir(path: str | os.PathLike) -> bool:
    """True when `path/train/seq.in` exists (the joint-format signature)."""
    return os.path.isfile(os.path.join(os.fspath(path), "train", "seq.in"))


def is_split_dir(path: str | os.PathLike) -> bool:
    """One split of a joint-format corpus: seq.in (with seq.out and label) directly inside."""
    return os.path.isfile(os.path.join(path, "seq.in"))


def load_data(data_dir: str | os.PathLike | None, seed: int = 0, synthetic_size: int = 3000,
              synthetic_canaries: int = 0, synthetic_canary_repeats: int = 10) -> Splits:
    """Loads a corpus, detecting its format (the one entry point for every corpus).

    * None or "": the built-in synthetic smart-home corpus (`edp_nlu.data.synthetic`, `seed`, of
      `synthetic_size` utterances, with `synthetic_canaries` planted canaries);
    * a directory with `train/seq.in`: the joint format;
    * a `.csv` file, or a directory holding `.csv` files: NLU-Evaluation-Data
      (`edp_nlu.data.nlu_csv`; `seed` fixes the train/dev/test split when none is given).
    """
    if data_dir is None or os.fspath(data_dir) == "":
        return synthetic.synthetic_corpus(seed=seed, size=synthetic_size,
                                          canaries=synthetic_canaries,
                                          canary_repeats=synthetic_canary_repeats)
    data_dir = os.fspath(data_dir)
    if is_joint_dir(data_dir):
        return load_joint_dir(data_dir)
    if nlu_csv.is_nlu_csv(data_dir):
        return nlu_csv.load_nlu_eval_csv(data_dir, seed=seed)
    if not os.path.exists(data_dir):
        raise DataFormatError(data_dir, None, "data path does not exist")
    raise DataFormatError(
        data_dir, None,
        "unrecognised data: expected a joint-format directory (train/seq.in, seq.out, label), "
        "an NLU-Evaluation-Data .csv file or a directory of them")


# The training subset's seed: public and fixed, so that a fraction names one subset whoever runs
# it, and a smaller fraction's subset lies inside a larger one's (one permutation, cut short).
TRAIN_SUBSET_SEED = "edp-tf train subset 0"


def subset_train(splits: Splits, fraction: float) -> Splits:
    """`splits` with round(fraction x n) of its n training utterances, in their order; dev and
    test whole. Why: a learning curve (how much data a private run needs) must train on the same
    subset at every run of a fraction, and a run's n (its delta, its sampling rate) is the
    subset's. The subset depends on `fraction` and n alone (TRAIN_SUBSET_SEED), never on the
    run's seed. A corpus with planted canaries is refused below 1: cutting their copies would
    change what the membership test measures."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not (
            0 < fraction <= 1):
        raise ValueError(f"--config.train_fraction={fraction!r} is invalid: expected a number "
                         "in (0, 1] (1 = the whole training split)")
    if fraction == 1:
        return splits
    if splits.canaries:
        raise ValueError("--config.train_fraction < 1 with planted canaries: the subset would "
                         "drop some of their copies; set --config.synthetic_canaries=0")
    n = len(splits.train)
    keep = max(1, round(fraction * n))
    order = list(range(n))
    random.Random(TRAIN_SUBSET_SEED).shuffle(order)
    kept = sorted(order[:keep])
    return dataclasses.replace(
        splits, train=tuple(splits.train[i] for i in kept),
        source=f"{splits.source}, train subset {keep} of {n} ({TRAIN_SUBSET_SEED!r})")


@dataclasses.dataclass(frozen=True)
class UnseenCounts:
    """What `conform` changed in one split (label names only, no text)."""

    split: str
    utterances: int
    tokens: int
    remapped_tag_tokens: int  # Tokens whose tag changed: unseen, or an I-X repaired after it.
    unknown_intent_utterances: int
    unseen_tags: tuple[str, ...]  # Distinct tags absent from train.
    unseen_intents: tuple[str, ...]  # Distinct intents absent from train.

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def without_training_users(splits: Splits) -> tuple[Splits, int]:
    """(splits whose dev and test hold no utterance of a training user, rows dropped).

    At user level epsilon protects a user's whole data, yet dev and test metrics are released
    unnoised: a training user's dev or test rows would feed them. Corpora split by row (a CSV
    with a userid column split by ratio) lose those rows from dev and test; the synthetic
    corpus has its own speakers per split and loses none."""
    users = {u.user for u in splits.train}
    dev = tuple(u for u in splits.dev if u.user not in users)
    test = tuple(u for u in splits.test if u.user not in users)
    dropped = len(splits.dev) + len(splits.test) - len(dev) - len(test)
    return dataclasses.replace(splits, dev=dev, test=test), dropped


def conform(utterances: Sequence[Utterance], tags: LabelVocabulary, intents: LabelVocabulary,
            split: str) -> tuple[tuple[Utterance, ...], UnseenCounts]:
    """Maps dev/test labels the label vocabularies lack, and logs the counts (never text).

    Unseen tags become `O` (an `I-X` left without its `B-X` starts the chunk, or becomes `O`),
    unseen intents `UNKNOWN_INTENT`. Score models against the *original* references, so that
    unseen labels still count as errors.
    """
    conformed, changed_tokens, changed_intents = [], 0, 0
    unseen_tags, unseen_intents = collections.Counter(), collections.Counter()
    for utterance in utterances:
        new_tags, changed = _conform_tags(utterance.tags, tags)
        changed_tokens += changed
        unseen_tags.update(t for t in utterance.tags if t not in tags)
        intent = utterance.intent
        if intent not in intents or intent == UNKNOWN_INTENT:
            unseen_intents[intent] += 1
            changed_intents += 1
            intent = UNKNOWN_INTENT
        conformed.append(Utterance(utterance.tokens, new_tags, intent))
    counts = UnseenCounts(
        split=split, utterances=len(conformed),
        tokens=sum(len(u.tokens) for u in conformed),
        remapped_tag_tokens=changed_tokens, unknown_intent_utterances=changed_intents,
        unseen_tags=tuple(sorted(unseen_tags)), unseen_intents=tuple(sorted(unseen_intents)))
    if changed_tokens or changed_intents:
        _log.warning(
            "%s: %d of %d tokens had tags unseen in train (mapped to O: %s); "
            "%d of %d utterances had intents unseen in train (mapped to %s: %s)",
            split, changed_tokens, counts.tokens, ", ".join(counts.unseen_tags) or "-",
            changed_intents, counts.utterances, UNKNOWN_INTENT,
            ", ".join(counts.unseen_intents) or "-")
    return tuple(conformed), counts


def _conform_tags(tags: Sequence[str], vocabulary: LabelVocabulary) -> tuple[tuple[str, ...], int]:
    conformed = []
    changed = 0
    for tag in tags:
        new = tag if tag in vocabulary else OUTSIDE
        previous = conformed[-1] if conformed else OUTSIDE
        if new.startswith("I-") and previous not in ("B-" + new[2:], new):
            begin = "B-" + new[2:]  # Its predecessor was unseen: start the chunk here.
            new = begin if begin in vocabulary else OUTSIDE
        changed += new != tag
        conformed.append(new)
    return tuple(conformed), changed


def slot_types_of(utterances: Iterable[Utterance]) -> set[str]:
    return {tag[2:] for u in utterances for tag in u.tags if tag != OUTSIDE}


def describe(splits: Splits) -> dict:
    """Corpus statistics without any utterance text (for logs, reports and `config.json`)."""
    parts = {"train": splits.train, "dev": splits.dev, "test": splits.test}
    stats = {"source": splits.source}
    for name, utterances in parts.items():
        stats[name] = {
            "utterances": len(utterances),
            "distinct_utterances": len({u.tokens for u in utterances}),
            "tokens": sum(len(u.tokens) for u in utterances),
            "max_tokens": max((len(u.tokens) for u in utterances), default=0),
            "intents": len({u.intent for u in utterances}),
            "slot_types": len(slot_types_of(utterances)),
            "tags": len({t for u in utterances for t in u.tags}),
        }
    everything = [u for utterances in parts.values() for u in utterances]
    stats["all"] = {
        "intents": len({u.intent for u in everything}),
        "slot_types": len(slot_types_of(everything)),
        "tags": len({t for u in everything for t in u.tags}),
    }
    stats["canaries"] = len(splits.canaries)
    return stats
