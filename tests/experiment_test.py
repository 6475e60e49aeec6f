"""The experiment command: cells run as edp_nlu.train processes, resumably, into tables and
plots."""
import csv
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from absl import app, flags
from absl.testing import flagsaver
from ml_collections import config_flags

from edp_nlu import evaluate
from edp_nlu.pipeline import run_files, training
from edp_tf import attacks, tuning
from edp_tf.accounting import EpochRecord
from edp_tf.ledger import read_ledger
from experiments import experiment
from experiments.grids.common import cell, grid
from tests.tiny_runs import TINY_RUN_METHOD, many_csv_rows, strategy, write_csv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("diagnostics=True", "synthetic_size=240", "batch_size=32", "epochs=1", "max_words=4",
        "replicas=1", "learning_rate=0.01", "clc.lstm_units=8", "clc.num_lstm_layers=1",
        "clc.char_embedding_dim=8", "clc.char_filters=8", "clc.vocabulary_size=2000",
        f"per_example_method={TINY_RUN_METHOD}",
        # the last step's weights: rows are rescored from their runs' checkpoints, which an
        # averaged run's scores do not come from (evaluate refuses it, naming the export)
        "private_ema_fraction=-1.0")


def tiny_grid(tmp_path):
    g = grid("tiny", [
        cell("clc_sgd", "SGD", "sgd", "edp_nlu/configs/default.py", "mechanism=sgd", *TINY),
        cell("clc_dpsgd", "per-example eps 8", "per-example", "edp_nlu/configs/default.py",
             "mechanism=dpsgd", "target_epsilon=8.0", *TINY),
        cell("clc_never", "not run", "per-example", "edp_nlu/configs/default.py",
             "mechanism=dpsgd", *TINY),
    ], schedule_reference="clc_dpsgd")
    g.results_dir = str(tmp_path / "results")
    g.runs_dir = str(tmp_path / "runs")
    g.grid_file = "tiny.py"
    return g


