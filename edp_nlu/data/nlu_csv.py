"""NLU-Evaluation-Data (Liu et al. 2019, github.com/xliuhw/NLU-Evaluation-Data) CSV loader.

Files are semicolon-separated with a header naming at least `scenario`, `intent` and
`answer_annotation` (the cross-validation files use
`answerid;scenario;intent;answer_annotation;answer_from_anno;answer_from_user`; the single
annotated file's longer header works too, since columns are found by name). Entities are
inline in the annotation: `wake me up at [time : five am] [date : tomorrow]`.

* intent = `<scenario>_<intent>`; tokens = the annotation without its brackets, split with
  `str.split()` and lower-cased (SNIPS and ATIS are lower-case too); entity words get
  `B-<type>`/`I-<type>`, everything else `O`. Spacing around `[`, `:` and `]` may vary
  (`[currency_name:euro]` occurs in the real data).
* Given splits: a directory with `train/` (or `trainset/`) and `test/` (or `testset/`) and
  optionally `dev/` (`valid/`, `devset/`), each searched recursively for `.csv` files (the
  KFold folders keep their test files in `testset/csv/`). Without a dev split, dev is carved
  from train with the seeded ratio.
* Otherwise (one file, or a directory whose own `.csv` files are pooled, not recursively):
  a seeded split by `ratios`, stratified by intent so rare intents reach every split.

Malformed rows raise `DataFormatError` naming the file and the line; no row is skipped.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import os
import random
from typing import Sequence

from edp_nlu.data.corpus import OUTSIDE, DataFormatError, Splits, Utterance

REQUIRED_COLUMNS = ("scenario", "intent", "answer_annotation")
USER_COLUMNS = ("userid",)  # optional: who spoke it (the full annotated file has it)
SPLIT_DIR_NAMES = {
    "train": ("train", "trainset"),
    "dev": ("dev", "valid", "devset"),
    "test": ("test", "testset"),
}


def parse_annotation(annotation: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Tokens and BIO tags of an inline annotation; ValueError (no text quoted) if malformed."""
    tokens: list[str] = []
    tags: list[str] = []

    def outside(text: str) -> None:
        if "]" in text:
            raise ValueError(f"']' without '[' near character {position + text.index(']') + 1}")
        words = text.lower().split()
        tokens.extend(words)
        tags.extend([OUTSIDE] * len(words))

    position = 0
    while position < len(annotation):
        start = annotation.find("[", position)
        if start < 0:
            outside(annotation[position:])
            break
        outside(annotation[position:start])
        end = annotation.find("]", start)
        if end < 0:
            raise ValueError(f"'[' at character {start + 1} is never closed")
        inner = annotation[start + 1:end]
        if "[" in inner:
            raise ValueError(f"nested '[' inside the entity at character {start + 1}")
        slot_type, colon, words_text = inner.partition(":")
        slot_type, words = slot_type.strip(), words_text.lower().split()
        if not colon:
            raise ValueError(f"entity at character {start + 1} has no ':'")
        if not slot_type or len(slot_type.split()) != 1:
            raise ValueError(f"entity at character {start + 1} has no one-word type")
        if not words:
            raise ValueError(f"entity {slot_type!r} at character {start + 1} has no words")
        tokens.extend(words)
        tags.extend([f"B-{slot_type}"] + [f"I-{slot_type}"] * (len(words) - 1))
        position = end + 1
    if not tokens:
        raise ValueError("annotation has no tokens")
    return tuple(tokens), tuple(tags)


def _decoded(path: str) -> str:
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataFormatError(path, line, f"bytes are not valid UTF-8 ({error.reason})") from None


def read_nlu_csv(path: str | os.PathLike) -> tuple[Utterance, ...]:
    """All rows of one NLU-Evaluation-Data CSV file, in file order."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataFormatError(path, None, "file is missing")
    reader = csv.reader(io.StringIO(_decoded(path), newline=""), delimiter=";")
    header = next(reader, None)
    if header is None:
        raise DataFormatError(path, None, "file is empty")
    header = [name.strip() for name in header]
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise DataFormatError(path, 1, f"header lacks columns {missing} (has {header})")
    column = {name: header.index(name) for name in REQUIRED_COLUMNS + USER_COLUMNS
              if name in header}
    utterances = []
    line = 1
    for row in reader:
        line = reader.line_num
        if len(row) != len(header):
            raise DataFormatError(
                path, line, f"{len(row)} fields, the header has {len(header)} (blank line or "
                "an unquoted ';'?)")
        scenario, intent = row[column["scenario"]].strip(), row[column["intent"]].strip()
        if len(scenario.split()) != 1 or len(intent.split()) != 1:
            raise DataFormatError(path, line, "scenario and intent must be single words")
        try:
            tokens, tags = parse_annotation(row[column["answer_annotation"]])
        except ValueError as error:
            raise DataFormatError(path, line, f"answer_annotation: {error}") from None
        user = row[column["userid"]].strip() or None if "userid" in column else None
        utterances.append(Utterance(tokens, tags, f"{scenario}_{intent}", user))
    if not utterances:
        raise DataFormatError(path, line, "file has a header but no rows")
    return tuple(utterances)


def _csv_files(directory: str, recursive: bool) -> list[str]:
    if not recursive:
        names = sorted(n for n in os.listdir(directory) if n.lower().endswith(".csv"))
        return [os.path.join(directory, n) for n in names
                if os.path.isfile(os.path.join(directory, n))]
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        found.extend(os.path.join(root, n) for n in sorted(files) if n.lower().endswith(".csv"))
    return found


def _split_dirs(directory: str) -> dict[str, str]:
    dirs = {}
    for split, names in SPLIT_DIR_NAMES.items():
        for name in names:
            if os.path.isdir(os.path.join(directory, name)):
                dirs[split] = os.path.join(directory, name)
                break
    return dirs


def is_nlu_csv(path: str | os.PathLike) -> bool:
    """True for a `.csv` file, a directory of them, or a directory of split folders of them."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path.lower().endswith(".csv")
    if not os.path.isdir(path):
        return False
    if _csv_files(path, recursive=False):
        return True
    dirs = _split_dirs(path)
    return "train" in dirs and bool(_csv_files(dirs["train"], recursive=True))


