"""What privacy costs each class: intent accuracy and slot-type F1 against training frequency.

Per intent: accuracy on the utterances whose reference intent it is (recall: correct / test
support), and precision (correct / utterances predicted with it). Per slot type: span-level
precision, recall and F1, a slot being right only when its type and both boundaries match
(`metrics.slot_spans`, the CoNLL chunking that SER and slot F1 use), so the per-type counts add up
to the micro slot F1 of `metrics.evaluate`. F1 is `2 correct / (support + predicted)`: the harmonic
mean of P and R where both exist, 0 when a type is referenced but never predicted (or the reverse).

Each class carries its training frequency: the utterances of an intent, the slots (spans) of a
type, in the training split. These are unnoised statistics of the training data. When that data
is private they are not covered by any epsilon: the report says so (`DIAGNOSTIC`) and nothing of
it belongs in a run's privacy statement.

Buckets of training frequency, `<20`, `20-99`, `100-499`, `>=500`, follow what one noisy step
sees of a class. Per-example DP-SGD adds noise of std `z C` per coordinate to the sum of a Poisson
batch that holds on average `q m` clipped gradients (each of norm at most `C`) of a class with `m`
training examples. At the recipes' q = 0.16 and epsilon 8 (z about 1.4 on SNIPS and ATIS) a class
under 20 examples brings at most about 3 gradients to a step, 20-99 about 3-16, 100-499 16-80,
and 500 or more 80 and up: roughly factor-five steps in the class's share of each noisy sum. The
same edges keep the buckets populated on the corpora at hand:
ATIS's 21 training intent labels run from 1 to 3,309 examples and 28 of its 79 slot types have
fewer than 20; SNIPS's 7 intents have about 1,850 each and its 39 slot types 100 or more. DP-SGD
is known to cost rare classes most (Bagdasaryan et al. 2019); the buckets show whether it does
here.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Iterable, Optional, Sequence

from edp_nlu.scoring import metrics as metrics_lib

DIAGNOSTIC = ("diagnostic: not a DP release (per-class training counts are unnoised statistics "
              "of the training split, not covered by epsilon)")

# (label, lowest training count, highest + 1 or None)
BUCKETS: tuple[tuple[str, int, Optional[int]], ...] = (
    ("<20", 0, 20), ("20-99", 20, 100), ("100-499", 100, 500), (">=500", 500, None))

# Thresholds of `losses`, explained in its docstring.
MIN_GAP = 0.10
MIN_SUPPORT = 5

INTENT, SLOT = "intent", "slot"

READ_AS_SHOWN = 3  # the most frequent readings `class_table` shows of a class's wrong ones


def bucket_of(train_count: int) -> str:
    """The frequency bucket (a label of `BUCKETS`) of a class seen `train_count` times."""
    if train_count < 0:
        raise ValueError(f"a training count cannot be negative, got {train_count}")
    for label, low, high in BUCKETS:
        if train_count >= low and (high is None or train_count < high):
            return label
    raise AssertionError("BUCKETS cover every count")  # pragma: no cover


@dataclasses.dataclass(frozen=True)
class ClassScore:
    """One intent or slot type on one split: counts and the scores they give."""

    kind: str  # INTENT or SLOT
    name: str
    train_count: int  # utterances (intent) or slots (slot type) in the training split
    support: int  # reference utterances / slots in the scored split
    predicted: int  # predicted utterances / slots in the scored split
    correct: int
    # What its references that were not right were read as, most often first: ((label, count),
    # ...); see `class_scores`. Why: a rare class under DP is mostly read as a frequent sibling
    # ("arrive_time.end_time" as "arrive_time.time"), which its score alone does not say.
    read_as: tuple = ()

    @property
    def bucket(self) -> str:
        return bucket_of(self.train_count)

    @property
    def precision(self) -> Optional[float]:
        return self.correct / self.predicted if self.predicted else None

    @property
    def recall(self) -> Optional[float]:
        return self.correct / self.support if self.support else None

    @property
    def f1(self) -> Optional[float]:
        total = self.support + self.predicted
        return 2 * self.correct / total if total else None

    @property
    def score(self) -> Optional[float]:
        """The headline metric: accuracy (recall) for an intent, F1 for a slot type. None when
        the scored split has no reference of the class."""
        if not self.support:
            return None
        return self.recall if self.kind == INTENT else self.f1

    def to_json(self) -> dict:
        return dict(kind=self.kind, name=self.name, train_count=self.train_count,
                    bucket=self.bucket, support=self.support, predicted=self.predicted,
                    correct=self.correct, precision=self.precision, recall=self.recall,
                    f1=self.f1, score=self.score, read_as=[list(p) for p in self.read_as])


def training_counts(intents: Iterable[str],
                    tags: Iterable[Sequence[str]]) -> dict[tuple[str, str], int]:
    """{(kind, name): count} over a training split: utterances per intent, spans per slot type."""
    counts: collections.Counter = collections.Counter()
    for intent in intents:
        counts[(INTENT, intent)] += 1
    for sequence in tags:
        for slot_type, _, _ in metrics_lib.slot_spans(sequence):
            counts[(SLOT, slot_type)] += 1
    return dict(counts)


def class_scores(ref_intents: Sequence[str], ref_tags: Sequence[Sequence[str]],
                 hyp_intents: Sequence[str], hyp_tags: Sequence[Sequence[str]],
                 train_counts: dict[tuple[str, str], int]) -> list[ClassScore]:
    """Per-intent and per-slot-type scores, one per class seen in training, the references or
    the predictions; intents first, then slot types, each by name.

    Each class's `read_as` counts what its references that were not right became: for an
    intent, the intent predicted instead; for a slot type, the type of the predicted span that
    overlaps the reference span most (the earliest of equals; the class's own name when only the
    boundaries are wrong), or "O" when no predicted span overlaps it (the slot was missed)."""
    if not (len(ref_intents) == len(ref_tags) == len(hyp_intents) == len(hyp_tags)):
        raise ValueError("references and hypotheses must have one entry per utterance")
    support: collections.Counter = collections.Counter()
    predicted: collections.Counter = collections.Counter()
    correct: collections.Counter = collections.Counter()
    read_as: dict = collections.defaultdict(collections.Counter)
    for ref_intent, ref, hyp_intent, hyp in zip(ref_intents, ref_tags, hyp_intents, hyp_tags):
        if len(ref) != len(hyp):
            raise ValueError(f"a reference has {len(ref)} tags, its hypothesis {len(hyp)}")
        support[(INTENT, ref_intent)] += 1
        predicted[(INTENT, hyp_intent)] += 1
        correct[(INTENT, ref_intent)] += ref_intent == hyp_intent
        if ref_intent != hyp_intent:
            read_as[(INTENT, ref_intent)][hyp_intent] += 1
        ref_spans = collections.Counter(metrics_lib.slot_spans(ref))
        hyp_spans = collections.Counter(metrics_lib.slot_spans(hyp))
        for span, n in (ref_spans - hyp_spans).items():
            read_as[(SLOT, span[0])][_overlapping_type(span, hyp_spans)] += n
        for span, n in ref_spans.items():
            support[(SLOT, span[0])] += n
        for span, n in hyp_spans.items():
            predicted[(SLOT, span[0])] += n
        for span, n in (ref_spans & hyp_spans).items():
            correct[(SLOT, span[0])] += n
    keys = set(train_counts) | set(support) | set(predicted)
    return [ClassScore(kind, name, train_counts.get((kind, name), 0), support[(kind, name)],
                       predicted[(kind, name)], correct[(kind, name)],
                       tuple(sorted(read_as[(kind, name)].items(), key=lambda p: (-p[1], p[0]))))
            for kind, name in sorted(keys, key=lambda k: (k[0] != INTENT, k[1]))]


def _overlapping_type(span: tuple, predicted: Iterable[tuple]) -> str:
    """The type of the predicted span sharing most positions with `span` (type, start, end),
    the earliest of equals; "O" when none overlaps."""
    best, best_overlap = metrics_lib.OUTSIDE, 0
    for other in sorted(predicted, key=lambda p: (p[1], p[2], p[0])):
        overlap = min(span[2], other[2]) - max(span[1], other[1])
        if overlap > best_overlap:
            best, best_overlap = other[0], overlap
    return best


@dataclasses.dataclass(frozen=True)
class ClassGap:
    """One class scored by two models on the same split: `gap = reference - run` (positive when
    the run, e.g. the private model, does worse than the reference, e.g. plain training)."""

    run: ClassScore
    reference: ClassScore

    @property
    def gap(self) -> Optional[float]:
        if self.run.score is None or self.reference.score is None:
            return None
        return self.reference.score - self.run.score

    @property
    def gap_se(self) -> Optional[float]:
        """A rough standard error of the gap: two binomial proportions on `support` trials,
        treated as independent (the models are scored on the same utterances, so it errs large)."""
        if self.gap is None:
            return None
        a, b, n = self.run.score, self.reference.score, self.run.support
        return math.sqrt((a * (1 - a) + b * (1 - b)) / n)

    def loses(self, min_gap: float = MIN_GAP, min_support: int = MIN_SUPPORT) -> bool:
        return (self.gap is not None and self.run.support >= min_support
                and self.gap >= min_gap - 1e-12)

    def to_json(self) -> dict:
        r = self.run
        return dict(kind=r.kind, name=r.name, train_count=r.train_count, bucket=r.bucket,
                    support=r.support, run=self.run.to_json(), reference=self.reference.to_json(),
                    gap=self.gap, gap_se=self.gap_se, loses=self.loses())


def compare(run: Sequence[ClassScore], reference: Sequence[ClassScore]) -> list[ClassGap]:
    """Pairs the classes of two reports on the same split of the same data (each class's
    training count and support must agree); a class one report lacks counts as never predicted."""
    by_key = {(s.kind, s.name): s for s in reference}
    mine = {(s.kind, s.name): s for s in run}
    gaps = []
    for key in list(mine) + [k for k in by_key if k not in mine]:
        a = mine.get(key) or dataclasses.replace(by_key[key], predicted=0, correct=0)
        b = by_key.get(key) or dataclasses.replace(a, predicted=0, correct=0)
        if (a.train_count, a.support) != (b.train_count, b.support):
            raise ValueError(f"{key[0]} {key[1]!r}: the two reports disagree on its training "
                             f"count or support ({a.train_count}/{a.support} against "
                             f"{b.train_count}/{b.support}): not the same data and split")
        gaps.append(ClassGap(a, b))
    gaps.sort(key=lambda g: (g.run.kind != INTENT, g.run.name))
    return gaps


def losses(gaps: Sequence[ClassGap], min_gap: float = MIN_GAP,
           min_support: int = MIN_SUPPORT) -> list[ClassGap]:
    """The classes the run loses against the reference, largest gap first.

    A class is lost when its score (intent accuracy, slot-type F1) falls by at least `min_gap`
    (0.10 absolute) on at least `min_support` (5) test references. Why these: for CLC at epsilon 8
    the whole model loses 0.035 (SNIPS) and 0.10 (ATIS) of intent accuracy and about 0.09 of slot
    F1 on both (results/snips, results/atis), so a class that loses 0.10 or more pays at least
    what the model pays on average, and one of its utterances in ten is newly wrong, which a user
    notices. Under 5 references one utterance moves a score by more than 0.2, so a gap there is
    mostly chance. These screen; they are not a significance test (one run per model): `gap_se`
    says how far each gap stands from noise.
    """
    lost = [g for g in gaps if g.loses(min_gap, min_support)]
    return sorted(lost, key=lambda g: (-g.gap, g.run.kind, g.run.name))


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:  # ties share their mean rank
            ranks[i] = (start + end) / 2
        start = end + 1
    return ranks


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation (Pearson's on ranks, ties at their mean rank); None with
    fewer than three pairs or a constant side."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} values against {len(ys)}")
    if len(xs) < 3:
        return None
    a, b = _ranks(xs), _ranks(ys)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b))
    var_a = sum((x - mean_a) ** 2 for x in a)
    var_b = sum((y - mean_b) ** 2 for y in b)
    return cov / math.sqrt(var_a * var_b) if var_a and var_b else None


def frequency_and_gap(gaps: Sequence[ClassGap], min_support: int = MIN_SUPPORT) -> list[dict]:
    """Per kind: how the gap follows training frequency over the classes with at least
    `min_support` test references, as Spearman's correlation of training count and gap (negative:
    rarer classes lose more) beside that of training count and the reference's score (how much
    of it rare classes being hard anyway would explain)."""
    rows = []
    for kind in (INTENT, SLOT):
        kept = [g for g in gaps if g.run.kind == kind and g.gap is not None
                and g.run.support >= min_support]
        counts = [g.run.train_count for g in kept]
        rows.append(dict(kind=kind, classes=len(kept), min_support=min_support,
                         count_vs_gap=rank_correlation(counts, [g.gap for g in kept]),
                         count_vs_reference=rank_correlation(
                             counts, [g.reference.score for g in kept])))
    return rows


def _pooled(scores: Sequence[ClassScore]) -> Optional[float]:
    """The bucket's score pooled over its classes: accuracy (intents), micro F1 (slot types)."""
    support = sum(s.support for s in scores)
    if not support:
        return None
    correct = sum(s.correct for s in scores)
    if scores[0].kind == INTENT:
        return correct / support
    return 2 * correct / (support + sum(s.predicted for s in scores))


