"""`python -m experiments.experiment`: a grid of training runs -> the paper's Table 1 + 2 and plots.

    python -m experiments.experiment --grid=experiments/grids/snips.py  # run what is missing
    python -m experiments.experiment --grid=experiments/grids/snips.py \\
        --cells=bert_sgd,bert_dpsgd_eps8
    python -m experiments.experiment --grid=experiments/grids/snips.py --report  # tables/plots only
    python -m experiments.experiment --grid=experiments/grids/snips.py --list

Each cell is one `python -m edp_nlu.train` process (its exact command goes into the table), run
in `<runs_dir>/<cell>`; when it finishes, its numbers go to `<results_dir>/cells/<cell>.json` and
the tables and plots are rewritten. Resumable: finished cells are skipped, an interrupted cell
continues from its last checkpoint (`--resume`), so a grid can be run over several sittings.

Writes `<results_dir>/table1.csv`, `table1.md` (test SER, delta SER vs the same model's SGD, intent
accuracy, slot F1, membership-inference AUC / TPR at 1% and 0.1% FPR / delta AUC, epsilon at the
run's delta and at 1/n and 1e-6, log10 epsilon, seconds per epoch and its ratio to SGD, command),
`frontier.png` (SER vs epsilon: per model and family, a line through the best row at each epsilon
and the other rows as hollow markers), `epsilon_per_epoch.png` (per noise-decay schedule) and
`membership_roc.png`.

    python -m experiments.experiment --grid=experiments/grids/snips.py --rescore  # add BIO decoding

Accounted tuning (edp_tf/tuning.py, docs/privacy.md "Tuning on your own data"): train K ~
Poisson(mu) candidates drawn uniformly from the grid's cells (or --cells), release the one with
the best dev SER, and state its epsilon with the selection included (Papernot & Steinke 2022):

    python -m experiments.experiment --grid=G --cells=a,b,c --select --mu=8  # train, select
    python -m experiments.experiment --grid=G --cells=a,b,c --select --mu=8 --plan_only  # epsilon

writes `results/tuning/<name>.json` and `.md` (the chosen candidate alone: its cell, its run
directory, its metrics); the candidates train in `<runs_dir>/select_<name>/<cell>-<random
token>/`, named without an index so that the released one tells neither K nor its position, and
nothing is printed per candidate. That directory's `draw.json` (K and the draws), the other runs
and their logs must stay secret.
"""
from __future__ import annotations

if __name__ == "__main__":  # before the imports below load TensorFlow: its native logs read the
    from edp_nlu import cli  # setting once, at import

    cli.quiet_unless_verbose()

import csv  # noqa: E402
import json
import math
import os
import secrets
import shlex
import subprocess
import sys
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from edp_nlu.configs import config_file
from edp_nlu.pipeline import builders, label_selection
from edp_nlu.pipeline.run_spec import RunSpec, upgrade_saved_config
from edp_tf import accounting, attacks, checks, tuning
from edp_tf.ledger import read_ledger, write_json_atomically

_GRID = config_flags.DEFINE_config_file("grid", None, "Grid config file (experiments/grids/*.py).")
_CELLS = flags.DEFINE_list("cells", None, "Only these cells (default: all of the grid).")
_REPORT = flags.DEFINE_bool("report", False, "Only rewrite the tables and plots.")
_LIST = flags.DEFINE_bool("list", False, "List the cells and their state, then exit.")
_PYTHON = flags.DEFINE_string("python", sys.executable, "Interpreter for the training runs.")
_DEV_ATTACK = flags.DEFINE_bool(
    "dev_attack", False, "For finished cells measured before the dev-split membership attack: "
    "resume their finished run (which recomputes its final metrics, the attack included) and add "
    "the attack to the cell's result. The run's test metrics must come out as stored.")

_RESCORE = flags.DEFINE_bool(
    "rescore", False, "For finished cells measured before the BIO-constrained decoding: score "
    "their run's last checkpoint with both decodings and add the BIO one to the cell's result. "
    "The unconstrained scores must come out as stored.")

_SELECT = flags.DEFINE_bool(
    "select", False, "Accounted tuning: train K ~ Poisson(--mu) candidates drawn uniformly from "
    "the grid's cells (--cells), release the best by dev SER, with its epsilon including the "
    "selection (edp_tf/tuning.py).")
_MU = flags.DEFINE_float("mu", 8.0, "--select: the mean number of candidates (>= 1).")
_DISTRIBUTION = flags.DEFINE_enum(
    "distribution", "poisson", ["poisson", "logarithmic", "geometric"],
    "--select: the distribution of the number of candidates K (Papernot & Steinke 2022).")
_SEED = flags.DEFINE_integer(
    "select_seed", None, "--select: draw K and the candidates from this seed instead of OS entropy "
    "(reproducible, and then NOT private: the bound needs K secret).")
_PLAN_ONLY = flags.DEFINE_bool(
    "plan_only", False, "--select: print the epsilon with and without the selection, train "
    "nothing.")
_NAME = flags.DEFINE_string("select_name", None, "--select: results/tuning/<name>.json (default: "
                            "the grid's dataset).")
