"""`python -m experiments.label_prior --run_dir=RUN [--run_dir=RUN ...]`: logit adjustment of
both heads (the issue's free post-processing), at best.

Logit adjustment (Menon et al. 2021) subtracts tau log(prior) from each class's score, which
favours rare classes. Here both heads are adjusted: the intent logits by the training split's
intent counts (tau_intent) and every word's tag emissions, before the BIO-constrained CRF
decoding, by the training split's word counts per tag (tau_tag). The prior is the training
split's *exact* counts: an upper bound on the lever, not a private lever (a private run would
release the counts with noise and charge them to its ledger, and the noise can only make the
adjustment worse). results/intent_prior (intents alone) and results/o_penalty (the O tag alone)
measured the two halves on the recipe's runs, where the rare classes were never learnt; this
tool asks the same of runs that do learn some of them (label-aware heads).

Both taus come from fixed grids and are chosen together on dev SER alone (the smallest pair of
the best); the test row at that pair is the result, every pair's rows are kept beside it.
Writes results/label_prior/<run name>.json and results/label_prior/table.md.
"""
from __future__ import annotations

import collections
import itertools
import os
from typing import Sequence

import numpy as np
import tensorflow as tf
from absl import app, flags

from edp_nlu import evaluate
from edp_nlu.data import encoding
from edp_nlu.pipeline import builders
from edp_nlu.scoring import per_class, predictions
from experiments import o_penalty, posthoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "label_prior")
# log counts span about 10 between O and a rare tag: tau 1 moves a rare tag by about as much as
# the emission scores' own range (1-10), tau 0.1 by about one unit.
TAUS_TAG = (0.0, 0.1, 0.25, 0.5, 1.0)
TAUS_INTENT = (0.0, 0.25, 0.5, 1.0)
RARE_BUCKET = per_class.BUCKETS[0][0]


def log_prior(counted: collections.Counter, names: Sequence[str]) -> np.ndarray:
    """log(count) per name in `names`' order (a vocabulary's), counts floored at 1: a class
    never seen in training gets no log(0)."""
    return np.log(np.maximum([counted.get(name, 0) for name in names], 1.0))


def choose(rows: Sequence[dict]) -> dict:
    """The row of the best dev SER, ties to the smallest taus: chosen on dev alone."""
    return min(rows, key=lambda r: (r["dev"]["ser"], r["tau_tag"], r["tau_intent"]))


def _decoded(decode, outputs: list, tag_shift: tf.Tensor, intent_shift: np.ndarray) -> list:
    decoded = []
    for real, out in outputs:
        tags = decode(out["tag_potentials"] - tf.cast(tag_shift, out["tag_potentials"].dtype),
                      out["tag_mask"])
        intents = np.argmax(out["intent_logits"].numpy() - intent_shift, axis=-1)
        decoded.append((real, {"intent_ids": tf.constant(intents, tf.int32), "tag_ids": tags,
                               "tag_mask": out["tag_mask"]}))
    return decoded


def prior_rows(run_dir: str, taus_tag: Sequence[float] = TAUS_TAG,
               taus_intent: Sequence[float] = TAUS_INTENT) -> list:
    """For each (tau_tag, tau_intent): dev and test SER, intent accuracy, slot F1 and pooled slot
    F1 per training-frequency bucket of the run's latest checkpoint, both heads adjusted by the
    exact training prior."""
    spec, model, preprocessor = evaluate.checkpoint_model(run_dir)
    splits = builders.load_splits(spec.data)
    counts = per_class.training_counts([u.intent for u in splits.train],
                                       [u.tags for u in splits.train])
    # the tag prior per word (what each emission scores), the intent prior per utterance
    log_tags = log_prior(collections.Counter(t for u in splits.train for t in u.tags),
                         preprocessor.tag_vocabulary.labels)
    log_intents = log_prior(collections.Counter(u.intent for u in splits.train),
                            preprocessor.intent_vocabulary.labels)
    by_split = {name: posthoc.forward(model, encoding.encode(preprocessor, getattr(splits, name),
                                                     name).x) for name in ("dev", "test")}
    decode = tf.function(lambda p, m: model.crf.decode(p, m, constrained=True)[0],
                         reduce_retracing=True)
    rows = []
    for tau_tag, tau_intent in itertools.product(taus_tag, taus_intent):
        tag_shift = tf.constant(tau_tag * log_tags, tf.float32)
        intent_shift = tau_intent * log_intents
        row = {"tau_tag": float(tau_tag), "tau_intent": float(tau_intent)}
        for name, outputs in by_split.items():
            references = getattr(splits, name)
            labels = predictions._labels(preprocessor, _decoded(decode, outputs, tag_shift,
                                                                intent_shift))
            scores = predictions.score(references, *labels)
            row[name] = {k: scores[k] for k in ("ser", "intent_accuracy", "slot_f1")}
            row[name]["slot_f1_by_bucket"] = o_penalty.bucket_f1(references, labels, counts)
        rows.append(row)
    return rows


def table(results: Sequence[dict]) -> str:
    """Markdown: per run, no adjustment against the dev-chosen pair on test."""
    lines = ["| run | tau tag, intent (dev) | dev SER | test SER | test intent acc | test slot "
             f"F1 | test slot F1, types of {RARE_BUCKET} spans |", "|---|---|---|---|---|---|---|"]
    for result in results:
        zero = next(r for r in result["rows"] if r["tau_tag"] == 0 and r["tau_intent"] == 0)
        best = choose(result["rows"])

        def pair(split, key):
            return f"{zero[split][key]:.3f} -> {best[split][key]:.3f}"

        rare = [r["test"]["slot_f1_by_bucket"].get(RARE_BUCKET) for r in (zero, best)]
        lines.append(f"| {result['name']} | {best['tau_tag']:g}, {best['tau_intent']:g} | "
                     f"{pair('dev', 'ser')} | {pair('test', 'ser')} | "
                     f"{pair('test', 'intent_accuracy')} | {pair('test', 'slot_f1')} | "
                     + ("" if rare[0] is None else f"{rare[0]:.3f} -> {rare[1]:.3f}") + " |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv
    for run_dir in flags.FLAGS.run_dir:
        rows = prior_rows(run_dir)
        name = posthoc.write_run(RESULTS, "label_prior", run_dir, rows, table,
                                 prior="exact training counts (an upper bound, not private)")
        best = choose(rows)
        print(f"{name}: tau tag {best['tau_tag']:g}, intent {best['tau_intent']:g} on dev, test "
              f"SER {rows[0]['test']['ser']:.4f} -> {best['test']['ser']:.4f}")

if __name__ == "__main__":
    flags.DEFINE_multi_string("run_dir", None, "A finished run's directory (repeatable).",
                              required=True)
    app.run(main)
