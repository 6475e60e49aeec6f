"""A resumed run after charged interruptions: the remaining epochs are replanned to land at the
target epsilon, a spent budget is refused before training in one line with the way out, and a
budget stop is never silent (summary line, state.json, exit code)."""
import json
import math
import pathlib
import shutil

import keras
import pytest

from edp_nlu.pipeline import training
from edp_nlu.pipeline.run_spec import RunSpec
from edp_tf import DPConfig, Mechanism, PrivacyPlan, accounting, ledger
from tests.tiny_runs import read, strategy, tiny_config
from tools import faults


def _plan_and_dp():
    """A 3-epoch plan at z0 = 1 and its epsilon, taken as the run's target (as calibrated)."""
    dp = DPConfig(noise_multiplier=1.0, microbatch_size=1, decay="linear", decay_rate=0.5)
    made = PrivacyPlan(Mechanism.from_config(dp, 1, 16), dataset_size=160,
                       sampling_rate=1 / 10, delta=1e-3, epochs=3, steps_per_epoch=10)
    return dp, made, made.epsilon()


def _write_ledger(run_dir, plan, epochs, in_progress=None):
    records = [r.to_dict() for r in plan.schedule()[:epochs]]
    content = {"epochs": records, "extra_events": [], "in_progress": in_progress}
    (run_dir / "privacy.json").write_text(json.dumps(content))


def test_a_resume_after_charged_interruptions_lands_at_the_target(tmp_path):
    dp, plan, target = _plan_and_dp()
    config = RunSpec.parse(tiny_config(target_epsilon=target, epochs=3))
    # epoch 0 ran, then two kills inside epoch 1 charged 3 and 6 steps; epoch 1 reruns from 0
    interrupted = dict(plan.schedule()[1].to_dict(), steps=6)
    _write_ledger(tmp_path, plan, 1, interrupted)
    content = json.loads((tmp_path / "privacy.json").read_text())
    content["epochs"].append(dict(interrupted, steps=3))
    (tmp_path / "privacy.json").write_text(json.dumps(content))
    records, events = ledger.charged(ledger.read_ledger(str(tmp_path)))
    assert [r.steps for r in records] == [10, 3, 6]
    assert plan.epsilon_after(records, 1, events) > target  # the old z0 would overshoot
    new_dp, replanned = training._replan(str(tmp_path), config, dp, plan, done=1)
    z0, z1 = plan.mechanism.noise_multiplier, replanned.mechanism.noise_multiplier
    assert z1 > z0 and new_dp.noise_multiplier == z1
    total = accounting.compute_epsilon(records + replanned.schedule(1), plan.sampling_rate,
                                       plan.delta)
    # calibrate_noise's tolerance is 1e-3 in z0: epsilon lands within a few 1e-3 below target
    assert target * 0.99 <= total <= target
    # no interruption: the run's own z0 is kept (the uninterrupted run is unchanged)
    _write_ledger(tmp_path, plan, 1)
    assert training._replan(str(tmp_path), config, dp, plan, done=1) == (dp, plan)


def test_a_spent_budget_is_refused_before_training_with_the_way_out(tmp_path):
    dp, plan, target = _plan_and_dp()
    config = RunSpec.parse(tiny_config(target_epsilon=target, epochs=3))
    # epoch 0, then four attempts at epoch 1 each charged a whole epoch: above the target
    _write_ledger(tmp_path, plan, 3)
    content = json.loads((tmp_path / "privacy.json").read_text())
    content["epochs"] = content["epochs"][:1] + [dict(e, epoch=1)
                                                 for e in content["epochs"][1:]] * 2
    (tmp_path / "privacy.json").write_text(json.dumps(content))
    with pytest.raises(training.BudgetSpentError) as refused:
        training._replan(str(tmp_path), config, dp, plan, done=1)
    (line,) = str(refused.value).splitlines()
    assert "privacy budget is spent" in line and "higher --target_epsilon" in line
    assert "--epochs=1 to finish with the 1 epochs trained" in line


def test_a_budget_stop_says_so_in_the_summary_and_state(tmp_path, monkeypatch):
    """The ledger's prediction made to exceed the budget after the first epoch: fit stops
    after 1 of 2 epochs, and the summary line and state.json say so (the command exits 3)."""
    predict = ledger.PrivacyLedger._predict
    monkeypatch.setattr(ledger.PrivacyLedger, "_predict",
                        lambda self, epoch, steps: math.inf if epoch >= 1
                        else predict(self, epoch, steps))
    config = tiny_config(mechanism="dpsgd", replicas=1, epochs=2, target_epsilon=8.0)
    summary = training.train(config, str(tmp_path / "run"), strategy=strategy(1), export=False)
    expected = "stopped by the privacy budget after 1 of 2 epochs"
    assert summary["stopped"].startswith(expected)
    assert expected in training.summary_line(summary)
    assert read(str(tmp_path / "run"), "state.json")["stopped"].startswith(expected)
    assert training.BUDGET_EXIT not in (0, 1, 2)  # distinct from success, failure, a bad flag