_CANDIDATE_OVERRIDES = flags.DEFINE_list(
    "candidate_overrides", [], "--select: config overrides (field=value) added to every "
    "candidate, after the cell's own.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------ cells
def cell_command(grid, cell, python: str = "python", resume: bool = False,
                 runs_dir: str | None = None) -> list:
    """The `edp_nlu.train` command line of a cell (relative paths: run it from the repo root).
    A resume names only the run directory: the run continues with its own config.json, which
    the cell's config file alone (without the cell's overrides) would contradict."""
    run_dir = f"--run_dir={os.path.join(runs_dir or grid.runs_dir, cell.name)}"
    if resume:
        return [python, "-m", "edp_nlu.train", run_dir, "--resume"]
    return [python, "-m", "edp_nlu.train", f"--config={cell.config}", run_dir,
            *(f"--config.{override}" for override in cell.overrides)]


def cell_result_path(grid, name: str) -> str:
    return os.path.join(grid.results_dir, "cells", f"{name}.json")


def _read(path, default=None):
    if not os.path.isfile(path):
        return default
    with open(path) as f:
        return json.load(f)


def _bytes(path):
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def _write(path, payload) -> None:
    write_json_atomically(path, payload, sort_keys=True)


def collect(grid, cell) -> dict:
    """The cell's numbers, read back from its finished run directory."""
    run_dir = os.path.join(grid.runs_dir, cell.name)
    config = _read(os.path.join(run_dir, "config.json"))
    metrics = _read(os.path.join(run_dir, "metrics.json"))
    if not config or not metrics or "test" not in metrics:
        raise RuntimeError(f"cell {cell.name}: {run_dir} holds no finished run")
    privacy = _read(os.path.join(run_dir, "privacy.json"), {})
    by_decoding = metrics.get("test_by_decoding") or {"viterbi": metrics["test"]}
    # an epoch evaluated on resume (its metrics lost to a kill) has no time of its own
    seconds = sorted(e["seconds"] for e in metrics["epochs"] if e.get("seconds") is not None)
    c = upgrade_saved_config(config["config"])  # a run's config before a field: what it used
    result = {
        "name": cell.name, "label": cell.label, "model": c["model"],
        "mechanism": c["mechanism"], "family": cell.family,
        "target_epsilon": c["target_epsilon"],
        # as a reader would type it: the default run directory, whatever this grid used
        "command": " ".join(shlex.quote(a) for a in cell_command(
            grid, cell, runs_dir=f"runs/experiments/{grid.dataset}")),
        # Every row's SER is the unconstrained Viterbi's (all runs have it); test_bio is the
        # BIO-constrained decoding's (runs that decoded both ways, or --rescore).
        "test": by_decoding["viterbi"], "test_bio": by_decoding.get("bio", {}),
        "membership_inference": {
            k: v for k, v in (metrics.get("membership_inference") or {}).items()},
        "membership_inference_dev": metrics.get("membership_inference_dev") or {},
        "epochs": len(metrics["epochs"]),
        "seconds_per_epoch": seconds[len(seconds) // 2] if seconds else None,
        "dataset_size": config["dataset_size"], "delta": config["delta"],
        "batch_size": c["batch_size"], "learning_rate": c["learning_rate"],
        "replicas": c["replicas"],
    }
    if c["mechanism"] != "sgd":
        result.update({
            "epsilon": privacy.get("epsilon"), "epsilon_rdp": privacy.get("epsilon_rdp"),
            "epsilon_at_other_deltas": privacy.get("epsilon_at_other_deltas", {}),
            "private": privacy.get("private"), "not_covered": privacy.get("not_covered", []),
            "noise_multiplier": (privacy.get("schedule") or {}).get("noise_multiplier"),
            "sampling_rate": privacy.get("sampling_rate"),
        })
    else:
        result.update({"epsilon": math.inf, "private": False})
    return result


def run_cell(grid, cell, python: str, log) -> dict:
    run_dir = os.path.join(grid.runs_dir, cell.name)
    resume = os.path.isfile(os.path.join(run_dir, "state.json"))
    if os.path.isfile(os.path.join(run_dir, "config.json")) and not resume:
        raise RuntimeError(f"cell {cell.name}: {run_dir} holds a run that never finished an "
                           "epoch; delete it to start the cell again")
    if not resume:
        _refuse_a_missing_source(grid, cell)
    os.makedirs(grid.runs_dir, exist_ok=True)
    command = cell_command(grid, cell, python, resume)
    with open(os.path.join(grid.runs_dir, f"{cell.name}.log"), "a") as out:
        out.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
        out.flush()
        code = subprocess.call(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"cell {cell.name}: edp_nlu.train exited with {code}; see "
                           f"{grid.runs_dir}/{cell.name}.log")
    result = collect(grid, cell)
    _write(cell_result_path(grid, cell.name), result)
    return result


def _refuse_a_missing_source(grid, cell) -> None:
    """RuntimeError before anything starts when the run the cell's `init_from` names is not here.

    Why here: the trainer refuses it too (no such run directory), but cannot say which cell of
    the grid makes that run, nor that the cell's recorded result makes the runner skip it (run
    directories go, results stay): the message says how to make the source again."""
    for override in cell.overrides:
        field, _, source = override.partition("=")
        if field != "init_from" or not source or os.path.isdir(os.path.join(ROOT, source)):
            continue
        maker = next((c for c in grid.cells if os.path.normpath(os.path.join(
            grid.runs_dir, c.name)) == os.path.normpath(source)), None)
        how = ""
        if maker is not None:
            recorded = cell_result_path(grid, maker.name)
            how = (f"; the grid's cell {maker.name} makes it: "
                   + (f"its result {recorded} is recorded, so the runner skips it: move that "
                      f"file away, then run --cells={maker.name} first" if os.path.isfile(recorded)
                      else f"run --cells={maker.name} first"))
        raise RuntimeError(f"cell {cell.name}: starts from {source} (init_from), which is not "
                           f"here{how}")


def add_dev_attack(grid, cell, python: str) -> dict:
    """The cell's stored result with `membership_inference_dev` from its finished run directory
    (the one its command names), recomputed by resuming that run; RuntimeError if the run's
    test metrics no longer match the stored ones (then it is not the run of this row)."""
    path = cell_result_path(grid, cell.name)
    result = _read(path)
    if "membership_inference_dev" in result or not result.get("membership_inference"):
        return result  # measured already (maybe {}: no dev split), or run without diagnostics
    run_dir = _result_run_dir(grid, result)
    full = os.path.join(ROOT, run_dir)
    state = _read(os.path.join(full, "state.json"))
    config = _read(os.path.join(full, "config.json"))
    if not state or not config:
        raise RuntimeError(f"cell {cell.name}: its run directory {run_dir} is not here")
    if state.get("epochs_done", 0) < config["config"]["epochs"]:  # resuming would train
        raise RuntimeError(f"cell {cell.name}: {run_dir} stopped before its last epoch")
    ledger_files = {f: _bytes(os.path.join(full, f)) for f in ("privacy.json", "state.json")}
    with open(full + ".attack.log", "a") as out:
        code = subprocess.call([python, "-m", "edp_nlu.train", f"--run_dir={run_dir}",
                                "--resume", "--recompute_metrics"], cwd=ROOT, stdout=out,
                               stderr=subprocess.STDOUT)
    if any(_bytes(os.path.join(full, f)) != b for f, b in ledger_files.items()):
        raise RuntimeError(f"cell {cell.name}: resuming {run_dir} changed its privacy.json or "
                           "state.json")
    metrics = _read(os.path.join(full, "metrics.json"), {})
    if code != 0 or "membership_inference_dev" not in metrics:
        raise RuntimeError(f"cell {cell.name}: resuming {run_dir} failed ({code}); see "
                           f"{run_dir}.attack.log")
    stored = result["test"]
    now = (metrics.get("test_by_decoding") or {"viterbi": metrics["test"]})["viterbi"]
    if any(abs(stored[k] - now[k]) > 1e-9 for k in ("ser", "intent_accuracy", "slot_f1")):
        raise RuntimeError(f"cell {cell.name}: {run_dir} now scores test SER {now['ser']:.4f}, "
                           f"the row says {stored['ser']:.4f}: not this row's run")
    result["membership_inference_dev"] = metrics["membership_inference_dev"]
    if "bio" in (metrics.get("test_by_decoding") or {}):  # the resume scored it too
        result["test_bio"] = metrics["test_by_decoding"]["bio"]
    _write(path, result)
    return result


def _result_run_dir(grid, result: dict) -> str:
    """The run directory a stored result's command names, inside this grid's runs_dir."""
    run_dir = next(a.split("=", 1)[1] for a in shlex.split(result["command"])
                   if a.startswith("--run_dir="))
    typed = f"runs/experiments/{grid.dataset}/"  # the command as typed; this grid's runs_dir
    if run_dir.startswith(typed):
        run_dir = os.path.join(grid.runs_dir, run_dir[len(typed):])
    return run_dir


def add_bio_decoding(grid, cell, python: str) -> dict:
    """The cell's stored result with `test_bio`, scored on its run's last checkpoint (by
    `edp_nlu.evaluate --decodings`, from the repository root as the run was); RuntimeError if
    the run is gone or its Viterbi scores differ from the stored ones (then it is not the run of
    this row)."""
    path = cell_result_path(grid, cell.name)
    result = _read(path)
    if result.get("test_bio"):
        return result
    run_dir = _result_run_dir(grid, result)
    full = os.path.join(ROOT, run_dir)
    if not os.path.isfile(os.path.join(full, "state.json")):
        raise RuntimeError(f"cell {cell.name}: its run directory {run_dir} is not here")
    scores = full + ".decodings.json"
    with open(full + ".decodings.log", "a") as out:
        code = subprocess.call([python, "-m", "edp_nlu.evaluate", f"--run_dir={run_dir}",
                                "--decodings", f"--output={scores}"], cwd=ROOT, stdout=out,
                               stderr=subprocess.STDOUT)
    now = _read(scores)
    if code != 0 or not now:
        raise RuntimeError(f"cell {cell.name}: scoring {run_dir} failed ({code}); see "
                           f"{run_dir}.decodings.log")
    os.remove(scores)
    stored = result["test"]
    if any(abs(stored[k] - now["viterbi"][k]) > 1e-9 for k in ("ser", "intent_accuracy",
                                                               "slot_f1")):
        raise RuntimeError(f"cell {cell.name}: its checkpoint now scores test SER "
                           f"{now['viterbi']['ser']:.4f}, the row says {stored['ser']:.4f}: not "
                           "this row's run")
    result["test_bio"] = now["bio"]
    _write(path, result)
    return result


# ------------------------------------------------------------------------------ report
COLUMNS = ["model", "row", "batch", "epochs", "target_eps", "epsilon", "log10_eps", "eps_at_1/n",
           "eps_at_1e-6", "test_ser", "delta_ser_pct", "ser_bio", "slot_f1_bio", "intent_acc",
           "slot_f1", "mia_auc", "mia_auc_ci95", "delta_auc", "mia_auc_dev", "mia_auc_dev_ci95",
           "tpr_at_1pct", "tpr_at_0.1pct", "s_per_epoch", "time_vs_sgd", "command"]


def table_rows(results: list) -> list:
    sgd = {}  # each model's first SGD row (grids list the current one first, older ones after)
    for r in results:
        if r["mechanism"] == "sgd":
            sgd.setdefault(r["model"], r)
    rows = []
    for r in results:
        base = sgd.get(r["model"])
        eps = r.get("epsilon")
        others = r.get("epsilon_at_other_deltas") or {}
        mia = r.get("membership_inference") or {}
        mia_dev = r.get("membership_inference_dev") or {}
        row = {
            "model": r["model"], "row": r["label"], "batch": r.get("batch_size", ""),
            "epochs": r.get("epochs", ""),
            "target_eps": (r.get("target_epsilon") or "") if r["mechanism"] != "sgd" else "",
            "epsilon": eps, "log10_eps": (math.log10(eps) if eps and math.isfinite(eps) and eps > 0
                                          else eps),
            "eps_at_1/n": (others.get("1/n") or {}).get("epsilon", ""),
            "eps_at_1e-6": (others.get("1e-06") or {}).get("epsilon", ""),
            "test_ser": r["test"]["ser"], "intent_acc": r["test"]["intent_accuracy"],
            "ser_bio": (r.get("test_bio") or {}).get("ser", ""),
            "slot_f1_bio": (r.get("test_bio") or {}).get("slot_f1", ""),
            "slot_f1": r["test"]["slot_f1"], "mia_auc": mia.get("auc", ""),
            "mia_auc_ci95": _auc_interval(mia),
            "mia_auc_dev": mia_dev.get("auc", ""), "mia_auc_dev_ci95": _auc_interval(mia_dev),
            "tpr_at_1pct": mia.get("tpr_at_1pct_fpr", ""),
            "tpr_at_0.1pct": mia.get("tpr_at_0.1pct_fpr", ""),
            "s_per_epoch": r.get("seconds_per_epoch"), "command": r["command"],
            "delta_ser_pct": "", "delta_auc": "", "time_vs_sgd": "",
        }
        if base is not None:
            row["delta_ser_pct"] = 100.0 * (r["test"]["ser"] - base["test"]["ser"]) / max(
                base["test"]["ser"], 1e-9)
            base_mia = base.get("membership_inference") or {}
            if mia and base_mia:
                row["delta_auc"] = mia["auc"] - base_mia["auc"]
            if r.get("seconds_per_epoch") and base.get("seconds_per_epoch"):
                row["time_vs_sgd"] = r["seconds_per_epoch"] / base["seconds_per_epoch"]
        rows.append(row)
    return rows


def _auc_interval(mia: dict) -> str:
    """"lo-hi", the attack AUC's 95% interval (from the counts, so older cells get it too)."""
    if not mia.get("members") or not mia.get("nonmembers"):
        return ""

    lo, hi = attacks.auc_interval(mia["auc"], mia["members"], mia["nonmembers"])
    return f"{lo:.3f}-{hi:.3f}"


def _fmt(value, digits=3) -> str:
    if value == "" or value is None:
        return ""
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:.{digits}f}"
    return str(value)


def write_tables(grid, results: list, missing: list) -> None:
    rows = table_rows(results)
    os.makedirs(grid.results_dir, exist_ok=True)
    with open(os.path.join(grid.results_dir, "table1.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    shown = [c for c in COLUMNS if c != "command"]
    lines = [f"# {grid.dataset}: utility, privacy and speed (test split)", "",
             f"Generated by `python -m experiments.experiment --grid={grid.grid_file}`; one run "
             "per "
             f"row, 2-core CPU. delta = {results[0]['delta']:.3g} (0.1/n) unless stated; "
             "test_ser, slot_f1 and the rest decode the CRF's unconstrained best path (as every "
             "row did before the BIO-constrained decoding was added); ser_bio and slot_f1_bio "
             "decode the best well-formed BIO path, the trainer's default now (blank: not "
             "measured, e.g. that run's checkpoint is gone "
             "or no longer reproduces the row). "
             "epsilon is PLD (dp-accounting) at that delta; eps_at_1/n and eps_at_1e-6 are the "
             "same run at other deltas. delta_ser_pct is relative to the same model's SGD row; "
             "mia = loss-threshold membership inference (members: training utterances, "
             "non-members: test), mia_auc_ci95 its 95% interval (Hanley-McNeil: about +-0.03 "
             "with 700 non-members), delta_auc vs SGD; mia_auc_dev is the same attack with the dev "
             "split as non-members (drawn like train, where test may not be; blank: not "
             "measured for that run).", ""] if results else [f"# {grid.dataset}", ""]
    if results:
        lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
        for row in rows:
            lines.append("| " + " | ".join(_fmt(row[c]) for c in shown) + " |")
        lines += ["", "Commands:", ""]
        lines += [f"- {row['model']} / {row['row']}: `{row['command']}`" for row in rows]
    if missing:
        lines += ["", "Cells not run yet (left out of this table): " + ", ".join(missing)]
    if grid.get("notes"):
        lines += ["", grid.notes]
    with open(os.path.join(grid.results_dir, "table1.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def frontier(results: list) -> dict:
    """{(model, family): (best, others)} over the private rows with a finite epsilon: `best` is
    the lowest-test-SER row at each epsilon (rounded to 0.1, so 7.99 and 8.00 are one budget),
    sorted by epsilon; `others` are the family's remaining rows (recipe variants at a budget),
    which a frontier line must not pass through."""
    budgets = {}
    for r in results:
        if r["mechanism"] != "sgd" and r.get("epsilon") and math.isfinite(r["epsilon"]):
            key = (r["model"], r["family"])
            budgets.setdefault(key, {}).setdefault(round(r["epsilon"], 1), []).append(r)
    out = {}
    for key, by_eps in budgets.items():
        best, others = [], []
        for eps in sorted(by_eps):
            rows = sorted(by_eps[eps], key=lambda r: r["test"]["ser"])
            best.append(rows[0])
            others.extend(rows[1:])
        out[key] = (best, others)
    return out


def write_plots(grid, results: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # frontier: SER vs epsilon, one line per (model, family) through its best row at each
    # epsilon, the family's other rows (recipe variants) as hollow markers; the best SGD row of
    # each model as a horizontal line
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    best_sgd = {}
    for r in results:
        if r["mechanism"] == "sgd":
            best_sgd[r["model"]] = min(best_sgd.get(r["model"], math.inf), r["test"]["ser"])
    for i, (model, ser) in enumerate(sorted(best_sgd.items())):
        ax.axhline(ser, ls="--", lw=1, color=f"C{i}", label=f"{model} SGD (best row)")
    for i, ((model, family), (best, others)) in enumerate(sorted(frontier(results).items())):
        color = f"C{len(best_sgd) + i}"
        ax.plot([r["epsilon"] for r in best], [r["test"]["ser"] for r in best], marker="o",
                color=color, label=f"{model} {family}")
        ax.plot([r["epsilon"] for r in others], [r["test"]["ser"] for r in others], ls="",
                marker="o", mfc="none", color=color)
    ax.set_xscale("log")
    ax.set_xlabel("per-run epsilon (PLD, delta = 0.1/n; selection not included)")
    ax.set_ylabel("test SER (lower is better)")
    ax.set_title(f"{grid.dataset}: privacy-utility frontier\n(per-run epsilon, selection not "
                 "included)")
    _save(fig, ax, os.path.join(grid.results_dir, "frontier.png"), legend_size=7)

    # membership-inference ROC curves
    fig, ax = plt.subplots(figsize=(5, 5))
    for r in results:
        roc = (r.get("membership_inference") or {}).get("roc")
        if roc:
            ax.plot([max(f, 1e-4) for f in roc["fpr"]], [max(t, 1e-4) for t in roc["tpr"]],
                    label=f"{r['model']} {r['label']} (AUC {r['membership_inference']['auc']:.3f})")
    ax.plot([1e-4, 1], [1e-4, 1], "k:", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate")
    ax.set_title(f"{grid.dataset}: loss-threshold membership inference")
    _save(fig, ax, os.path.join(grid.results_dir, "membership_roc.png"), legend_size=6)


def _save(fig, ax, path: str, legend_size: int) -> None:
    import matplotlib.pyplot as plt

    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_epsilon_per_epoch(grid, results: list) -> None:
    """Epsilon after each epoch for each decay schedule, every schedule calibrated to the same
    final epsilon (the grid's reference private cell: its n, q, epochs)."""
    reference = [r for r in results if r["name"] == grid.get("schedule_reference", "")]
    if not reference or not reference[0].get("sampling_rate"):
        return
    r = reference[0]
    path = os.path.join(grid.results_dir, "epsilon_per_epoch.json")
    key = [r["epsilon"], r["sampling_rate"], r["epochs"], r["delta"]]
    cached = _read(path)
    if not cached or cached.get("key") != key:
        steps = math.ceil(1.0 / r["sampling_rate"] - 1e-9)
        curves = {}
        for decay, rate in (("none", 0.0), ("linear", 0.1), ("exponential", 0.1)):
            z0 = accounting.calibrate_noise(r["epsilon"], r["delta"], r["sampling_rate"],
                                            r["epochs"], steps, decay, rate, "calibrated", 1, 1)
            records = accounting.plan_schedule(z0, r["epochs"], steps, decay, rate,
                                               "calibrated", 1, 1)
            eps = accounting.epsilon_per_epoch(records, r["sampling_rate"], r["delta"], (), "pld")
            curves[f"{decay} (tau {rate:g}), z0 {z0:.3f}"] = [float(e) for e in eps]
        cached = {"key": key, "curves": curves}
        _write(path, cached)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, eps in cached["curves"].items():
        ax.plot(range(1, len(eps) + 1), eps, marker=".", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("epsilon so far (PLD)")
    ax.set_title(f"{grid.dataset}: epsilon per epoch by noise decay ({r['name']})")
    _save(fig, ax, os.path.join(grid.results_dir, "epsilon_per_epoch.png"), legend_size=7)


def report(grid) -> list:
    results, missing = [], []
    for cell in grid.cells:
        result = _read(cell_result_path(grid, cell.name))
        (results.append(result) if result else missing.append(cell.name))
    if results:
        write_tables(grid, results, missing)
        write_plots(grid, results)
        write_epsilon_per_epoch(grid, results)
    return results


# ------------------------------------------------------------------------------ accounted tuning
DISTRIBUTION_SHAPES = {"poisson": math.inf, "logarithmic": 0.0, "geometric": 1.0}
SCORE = "dev SER at the last epoch (lower is better)"
TUNING_NOT_COVERED = [
    "The number of candidates K, the other candidates (their models, runs and scores) and "
    "draw.json: the bound needs them secret; releasing them costs the composition of the K runs.",
    "The dev split: the selection reads exact dev metrics, so the dev utterances are not "
    "protected (epsilon protects the training examples); the released dev and test metrics are "
    "exact functions of the dev and test splits.",
]


def cell_config(cell, extra_overrides=()):
    """The edp_nlu.train config of a cell (its file and overrides, parsed as the trainer
    parses them), with `extra_overrides` after the cell's own."""
    path = config_file(cell.config)  # a packaged config's name, or a path from the repository root
    path = path if os.path.isabs(path) else os.path.join(ROOT, path)
    argv = ["cell", f"--config={path}"] + [f"--config.{o}" for o in
                                           (*cell.overrides, *extra_overrides)]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


_SPLITS: dict = {}


def planned_run(config) -> dict:
    """The schedule edp_nlu.train will charge for `config`, found with the trainer's own
    builders (the corpus's n, the automatic recipe, the calibrated z0) without training: the
    selection's bound must hold for every candidate before any of them sees the data.

    Returns {"records", "sampling_rate", "extra_events", "delta", "dataset_size"}; ValueError
    for a candidate that would not be private (plain training, shuffled batches, a fixed seed)."""
    spec = RunSpec.parse(config)
    if label_selection.selects_privately(spec.data, spec.privacy.private):
        raise ValueError(
            "a candidate would select its label sets from the training split with DP, and the "
            "selection's threshold spends a delta the tuning accountant (RDP) cannot compose: "
            "give the candidates a label schema (--config.label_schema, or schema.json in the "
            "data directory)")
    if not spec.privacy.private or spec.sampling.sampling != "poisson" or spec.run.seed >= 0:
        raise ValueError("a candidate must be private: a DP mechanism, Poisson sampling and no "
                         f"fixed seed (got mechanism={config.mechanism}, sampling="
                         f"{config.sampling}, seed={config.seed})")
    key = (config.data_dir, config.data_seed, config.synthetic_size, config.synthetic_canaries,
           config.synthetic_canary_repeats)
    if key not in _SPLITS:
        _SPLITS[key] = builders.load_splits(spec.data)
    if not _SPLITS[key].dev:
        raise ValueError("the selection scores candidates on the dev split, and this corpus has "
                         "none")
    n, users = builders.privacy_units(spec.privacy, _SPLITS[key].train)
    c = spec.resolved(n)
    delta = c.privacy.delta or accounting.default_delta(n)
    k, replicas = builders.microbatch_size(c.privacy), int(c.run.replicas)
    q = int(c.sampling.batch_size) / n
    sampler = builders.poisson_sampler(c.data, c.privacy, n, q, k, replicas, users)
    steps = sampler.steps_per_epoch
    _, plan = builders.private_run(c.sampling, c.privacy, k, sampler.expected_batch_size, None,
                                   replicas, sampler, q, n, delta, steps)
    return {"records": plan.schedule(), "sampling_rate": q,
            "extra_events": tuple(plan.extra_events), "delta": delta, "dataset_size": n}


def _same_schedule(ledger: dict, plan: dict) -> str:
    """"" if the run's ledger charged (a prefix of) the planned schedule, else why not."""
    recorded = [accounting.EpochRecord.from_dict(e) for e in ledger["epochs"]]
    planned = plan["records"]
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-9)  # noqa: E731
    if not ledger.get("private"):
        return "its privacy.json says private: false"
    if not (close(ledger["sampling_rate"], plan["sampling_rate"])
            and close(ledger["delta"], plan["delta"])):
        return "its sampling rate or delta is not the planned one"
    if len(recorded) > len(planned) or any(
            r.steps != p.steps or not close(r.effective_noise_multiplier,
                                            p.effective_noise_multiplier)
            for r, p in zip(recorded, planned)):
        return "its recorded epochs are not the planned schedule"
    if accounting.as_extra_events(ledger.get("extra_events", [])) != tuple(plan["extra_events"]):
        return "its extra events are not the planned ones"
    return ""


def tuning_plan(grid, cells, mu: float, distribution: str, extra_overrides=()) -> tuple:
    """(the plan's dict for the results file, the edp_tf.tuning.TuningCost): every candidate's
    planned schedule and per-run epsilon, and the released model's epsilon with the selection."""
    plans = {c.name: planned_run(cell_config(c, extra_overrides)) for c in cells}
    deltas = {p["delta"] for p in plans.values()}
    if len(deltas) != 1:
        raise ValueError(f"the candidates must share one delta (one corpus), got {sorted(deltas)}")
    events = {name: tuning.run_event(p["records"], p["sampling_rate"], p["extra_events"])
              for name, p in plans.items()}
    delta = deltas.pop()
    cost = tuning.tuning_cost(list(events.values()), delta, mu, DISTRIBUTION_SHAPES[distribution])
    others = {d: tuning.selection_cost(cost.per_run, mu, shape).epsilon
              for d, shape in DISTRIBUTION_SHAPES.items()}
    candidates = {}
    for name, p in plans.items():
        one = tuning.per_run([events[name]], delta)
        candidates[name] = {
            "dataset_size": p["dataset_size"], "sampling_rate": p["sampling_rate"],
            "epochs": len(p["records"]), "steps": sum(r.steps for r in p["records"]),
            "noise_multiplier": p["records"][0].noise_multiplier if p["records"] else None,
            "epsilon": one.epsilon, "epsilon_rdp": one.epsilon_rdp}
    plan = {"candidates": candidates, "accounting": cost.to_dict(),
            "selection_epsilon_by_distribution": others}
    return plan, cost, plans


def tuning_text(plan: dict) -> list:
    """The plan as lines: the candidates, then epsilon per run, with the selection, composed."""
    a = plan["accounting"]
    lines = [f"Candidates (each run draws one uniformly; the selection is charged the costliest), "
             f"delta = {a['delta']:.3g}:",
             f"  {'cell':32s} {'n':>6} {'q':>7} {'steps':>6} {'z0':>7} {'eps PLD':>8} "
             f"{'eps RDP':>8}"]
    for name, c in plan["candidates"].items():
        lines.append(f"  {name:32s} {c['dataset_size']:>6} {c['sampling_rate']:>7.4g} "
                     f"{c['steps']:>6} {c['noise_multiplier']:>7.4g} {c['epsilon']:>8.3f} "
                     f"{c['epsilon_rdp']:>8.3f}")
    k = f"K ~ {a['distribution']}(mean {a['mean_runs']:g})"
    lines += [
        f"One run (what each run's privacy.json says): epsilon {a['per_run_epsilon']:.3f} (PLD; "
        f"RDP {a['per_run_epsilon_rdp']:.3f})",
        f"The best of {k} runs, released alone (Papernot & Steinke 2022): epsilon "
        f"{a['selection_epsilon']:.3f}" + (
            f" (delta_hat from the runs' PLD; {a['selection_epsilon_rdp_delta_hat']:.3f} with "
            "delta_hat from RDP, dp-accounting's RepeatAndSelectDpEvent)"
            if a["selection_epsilon_pld_delta_hat"] is not None else ""),
        f"{a['fixed_runs']} runs composed (all released): epsilon {a['fixed_runs_epsilon']:.3f} "
        f"(PLD; RDP {a['fixed_runs_epsilon_rdp']:.3f})",
        "Same mean, other distributions of K: " + ", ".join(
            f"{d} {e:.3f}" for d, e in plan["selection_epsilon_by_distribution"].items())]
    return lines


def _candidate(cell, run_name: str, extra_overrides):
    import ml_collections

    return ml_collections.ConfigDict(dict(
        name=run_name, label=cell.label, family=cell.family,
        config=cell.config, overrides=tuple(cell.overrides) + tuple(extra_overrides)))


def _run_names(drawn) -> list:
    """A run directory name per drawn candidate: its cell and a random token from OS entropy.
    The released run's name must not tell K or the run's position in the draw (Papernot &
    Steinke's bound needs K secret), so no index; the token keeps repeated cells apart."""
    names: list = []
    for cell_name in drawn:
        name = f"{cell_name}-{secrets.token_hex(6)}"
        while name in names:  # 48 random bits: a collision is all but impossible
            name = f"{cell_name}-{secrets.token_hex(6)}"
        names.append(name)
    return names


def _name_runs(draw: dict, runs_dir: str) -> dict:
    """`draw` with its run names; a draw saved before runs were named by token had them named
    by their index (`00_<cell>`): its directories and logs are renamed, so that an interrupted
    selection continues the same draw and still releases no index."""
    if "run_names" in draw:
        return draw
    names = _run_names(draw["drawn"])
    for i, (cell_name, name) in enumerate(zip(draw["drawn"], names)):
        for suffix in ("", ".log"):
            old = os.path.join(runs_dir, f"{i:02d}_{cell_name}{suffix}")
            if os.path.exists(old):
                os.replace(old, os.path.join(runs_dir, name + suffix))
    return dict(draw, run_names=names)


def _train_candidate(grid, candidate, runs_dir: str, python: str) -> None:
    """One candidate's edp_nlu.train run (resumed if it was interrupted)."""
    run_dir = os.path.join(runs_dir, candidate.name)
    if "test" in (_read(os.path.join(run_dir, "metrics.json")) or {}):
        return
    resume = os.path.isfile(os.path.join(run_dir, "state.json"))
    if os.path.isfile(os.path.join(run_dir, "config.json")) and not resume:
        raise RuntimeError(f"candidate {candidate.name}: {run_dir} holds a run that never "
                           "finished an epoch; delete it to start the candidate again")
    command = cell_command(grid, candidate, python, resume, runs_dir)
    with open(os.path.join(runs_dir, f"{candidate.name}.log"), "a") as out:
        out.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
        out.flush()
        code = subprocess.call(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"candidate {candidate.name}: edp_nlu.train exited with {code}; see "
                           f"{runs_dir}/{candidate.name}.log")


def _say(line: str) -> None:
    print(line, flush=True)


def _selection_draw(runs_dir: str, asked: dict, cells, mu: float, shape, seed) -> dict:
    """The selection's draw (K, the cells, their tie-break keys and run names), made once and
    kept in <runs_dir>/draw.json: an interrupted selection continues the same draw."""
    draw_path = os.path.join(runs_dir, "draw.json")
    draw = _read(draw_path)
    if draw is None:
        rng = np.random.default_rng(seed if seed is not None else secrets.randbits(128))
        k = tuning.draw_number_of_runs(rng, mu, shape)
        drawn = [cells[int(i)].name for i in rng.integers(len(cells), size=k)]
        draw = dict(asked, k=k, drawn=drawn, tie_keys=[float(u) for u in rng.random(k)],
                    run_names=_run_names(drawn))
        _write(draw_path, draw)
    elif {key: draw.get(key) for key in asked} != asked:
        raise RuntimeError(f"{draw_path} was drawn for another selection; a new draw for the "
                           "same data is a new release: use another --select_name")
    elif "run_names" not in draw:
        draw = _name_runs(draw, runs_dir)
        _write(draw_path, draw)
    return draw


def _train_drawn(grid, draw: dict, by_name: dict, runs_dir: str, plans: dict, extra_overrides,
                 python: str) -> list:
    """Trains each drawn candidate; an entry per run, "discarded" saying why it cannot be
    released (it failed, or its ledger is not its plan)."""
    tried = []
    # Nothing is printed per candidate: a line per run (its index, its score) would tell K and
    # the other candidates' scores, which the selection's bound needs secret.
    for i, cell_name in enumerate(draw["drawn"]):
        candidate = _candidate(by_name[cell_name], draw["run_names"][i], extra_overrides)
        run_dir = os.path.join(runs_dir, candidate.name)
        entry = {"candidate": candidate.name, "cell": cell_name, "run_dir": run_dir,
                 "tie_key": draw["tie_keys"][i]}
        try:
            _train_candidate(grid, candidate, runs_dir, python)

            ledger, metrics = read_ledger(run_dir), _read(os.path.join(run_dir, "metrics.json"))
            entry["discarded"] = _same_schedule(ledger, plans[cell_name])
            entry.update(dev=metrics["epochs"][-1]["dev"], test=metrics.get("test", {}),
                         epsilon=ledger["epsilon"])
        except (RuntimeError, ValueError, KeyError, IndexError) as error:
            entry["discarded"] = f"it failed: {error}"
        tried.append(entry)
    return tried


def select(grid, cells, mu: float, distribution: str, seed, name: str, extra_overrides=(),
           python: str = sys.executable, plan_only: bool = False, log=_say) -> dict:
    """Accounted tuning: the release (written to results/tuning/<name>.json and .md).

    Before any training: every candidate's schedule is planned and the selection's epsilon
    computed (edp_tf.tuning). Then K is drawn (OS entropy unless `seed`), K cells uniformly with
    replacement and a tie-break key each, saved to <runs_dir>/select_<name>/draw.json (so an
    interrupted selection continues the same draw, never a new one); each candidate trains in
    a directory named by its cell and a random token (`_run_names`), its ledger must match its
    plan (else it is discarded: its schedule depends on its config and the public n only, so
    discarding leaks nothing); the lowest dev SER is released. `log` gets the plan, then one
    line for the released run: nothing that tells K or another candidate's score."""
    checks.number("mean", mu, 1.0)  # before the candidates are planned (that loads the corpus)
    shape = DISTRIBUTION_SHAPES[distribution]
    plan, cost, plans = tuning_plan(grid, cells, mu, distribution, extra_overrides)
    out_dir = os.path.join(os.path.dirname(os.path.normpath(grid.results_dir)) or ".", "tuning")
    command = ["python", "-m", "experiments.experiment", f"--grid={grid.grid_file}",
               f"--cells={','.join(c.name for c in cells)}", "--select", f"--mu={mu:g}",
               f"--distribution={distribution}", f"--select_name={name}"]
    command += [f"--select_seed={seed}"] if seed is not None else []
    command += ([f"--candidate_overrides={','.join(extra_overrides)}"] if extra_overrides
                else [])
    result = {"name": name, "grid": grid.grid_file, "candidates": [c.name for c in cells],
              "candidate_overrides": list(extra_overrides), "distribution": distribution,
              "mean_runs": mu, "score": SCORE, "plan": plan, "not_covered": TUNING_NOT_COVERED}
    for line in tuning_text(plan):
        log(line)
    if plan_only:
        result["command"] = " ".join(command + ["--plan_only"])
        _write_tuning(out_dir, result)
        return result
    result["command"] = " ".join(command)
    runs_dir = os.path.join(grid.runs_dir, f"select_{name}")
    os.makedirs(runs_dir, exist_ok=True)
    asked = {"cells": result["candidates"], "candidate_overrides": list(extra_overrides),
             "mean_runs": mu, "distribution": distribution, "seed": seed}
    draw = _selection_draw(runs_dir, asked, cells, mu, shape, seed)
    by_name = {c.name: c for c in cells}
    tried = _train_drawn(grid, draw, by_name, runs_dir, plans, extra_overrides, python)
    kept = [e for e in tried if not e["discarded"]]
    best = min(kept, key=lambda e: (e["dev"]["ser"], e["tie_key"])) if kept else None
    _write(os.path.join(runs_dir, "candidates.json"), {"draw": draw, "candidates": tried})
    result["selected"] = None if best is None else {
        "cell": best["cell"], "label": by_name[best["cell"]].label,
        "overrides": list(by_name[best["cell"]].overrides) + list(extra_overrides),
        "run_dir": best["run_dir"], "dev": best["dev"], "test": best["test"],
        "epsilon_own": best["epsilon"],
        "epsilon_with_selection": plan["accounting"]["selection_epsilon"],
        "delta": plan["accounting"]["delta"]}
    result["private"] = seed is None
    if seed is not None:  # not private anyway: K and the candidates may as well be shown
        result["seeded_draw"] = {"seed": seed, "k": draw["k"], "candidates": [
            {k: e.get(k) for k in ("candidate", "discarded", "dev", "test", "epsilon")}
            for e in tried]}
    _write_tuning(out_dir, result)
    selected = result["selected"]
    log(f"released {selected['run_dir']} ({selected['cell']}): dev SER "
        f"{selected['dev']['ser']:.4f}, epsilon {selected['epsilon_with_selection']:.3f} with the "
        f"selection" if selected else "nothing released (no candidate ran or none was kept)")
    if seed is not None:
        log(f"--select_seed: NOT private; every candidate is listed in {out_dir}/{name}.md")
    return result


def _write_tuning(out_dir: str, result: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    _write(os.path.join(out_dir, f"{result['name']}.json"), result)
    a = result["plan"]["accounting"]
    lines = [f"# Accounted tuning: {result['name']}", "",
             f"Generated by `{result['command']}`. Candidates: {', '.join(result['candidates'])}"
             + (f", each with {', '.join(result['candidate_overrides'])}"
                if result["candidate_overrides"] else "")
             + f"; K ~ {a['distribution']} with mean {a['mean_runs']:g}; score: {result['score']}"
             ". Epsilon at delta = " f"{a['delta']:.3g}, add/remove one training example.", "",
             "| what is released | epsilon |", "|---|---|",
             f"| one run (per-run epsilon, PLD; RDP {a['per_run_epsilon_rdp']:.2f}) | "
             f"{a['per_run_epsilon']:.2f} |",
             f"| the best of K runs, the selection included (Papernot & Steinke 2022, "
             f"{a['distribution']} K) | {a['selection_epsilon']:.2f} |",
             f"| {a['fixed_runs']} runs composed (all of them; PLD) | "
             f"{a['fixed_runs_epsilon']:.2f} |", ""]
    if a["selection_epsilon_pld_delta_hat"] is not None:
        lines += [f"The selection's epsilon takes delta_hat from the runs' PLD; from their RDP "
                  f"curve (dp-accounting's RepeatAndSelectDpEvent) it is "
                  f"{a['selection_epsilon_rdp_delta_hat']:.2f}. The same mean with other "
                  "distributions of K: " + ", ".join(
                      f"{d} {e:.2f}" for d, e in
                      result["plan"]["selection_epsilon_by_distribution"].items()) + ".", ""]
    selected = result.get("selected")
    if selected:
        lines += [f"Released: `{selected['run_dir']}` ({selected['cell']}: {selected['label']}), "
                  f"dev SER {selected['dev']['ser']:.4f}, test SER "
                  f"{selected['test'].get('ser', float('nan')):.4f}; epsilon "
                  f"{selected['epsilon_with_selection']:.2f} with the selection (its own "
                  f"privacy.json: {selected['epsilon_own']:.2f}).", ""]
    elif "selected" in result:
        lines += ["Nothing released: no candidate ran (K = 0) or none was kept.", ""]
    seeded = result.get("seeded_draw")
    if seeded:
        lines += [f"Drawn from --select_seed={seeded['seed']}, so NOT private (the bound needs K "
                  f"and the draws secret); shown for that reason: K = {seeded['k']}.", "",
                  "| candidate | dev SER | test SER | own epsilon | kept |",
                  "|---|---|---|---|---|"]
        for e in seeded["candidates"]:
            lines.append(f"| {e['candidate']} | {_fmt((e['dev'] or {}).get('ser', ''), 4)} | "
                         f"{_fmt((e['test'] or {}).get('ser', ''), 4)} | "
                         f"{_fmt(e['epsilon'] or '', 2)} | "
                         f"{'no: ' + e['discarded'] if e['discarded'] else 'yes'} |")
        lines.append("")
    lines += ["Not covered by the selection's epsilon:"] + [f"- {s}" for s in
                                                          result["not_covered"]]
    with open(os.path.join(out_dir, f"{result['name']}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------ main
def main(argv):
    del argv
    grid, wanted = _grid_and_cells()
    if _LIST.value:
        _list_cells(grid)
        return
    if _SELECT.value:
        _select_from_flags(grid, wanted)
        return
    if _PLAN_ONLY.value:
        raise app.UsageError("--plan_only goes with --select")
    if _RESCORE.value and _DEV_ATTACK.value:
        raise app.UsageError("--rescore and --dev_attack: one at a time")
    if _RESCORE.value:
        _rescore_cells(grid, wanted)
    elif _DEV_ATTACK.value:
        _dev_attack_cells(grid, wanted)
    elif not _REPORT.value:
        _run_cells(grid, wanted)
    results = report(grid)
    print(f"{len(results)} of {len(grid.cells)} cells in {grid.results_dir}/table1.md", flush=True)


def _grid_and_cells() -> tuple:
    """The --grid (its file recorded for the tables) and the --cells it has, or a usage error."""
    grid = _GRID.value
    if grid is None:
        raise app.UsageError("--grid is required (e.g. experiments/grids/snips.py)")
    with grid.unlocked():
        grid.grid_file = os.path.relpath(flags.FLAGS["grid"].config_filename, ROOT) if hasattr(
            flags.FLAGS["grid"], "config_filename") else "?"
    names = [c.name for c in grid.cells]
    if len(set(names)) != len(names):
        raise app.UsageError(f"grid has duplicate cell names: {names}")
    wanted = _CELLS.value or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise app.UsageError(f"--cells: unknown cells {unknown}; the grid has {names}")
    return grid, wanted


def _list_cells(grid) -> None:
    """--list: each cell's state and command, without running anything."""
    for cell in grid.cells:
        state = ("done" if os.path.isfile(cell_result_path(grid, cell.name)) else
                 "started" if os.path.isdir(os.path.join(grid.runs_dir, cell.name)) else
                 "todo")
        print(f"{cell.name:28s} {state:8s} {' '.join(cell_command(grid, cell)[3:])}")


def _select_from_flags(grid, wanted) -> None:
    """--select: accounted tuning over the wanted cells; a bad setting is a usage error."""
    try:
        select(grid, [c for c in grid.cells if c.name in wanted], _MU.value,
               _DISTRIBUTION.value, _SEED.value, _NAME.value or grid.dataset,
               tuple(_CANDIDATE_OVERRIDES.value), _PYTHON.value, _PLAN_ONLY.value)
    except ValueError as error:
        raise app.UsageError(f"--select: {error}") from None


def _rescore_cells(grid, wanted) -> None:
    """--rescore: add the BIO decoding to each finished wanted cell; a failure skips the cell."""
    for cell in (c for c in grid.cells if c.name in wanted):
        if os.path.isfile(cell_result_path(grid, cell.name)):
            try:
                bio = add_bio_decoding(grid, cell, _PYTHON.value)["test_bio"]
                print(f"{cell.name}: BIO decoding: test SER {bio['ser']:.4f}, slot F1 "
                      f"{bio['slot_f1']:.4f}", flush=True)
            except RuntimeError as error:
                print(f"{cell.name}: FAILED: {error}", flush=True)


def _dev_attack_cells(grid, wanted) -> None:
    """--dev_attack: add the dev-split attack to each finished wanted cell."""
    for cell in (c for c in grid.cells if c.name in wanted):
        if os.path.isfile(cell_result_path(grid, cell.name)):
            try:
                mia = add_dev_attack(grid, cell, _PYTHON.value).get(
                    "membership_inference_dev") or {}
                print(f"{cell.name}: dev-split attack AUC {mia['auc']:.3f}" if mia else
                      f"{cell.name}: no dev-split attack (no diagnostics or no dev split)",
                      flush=True)
            except RuntimeError as error:
                print(f"{cell.name}: FAILED: {error}", flush=True)


def _run_cells(grid, wanted) -> None:
    """Runs each wanted cell not finished yet, rewriting the report after each; a failed cell is
    reported and skipped so the others still run."""
    todo = [c for c in grid.cells if c.name in wanted]
    for i, cell in enumerate(todo, 1):
        prefix = f"[{i}/{len(todo)}] {grid.dataset} {cell.name}"
        if os.path.isfile(cell_result_path(grid, cell.name)):
            print(f"{prefix}: done earlier, skipped", flush=True)
            continue
        print(f"{prefix}: running ({cell.label})", flush=True)
        started = time.time()
        try:
            r = run_cell(grid, cell, _PYTHON.value, None)
        except RuntimeError as error:
            print(f"{prefix}: FAILED: {error}", flush=True)
            continue
        eps = r.get("epsilon")
        print(f"{prefix}: test SER {r['test']['ser']:.4f}, intent acc "
              f"{r['test']['intent_accuracy']:.4f}, slot F1 {r['test']['slot_f1']:.4f}, "
              f"epsilon {eps:.3g} in {time.time() - started:.0f} s", flush=True)
        report(grid)

if __name__ == "__main__":
    cli.run(main)
