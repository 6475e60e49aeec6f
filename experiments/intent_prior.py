"""`python -m experiments.intent_prior --run_dir=RUN [--run_dir=RUN ...]`: how much a prior over
the intents could give back the rare intents a private model loses, at best.

On ATIS the private model gets no intent under 100 training examples right: they fall into the
majority intent (docs/results.md, "What privacy costs, per class"). Logit adjustment (Menon et al.
2021) subtracts tau log(prior) from the intent logits, which favours rare intents. Here the prior is
the training split's *exact* intent counts: an upper bound on the lever, not a private lever. A
private run would need those counts released with noise and charged to its ledger (or the label
selection's noisy counts, edp_nlu/pipeline/label_selection.py); noise only makes the adjustment
worse. tau is chosen on dev (the smallest tau of the best dev intent accuracy) from a fixed grid.

Writes results/intent_prior/<run name>.json and results/intent_prior/table.md.
"""
from __future__ import annotations

import collections
import os
from typing import Sequence

import numpy as np
from absl import app, flags

from edp_nlu import evaluate
from edp_nlu.data import encoding
from edp_nlu.pipeline import builders
from experiments import posthoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "intent_prior")
TAUS = (0.0, 0.25, 0.5, 1.0, 1.5)
RARE = 100  # intents with fewer training examples: the ones lost on ATIS


def adjusted(logits: np.ndarray, counts: np.ndarray, tau: float) -> np.ndarray:
    """Logits minus tau log(count), counts floored at 1 (an intent seen 0 times gets no
    log(0))."""
    return logits - tau * np.log(np.maximum(counts, 1.0))


def accuracies(predicted: Sequence[str], gold: Sequence[str], counts: dict) -> dict:
    """Intent accuracy over all utterances and over those whose intent has fewer than RARE
    training examples (None when there are none)."""
    right = [p == g for p, g in zip(predicted, gold)]
    rare = [r for r, g in zip(right, gold) if counts.get(g, 0) < RARE]
    return {"intent_accuracy": float(np.mean(right)), "rare_utterances": len(rare),
            "rare_accuracy": float(np.mean(rare)) if rare else None}


def choose(rows: Sequence[dict]) -> dict:
    """The row of the smallest tau with the best dev intent accuracy: chosen on dev alone."""
    return min(rows, key=lambda row: (-row["dev"]["intent_accuracy"], row["tau"]))


def prior_rows(run_dir: str, taus: Sequence[float] = TAUS) -> list:
    """For each tau: dev and test intent accuracy (all, and intents under RARE examples) of the
    run's latest checkpoint with its intent logits adjusted by the exact training prior."""
    spec, model, preprocessor = evaluate.checkpoint_model(run_dir)
    splits = builders.load_splits(spec.data)
    names = preprocessor.intent_vocabulary.labels
    counts = collections.Counter(u.intent for u in splits.train)
    count_vector = np.array([counts.get(name, 0) for name in names], np.float64)
    logits = {}
    for split in ("dev", "test"):
        x = encoding.encode(preprocessor, getattr(splits, split), split).x
        logits[split] = np.concatenate([out["intent_logits"].numpy()[:real]
                                        for real, out in posthoc.forward(model, x)])
    rows = []
    for tau in taus:
        row = {"tau": float(tau)}
        for split, values in logits.items():
            predicted = [names[i] for i in adjusted(values, count_vector, tau).argmax(-1)]
            row[split] = accuracies(predicted, [u.intent for u in getattr(splits, split)],
                                    counts)
        rows.append(row)
    return rows


def table(results: Sequence[dict]) -> str:
    """Markdown: per run, tau = 0 against the dev-chosen tau on test."""
    lines = ["| run | tau (dev) | dev intent acc | test intent acc | test acc, intents under "
             f"{RARE} examples | rare test utterances |", "|---|---|---|---|---|---|"]
    for result in results:
        zero = next(r for r in result["rows"] if r["tau"] == 0.0)
        best = choose(result["rows"])

        def pair(split, key):
            a, b = zero[split][key], best[split][key]
            return "" if a is None else f"{a:.3f} -> {b:.3f}"

        lines.append(f"| {result['name']} | {best['tau']:g} | {pair('dev', 'intent_accuracy')} "
                     f"| {pair('test', 'intent_accuracy')} | {pair('test', 'rare_accuracy')} | "
                     f"{best['test']['rare_utterances']} |")
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    del argv
    for run_dir in flags.FLAGS.run_dir:
        rows = prior_rows(run_dir)
        name = posthoc.write_run(RESULTS, "intent_prior", run_dir, rows, table,
                                 prior="exact training counts (an upper bound, not private)")
        best = choose(rows)
        print(f"{name}: tau = {best['tau']:g} on dev, test intent accuracy "
              f"{rows[0]['test']['intent_accuracy']:.4f} -> "
              f"{best['test']['intent_accuracy']:.4f}")

if __name__ == "__main__":
    flags.DEFINE_multi_string("run_dir", None, "A finished run's directory (repeatable).",
                              required=True)
    app.run(main)
