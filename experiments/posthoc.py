"""What the post-hoc scoring tools (o_penalty, intent_prior, label_prior) share: one forward
pass of a run's model over padded batches, and their results files (one JSON per run, and a
table over every run that names the command of each row)."""
from __future__ import annotations

import glob
import json
import os
from typing import Callable, Sequence

import tensorflow as tf

from edp_nlu.scoring import predictions


def forward(model, x: dict) -> list:
    """[(real rows, infer outputs)] over padded batches: one forward pass serves every setting
    a tool sweeps."""
    infer = tf.function(model.infer, reduce_retracing=True)
    return [(real, infer(batch)) for real, (batch,) in predictions.padded_batches(256, x)]


def write_run(results_dir: str, tool: str, run_dir: str, rows: list,
              table: Callable[[Sequence[dict]], str], **fields) -> str:
    """One run's rows (settings chosen on dev) as results_dir/<run name>.json, naming the tool's
    command for that run, then the table over every run; returns the run's name."""
    name = os.path.basename(os.path.normpath(run_dir))
    write_results(results_dir, {
        "name": name, "run_dir": run_dir, "chosen_on": "dev", **fields,
        "command": f"python -m experiments.{tool} --run_dir={run_dir}", "rows": rows}, table)
    return name


def write_results(results_dir: str, result: dict,
                  table: Callable[[Sequence[dict]], str]) -> None:
    """`result` as results_dir/<name>.json, then results_dir/table.md from every run's JSON
    there: `table(results)` followed by the command of each row."""
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, result["name"] + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    results = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path) as f:
            results.append(json.load(f))
    commands = "".join(f"- {r['name']}: `{r['command']}`\n" for r in results)
    with open(os.path.join(results_dir, "table.md"), "w") as f:
        f.write(table(results) + "\nCommands:\n\n" + commands)
