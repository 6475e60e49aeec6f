"""`python -m edp_nlu.evaluate --run_dir=... [--data_dir=...] [--split=test] [--decodings]`: score a
saved run. `--per_class [--compare_to=OTHER_RUN]`: per intent and slot type, against training
frequency, beside another run (e.g. the private run beside plain training).

It scores the exported SavedModel (what would be served: raw utterance strings in, intent and
tags out), so it checks the export as much as the model. Without --data_dir it uses the data the
run was trained on (its config). With --decodings it instead rebuilds the model from the latest
checkpoint and scores both CRF decodings (BIO-constrained and plain Viterbi). Prints the metrics as
JSON (no utterance text).

With --per_class it prints a table per intent and slot type (accuracy / F1, training count, test
support; edp_nlu/scoring/per_class.py) and writes it as JSON to --output or, by default,
RUN_DIR-per_class.json beside the run directory. The training counts are unnoised statistics of
the run's training split, so the report is a diagnostic, not a DP release, and says so; it stays
out of the run directory, whose files privacy.json lists as covered or not.

A private run (a DP mechanism, or privacy.json saying private) is not scored on its training
split: exact metrics there are unnoised statistics of the data epsilon protects.
"""
from __future__ import annotations

if __name__ == "__main__":  # before edp_tf loads TensorFlow: its native logs read the setting once
    from edp_nlu import cli

    cli.quiet_unless_verbose()

import dataclasses
import json
import os
from typing import Optional

from absl import app, flags

from edp_nlu import cli

# The machinery imports TensorFlow; `--help` and a misspelt flag answer without it.
encoding = cli.on_first_use("edp_nlu.data.encoding")
builders = cli.on_first_use("edp_nlu.pipeline.builders")
checkpoints = cli.on_first_use("edp_nlu.pipeline.checkpoints")
run_files = cli.on_first_use("edp_nlu.pipeline.run_files")
warm_start = cli.on_first_use("edp_nlu.pipeline.warm_start")
metrics_lib = cli.on_first_use("edp_nlu.scoring.metrics")
per_class = cli.on_first_use("edp_nlu.scoring.per_class")
predictions = cli.on_first_use("edp_nlu.scoring.predictions")
ledger_lib = cli.on_first_use("edp_tf.ledger")


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
    """Defined only when run as a command: other trainers use the same flag names and tests
    import several of them into one process (which gives its own `values`)."""
    v = dict(flag_values=values)
    flags.DEFINE_string("run_dir", None, "A finished run directory.", required=True, **v)
    flags.DEFINE_string("data_dir", None, "Data to score (default: the run's own data).", **v)
    flags.DEFINE_enum("split", "test", ["train", "dev", "test"], "Which split to score. train "
                      "is refused for a private run: exact scores on the training split are "
                      "unnoised statistics of the training data.", **v)
    flags.DEFINE_string("output", None, "Also write the metrics JSON here.", **v)
    flags.DEFINE_bool("decodings", False, "Score the latest checkpoint (not the export) with "
                      "both CRF decodings, BIO-constrained and unconstrained Viterbi.", **v)
    flags.DEFINE_bool("per_class", False, "Score each intent and slot type against its count in "
                      "the run's training split. The per-class training counts are unnoised "
                      "statistics of the training data, not covered by epsilon: a diagnostic, "
                      "not a DP release. Writes --output or RUN_DIR-per_class.json beside the "
                      "run directory (never inside a private run's directory).", **v)
    flags.DEFINE_string("compare_to", None, "With --per_class: a run on the same data (e.g. plain "
                        "training) to put beside --run_dir; gap = its score - the run's.", **v)
    flags.DEFINE_string("per_class_results", None, "With --per_class and --compare_to: also "
                        "write PREFIX.md (tables and commands) and PREFIX.png (gap by bucket).",
                        **v)
    flags.DEFINE_multi_string("command", [], "With --per_class_results: a command that made "
                              "the runs, quoted in PREFIX.md (repeatable).", **v)


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


