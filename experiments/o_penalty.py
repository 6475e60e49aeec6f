"""`python -m experiments.o_penalty --run_dir=RUN [--run_dir=RUN ...]`: rare slots the private
model misses, recovered by post-processing that costs no privacy.

Where slot types collapse under DP (docs/results.md, "What privacy costs, per class"), the
question is whether the private model just falls short of saying them, O winning by a small
margin. If so, lowering the O tag's emission score by a penalty b at every word before the
BIO-constrained CRF decoding recovers them. b is a public constant applied to the released
model's outputs: post-processing, epsilon unchanged.

b is chosen on the dev split (never on test) from a fixed grid, the smallest b of the best dev SER;
the test row at that b is the result, and every b's dev and test rows are kept beside it.
Writes results/o_penalty/<run name>.json and results/o_penalty/table.md (every run in
results/o_penalty/*.json).
"""
from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf
from absl import app, flags

from edp_nlu import evaluate
from edp_nlu.data import encoding
from edp_nlu.pipeline import builders
from edp_nlu.scoring import per_class, predictions
from experiments import posthoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "o_penalty")
# Emission scores of a trained CLC are of order 1-10: from no change to about one word's margin.
PENALTIES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
OUTSIDE = "O"


def penalised(potentials: tf.Tensor, o_index: int, penalty: float) -> tf.Tensor:
    """`potentials` [batch, words, tags] with `penalty` taken from the O tag's at every word."""
    depth = potentials.shape[-1]
    return potentials - penalty * tf.one_hot(o_index, depth, dtype=potentials.dtype)


def choose(rows: Sequence[dict]) -> dict:
    """The row of the smallest penalty with the lowest dev SER: chosen on dev alone."""
    return min(rows, key=lambda row: (row["dev"]["ser"], row["penalty"]))


def _labels(decode, preprocessor, outputs: list, penalty: float) -> tuple:
    o_index = preprocessor.tag_vocabulary.labels.index(OUTSIDE)
    decoded = []
    for real, out in outputs:
        tags = decode(penalised(out["tag_potentials"], o_index, penalty), out["tag_mask"])
        intents = tf.argmax(out["intent_logits"], axis=-1, output_type=tf.int32)
        decoded.append((real, {"intent_ids": intents, "tag_ids": tags,
                               "tag_mask": out["tag_mask"]}))
    return predictions._labels(preprocessor, decoded)


def bucket_f1(references, labels, counts) -> dict:
    """Pooled slot-type F1 per training-frequency bucket (buckets with test references)."""
    scores = per_class.class_scores([r.intent for r in references],
                                    [r.tags for r in references], labels[0],
                                    [list(t) + [OUTSIDE] * (len(r.tokens) - len(t))
                                     for r, t in zip(references, labels[1])], counts)
    return {row["bucket"]: row["pooled"] for row in per_class.by_bucket(scores)
            if row["kind"] == per_class.SLOT and row["classes"]}


def penalty_rows(run_dir: str, penalties: Sequence[float] = PENALTIES) -> list:
    """For each b: dev and test scores (SER, slot F1, precision, recall, pooled slot F1 per
    frequency bucket) of the run's latest checkpoint, BIO-decoded with O lowered by b."""
    spec, model, preprocessor = evaluate.checkpoint_model(run_dir)
    splits = builders.load_splits(spec.data)
    counts = per_class.training_counts([u.intent for u in splits.train],
                                       [u.tags for u in splits.train])
    by_split = {name: posthoc.forward(model, encoding.encode(preprocessor, getattr(splits, name),
                                                     name).x) for name in ("dev", "test")}
    decode = tf.function(lambda p, m: model.crf.decode(p, m, constrained=True)[0],
                         reduce_retracing=True)
    rows = []
    for penalty in penalties:
        row = {"penalty": float(penalty)}
        for name, outputs in by_split.items():
            references = getattr(splits, name)
            labels = _labels(decode, preprocessor, outputs, penalty)
            scores = predictions.score(references, *labels)
            keep = ("ser", "slot_f1", "slot_precision", "slot_recall", "intent_accuracy")
            row[name] = {k: scores[k] for k in keep}
            row[name]["slot_f1_by_bucket"] = bucket_f1(references, labels, counts)
        rows.append(row)
    return rows


def table(results: Sequence[dict]) -> str:
    """Markdown: per run, b = 0 against the dev-chosen b on test."""
    buckets = [label for label, _, _ in per_class.BUCKETS]
    head = ("| run | b (dev) | dev SER b=0 -> b | test SER b=0 -> b | test slot recall | "
            "test slot precision | " + " | ".join(f"slot F1 {b}" for b in buckets) + " |")
    lines = [head, "|" + "---|" * (6 + len(buckets))]
    for result in results:
        zero = next(r for r in result["rows"] if r["penalty"] == 0.0)
        best = choose(result["rows"])

        def pair(split, key, row_a=zero, row_b=best):
            return f"{row_a[split][key]:.3f} -> {row_b[split][key]:.3f}"

        cells = []
        for b in buckets:
            a = zero["test"]["slot_f1_by_bucket"].get(b)
            c = best["test"]["slot_f1_by_bucket"].get(b)
            cells.append("" if a is None else f"{a:.3f} -> {c:.3f}")
        lines.append(f"| {result['name']} | {best['penalty']:g} | {pair('dev', 'ser')} | "
                     f"{pair('test', 'ser')} | {pair('test', 'slot_recall')} | "
                     f"{pair('test', 'slot_precision')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv
    for run_dir in flags.FLAGS.run_dir:
        rows = penalty_rows(run_dir)
        name = posthoc.write_run(RESULTS, "o_penalty", run_dir, rows, table)
        best = choose(rows)
        print(f"{name}: b = {best['penalty']:g} on dev, test SER "
              f"{rows[0]['test']['ser']:.4f} -> {best['test']['ser']:.4f}")

if __name__ == "__main__":
    flags.DEFINE_multi_string("run_dir", None, "A finished run's directory (repeatable).",
                              required=True)
    app.run(main)
