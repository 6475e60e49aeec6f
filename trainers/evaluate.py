"""`python -m trainers.evaluate --run_dir=... [--data_dir=...] [--split=test] [--decodings]`: score a
saved run.

It scores the exported SavedModel (what would be served: raw utterance strings in, intent and
tags out), so it checks the export as much as the model. Without --data_dir it uses the data the
run was trained on (its config). With --decodings it instead rebuilds the model from the latest
checkpoint and scores both CRF decodings (BIO-constrained and plain Viterbi). Prints the metrics as
JSON (no utterance text).
"""
from __future__ import annotations

import json
import os
from typing import Optional

from absl import app, flags


def define_flags() -> None:
    """Defined only when run as a command: other trainers use the same flag names and tests
    import several of them into one process."""
    flags.DEFINE_string("run_dir", None, "A finished run directory.", required=True)
    flags.DEFINE_string("data_dir", None, "Data to score (default: the run's own data).")
    flags.DEFINE_enum("split", "test", ["train", "dev", "test"], "Which split to score.")
    flags.DEFINE_string("output", None, "Also write the metrics JSON here.")
    flags.DEFINE_bool("decodings", False, "Score the latest checkpoint (not the export) with "
                      "both CRF decodings, BIO-constrained and unconstrained Viterbi.")


def load_serving(run_dir: str):
    import tensorflow as tf

    path = os.path.join(run_dir, "saved_model")
    if not os.path.isdir(path):
        raise ValueError(f"{run_dir} has no saved_model/ (did the run finish?)")
    try:
        import tensorflow_text  # noqa: F401  (registers the WordPiece ops a BERT export uses)
    except ImportError:
        pass
    return tf.saved_model.load(path).signatures["serving_default"]


def evaluate_run(run_dir: str, data_dir: Optional[str] = None, split: str = "test",
                 batch_size: int = 256) -> dict:
    import tensorflow as tf

    from trainers.pipeline import builders, run_files
    from trainers.scoring import metrics as metrics_lib

    config = run_files.load_run_config(run_dir)
    if data_dir is not None:
        with config.unlocked():
            config.data_dir = data_dir
    utterances = getattr(builders.load_splits(config), split)
    if not utterances:
        raise ValueError(f"the {split} split of the data is empty")
    serve = load_serving(run_dir)
    intents, tags = [], []
    for start in range(0, len(utterances), batch_size):
        batch = utterances[start:start + batch_size]
        out = serve(utterances=tf.constant([" ".join(u.tokens) for u in batch]))
        intents.extend(s.decode() for s in out["intent"].numpy())
        for row, u in zip(out["slot_tags"].numpy(), batch):
            tags.append([t.decode() for t in row[:len(u.tokens)]])
    result = metrics_lib.evaluate_utterances(utterances, intents, tags)
    result.update({"run_dir": run_dir, "split": split, "data": config.data_dir or "synthetic"})
    return result


def scores_by_decoding(run_dir: str, split: str = "test") -> dict:
    """{"viterbi": metrics, "bio": metrics} of a run's latest checkpoint on `split` of its own
    data: the model is rebuilt from the run's config, so runs exported before the BIO decoding
    existed get both (their SavedModel serves Viterbi only)."""
    import tensorflow as tf

    from trainers.pipeline import builders, run_files, warm_start
    from trainers.scoring import predictions

    config = run_files.load_run_config(run_dir)
    if config.get("ema_fraction", 0.0) > 0:  # its checkpoint holds the raw weights, not these
        raise ValueError(f"{run_dir} kept a moving average of its weights (ema_fraction), which "
                         "its checkpoint does not hold: score its export instead")
    checkpoint = tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    if checkpoint is None:
        raise ValueError(f"{run_dir} has no checkpoint in checkpoints/")
    utterances = getattr(builders.load_splits(config), split)
    if not utterances:
        raise ValueError(f"the {split} split of {run_dir}'s data is empty")
    preprocessor = warm_start.run_preprocessor(run_dir, config)
    widths = [shape[1] for name, shape in tf.train.list_variables(checkpoint)
              if "word_embedding/_embeddings" in name and "optimizer" not in name]
    model = warm_start.trained_model(config, preprocessor, checkpoint, widths[0] if widths else 0)
    x = builders.encode(preprocessor, utterances, split).x
    return predictions.scores_by_decoding(model, preprocessor, utterances, x)


def main(argv):
    del argv
    f = flags.FLAGS
    if f.decodings:
        if f.data_dir:
            raise app.UsageError("--decodings scores the run's own data: drop --data_dir")
        result = scores_by_decoding(f.run_dir, f.split)
    else:
        result = evaluate_run(f.run_dir, f.data_dir, f.split)
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if f.output:
        with open(f.output, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    from trainers import cli

    cli.quiet_unless_verbose()
    define_flags()
    cli.run(main)