def test_the_fault_suite_pairs_epochs_begun_with_charges():
    """tools.faults' check: an epoch begun by an attempt killed before its first step may be
    uncharged (start-up, tracing); every epoch that ran a step is charged, at least its steps."""
    ran = [(0, 30), (1, 0), (1, 12), (1, 0), (1, 30), (2, 30)]
    assert faults.align(ran, [(0, 30), (1, 14), (1, 30), (2, 30)]) == [
        (30, 30), (12, 14), (30, 30), (30, 30)]
    assert faults.align(ran, [(0, 30), (1, 1), (1, 14), (1, 30), (2, 30)]) is not None
    assert faults.align(ran, [(0, 30), (1, 30), (2, 30)]) is None  # 12 steps of epoch 1 lost
    assert faults.align([(0, 3)], []) is None


def test_the_fault_suite_measures_a_kills_over_charge(tmp_path):
    witness = tmp_path / "w"
    witness.write_text("begin 0\n" + "step 0\n" * 5)
    (tmp_path / "privacy.json").write_text(json.dumps(
        {"epochs": [], "in_progress": {"epoch": 0, "steps": 9}}))
    assert faults.kill_over_charge(str(tmp_path), str(witness), 0) == (4, "")
    (tmp_path / "privacy.json").write_text(json.dumps(
        {"epochs": [], "in_progress": {"epoch": 0, "steps": 4}}))
    assert faults.kill_over_charge(str(tmp_path), str(witness), 0)[1] == "5 steps ran, 4 charged"
    (tmp_path / "privacy.json").write_text(json.dumps({"epochs": [], "in_progress": None}))
    assert faults.kill_over_charge(str(tmp_path), str(witness), 0)[1] == "5 steps ran, none charged"
    # an earlier attempt's charge, left by one killed before its resume: this one charged nothing
    earlier = {"epoch": 0, "steps": 1}
    (tmp_path / "privacy.json").write_text(json.dumps({"epochs": [], "in_progress": earlier}))
    assert faults.kill_over_charge(str(tmp_path), str(witness), 6, earlier) == (0, "")


def test_a_resume_inside_an_epoch_plans_only_the_steps_left(tmp_path):
    """Killed in epoch 1 after its checkpoint at step 4 (the ledger's bound charged 6 steps):
    the rest of epoch 1 is 6 steps, not 10, and the replanned run lands at the target."""
    dp, plan, target = _plan_and_dp()
    config = RunSpec.parse(tiny_config(target_epsilon=target, epochs=3))
    _write_ledger(tmp_path, plan, 1, dict(plan.schedule()[1].to_dict(), steps=6))
    records, events = ledger.charged(ledger.read_ledger(str(tmp_path)))
    _, replanned = training._replan(str(tmp_path), config, dp, plan, done=1, steps_done=4)
    left = replanned.schedule(1, first_epoch_steps=6)
    assert [r.steps for r in left] == [6, 10]
    total = accounting.compute_epsilon(records + left, plan.sampling_rate, plan.delta)
    assert target * 0.99 <= total <= target  # calibrate_noise's 1e-3 tolerance in z0
    # planned as a whole epoch 1 again, z0 would be larger than the steps left need
    _, whole = training._replan(str(tmp_path), config, dp, plan, done=1)
    assert whole.mechanism.noise_multiplier > replanned.mechanism.noise_multiplier


def test_a_resume_that_would_more_than_double_z0_is_refused_unless_allowed(tmp_path):
    """Epochs 0 and 1 charged, then 9 steps of epoch 2, all lost to a kill before epoch 1's
    checkpoint (z0 = 1 without decay): epochs 1 and 2 fit what is left only at z0 about 3; the
    default limit (2) refuses in one line naming the flags, resume_noise_limit=0 trains them."""
    dp = DPConfig(noise_multiplier=1.0, microbatch_size=1)
    plan = PrivacyPlan(Mechanism.from_config(dp, 1, 16), dataset_size=160,
                       sampling_rate=1 / 10, delta=1e-3, epochs=3, steps_per_epoch=10)
    target = plan.epsilon()
    _write_ledger(tmp_path, plan, 2, dict(plan.schedule()[2].to_dict(), steps=9))
    config = RunSpec.parse(tiny_config(target_epsilon=target, epochs=3))
    with pytest.raises(training.BudgetSpentError) as refused:
        training._replan(str(tmp_path), config, dp, plan, done=1)
    (line,) = str(refused.value).splitlines()
    assert "resume_noise_limit=2" in line and "--config.resume_noise_limit=0" in line
    assert "higher --target_epsilon" in line
    allowed = RunSpec.parse(tiny_config(target_epsilon=target, epochs=3,
                                        resume_noise_limit=0.0))
    new_dp, _ = training._replan(str(tmp_path), allowed, dp, plan, done=1)
    assert new_dp.noise_multiplier > 2 * plan.mechanism.noise_multiplier


