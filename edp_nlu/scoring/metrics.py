"""Utility metrics for joint intent classification and slot filling.

All metrics read slots from BIO tags with the CoNLL (conlleval / seqeval default) chunking
rule, so that SER and slot F1 see the same slots: a chunk starts at `B-X`, and also at an
`I-X` that follows `O` or a tag of another type (lenient, because predictions may be ill-formed);
it continues over `I-X` of the same type.

Semantic error rate (SER), per utterance, with reference slots R and hypothesis slots H as
(type, start, end) spans:
  1. a reference slot with a hypothesis slot of the same type and the same span: correct;
  2. of the rest, a reference and a hypothesis slot with the same span but different types:
     one substitution;
  3. of the rest, a reference and a hypothesis slot of the same type whose spans overlap:
     one substitution (a boundary error); pairs are taken greedily, left to right;
  4. reference slots still unpaired: deletions; hypothesis slots still unpaired: insertions
     (so a slot with both type and span wrong counts twice: one deletion + one insertion);
  5. a wrong intent: one intent error.
  SER = (substitutions + deletions + insertions + intent errors) / (reference slots + utterances).
  It can exceed 1 when a model inserts many slots.

Sentence accuracy: the intent and every tag (token by token) are right.
Slot F1/precision/recall: micro-averaged over slots, as seqeval's default (CoNLL) mode computes
them, from the same slots as SER.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from edp_nlu.models.labels import OUTSIDE_TAG as OUTSIDE

Span = tuple[str, int, int]  # (slot type, start token, end token exclusive)


def slot_spans(tags: Sequence[str]) -> list[Span]:
    """The slots of a tag sequence under the CoNLL chunking rule (see the module docstring).

    Raises ValueError for tags that are not O, B-<type> or I-<type>.
    """
    spans: list[Span] = []
    current: list | None = None  # [type, start]
    for position, tag in enumerate(tags):
        if tag == OUTSIDE:
            prefix, slot_type = OUTSIDE, ""
        else:
            prefix, _, slot_type = tag.partition("-")
            if prefix not in ("B", "I") or not slot_type:
                raise ValueError(
                    f"tag {tag!r} at position {position} is not O, B-<type> or I-<type>")
        continues = prefix == "I" and current is not None and current[0] == slot_type
        if current is not None and not continues:
            spans.append((current[0], current[1], position))
            current = None
        if prefix in ("B", "I") and not continues:
            current = [slot_type, position]
    if current is not None:
        spans.append((current[0], current[1], len(tags)))
    return spans


@dataclasses.dataclass(frozen=True)
class SlotErrors:
    substitutions: int
    deletions: int
    insertions: int


def slot_errors(reference: Sequence[Span], hypothesis: Sequence[Span]) -> SlotErrors:
    """Counts slot errors between two span lists by the rule in the module docstring."""
    unmatched_ref = sorted(reference, key=lambda s: (s[1], s[2]))
    unmatched_hyp = sorted(hypothesis, key=lambda s: (s[1], s[2]))

    def pair_off(same) -> int:
        pairs = 0
        for ref in list(unmatched_ref):
            for hyp in unmatched_hyp:
                if same(ref, hyp):
                    unmatched_ref.remove(ref)
                    unmatched_hyp.remove(hyp)
                    pairs += 1
                    break
        return pairs

    pair_off(lambda r, h: r == h)
    substitutions = pair_off(lambda r, h: r[1:] == h[1:])
    substitutions += pair_off(lambda r, h: r[0] == h[0] and r[1] < h[2] and h[1] < r[2])
    return SlotErrors(substitutions, len(unmatched_ref), len(unmatched_hyp))


def _check_inputs(ref_intents: Sequence[str], ref_tags: Sequence[Sequence[str]],
                  hyp_intents: Sequence[str], hyp_tags: Sequence[Sequence[str]]) -> None:
    lengths = {"ref_intents": len(ref_intents), "ref_tags": len(ref_tags),
               "hyp_intents": len(hyp_intents), "hyp_tags": len(hyp_tags)}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"inputs must have one entry per utterance, got lengths {lengths}")
    if not ref_intents:
        raise ValueError("no utterances to score")
    for index, (ref, hyp) in enumerate(zip(ref_tags, hyp_tags)):
        if len(ref) != len(hyp):
            raise ValueError(
                f"utterance {index}: ref_tags has {len(ref)} tags, hyp_tags has {len(hyp)}")


def intent_accuracy(ref_intents: Sequence[str], hyp_intents: Sequence[str]) -> float:
    """Fraction of utterances whose intent is right."""
    if len(ref_intents) != len(hyp_intents) or not ref_intents:
        raise ValueError(f"ref_intents ({len(ref_intents)}) and hyp_intents "
                         f"({len(hyp_intents)}) must be equally long and non-empty")
    return sum(r == h for r, h in zip(ref_intents, hyp_intents)) / len(ref_intents)


def slot_prf(ref_tags: Sequence[Sequence[str]],
             hyp_tags: Sequence[Sequence[str]]) -> tuple[float, float, float]:
    """Micro (precision, recall, F1) over slots: seqeval's default (CoNLL) mode, computed from
    `slot_spans` (the same slots; edp_nlu/scoring/metrics_test.py checks the numbers against
    seqeval)."""
    return _prf(*_slot_counts(zip(map(slot_spans, ref_tags), map(slot_spans, hyp_tags))))


def _slot_counts(span_pairs) -> tuple[int, int, int]:
    """(slots right, predicted slots, reference slots) over (reference, hypothesis) spans."""
    right = predicted = reference = 0
    for ref, hyp in span_pairs:
        right += len(set(ref) & set(hyp))
        predicted += len(hyp)
        reference += len(ref)
    return right, predicted, reference


def _prf(right: int, predicted: int, reference: int) -> tuple[float, float, float]:
    precision = right / predicted if predicted else 0.0  # seqeval's zero_division=0
    recall = right / reference if reference else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def evaluate(ref_intents: Sequence[str], ref_tags: Sequence[Sequence[str]],
             hyp_intents: Sequence[str], hyp_tags: Sequence[Sequence[str]]) -> dict:
    """All metrics plus the error counts behind SER (a JSON-ready dict, no utterance text)."""
    _check_inputs(ref_intents, ref_tags, hyp_intents, hyp_tags)
    substitutions = deletions = insertions = reference_slots = sentences_right = 0
    intent_errors = 0
    span_pairs = []
    for ref_intent, ref, hyp_intent, hyp in zip(ref_intents, ref_tags, hyp_intents, hyp_tags):
        ref_spans, hyp_spans = slot_spans(ref), slot_spans(hyp)
        span_pairs.append((ref_spans, hyp_spans))
        errors = slot_errors(ref_spans, hyp_spans)
        substitutions += errors.substitutions
        deletions += errors.deletions
        insertions += errors.insertions
        reference_slots += len(ref_spans)
        intent_errors += ref_intent != hyp_intent
        sentences_right += ref_intent == hyp_intent and tuple(ref) == tuple(hyp)
    utterances = len(ref_intents)
    precision, recall, f1 = _prf(*_slot_counts(span_pairs))
    total_errors = substitutions + deletions + insertions + intent_errors
    return {
        "ser": total_errors / (reference_slots + utterances),
        "intent_accuracy": 1 - intent_errors / utterances,
        "slot_f1": f1,
        "slot_precision": precision,
        "slot_recall": recall,
        "sentence_accuracy": sentences_right / utterances,
        "slot_substitutions": substitutions,
        "slot_deletions": deletions,
        "slot_insertions": insertions,
        "intent_errors": intent_errors,
        "reference_slots": reference_slots,
        "utterances": utterances,
    }


def semantic_error_rate(ref_intents: Sequence[str], ref_tags: Sequence[Sequence[str]],
                        hyp_intents: Sequence[str], hyp_tags: Sequence[Sequence[str]]) -> float:
    """SER as defined in the module docstring."""
    return evaluate(ref_intents, ref_tags, hyp_intents, hyp_tags)["ser"]


def sentence_accuracy(ref_intents: Sequence[str], ref_tags: Sequence[Sequence[str]],
                      hyp_intents: Sequence[str], hyp_tags: Sequence[Sequence[str]]) -> float:
    """Fraction of utterances with the right intent and every tag right."""
    _check_inputs(ref_intents, ref_tags, hyp_intents, hyp_tags)
    right = sum(ri == hi and tuple(rt) == tuple(ht)
                for ri, rt, hi, ht in zip(ref_intents, ref_tags, hyp_intents, hyp_tags))
    return right / len(ref_intents)


def evaluate_utterances(references: Sequence, hyp_intents: Sequence[str],
                        hyp_tags: Sequence[Sequence[str]]) -> dict:
    """`evaluate` for reference objects with `.intent` and `.tags` (e.g. `data.Utterance`)."""
    return evaluate([r.intent for r in references], [r.tags for r in references],
                    hyp_intents, hyp_tags)