def main_in_process(**flag_values) -> None:
    """`python -m experiments.experiment` with these flags, in this process: its flags are
    defined by importing the module, as the command's are. What only a process shows (the exit
    code and the one `error:` line of a usage error) is test_select_command_line's."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    with flagsaver.as_parsed(**flag_values):
        experiment.main([])


_REAL_CALL = subprocess.call


def _in_process_call(command, **kwargs) -> int:
    """subprocess.call for the commands experiment.py runs with this interpreter, run in this
    process through the library calls those commands make (a process would import TensorFlow
    again); other commands (the tests' stand-ins) run as processes. That the commands work as
    processes is test_a_cell_with_overrides_resumes_with_its_own_settings's (edp_nlu.train)
    and evaluate_test's (edp_nlu.evaluate)."""
    if command[0] != sys.executable:
        return _REAL_CALL(command, **kwargs)
    module, args = command[2], command[3:]
    given = dict(a[2:].split("=", 1) for a in args if "=" in a)
    run_dir = given["run_dir"]
    if module == "edp_nlu.train" and args[0].startswith("--config="):  # a cell's first run
        argv = ["edp_nlu.train", f"--config={os.path.join(kwargs['cwd'], given['config'])}",
                *(a for a in args if a.startswith("--config."))]
        values = flags.FlagValues()  # the config parsed as edp_nlu.train parses it
        config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
        values(argv)
        training.train(values.config, run_dir, strategy=strategy(int(values.config.replicas)))
    elif module == "edp_nlu.train" and args[1:] == ["--resume", "--recompute_metrics"]:
        config = run_files.load_run_config(run_dir)
        training.train(config, run_dir, resume=True, strategy=strategy(int(config.replicas)))
    elif module == "edp_nlu.evaluate" and args[1:-1] == ["--decodings"]:
        experiment._write(given["output"], evaluate.scores_by_decoding(run_dir, "test"))
    else:
        raise AssertionError(f"no in-process stand-in for {command}")
    return 0


@pytest.fixture
def rescoring_in_process(monkeypatch):
    monkeypatch.setattr(experiment.subprocess, "call", _in_process_call)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The grid with its first two cells run, in this process (their configs parsed from the
    cells' edp_nlu.train command lines as the command parses them): that run_cell's process
    is accepted and its exit code read is test_a_cell_with_overrides_resumes_with_its_own_
    settings's, which runs the command on the DP cell's run."""
    tmp = tmp_path_factory.mktemp("grid")
    g = tiny_grid(tmp)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(experiment.subprocess, "call", _in_process_call)
        results = [experiment.run_cell(g, c, sys.executable, None) for c in g.cells[:2]]
    experiment.report(g)
    return g, results


def test_cells_collect_the_runs_numbers(finished):
    g, (sgd, dp) = finished
    for r in (sgd, dp):
        with open(os.path.join(g.runs_dir, r["name"], "metrics.json")) as f:
            metrics = json.load(f)
        # rows keep the unconstrained decoding's numbers (comparable with every earlier row)
        assert r["test"] == metrics["test_by_decoding"]["viterbi"]
        assert r["test_bio"] == metrics["test"] == metrics["test_by_decoding"]["bio"]
        assert 0 <= r["membership_inference"]["auc"] <= 1
        assert r["command"].startswith(
            "python -m edp_nlu.train --config=edp_nlu/configs/default.py")
    assert sgd["epsilon"] == float("inf") and sgd["private"] is False
    with open(os.path.join(g.runs_dir, "clc_dpsgd", "privacy.json")) as f:
        privacy = json.load(f)
    assert dp["epsilon"] == privacy["epsilon"] <= 8.0 and dp["private"] is True
    assert dp["epsilon_at_other_deltas"] == privacy["epsilon_at_other_deltas"]


def test_a_cell_with_overrides_resumes_with_its_own_settings(finished):
    """A cell whose run directory has a checkpoint is resumed from the run's own config: its
    config file alone (here edp_nlu/configs/default.py without synthetic_size=240, ...) would ask
    for another run, which edp_nlu.train refuses."""
    g, (_, dp) = finished
    command = experiment.cell_command(g, g.cells[1], sys.executable, resume=True)
    assert "--resume" in command and not any(a.startswith("--config") for a in command)
    # run_cell's edp_nlu.train process (the file's one): a refused command would exit non-zero
    again = experiment.run_cell(g, g.cells[1], sys.executable, None)  # finished: nothing to train
    assert again == dp


def test_tables_and_plots(finished):
    g, (sgd, dp) = finished
    with open(os.path.join(g.results_dir, "table1.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["row"] for r in rows] == ["SGD", "per-example eps 8"]
    ser = float(rows[1]["test_ser"])
    assert ser == pytest.approx(dp["test"]["ser"])
    assert float(rows[1]["ser_bio"]) == pytest.approx(dp["test_bio"]["ser"])
    assert float(rows[1]["delta_ser_pct"]) == pytest.approx(
        100 * (dp["test"]["ser"] - sgd["test"]["ser"]) / sgd["test"]["ser"])
    assert float(rows[1]["time_vs_sgd"]) > 0 and rows[1]["command"] == dp["command"]
    mia = dp["membership_inference"]
    lo, hi = (float(v) for v in rows[1]["mia_auc_ci95"].split("-"))
    assert lo <= mia["auc"] <= hi and (lo, hi) == pytest.approx(
        attacks.auc_interval(mia["auc"], mia["members"], mia["nonmembers"]), abs=1e-3)
    md = open(os.path.join(g.results_dir, "table1.md")).read()
    assert "clc_never" in md  # cells left out are named
    for png in ("frontier.png", "membership_roc.png", "epsilon_per_epoch.png"):
        assert os.path.getsize(os.path.join(g.results_dir, png)) > 1000


def test_frontier_passes_through_the_best_row_per_budget_only():
    def row(model, family, eps, ser, mechanism="dpsgd"):
        return dict(model=model, family=family, epsilon=eps, mechanism=mechanism,
                    test=dict(ser=ser))
    rows = [row("clc", "sgd", float("inf"), 0.05, "sgd"),
            row("clc", "per-example", 7.99, 0.30),  # a worse recipe variant at epsilon 8
            row("clc", "per-example", 8.0, 0.20),
            row("clc", "per-example", 1.0, 0.50),
            row("clc", "per-example", 3.0, 0.25),
            row("clc", "per-example", float("inf"), 0.10),  # sigma = 0: no epsilon
            row("bert", "per-example", 7.99, 0.15)]
    f = experiment.frontier(rows)
    assert set(f) == {("clc", "per-example"), ("bert", "per-example")}
    best, others = f[("clc", "per-example")]
    assert [(r["epsilon"], r["test"]["ser"]) for r in best] == [(1.0, 0.5), (3.0, 0.25),
                                                                 (8.0, 0.2)]
    assert [r["test"]["ser"] for r in others] == [0.3]
    assert f[("bert", "per-example")] == ([rows[-1]], [])


def test_finished_cells_are_skipped_and_unknown_cells_refused(finished, tmp_path, capsys):
    g, _ = finished
    grid_file = tmp_path / "grid.py"
    grid_file.write_text(
        "from experiments.grids.common import cell, grid\n"
        "def get_config():\n"
        f"    g = grid('tiny', [cell('clc_sgd', 'SGD', 'sgd', 'edp_nlu/configs/default.py')])\n"
        f"    g.results_dir = {g.results_dir!r}\n    g.runs_dir = {g.runs_dir!r}\n    return g\n")
    main_in_process(grid=str(grid_file))
    assert "clc_sgd: done earlier, skipped" in capsys.readouterr().out
    with pytest.raises(app.UsageError, match=re.escape("unknown cells ['nope']")):
        main_in_process(grid=str(grid_file), cells="nope")


def test_a_cell_whose_source_run_is_gone_is_refused_before_it_starts(tmp_path, monkeypatch):
    """A cell starting from another cell's run (init_from) whose directory is gone: refused
    before any process or run directory, naming the source cell and the recorded result that
    makes the runner skip it."""
    g = tiny_grid(tmp_path)
    source = os.path.join(g.runs_dir, "clc_sgd")
    g.cells.append(cell("clc_from_sgd", "from SGD", "per-example", "edp_nlu/configs/default.py",
                        "mechanism=dpsgd", f"init_from={source}", *TINY))
    monkeypatch.setattr(experiment.subprocess, "call", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(RuntimeError, match=r"clc_from_sgd: starts from .*clc_sgd \(init_from\), "
                                           r"which is not here; .* run --cells=clc_sgd first"):
        experiment.run_cell(g, g.cells[-1], sys.executable, None)
    os.makedirs(os.path.join(g.results_dir, "cells"))
    with open(experiment.cell_result_path(g, "clc_sgd"), "w") as f:
        f.write("{}")
    with pytest.raises(RuntimeError, match=r"its result .*clc_sgd.json is recorded.*move that"):
        experiment.run_cell(g, g.cells[-1], sys.executable, None)
    assert not os.path.exists(os.path.join(g.runs_dir, "clc_from_sgd"))


def test_dev_attack_is_added_to_rows_measured_without_it(finished, rescoring_in_process):
    """--dev_attack: a row stored before the dev-split attack gets it from its own finished run
    (resumed: the final metrics are recomputed, the ledger and state untouched), and a run that
    no longer scores the row's test metrics is refused rather than mixed into it."""
    g, (_, dp) = finished
    assert dp["membership_inference_dev"]["nonmembers"] > 0  # new runs measure it
    run_dir = os.path.join(g.runs_dir, "clc_dpsgd")
    metrics_path = os.path.join(run_dir, "metrics.json")
    with open(metrics_path) as f:
        metrics = json.load(f)
    metrics.pop("membership_inference_dev")
    metrics["test"] = {}  # only a recomputation can bring them back
    metrics.pop("test_by_decoding")
    experiment._write(metrics_path, metrics)
    old = {k: v for k, v in dp.items() if k != "membership_inference_dev"}
    experiment._write(experiment.cell_result_path(g, "clc_dpsgd"), old)
    ledger = {f: open(os.path.join(run_dir, f), "rb").read()
              for f in ("privacy.json", "state.json")}
    cell = g.cells[1]
    again = experiment.add_dev_attack(g, cell, sys.executable)
    assert again["membership_inference_dev"]["auc"] == pytest.approx(
        dp["membership_inference_dev"]["auc"])
    with open(metrics_path) as f:
        assert json.load(f)["test_by_decoding"]["viterbi"] == dp["test"]
    assert ledger == {f: open(os.path.join(run_dir, f), "rb").read() for f in ledger}
    wrong = dict(old, test=dict(dp["test"], ser=dp["test"]["ser"] + 0.5))
    experiment._write(experiment.cell_result_path(g, "clc_dpsgd"), wrong)
    # The recomputation above left the run's files as a second one would (it restores the same
    # checkpoint): `true` stands in for it, and the row is compared with those files.
    with pytest.raises(RuntimeError, match="not this row's run"):
        experiment.add_dev_attack(g, cell, shutil.which("true"))
    experiment._write(experiment.cell_result_path(g, "clc_dpsgd"), again)


def test_bio_decoding_is_added_to_rows_measured_without_it(finished, tmp_path,
                                                           rescoring_in_process):
    """--rescore: a row stored before the BIO decoding gets it from its run's last checkpoint;
    a checkpoint that no longer scores the row's (Viterbi) test metrics is refused."""
    g, (_, dp) = finished
    path = experiment.cell_result_path(g, "clc_dpsgd")
    stored = experiment._read(path)
    old = {k: v for k, v in stored.items() if k != "test_bio"}
    experiment._write(path, old)
    # as a run directory written before the decoding field: no config.decoding, no
    # test_by_decoding (the run is rebuilt with the unconstrained decoding it had then)
    run_dir = os.path.join(g.runs_dir, "clc_dpsgd")
    for name, key in (("config.json", None), ("metrics.json", "test_by_decoding")):
        with open(os.path.join(run_dir, name)) as f:
            saved = json.load(f)
        (saved["config"] if key is None else saved).pop(key or "decoding")
        experiment._write(os.path.join(run_dir, name), saved)
    cell = g.cells[1]
    again = experiment.add_bio_decoding(g, cell, sys.executable)
    # the same checkpoint and the same inference code as the run's own final scoring
    assert again["test_bio"] == pytest.approx(dp["test_bio"], abs=1e-9)
    assert experiment._read(path)["test_bio"] == again["test_bio"]
    experiment._write(path, dict(old, test=dict(dp["test"], ser=dp["test"]["ser"] + 0.5)))
    # A stand-in for the scoring process that writes the scores just computed (the same
    # checkpoint scores the same again) to its --output: the row is compared with them.
    scores = tmp_path / "decodings.json"
    scores.write_text(json.dumps({"viterbi": dp["test"], "bio": again["test_bio"]}))
    stand_in = tmp_path / "score"
    stand_in.write_text('#!/bin/sh\nfor a; do case "$a" in --output=*) '
                        f'cp {scores} "${{a#--output=}}";; esac; done\n')
    stand_in.chmod(0o755)
    with pytest.raises(RuntimeError, match="not this row's run"):
        experiment.add_bio_decoding(g, cell, str(stand_in))
    experiment._write(path, stored)


# ------------------------------------------------------------------------------ --select
def test_select_plans_the_schedule_the_trainer_charges(finished):
    """A candidate's schedule is planned before training (the selection's bound must cover
    every candidate first); the plan is what edp_nlu.train then recorded, and a ledger that
    differs from its plan is caught (the candidate would be discarded)."""
    g, _ = finished
    plan = experiment.planned_run(experiment.cell_config(g.cells[1]))
    ledger = read_ledger(os.path.join(g.runs_dir, "clc_dpsgd"))
    recorded = [EpochRecord.from_dict(e) for e in ledger["epochs"]]
    assert [r.steps for r in plan["records"]] == [r.steps for r in recorded]
    assert [r.effective_noise_multiplier for r in plan["records"]] == pytest.approx(
        [r.effective_noise_multiplier for r in recorded], rel=1e-12)
    assert plan["delta"] == ledger["delta"] and plan["sampling_rate"] == ledger["sampling_rate"]
    assert experiment._same_schedule(ledger, plan) == ""
    quieter = dict(plan, records=tuple(EpochRecord(r.epoch, r.steps, r.noise_multiplier * 1.1,
                                                   r.effective_noise_multiplier * 1.1)
                                       for r in plan["records"]))
    assert "not the planned schedule" in experiment._same_schedule(ledger, quieter)
    assert "private: false" in experiment._same_schedule(dict(ledger, private=False), plan)
    with pytest.raises(ValueError, match="must be private"):
        experiment.planned_run(experiment.cell_config(g.cells[0]))  # the SGD cell


def test_select_refuses_candidates_that_would_select_their_labels_privately(tmp_path):
    """A corpus without a schema: each private candidate would select its label sets with DP,
    whose threshold delta the tuning accountant cannot compose; refused before any training."""
    corpus = write_csv(tmp_path / "data.csv", many_csv_rows("alarm", "set", 40))
    candidate = cell("csv", "per-example", "per-example", "edp_nlu/configs/default.py",
                     "mechanism=dpsgd", f"data_dir={corpus}", *TINY)
    with pytest.raises(ValueError, match="give the candidates a label schema"):
        experiment.planned_run(experiment.cell_config(candidate))


def test_select_plan_only_states_the_epsilon_with_and_without_selection(tmp_path):
    g = tiny_grid(tmp_path)
    lines = []
    result = experiment.select(g, [g.cells[1]], 8.0, "poisson", None, "plan", plan_only=True,
                               log=lines.append)
    a = result["plan"]["accounting"]
    assert a["per_run_epsilon"] <= 8.0 < a["selection_epsilon"] < a["fixed_runs_epsilon"]
    assert a["selection_epsilon"] <= a["selection_epsilon_rdp_delta_hat"]
    assert a["fixed_runs"] == 8 and a["distribution"] == "Poisson"
    assert result["plan"]["candidates"]["clc_dpsgd"]["epsilon"] == pytest.approx(
        a["per_run_epsilon"])
    assert any("released alone" in line for line in lines)
    with open(tmp_path / "tuning" / "plan.json") as f:
        assert json.load(f)["plan"]["accounting"] == a
    md = (tmp_path / "tuning" / "plan.md").read_text()
    assert f"| {a['selection_epsilon']:.2f} |" in md and "--plan_only" in md
    assert not os.path.exists(g.runs_dir)  # nothing trained


def _fake_training(finished, dev_ser: dict, tamper=()):
    """A _train_candidate that copies the finished clc_dpsgd run (a candidate of the same
    schedule) instead of training, with the dev SER `dev_ser` gives the n-th candidate trained
    (candidates train in their draw's order); the ledgers of those in `tamper` say not private."""
    import shutil

    g, _ = finished
    calls = []

    def train(grid, candidate, runs_dir, python):
        run_dir = os.path.join(runs_dir, candidate.name)
        if os.path.isdir(run_dir):
            return
        index = len(calls)
        calls.append(candidate.name)
        shutil.copytree(os.path.join(g.runs_dir, "clc_dpsgd"), run_dir)
        metrics = experiment._read(os.path.join(run_dir, "metrics.json"))
        metrics["epochs"][-1]["dev"]["ser"] = dev_ser[index]
        experiment._write(os.path.join(run_dir, "metrics.json"), metrics)
        if index in tamper:
            ledger = experiment._read(os.path.join(run_dir, "privacy.json"))
            experiment._write(os.path.join(run_dir, "privacy.json"), dict(ledger, private=False))
    return train, calls


def _tiny_selection_grid(tmp_path, candidates):
    tmp = grid("tiny", candidates)
    tmp.results_dir, tmp.runs_dir, tmp.grid_file = (str(tmp_path / "results"),
                                                     str(tmp_path / "runs"), "tiny.py")
    return tmp


def test_select_releases_the_best_kept_candidate_and_resumes_its_draw(finished, tmp_path,
                                                                      monkeypatch):
    g, _ = finished
    twin = cell("clc_dpsgd_twin", "the same recipe", "per-example", "edp_nlu/configs/default.py",
                "mechanism=dpsgd", "target_epsilon=8.0", *TINY)
    candidates = [g.cells[1], twin]
    dev_ser = {i: 0.5 - 0.01 * i for i in range(40)}  # later candidates score better...
    train, calls = _fake_training(finished, dev_ser)
    monkeypatch.setattr(experiment, "_train_candidate", train)
    tmp = _tiny_selection_grid(tmp_path, candidates)
    result = experiment.select(tmp, candidates, 6.0, "poisson", 3, "sel", log=lambda _: None)
    draw = experiment._read(os.path.join(tmp.runs_dir, "select_sel", "draw.json"))
    assert draw["k"] >= 2 and len(calls) == draw["k"] == len(result["seeded_draw"]["candidates"])
    assert calls == draw["run_names"]
    last = draw["run_names"][-1]
    assert result["selected"]["run_dir"].endswith(last)  # ...so the last one is released
    assert result["selected"]["cell"] == draw["drawn"][-1]
    assert result["selected"]["dev"]["ser"] == pytest.approx(dev_ser[draw["k"] - 1])
    assert result["selected"]["epsilon_with_selection"] == result["plan"]["accounting"][
        "selection_epsilon"] > result["selected"]["epsilon_own"]
    assert result["private"] is False  # a seed makes K and the draws public
    md = (tmp_path / "tuning" / "sel.md").read_text()
    assert "NOT private" in md and last in md
    # again: the same draw, nothing retrained, the same release
    again = experiment.select(tmp, candidates, 6.0, "poisson", 3, "sel", log=lambda _: None)
    assert len(calls) == draw["k"] and again["selected"] == result["selected"]
    with pytest.raises(RuntimeError, match="another selection") as refused:
        experiment.select(tmp, candidates, 4.0, "poisson", 3, "sel", log=lambda _: None)
    assert "'k'" not in str(refused.value)  # the message does not print the draw


def test_select_discards_a_candidate_whose_ledger_is_not_its_plan(finished, tmp_path,
                                                                   monkeypatch):
    g, _ = finished
    # the first candidate scores best but its ledger says not private: discarded
    train, calls = _fake_training(finished, {i: 0.1 + 0.01 * i for i in range(40)}, tamper={0})
    monkeypatch.setattr(experiment, "_train_candidate", train)
    tmp = _tiny_selection_grid(tmp_path, [g.cells[1]])
    result = experiment.select(tmp, [g.cells[1]], 6.0, "poisson", 3, "d", log=lambda _: None)
    tried = result["seeded_draw"]["candidates"]
    assert "private: false" in tried[0]["discarded"]
    assert result["selected"]["run_dir"] == os.path.join(tmp.runs_dir, "select_d", calls[1])


def test_accounted_tuning_releases_nothing_that_tells_k_or_the_other_candidates(
        finished, tmp_path, monkeypatch, capsys):
    """A private selection (no seed): Papernot & Steinke's bound needs K secret and only the
    best candidate released. The released files and the console name the chosen run without an
    index (no position, no count) and show no other candidate's score."""
    g, _ = finished
    twin = cell("clc_dpsgd_twin", "the same recipe", "per-example", "edp_nlu/configs/default.py",
                "mechanism=dpsgd", "target_epsilon=8.0", *TINY)
    candidates = [g.cells[1], twin]
    k = 5  # K is drawn as always, from OS entropy; here it is fixed to know what to look for
    monkeypatch.setattr(tuning, "draw_number_of_runs", lambda rng, mean, shape: k)
    dev_ser = {0: 0.4111, 1: 0.3222, 2: 0.2333, 3: 0.4444, 4: 0.3555}  # the third is best
    train, calls = _fake_training(finished, dev_ser)
    monkeypatch.setattr(experiment, "_train_candidate", train)
    tmp = _tiny_selection_grid(tmp_path, candidates)
    result = experiment.select(tmp, candidates, 6.0, "poisson", None, "private")  # prints
    console = capsys.readouterr().out
    assert len(calls) == k and result["private"] is True
    released = os.path.basename(result["selected"]["run_dir"])
    assert released == calls[2]
    assert re.fullmatch(r"clc_dpsgd(_twin)?-[0-9a-f]{12}", released), released
    assert console.count(released) == 1 and "0.2333" in console
    files = {name: (tmp_path / "tuning" / name).read_text()
             for name in ("private.json", "private.md")}
    released_json = json.loads(files["private.json"])
    assert released_json["selected"]["dev"]["ser"] == 0.2333
    assert "seeded_draw" not in released_json and "k" not in released_json
    for where, text in dict(files, console=console).items():
        # no other candidate's score, run name or index
        assert not [ser for i, ser in dev_ser.items()
                    if i != 2 and re.search(rf"(?<![\d.]){ser:.4f}", text)], where
        assert not [name for name in calls if name != released and name in text], where
        assert not re.search(r"\b\d{2}_clc_dpsgd|\[\d+/\d+\]|K = |" + rf"\b{k} (candidates|runs)\b",
                             text), where
    # the run directories themselves carry no index either (the released one is among them)
    names = [n for n in os.listdir(os.path.join(tmp.runs_dir, "select_private"))
             if os.path.isdir(os.path.join(tmp.runs_dir, "select_private", n))]
    assert sorted(names) == sorted(calls)
    assert not [n for n in names if re.match(r"\d", n)]


def test_a_draw_saved_with_index_names_continues_under_token_names(finished, tmp_path,
                                                                   monkeypatch):
    """A selection drawn when candidates were named by their index (`00_<cell>`) continues its
    own draw: its finished runs are renamed, not retrained, and the release names no index."""
    import shutil

    g, _ = finished
    train, calls = _fake_training(finished, {i: 0.3 - 0.01 * i for i in range(40)})
    monkeypatch.setattr(experiment, "_train_candidate", train)
    tmp = _tiny_selection_grid(tmp_path, [g.cells[1]])
    runs_dir = os.path.join(tmp.runs_dir, "select_old")
    os.makedirs(runs_dir)
    draw = {"cells": ["clc_dpsgd"], "candidate_overrides": [], "mean_runs": 6.0,
            "distribution": "poisson", "seed": None, "k": 2, "drawn": ["clc_dpsgd"] * 2,
            "tie_keys": [0.5, 0.25]}
    experiment._write(os.path.join(runs_dir, "draw.json"), draw)
    shutil.copytree(os.path.join(g.runs_dir, "clc_dpsgd"), os.path.join(runs_dir, "00_clc_dpsgd"))
    (tmp_path / "runs" / "select_old" / "00_clc_dpsgd.log").write_text("trained\n")
    result = experiment.select(tmp, [g.cells[1]], 6.0, "poisson", None, "old",
                               log=lambda _: None)
    saved = experiment._read(os.path.join(runs_dir, "draw.json"))
    first, second = saved["run_names"]
    assert calls == [second]  # the first had finished: renamed, not retrained
    assert sorted(os.listdir(runs_dir)) == sorted(
        ["draw.json", "candidates.json", first, first + ".log", second])
    assert not re.search(r"\d{2}_clc", json.dumps(result))


def test_select_command_line(tmp_path, capsys):
    """The flags reach the selection (in this process); a usage error is a process's `error:`
    line and exit code 2."""
    grid_file = tmp_path / "grid.py"
    grid_file.write_text(
        "from experiments.grids.common import cell, grid\n"
        "def get_config():\n"
        f"    g = grid('tiny', [cell('dp', 'dp', 'dp', 'edp_nlu/configs/default.py', "
        f"*{('mechanism=dpsgd', 'target_epsilon=8.0') + TINY!r})])\n"
        f"    g.results_dir = {str(tmp_path / 'results')!r}\n"
        f"    g.runs_dir = {str(tmp_path / 'runs')!r}\n    return g\n")
    main_in_process(grid=str(grid_file), select="true", plan_only="true", mu="4",
                    distribution="logarithmic")
    assert "K ~ logarithmic(mean 4)" in capsys.readouterr().out
    assert experiment._read(str(tmp_path / "tuning" / "tiny.json"))["distribution"] == "logarithmic"
    # a usage error: an `error:` line and exit code 2 (edp_nlu/cli.py)
    bad = subprocess.run([sys.executable, "-m", "experiments.experiment", f"--grid={grid_file}",
                          "--plan_only"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "error: --plan_only goes with --select" in bad.stderr.splitlines(), bad.stderr[-2000:]
    with pytest.raises(app.UsageError, match="mean must be in"):
        main_in_process(grid=str(grid_file), select="true", plan_only="true", mu="0.5")