class _CrashAfter(keras.callbacks.Callback):
    """Raises after step `step` of epoch `epoch`, as a crash inside the process would."""

    def __init__(self, epoch: int, step: int):
        super().__init__()
        self.epoch, self.step, self._epoch = epoch, step, None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._epoch == self.epoch and int(batch) + 1 == self.step:
            raise RuntimeError("crash")


def test_a_run_crashed_inside_an_epoch_resumes_after_its_last_checkpoint(tmp_path):
    """A checkpoint after every step (checkpoint_seconds tiny), a crash after step 4 of epoch
    1: state.json names the checkpoint inside the epoch, the resume trains only the epoch's
    other steps (charged on top of the 4 that ran), then the next epoch; nothing is lost."""
    config = tiny_config(mechanism="dpsgd", replicas=1, epochs=3, checkpoint_seconds=1e-9)
    run = str(tmp_path / "run")
    with pytest.raises(RuntimeError, match="crash"):
        training.train(config, run, strategy=strategy(1), callbacks=(_CrashAfter(1, 4),),
                       export=False)
    state = read(run, "state.json")
    steps = state["steps_per_epoch"]
    assert (state["epochs_done"], state["steps_done"]) == (1, 4) and steps > 4
    assert [(e["epoch"], e["steps"]) for e in read(run, "privacy.json")["epochs"]] == [
        (0, steps), (1, 4)]  # an exception in the process: exactly the steps that started
    _a_run_finished_from_what_it_trained_counts_the_interrupted_steps(run, tmp_path, config)
    summary = training.train(config, run, resume=True, strategy=strategy(1), export=False)
    charged = [(e["epoch"], e["steps"]) for e in read(run, "privacy.json")["epochs"]]
    assert charged == [(0, steps), (1, 4), (1, steps - 4), (2, steps)]
    state = read(run, "state.json")
    assert (state["epochs_done"], state["steps_done"], summary["epochs"]) == (3, 0, 3)
    assert [e["epoch"] for e in read(run, "metrics.json")["epochs"]] == [0, 1, 2]


def test_the_fault_suite_accepts_an_epoch_finished_from_a_checkpoint_inside_it():
    """The kept (last) charge of an epoch is its uninterrupted record, or the rest of it after
    an earlier charge of the same epoch (a resume inside it); anything else is named."""
    reference = {0: (10, 1.0), 1: (10, 0.9)}

    def rec(epoch, steps, z):
        return {"epoch": epoch, "steps": steps, "noise_multiplier": z}

    assert faults.kept_differences([rec(0, 10, 1.0), rec(1, 10, 0.9)], reference) == ""
    assert faults.kept_differences([rec(0, 10, 1.0), rec(1, 7, 0.9), rec(1, 4, 0.9)],
                                   reference) == ""
    assert "epoch 1 kept 4" in faults.kept_differences([rec(0, 10, 1.0), rec(1, 4, 0.9)],
                                                       reference)  # the first 6 steps missing
    assert "z 0.8" in faults.kept_differences([rec(0, 10, 1.0), rec(1, 10, 0.8)], reference)
    assert "differ" in faults.kept_differences([rec(0, 10, 1.0)], reference)


def _a_run_finished_from_what_it_trained_counts_the_interrupted_steps(run, tmp_path, config):
    """The same run as a SIGKILL would leave it (epoch 1's steps only in `in_progress`), resumed
    with --epochs=1 to finish from its checkpoint inside epoch 1: no fit runs, and still its
    ledger and statement charge those steps (they are in the weights it exports)."""
    killed = str(tmp_path / "killed")
    shutil.copytree(run, killed)
    content = json.loads(pathlib.Path(killed, "privacy.json").read_text())
    content["in_progress"] = content["epochs"].pop()
    before, events = ledger.charged(dict(content, in_progress=None))  # epoch 0 alone
    content["epsilon"] = accounting.compute_epsilon(before, content["sampling_rate"],
                                                    content["delta"], events)
    pathlib.Path(killed, "privacy.json").write_text(json.dumps(content))
    summary = training.train(_with_epochs(config, 1), killed, resume=True,
                             strategy=strategy(1), export=False)
    after = read(killed, "privacy.json")
    assert after["in_progress"] is None and [e["steps"] for e in after["epochs"]][-1] == 4
    records, events = ledger.charged(after)
    assert summary["epsilon"] == pytest.approx(
        accounting.compute_epsilon(records, after["sampling_rate"], after["delta"], events))
    assert summary["epsilon"] > content["epsilon"]


def _with_epochs(config, epochs):
    changed = config.copy_and_resolve_references()
    changed.epochs = epochs
    return changed