def _read_all(paths: Sequence[str], where: str) -> tuple[Utterance, ...]:
    if not paths:
        raise DataFormatError(where, None, "no .csv files found")
    return tuple(u for path in paths for u in read_nlu_csv(path))


def _check_ratios(ratios: Sequence[float]) -> tuple[float, float, float]:
    if len(ratios) != 3 or any(not 0 <= r <= 1 for r in ratios) or ratios[0] <= 0:
        raise ValueError(f"ratios must be (train > 0, dev >= 0, test >= 0), got {ratios}")
    if abs(sum(ratios) - 1) > 1e-6:
        raise ValueError(f"ratios must sum to 1, got {ratios} (sum {sum(ratios)})")
    return tuple(float(r) for r in ratios)


def split_by_ratio(utterances: Sequence[Utterance], seed: int,
                   ratios: Sequence[float]) -> tuple[tuple[Utterance, ...], ...]:
    """A seeded (train, dev, test) split, stratified by intent; train keeps >= 1 per intent."""
    _, dev_ratio, test_ratio = _check_ratios(ratios)
    by_intent: dict[str, list[Utterance]] = {}
    for utterance in utterances:
        by_intent.setdefault(utterance.intent, []).append(utterance)
    rng = random.Random(seed)
    train, dev, test = [], [], []
    for intent in sorted(by_intent):
        group = by_intent[intent]
        rng.shuffle(group)
        n_test = int(len(group) * test_ratio + 0.5)
        n_dev = int(len(group) * dev_ratio + 0.5)
        n_test = min(n_test, len(group) - 1)
        n_dev = min(n_dev, len(group) - 1 - n_test)
        test.extend(group[:n_test])
        dev.extend(group[n_test:n_test + n_dev])
        train.extend(group[n_test + n_dev:])
    for part in (train, dev, test):
        rng.shuffle(part)
    return tuple(train), tuple(dev), tuple(test)


def load_nlu_eval_csv(path: str | os.PathLike, seed: int = 0,
                      ratios: Sequence[float] = (0.8, 0.1, 0.1)) -> Splits:
    """Loads NLU-Evaluation-Data from a CSV file or directory (see the module docstring).

    `Splits.source` says whether the files had a `userid` column (user-level privacy needs it).
    """
    splits = _load(path, seed, ratios)
    users = sum(u.user is not None for part in (splits.train, splits.dev, splits.test)
                for u in part)
    note = ("users from the userid column" if users else
            "no userid column: user-level privacy is not available for this data")
    return dataclasses.replace(splits, source=f"{splits.source}; {note}")


def _load(path, seed: int, ratios) -> Splits:
    path = os.fspath(path)
    ratios = _check_ratios(ratios)
    if not os.path.exists(path):
        raise DataFormatError(path, None, "data path does not exist")
    source = f"NLU-Evaluation-Data CSV: {os.path.abspath(path)}"
    dirs = _split_dirs(path) if os.path.isdir(path) else {}
    if dirs and not _csv_files(path, recursive=False):
        for required in ("train", "test"):
            if required not in dirs:
                names = "/ or ".join(SPLIT_DIR_NAMES[required])
                raise DataFormatError(path, None, f"split folders given but no {names}/")
        read = {split: _read_all(_csv_files(d, recursive=True), d) for split, d in dirs.items()}
        if "dev" in read:
            return Splits(read["train"], read["dev"], read["test"], source + " (given splits)")
        train_share = ratios[0] / (ratios[0] + ratios[1])
        train, dev, _ = split_by_ratio(read["train"], seed, (train_share, 1 - train_share, 0.0))
        return Splits(train, dev, read["test"],
                      f"{source} (given train/test; dev carved from train, seed {seed})")
    files = [path] if os.path.isfile(path) else _csv_files(path, recursive=False)
    train, dev, test = split_by_ratio(_read_all(files, path), seed, ratios)
    return Splits(train, dev, test, f"{source} (seeded split, seed {seed}, ratios {ratios})")