def serve_predictions(run_dir: str, utterances, batch_size: int = 256):
    """(intents, tag lists) the run's SavedModel serves for `utterances`."""
    import tensorflow as tf

    serve = load_serving(run_dir)
    intents, tags = [], []
    for start in range(0, len(utterances), batch_size):
        batch = utterances[start:start + batch_size]
        out = serve(utterances=tf.constant([" ".join(u.tokens) for u in batch]))
        intents.extend(s.decode() for s in out["intent"].numpy())
        for row, u in zip(out["slot_tags"].numpy(), batch):
            tags.append([t.decode() for t in row[:len(u.tokens)]])
    return intents, tags


def is_private_run(run_dir: str) -> bool:
    """True for a run trained with a DP mechanism, or whose privacy.json says private: its
    training split is what epsilon protects."""
    if run_files.load_run_spec(run_dir).privacy.private:
        return True
    path = os.path.join(run_dir, "privacy.json")
    return os.path.isfile(path) and run_files.read_json(path, {}).get("private") is True


def check_split(run_dir: str, split: str) -> None:
    """ValueError for the training split of a private run: its exact scores (overall or per
    class) are unnoised statistics of the training data, which no epsilon covers."""
    if split == "train" and is_private_run(run_dir):
        raise ValueError(f"--split=train: {run_dir} is a private run, and its exact scores on "
                         "the training split are unnoised statistics of the training data (not "
                         "covered by epsilon); score --split=dev or test")


def per_class_output(run_dir: str, output: Optional[str], compare_to: Optional[str] = None,
                     flag: str = "--output") -> str:
    """Where --per_class writes: `output`, or RUN_DIR-per_class.json beside the run. The report
    holds unnoised training counts (of both runs: they share the training split), so neither
    run's directory takes it when that run is private: privacy.json describes a private run's
    directory file by file."""
    path = output or os.path.normpath(run_dir) + "-per_class.json"
    where = os.path.realpath(os.path.abspath(path))
    for directory in (run_dir, compare_to):
        if directory is None:
            continue
        top = os.path.realpath(directory)
        if os.path.commonpath([top, where]) == top and is_private_run(directory):
            raise ValueError(f"{flag}: {path} is inside the private run {directory}: the "
                             "per-class training counts are unnoised statistics of the training "
                             "data, which the run's privacy.json does not cover; write it "
                             "elsewhere")
    return path


def _data_and_split(run_dir: str, data_dir: Optional[str], split: str) -> tuple:
    """(the run's data part, `data_dir` in its place when given; the utterances of `split`)."""
    data = run_files.load_run_spec(run_dir).data
    if data_dir is not None:
        data = dataclasses.replace(data, data_dir=data_dir)
    utterances = getattr(builders.load_splits(data), split)
    if not utterances:
        raise ValueError(f"the {split} split of the data is empty")
    return data, utterances


def evaluate_run(run_dir: str, data_dir: Optional[str] = None, split: str = "test",
                 batch_size: int = 256) -> dict:
    check_split(run_dir, split)
    data, utterances = _data_and_split(run_dir, data_dir, split)
    intents, tags = serve_predictions(run_dir, utterances, batch_size)
    result = metrics_lib.evaluate_utterances(utterances, intents, tags)
    result.update({"run_dir": run_dir, "split": split, "data": data.data_dir or "synthetic"})
    return result


# what decides a run's corpus: two runs compared per class must agree on all of them
_DATA_FIELDS = ("data_dir", "data_seed", "synthetic_size", "synthetic_canaries",
                "synthetic_canary_repeats", "train_fraction")


def run_label(run_dir: str) -> str:
    """"<model> <mechanism>[, eps E]" from the run's config and, if private, its ledger (read
    only): the name a per-class table gives the run."""
    spec = run_files.load_run_spec(run_dir)
    label = f"{spec.model.model} {spec.privacy.mechanism}"
    path = os.path.join(run_dir, "privacy.json")
    if spec.privacy.private and os.path.isfile(path):
        with open(path) as f:
            led = json.load(f)
        # the headline (an interrupted epoch's steps too) where the file is a whole ledger
        epsilon = ledger_lib.headline(led)["epsilon"] if "epochs" in led else led.get("epsilon")
        if isinstance(epsilon, (int, float)):
            label += f", eps {epsilon:.2f}"
    return label