def _mean(values: Iterable[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def by_bucket(scores: Sequence[ClassScore],
              reference: Optional[Sequence[ClassScore]] = None) -> list[dict]:
    """Per kind and frequency bucket: how many classes (with test support), their test support,
    the score pooled over the bucket's classes and the mean of its per-class scores, for the run
    and, given, the reference (with both gaps)."""
    rows = []
    ref_by_key = {(s.kind, s.name): s for s in reference or ()}
    for kind in (INTENT, SLOT):
        for label, _, _ in BUCKETS:
            members = [s for s in scores if s.kind == kind and s.bucket == label and s.support]
            row = dict(kind=kind, bucket=label, classes=len(members),
                       support=sum(s.support for s in members),
                       pooled=_pooled(members) if members else None,
                       mean=_mean(s.score for s in members))
            if reference is not None:
                refs = [ref_by_key.get((s.kind, s.name))
                        or dataclasses.replace(s, predicted=0, correct=0) for s in members]
                row["reference_pooled"] = _pooled(refs) if refs else None
                row["reference_mean"] = _mean(s.score for s in refs)
                for name in ("pooled", "mean"):
                    a, b = row[name], row[f"reference_{name}"]
                    row[f"gap_{name}"] = None if a is None or b is None else b - a
            rows.append(row)
    return rows


def _fmt(value: Optional[float], digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def class_table(gaps_or_scores: Sequence, run_label: str = "run",
                reference_label: str = "reference") -> str:
    """A markdown table, one row per class with test support, rarest first. Takes ClassGap
    (two models) or ClassScore (one)."""
    paired = bool(gaps_or_scores) and isinstance(gaps_or_scores[0], ClassGap)
    head = ["kind", "class", "train n", "bucket", "test n", "metric", run_label]
    if paired:
        head += [reference_label, "gap", "gap se", "lost"]
    head.append(f"{run_label}: wrong ones read as")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    items = [g for g in gaps_or_scores if (g.run if paired else g).support]
    items.sort(key=lambda g: ((g.run if paired else g).kind != INTENT,
                              (g.run if paired else g).train_count, (g.run if paired else g).name))
    for item in items:
        s = item.run if paired else item
        cells = [s.kind, s.name, str(s.train_count), s.bucket, str(s.support),
                 "accuracy" if s.kind == INTENT else "F1", _fmt(s.score)]
        if paired:
            cells += [_fmt(item.reference.score), _fmt(item.gap), _fmt(item.gap_se),
                      "yes" if item.loses() else ""]
        cells.append(", ".join(f"{label} {n}" for label, n in s.read_as[:READ_AS_SHOWN]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bucket_table(rows: Sequence[dict], run_label: str = "run",
                 reference_label: str = "reference") -> str:
    """A markdown table of `by_bucket` rows (scores pooled over each bucket's classes)."""
    paired = bool(rows) and "reference_pooled" in rows[0]
    head = ["kind", "train n bucket", "classes", "test n", f"{run_label} pooled",
            f"{run_label} class mean"]
    if paired:
        head += [f"{reference_label} pooled", f"{reference_label} class mean", "gap pooled",
                 "gap class mean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r["classes"]:
            continue
        cells = [r["kind"], r["bucket"], str(r["classes"]), str(r["support"]),
                 _fmt(r["pooled"]), _fmt(r["mean"])]
        if paired:
            cells += [_fmt(r["reference_pooled"]), _fmt(r["reference_mean"]),
                      _fmt(r["gap_pooled"]), _fmt(r["gap_mean"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_gap_by_bucket(rows: Sequence[dict], path: str, title: str, run_label: str = "run",
                       reference_label: str = "reference") -> None:
    """Bars per frequency bucket, the run beside the reference, one panel per kind (intent
    accuracy, slot-type F1), pooled over each bucket's classes; the gap is written above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind, metric in zip(axes, (INTENT, SLOT), ("intent accuracy", "slot-type F1")):
        # every bucket on the axis, empty ones too, so that corpora read alike
        kept = {r["bucket"]: r for r in rows if r["kind"] == kind and r["classes"]}
        for i, (label, _, _) in enumerate(BUCKETS):
            r = kept.get(label)
            if r is None:
                ax.text(i, 0.05, "no class", ha="center", fontsize=8, color="gray")
                continue
            first = label == next(iter(kept))  # one legend entry per model
            run, ref = r["pooled"] or 0.0, r.get("reference_pooled")
            ax.bar(i - 0.2, run, width=0.4, color="#de2d26", label=run_label if first else None)
            if ref is not None:
                ax.bar(i + 0.2, ref, width=0.4, color="#9ecae1",
                       label=reference_label if first else None)
            if r.get("gap_pooled") is not None:
                ax.text(i, max(run, ref) + 0.02, f"gap {r['gap_pooled']:+.2f}", ha="center",
                        fontsize=8)
        ax.set_xticks(range(len(BUCKETS)))
        ax.set_xticklabels([f"{label}\n{kept[label]['classes']} cls, {kept[label]['support']} test"
                            if label in kept else label for label, _, _ in BUCKETS], fontsize=8)
        ax.set_ylim(0, 1.25)
        ax.set_xlabel("training examples of the class")
        ax.set_ylabel(f"{metric} (pooled over the bucket)")
        ax.set_title(f"{title}: {kind}s", fontsize=10)
        if kept:
            ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
