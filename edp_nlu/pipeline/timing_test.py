"""The run's wall-time breakdown: phases add up, the first step's tracing is told apart."""
import time

from edp_nlu.pipeline import timing


def test_phases_add_up_to_the_total_with_the_rest_as_other():
    phases = timing.Phases()
    with phases.phase("data"):
        time.sleep(0.05)
    phases.add("steps", 0.5)
    phases.add("steps", 0.25)
    out = phases.breakdown()
    assert out["steps"] == 0.8  # 0.75 rounded to 0.1 s
    assert out["data"] >= 0.0 and out["start-up"] > 0.0  # this process started before the test
    parts = sum(v for k, v in out.items() if k not in ("total",))
    assert abs(parts - out["total"]) <= 0.2 or out["other"] == 0.0
    line = timing.breakdown_line({"total": 100.0, "steps": 80.0, "tracing": 15.0, "export": 0.2})
    # a short phase is still named: a run whose steps took 0.3 s says so
    assert line == "time: 100 s (80% in training steps): steps 80.0, tracing 15.0, export 0.2"


def test_the_first_step_beyond_a_typical_one_is_tracing():
    phases = timing.Phases()
    steps = timing.StepTimes(phases)
    for seconds in (0.30, 0.02, 0.02, 0.02):
        steps.on_train_batch_begin(0)
        time.sleep(seconds)
        steps.on_train_batch_end(0)
    steps.on_train_end()
    # tracing ~ 0.30 - 0.02, steps ~ 4 x 0.02; the upper bounds leave room for sleeps that
    # overshoot on a loaded machine, the lower ones fail if the first step is not split
    assert 0.2 <= phases.seconds["tracing"] <= 0.6
    assert 0.07 <= phases.seconds["steps"] <= 0.4


def test_a_callbacks_hooks_are_timed_and_still_called():
    phases = timing.Phases()

    class Hook:
        calls = []

        def on_epoch_end(self, epoch, logs=None):
            time.sleep(0.05)
            self.calls.append(epoch)
            return epoch

    hook = Hook()
    phases.time_methods(hook, ("on_epoch_end",), "privacy accounting")
    assert hook.on_epoch_end(3) == 3 and hook.calls == [3]
    assert 0.04 <= phases.seconds["privacy accounting"] < 0.5