def per_class_run(run_dir: str, compare_to: Optional[str] = None,
                  data_dir: Optional[str] = None, split: str = "test") -> dict:
    """Per-intent and per-slot-type scores of a run (and of `compare_to`, on the same data) with
    each class's count in the run's own training split; a JSON-ready dict, no utterance text.

    The training counts always come from the run's training split (what the model learnt from),
    also when `data_dir` supplies the scored split.
    """
    check_split(run_dir, split)
    if compare_to is not None:
        check_split(compare_to, split)
    data = run_files.load_run_spec(run_dir).data
    if compare_to is not None:  # config.json of a run before a field: upgrade_saved_config's
        other = run_files.load_run_spec(compare_to).data
        differ = [f for f in _DATA_FIELDS if getattr(data, f) != getattr(other, f)]
        if differ:
            raise ValueError(f"{compare_to} was trained on other data than {run_dir} "
                             f"(differing: {', '.join(differ)}): per-class gaps need the same "
                             "training split")
    train = builders.load_splits(data).train
    counts = per_class.training_counts([u.intent for u in train], [u.tags for u in train])
    _, utterances = _data_and_split(run_dir, data_dir, split)
    ref_intents = [u.intent for u in utterances]
    ref_tags = [u.tags for u in utterances]

    def scores(path):
        intents, tags = serve_predictions(path, utterances)
        return per_class.class_scores(ref_intents, ref_tags, intents, tags, counts)

    mine = scores(run_dir)
    result = {
        "diagnostic": per_class.DIAGNOSTIC,
        "run_dir": run_dir, "run": run_label(run_dir), "split": split,
        "data": (data_dir or data.data_dir) or "synthetic",
        "training_data": data.data_dir or "synthetic",
        "training_utterances": len(train),
        "buckets": [label for label, _, _ in per_class.BUCKETS],
        "score": "intent: accuracy (correct / test support); slot type: span F1, exact type "
                 "and boundaries",
    }
    if compare_to is None:
        result["classes"] = [s.to_json() for s in mine]
        result["by_bucket"] = per_class.by_bucket(mine)
        return result
    theirs = scores(compare_to)
    gaps = per_class.compare(mine, theirs)
    result.update({
        "compare_to": compare_to, "reference": run_label(compare_to),
        "gap": "reference score - run score (positive: the run does worse)",
        "lost_if": {"min_gap": per_class.MIN_GAP, "min_support": per_class.MIN_SUPPORT},
        "classes": [g.to_json() for g in gaps],
        "by_bucket": per_class.by_bucket(mine, theirs),
        "frequency_and_gap": per_class.frequency_and_gap(gaps),
        "lost": [dict(kind=g.run.kind, name=g.run.name, train_count=g.run.train_count,
                      support=g.run.support, gap=g.gap)
                 for g in per_class.losses(gaps)],
    })
    return result


def _scores_from_json(classes: list, key: Optional[str] = None):
    def score(d):
        return per_class.ClassScore(d["kind"], d["name"], d["train_count"], d["support"],
                                    d["predicted"], d["correct"],
                                    tuple(tuple(p) for p in d.get("read_as", ())))
    return [score(c[key] if key else c) for c in classes]


def _correlation_lines(result: dict) -> list:
    def fmt(value):
        return "n/a" if value is None else f"{value:+.2f}"
    return [f"{r['kind']}s with >= {r['min_support']} test references ({r['classes']}): "
            f"rank correlation of training count with the gap {fmt(r['count_vs_gap'])}, with "
            f"the reference's score {fmt(r['count_vs_reference'])}"
            for r in result.get("frequency_and_gap", ())]


def per_class_text(result: dict) -> str:
    """The printed report: the diagnostic line, the tables, the classes the run loses."""
    run = result["run"]
    lines = [result["diagnostic"],
             f"run: {result['run_dir']} ({run}); {result['split']} split of {result['data']}; "
             f"training counts from {result['training_utterances']} training utterances of "
             f"{result['training_data']}"]
    if "compare_to" not in result:
        scores = _scores_from_json(result["classes"])
        lines += ["", per_class.class_table(scores, run), "",
                  per_class.bucket_table(result["by_bucket"], run)]
        return "\n".join(lines)
    ref = result["reference"]
    gaps = [per_class.ClassGap(a, b) for a, b in zip(
        _scores_from_json(result["classes"], "run"),
        _scores_from_json(result["classes"], "reference"))]
    lines += [f"reference: {result['compare_to']} ({ref}); gap = reference - run", "",
              per_class.class_table(gaps, run, ref), "",
              per_class.bucket_table(result["by_bucket"], run, ref), ""]
    lines += _correlation_lines(result)
    lost = result["lost"]
    limits = result["lost_if"]
    rule = f"gap >= {limits['min_gap']:.2f} on >= {limits['min_support']} test references"
    if lost:
        lines.append(f"{run} loses {len(lost)} classes against {ref} ({rule}): " + "; ".join(
            f"{c['kind']} {c['name']} (train {c['train_count']}, test {c['support']}, "
            f"gap {c['gap']:.2f})" for c in lost))
    else:
        lines.append(f"{run} loses no class against {ref} ({rule})")
    return "\n".join(lines)


def _run_row(run_dir: str, label: str) -> str:
    """A markdown row of what a run did, from its metrics.json (full runs, as trained)."""
    path = os.path.join(run_dir, "metrics.json")
    if not os.path.isfile(path):
        return f"| `{run_dir}` | {label} | | | | | | |"
    with open(path) as f:
        m = json.load(f)
    test = m.get("test", {})
    seconds = sum(e.get("seconds", 0.0) for e in m.get("epochs", []))
    cells = [f"`{run_dir}`", label, m.get("decoding", "viterbi"), str(len(m.get("epochs", []))),
             f"{seconds:.0f}"] + [f"{test[k]:.3f}" if k in test else ""
                                  for k in ("ser", "intent_accuracy", "slot_f1")]
    return "| " + " | ".join(cells) + " |"


def write_per_class_results(result: dict, prefix: str, commands: list) -> None:
    """PREFIX.md (the report as markdown, with the commands) and PREFIX.png (gap by bucket)."""
    import shlex
    import sys

    directory = os.path.dirname(prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    title = os.path.basename(prefix)
    per_class.plot_gap_by_bucket(result["by_bucket"], prefix + ".png", title, result["run"],
                                 result["reference"])
    evaluate_command = "python -m edp_nlu.evaluate " + " ".join(
        shlex.quote(a) for a in sys.argv[1:])
    text = [f"# {title}: what privacy costs, per class ({result['split']} split)", "",
            f"*{result['diagnostic']}.*", "",
            f"Generated by `{evaluate_command}`. run: `{result['run_dir']}` ({result['run']}); "
            f"reference: `{result['compare_to']}` ({result['reference']}); gap = reference - "
            f"run. Score: {result['score']}. Training counts from the "
            f"{result['training_utterances']} training utterances of `{result['training_data']}`."
            f" A class is lost when the gap is at least {result['lost_if']['min_gap']:.2f} on at "
            f"least {result['lost_if']['min_support']} test references "
            "(edp_nlu/scoring/per_class.py, `losses`); gap se is a rough binomial standard "
            "error.", "", f"![gap by bucket]({title}.png)", "",
            "## Runs", "",
            "| run | model | served decoding | epochs | training seconds | test SER | "
            "intent accuracy | slot F1 |", "|---|---|---|---|---|---|---|---|"]
    text += [_run_row(path, label) for path, label in (
        (result["run_dir"], result["run"]), (result["compare_to"], result["reference"]))]
    text += ["", "## By training-frequency bucket", "",
            per_class.bucket_table(result["by_bucket"], result["run"], result["reference"]), ""]
    text += [f"- {line} (Spearman)" for line in _correlation_lines(result)]
    text += ["", "## Classes lost", ""]
    text += [f"- {c['kind']} `{c['name']}`: train {c['train_count']}, test {c['support']}, "
             f"gap {c['gap']:.3f}" for c in result["lost"]] or ["none"]
    gaps = [per_class.ClassGap(a, b) for a, b in zip(
        _scores_from_json(result["classes"], "run"),
        _scores_from_json(result["classes"], "reference"))]
    text += ["", "## Per class (rarest first)", "",
             per_class.class_table(gaps, result["run"], result["reference"]), "",
             "## Commands", ""]
    text += [f"- `{c}`" for c in commands + [evaluate_command]]
    with open(prefix + ".md", "w") as out:
        out.write("\n".join(text) + "\n")


def scores_by_decoding(run_dir: str, split: str = "test") -> dict:
    """{"viterbi": metrics, "bio": metrics} of a run's latest checkpoint on `split` of its own
    data: the model is rebuilt from the run's config, so runs exported before the BIO decoding
    existed get both (their SavedModel serves Viterbi only)."""
    check_split(run_dir, split)
    spec, model, preprocessor = checkpoint_model(run_dir)
    utterances = getattr(builders.load_splits(spec.data), split)
    if not utterances:
        raise ValueError(f"the {split} split of {run_dir}'s data is empty")
    x = encoding.encode(preprocessor, utterances, split).x
    return predictions.scores_by_decoding(model, preprocessor, utterances, x)


def checkpoint_model(run_dir: str) -> tuple:
    """(run spec, model, preprocessor) of a run's latest checkpoint, the model rebuilt from the
    run's config: for scoring what its export cannot (other decodings of the same weights)."""
    import tensorflow as tf

    spec = run_files.load_run_spec(run_dir)
    if spec.optimizer.ema_fraction > 0:  # its checkpoint holds the raw weights, not these
        raise ValueError(f"{run_dir} kept a moving average of its weights (ema_fraction), which "
                         "its checkpoint does not hold: score its export instead")
    if spec.privacy.private and spec.optimizer.noise_filter == "kalman":
        # between steps the model holds the Kalman filter's extrapolated point, which the
        # checkpoint saves; the export holds the iterate (FilteredOptimizer's finalize)
        raise ValueError(f"{run_dir} trained behind the Kalman filter (noise_filter=kalman): its "
                         "checkpoint holds the extrapolated weights, not the ones it released: "
                         "score its export instead")
    checkpoint = checkpoints.latest_prefix(run_dir)
    if checkpoint is None:
        raise ValueError(f"{run_dir} has no intact committed checkpoint in checkpoints/")
    preprocessor = warm_start.run_preprocessor(run_dir, spec.model)
    widths = [shape[1] for name, shape in tf.train.list_variables(checkpoint)
              if "word_embedding/_embeddings" in name and "optimizer" not in name]
    model = warm_start.trained_model(spec.model, preprocessor, checkpoint,
                                     widths[0] if widths else 0)
    return spec, model, preprocessor


def main(argv, values: flags.FlagValues = flags.FLAGS) -> None:
    del argv
    f = values
    if (f.compare_to or f.per_class_results or f.command) and not f.per_class:
        raise app.UsageError("--compare_to, --per_class_results and --command go with --per_class")
    if f.per_class_results and not f.compare_to:
        raise app.UsageError("--per_class_results plots a gap: give --compare_to")
    if f.per_class:
        if f.decodings:
            raise app.UsageError("--per_class scores the export: drop --decodings")
        # refused before anything is scored
        path = per_class_output(f.run_dir, f.output, f.compare_to)
        if f.per_class_results:
            per_class_output(f.run_dir, f.per_class_results + ".md", f.compare_to,
                             "--per_class_results")
        result = per_class_run(f.run_dir, f.compare_to, f.data_dir, f.split)
        print(per_class_text(result))
        with open(path, "w") as out:
            out.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")
        if f.per_class_results:
            write_per_class_results(result, f.per_class_results, list(f.command))
            print(f"wrote {f.per_class_results}.md and {f.per_class_results}.png")
        return
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
    cli.define_flags_or_exit(define_flags)
    cli.run(main)
